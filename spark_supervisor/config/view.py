"""One deployment's facts (``DeploymentView``), computed once per (re)load from the whole config: the
deployment, its members (head first), the nodes its serve runs on, who owns containers, its state directory,
its spec hashes, its addresses and the deadlines derived from the settings, each with the reason for its
value. Frozen: a new config makes new views; nothing recomputes them per tick.

``Config`` is the whole file; a ``DeploymentView`` is one deployment of it, so the two cannot be mixed up
(``Config.deployment`` is the file's first deployment, ``DeploymentView.dep`` this one). ``cfg`` holds the
settings the deployment runs on (``Config.view``: its nodes only, its own state directory)."""

from __future__ import annotations

from dataclasses import dataclass

from . import Config, Deployment, Node, deployment_secrets, image_check_key, ray_hash, serve_hash


@dataclass(frozen=True)
class Deadline:
    """A timeout derived from the settings, and why it has its value."""

    seconds: float
    why: str


@dataclass(frozen=True)
class Deadlines:
    docker: Deadline  # one Docker API call (a container stop included)
    checks: Deadline  # a first start's image and model checks, run in one container
    api: Deadline  # one call to the serve's OpenAI API
    probes: Deadline  # one node's probes (nvidia-smi, meminfo, units, listeners) in one SSH session
    node: Deadline  # one node's whole observation
    follower: Deadline  # mp across nodes: one headless rank's serve state
    ray_gcs: Deadline  # Ray's node table read through the GCS (`ray-nodes.sh` in the head container)


def deadlines(cfg: Config, dep: Deployment) -> Deadlines:
    sup = cfg.supervisor
    io, ssh = sup.io_timeout, sup.ssh_connect_timeout
    docker = max(io, dep.serve.stop_timeout + 15)
    return Deadlines(
        docker=Deadline(docker, "the larger of io_timeout and serve.stop_timeout + 15 s: a stop waits for the serve to exit"),
        checks=Deadline(2 * docker, "twice a Docker call's: two probes (a slow `vllm --version`, a model on slow "
                        "storage), each within its own time, must not time out together"),
        api=Deadline(min(io, 5), "io_timeout, at most 5 s: the API answers at once or is judged by its probe"),
        probes=Deadline(io + ssh, "io_timeout + ssh_connect_timeout: a connection and one call"),
        node=Deadline(io + ssh + 5, "io_timeout + ssh_connect_timeout + 5 s: its probes and 5 s of slack"),
        follower=Deadline(io + 10, "io_timeout + 10 s: one exec in its container, and slack"),
        ray_gcs=Deadline(io, "io_timeout: one command in the head container"),
    )


@dataclass(frozen=True)
class DeploymentView:
    """One deployment's facts, computed once from the whole config (``build``)."""

    dep: Deployment
    cfg: Config  # the settings it runs on: its nodes only, its own state directory (Config.view)
    members: tuple[Node, ...]  # head first: Ray needs the head up before workers join
    serve_nodes: tuple[Node, ...]  # where a serve process runs, the API's (rank 0, the head) first
    owners: frozenset[str]  # every configured deployment's name: their containers are nobody's orphans
    ray_hash: str
    serve_hash: str
    image_key: str  # what its image check is kept for, beside the image's ID (config.image_check_key)
    endpoint: str  # the serve's API
    dashboard: str  # Ray's dashboard on the head
    gcs: str  # Ray's GCS on the head (host:port)
    master: str  # mp across nodes: where rank 0 waits for the others (host:port); "" otherwise
    secrets: tuple[str, ...]  # what never goes into a log line or status (config.deployment_secrets)
    deadlines: Deadlines

    @property
    def name(self) -> str:
        return self.dep.name

    @property
    def serve_node(self) -> Node:
        """Where the serve's API runs: the head of its members."""
        return self.members[0]

    @property
    def state_dir(self) -> str:
        """Its own state directory (repair log, bests, status) under the supervisor's."""
        return self.cfg.supervisor.state_dir

    @property
    def multi_node_mp(self) -> bool:
        """vLLM's own multi-node mode: a serve process (a rank) on every member, no Ray."""
        return len(self.serve_nodes) > 1

    @classmethod
    def build(cls, whole: Config, dep: Deployment) -> DeploymentView:
        return cls.of(whole.view(dep), dep)

    @classmethod
    def of(cls, cfg: Config, dep: Deployment) -> DeploymentView:
        """The view of ``dep`` on ``cfg`` as given (a view already, or a one-deployment test config)."""
        members = tuple(cfg.members(dep))
        head = members[0]
        mp = not dep.uses_ray and len(members) > 1
        return cls(dep=dep, cfg=cfg, members=members, serve_nodes=members if mp else (head,), owners=cfg.owners,
                   ray_hash=ray_hash(cfg, dep), serve_hash=serve_hash(cfg, dep),
                   image_key=image_check_key(cfg, dep), endpoint=cfg.endpoint(dep),
                   dashboard=f"http://{head.fabric_ip}:{dep.ray.dashboard_port}",
                   gcs=f"{head.fabric_ip}:{dep.ray.port}",
                   master=f"{head.fabric_ip}:{dep.serve.master_port}" if mp else "",
                   secrets=tuple(deployment_secrets(cfg, dep)), deadlines=deadlines(cfg, dep))


def views(whole: Config) -> dict[str, DeploymentView]:
    """Every configured deployment's view, by name, in the file's order."""
    return {d.name: DeploymentView.build(whole, d) for d in whole.deployments}
