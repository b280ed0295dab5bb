"""Read the world through the adapters, nodes in parallel, every call bounded. No decisions here."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..adapters import AdapterError, Unreachable, guarded
from ..adapters.docker import DockerEngine
from ..adapters.listening import LISTENING, read_listening
from ..adapters.nvidia import parse_meminfo, parse_smi_xml
from ..adapters.ray import RayDashboard, read_nodes
from ..adapters.shell import NodeShell, Result, SshKeys
from ..adapters.sysfs import host_facts_of
from ..adapters.vllm import VllmApi
from ..base import redaction
from ..config import Config, Node, identity
from ..config.view import DeploymentView
from ..judge.completion import health_result
from ..judge.preflight import parse_ip_addr
from ..model import (
    Container,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Gpu,
    Kind,
    Memory,
    NodeObservation,
    Observation,
    ProbeResult,
    RayObservation,
    ServeObservation,
    Unit,
)
from ..specs import commands


@dataclass
class NodeAdapters:
    node: Node
    shell: NodeShell
    docker: DockerEngine


class World:
    """The real adapters for one deployment (rebuilt on reload), on its view."""

    KEEP_ALIVE_S = 2.0

    def __init__(self, view: DeploymentView, control_dir: str = "", follow_events: bool = False):
        """follow_events: the daemon's world, which follows each engine's container events (DockerEngine)."""
        self.view = view
        self.cfg = cfg = view.cfg
        dep, sup, docker_timeout = view.dep, cfg.supervisor, view.deadlines.docker.seconds
        self.nodes = {
            n.name: NodeAdapters(n, NodeShell(n.name, n.ssh, timeout=sup.io_timeout, keys=SshKeys.of(n),
                                              connect_timeout=sup.ssh_connect_timeout, control_dir=control_dir),
                                 DockerEngine(n.name, n.docker, timeout=docker_timeout, follow=follow_events,
                                              keys=SshKeys.of(n)))
            for n in cfg.nodes
        }
        # Let go of a kept connection before vLLM's uvicorn closes it (5 s): a request then would fail a probe.
        self.http = httpx.Client(trust_env=False, limits=httpx.Limits(keepalive_expiry=self.KEEP_ALIVE_S))
        self.ray = RayDashboard(self.http, view.dashboard, sup.io_timeout)
        self.api = VllmApi(self.http, view.endpoint, api_key=dep.api_key.get_secret_value(),
                           timeout=view.deadlines.api.seconds)
        self.pool = cf.ThreadPoolExecutor(max_workers=len(cfg.nodes) + 2, thread_name_prefix="observe")
        self.probes = cf.ThreadPoolExecutor(max_workers=4 * len(cfg.nodes), thread_name_prefix="probe")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.probes.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        self.api.kept.close()
        for a in self.nodes.values():
            a.docker.close()

    def head(self) -> NodeAdapters:
        """The node the serve runs on."""
        return self.nodes[self.view.serve_node.name]


def _units(r: Result) -> tuple[Unit, ...]:
    if r.rc != 0 and not r.out.strip():
        raise AdapterError("SystemctlFailed", (r.err.strip() or f"exit {r.rc}")[-200:])
    units: list[Unit] = []
    cur: dict[str, str] = {}
    for line in (r.out + "\n\n").splitlines():
        if not line.strip():
            if cur:
                units.append(Unit(cur.get("Id", "").removesuffix(".service"), cur.get("ActiveState", ""),
                                  cur.get("UnitFileState", ""), cur.get("LoadState", "")))
            cur = {}
            continue
        k, _, v = line.partition("=")
        cur[k] = v
    return tuple(units)


NVML_LOST = "Failed to initialize NVML: Unknown Error"  # docs/wire-formats.md §8.3


def _nvidia(r: Result) -> Gpu | str:
    """The GPU; or nvidia-smi's own words when it lost the GPU (NVML's "Unknown Error": GpuAccessLost)."""
    said = f"{r.out}\n{r.err}"
    if NVML_LOST in said:
        return next(ln.strip() for ln in said.splitlines() if NVML_LOST in ln)[:200]
    if r.rc != 0:
        raise AdapterError("NvidiaSmiFailed", (r.err.strip() or r.out.strip() or f"exit {r.rc}")[-200:])
    return parse_smi_xml(r.out)


def _meminfo(r: Result) -> Memory:
    if r.rc != 0:
        raise AdapterError("MeminfoFailed", f"exit {r.rc}")
    return parse_meminfo(r.out)


def _interfaces(r: Result) -> dict[str, tuple[str, ...]]:
    if r.rc != 0:
        raise AdapterError("IpFailed", f"exit {r.rc}")
    return parse_ip_addr(r.out)


Probe = tuple[list[str], Callable[[Result], Any]]  # a probe's argv on the node and the reader of its result


def _probes(a: NodeAdapters, cfg: Config) -> dict[str, Probe]:
    """The slow facts of a full observation: name -> (argv on the node, reader of its result)."""
    out: dict[str, Probe] = {}
    if cfg.stale.units:
        out["units"] = (commands.systemctl_show(cfg.stale.units), _units)
    out["nvidia-smi"] = ([*a.node.nvidia_smi, "-q", "-x"], _nvidia)
    out["meminfo"] = (list(a.node.meminfo), _meminfo)
    out["ip"] = (list(a.node.ip), _interfaces)
    out["listening"] = (list(LISTENING), read_listening)
    out["host"] = (commands.host_facts(a.node), host_facts_of)
    return out


def _ended(a: NodeAdapters, view: DeploymentView, containers: tuple[Container, ...]) -> tuple[Container, ...]:
    """The deployment's exited containers with their exit code and last lines (why they ended); one that
    cannot be read stays as listed (unknown why, still exited)."""
    dep = view.dep
    out = []
    for c in containers:
        if c.lost and identity.owns(c, dep):
            try:
                code, tail = guarded("container end", a.docker.ended, c.name)
                c = dataclasses.replace(c, exit_code=code, log_tail=redaction.text(tail, view.secrets))
            except AdapterError:
                pass
        out.append(c)
    return tuple(out)


def _run_batch(a: NodeAdapters, argvs: list[list[str]]) -> list[Result | None]:
    """A worker's probes in one SSH session (commands.PROBES); None for one that did not run to its end."""
    def run() -> list[Result | None]:
        r = a.shell.run(commands.probes_argv(argvs))
        return [None if x is None else Result(x[0], x[1], r.err) for x in commands.parse_probes(r.out, len(argvs))]
    return guarded("probes", run)


def observe_node(a: NodeAdapters, view: DeploymentView, full: bool, probes: cf.Executor | None = None,
                 steady: bool = False) -> NodeObservation:
    """One node's observation; whatever fails in it unforeseen is the node's unknown, never the tick's."""
    try:
        return guarded("node", _observe_node, a, view, full, probes, steady)
    except AdapterError as e:
        return NodeObservation(a.node.name, error=str(e))


def _observe_node(a: NodeAdapters, view: DeploymentView, full: bool, probes: cf.Executor | None,
                  steady: bool) -> NodeObservation:
    """Containers every tick; on a full observation also units, GPU, memory and interfaces, read in
    parallel with the Docker calls (on a worker each is an SSH round trip). ``on``: the deployment's view
    steady: a quick sweep (not full) of a healthy serve, which may keep a listing."""
    cfg, name = view.cfg, a.node.name
    wanted = _probes(a, cfg) if full and probes is not None else {}
    started = _start_probes(a, wanted, probes) if wanted and probes is not None else (None, {})
    try:
        if a.node.remote and not a.docker.connected:
            guarded("ssh", a.shell.reachable)  # fail fast on a dead host before docker-py's SSH transport hangs
        containers = guarded("containers", lambda: tuple(a.docker.containers(trusted=steady)))
    except AdapterError as e:
        return NodeObservation(name, error=str(e))
    containers = _ended(a, view, containers)
    if not full:
        return NodeObservation(name, containers=containers)
    errors: list[str] = []
    try:  # the engine's version goes through containerd too: failing, it is a probe's problem, not the node's
        version = guarded("docker version", a.docker.version)
    except AdapterError as e:
        version = ""
        errors.append(f"docker version: {e}")
    got: dict[str, Any] = {"units": None if cfg.stale.units else ()}
    try:
        got.update(_collect_probes(wanted, *started, view.deadlines.probes.seconds, errors))
    except Unreachable as e:
        return NodeObservation(name, error=str(e))
    read, lost = got.get("nvidia-smi"), ""
    gpu: Gpu | None = read if isinstance(read, Gpu) else None
    if isinstance(read, str):  # no GPU reading: its memory is unknown, and why is said
        lost = read
        errors.append(f"nvidia-smi: {Kind.GPU_ACCESS_LOST}: {lost}")
    lost = lost or _lost_inside(a, view, containers, errors)
    owned = _owned_pids(a, cfg, containers, gpu, errors) if gpu is not None else None
    return NodeObservation(name, containers=containers, docker_version=version, units=got.get("units"),
                           gpu=gpu, memory=got.get("meminfo"), interfaces=got.get("ip"),
                           probe_errors=tuple(errors), owned_pids=owned, listening=got.get("listening"),
                           host=got.get("host"), gpu_lost=lost)


def _start_probes(a: NodeAdapters, wanted: dict[str, Probe], probes: cf.Executor
                  ) -> tuple[cf.Future[list[Result | None]] | None, dict[str, cf.Future[Any]]]:
    """The host probes started beside the Docker calls: on a worker one SSH round trip for all of them (a
    batch), on the head one future each."""
    if a.node.remote:
        return probes.submit(_run_batch, a, [argv for argv, _ in wanted.values()]), {}
    return None, {what: probes.submit(lambda what, argv, read: guarded(what, lambda: read(a.shell.run(argv))),
                                      what, argv, read)
                  for what, (argv, read) in wanted.items()}


def _collect_probes(wanted: dict[str, Probe], batch: cf.Future[list[Result | None]] | None,
                    pending: dict[str, cf.Future[Any]], wait: float, errors: list[str]) -> dict[str, Any]:
    """What each probe read, waiting at most `wait` for each; a probe that failed or did not answer is left
    out (unknown) with its error in `errors`. Raises Unreachable when the node itself cannot be reached."""
    got: dict[str, Any] = {}
    if batch is not None:
        try:
            results: list[Result | None] = batch.result(timeout=wait)
        except Unreachable:
            raise
        except AdapterError as e:
            results = [None] * len(wanted)
            errors.append(f"probes: {e}")
        except cf.TimeoutError:
            results = [None] * len(wanted)
        for (what, (_, read)), r in zip(wanted.items(), results, strict=True):
            try:
                if r is None:
                    raise AdapterError("ProbeCutOff", "no answer")
                got[what] = guarded(what, read, r)
            except AdapterError as e:
                errors.append(f"{what}: {e}")
    for what, fut in pending.items():
        try:
            got[what] = fut.result(timeout=wait)
        except Unreachable:
            raise
        except AdapterError as e:
            errors.append(f"{what}: {e}")
        except cf.TimeoutError:
            errors.append(f"{what}: no answer")
    return got


def _lost_inside(a: NodeAdapters, view: DeploymentView, containers: tuple[Container, ...], errors: list[str]) -> str:
    """NVML's "Unknown Error" as the deployment's own running containers see it (ray.nvidia_smi), "" if none says
    so. Any other answer, or none, is no verdict: an image may well have no nvidia-smi."""
    argv = view.dep.ray.nvidia_smi
    if not argv or not view.dep.ray.gpus:
        return ""
    for c in containers:
        if c.running and identity.owns(c, view.dep):
            try:
                _, said = guarded("nvidia-smi in a container", a.docker.exec, c.name, list(argv))
            except AdapterError as e:
                errors.append(f"in-container nvidia-smi: {c.name}: {e}")  # not "nvidia-smi": not the host's GPU
                continue
            line = next((ln.strip() for ln in said.splitlines() if NVML_LOST in ln), "")
            if line:
                return f"{line[:200]} (in {c.name})"
    return ""


def _owned_pids(a: NodeAdapters, cfg: Config, containers: tuple[Container, ...], gpu: Gpu,
                errors: list[str]) -> frozenset[int] | None:
    """Which of the GPU's processes run in a configured deployment's container (another deployment's serve
    on a shared node is not a foreign process). Asked of the engine only when some process is not allowed."""
    if all(cfg.stale.allows(p.name) for p in gpu.processes):
        return None
    pids: set[int] = set()
    for c in containers:
        if c.running and identity.owned_by_any(c, cfg):
            try:
                pids.update(guarded("container processes", a.docker.pids, c.name))
            except AdapterError as e:
                errors.append(f"container processes: {c.name}: {e}")
                return None  # not read: every process stays a stranger (nothing starts on a guess)
    return frozenset(pids)


STATE_MARK = "serve-state"  # the first word of scripts/serve-state.sh's answer


def parse_serve_state(out: str, container_id: str = "") -> ServeObservation:
    """The serve-state script's answer. Raises ValueError on one without its first line (an exec whose output
    was lost or cut short, seen under load): that is unknown, never "no serve"."""
    head, _, tail = out.partition("\n")
    parts = head.split()
    if not parts or parts[0] != STATE_MARK:
        raise ValueError(f"no {STATE_MARK} line in its answer ({len(out)} bytes)")
    parts = parts[1:]
    if len(parts) < 2 or parts[0] == "0":
        return ServeObservation(False, log_tail=tail)
    pid, spec = int(parts[0]), parts[1]
    started = parts[2] if len(parts) > 2 else ""
    running = len(parts) > 3 and parts[3] == "1"
    code = int(parts[4]) if len(parts) > 4 and parts[4].lstrip("-").isdigit() else None
    return ServeObservation(True, pid, container_id, running, code, spec, started, tail)


def observe_serve(world: World, container: Container | None, node: str = "") -> ServeObservation | None:
    """None: no running container to look in. Raises AdapterError when the exec fails: unknown."""
    if container is None or not container.running:
        return None
    dep = world.view.dep
    engine = world.nodes[node].docker if node else world.head().docker
    code, out = engine.exec(container.name, commands.serve_state(dep), what="serve state")
    if code == 3:
        return ServeObservation(False)
    if code != 0:
        raise AdapterError("ServeStateFailed", f"the serve-state script exited {code}: {out.strip()[-200:]}")
    try:
        serve = parse_serve_state(out, container.id)
    except ValueError as e:
        raise AdapterError("ServeStateUnreadable", str(e)) from None
    key = dep.api_key.get_secret_value()
    if key and key in serve.log_tail:  # vLLM echoes its arguments and environment in some versions
        serve = dataclasses.replace(serve, log_tail=serve.log_tail.replace(key, "[redacted]"))
    return serve


class Observer:
    def __init__(self, world: World, clock: Callable[[], float] = time.monotonic,
                 recent: Callable[[], tuple[RayObservation | None, EndpointObservation | None]] | None = None):
        self.world, self.clock = world, clock
        # The quick check's Ray nodes and /health when they are fresh and good (None: look). A sweep while
        # serving reuses them instead of asking again a moment after the quick check did.
        self.recent = recent or (lambda: (None, None))
        self._serve: ServeObservation | None = None
        self._endpoint: EndpointObservation | None = None
        self._listed = ""  # the serve instance whose API last listed the model (its /metrics is worth reading)
        self._followers: dict[str, ServeObservation | None] = {}
        self.ray_via = "dashboard"  # how the running Ray head is read: its container's label says
        self.last_ray: RayObservation | None = None

    def _serve_and_endpoint(self, head_c: Container | None, full: bool, node_error: str) -> tuple[
            ServeObservation | None, EndpointObservation | None]:
        w = self.world
        last, ep_last = self._serve, self._endpoint
        if node_error:  # the serve's node could not be seen: its serve is unknown, not gone
            return (dataclasses.replace(last or ServeObservation(False), error=f"its node: {node_error}"),
                    w.api.observe())
        if (not full and last is not None and last.running and head_c is not None and head_c.running
                and head_c.id == last.container_id and ep_last is not None and ep_last.state == EndpointState.UP):
            # Watching a healthy serve: /health 200 proves the same process still listens, so skip the
            # exec into the container and the model list until the next full observation.
            recent = self.recent()[1]
            healthy = recent is not None and health_result(recent) == ProbeResult.SUCCESS
            if healthy or health_result(w.api.observe_health()) == ProbeResult.SUCCESS:
                return last, EndpointObservation(EndpointState.UP, "", 200, ep_last.models)
        # A serve seen before: its endpoint asked before its log, so that a 200 means the tail read after it
        # already says the start completed (its KV cache with it): readiness and what the load printed are
        # judged on the same evidence. No serve seen: no endpoint to ask (one that hangs would hold the tick).
        seen_before = last is not None and last.present and head_c is not None and head_c.running
        answer = w.api.observe() if seen_before else None
        serve = self._look(head_c, "", last)
        endpoint = (answer or w.api.observe()) if serve is not None and (serve.running or serve.error) else None
        if endpoint is None and serve is not None:
            endpoint = EndpointObservation(EndpointState.UNKNOWN)
        if serve is None or not serve.error:
            self._serve = serve
        self._endpoint = endpoint
        return serve, endpoint

    def _look(self, c: Container | None, node: str, last: ServeObservation | None) -> ServeObservation | None:
        """One serve's state; a failed look carries the last state seen, marked unknown (never "no serve")."""
        try:
            return guarded("serve state", observe_serve, self.world, c, node)
        except AdapterError as e:
            seen = last if last is not None and c is not None and last.container_id == c.id else None
            return dataclasses.replace(seen or ServeObservation(False), error=str(e))

    def _followers_of(self, nodes: dict[str, NodeObservation]) -> dict[str, ServeObservation | None]:
        """mp across nodes: the headless ranks, each in its node's container (in parallel: SSH round trips),
        looked at every sweep. Rank 0's healthy /health proves nothing of them: the real vLLM (0.32, measured)
        answers 200 for as long as it is idle after a follower died, and finds out only at the next request."""
        w = self.world
        view, dep = w.view, w.view.dep
        if not view.multi_node_mp:
            return {}
        out: dict[str, ServeObservation | None] = {}
        pending = {}
        for node in view.serve_nodes[1:]:
            o, last = nodes[node.name], self._followers.get(node.name)
            c = identity.named(o.containers, identity.node_container_name(dep, node))
            if o.error:
                out[node.name] = dataclasses.replace(last or ServeObservation(False), error=f"its node: {o.error}")
            else:
                pending[node.name] = w.pool.submit(self._look, c, node.name, last)
        for name, f in pending.items():
            try:
                out[name] = f.result(timeout=view.deadlines.follower.seconds)
            except cf.TimeoutError:
                out[name] = dataclasses.replace(self._followers.get(name) or ServeObservation(False),
                                                error="ServeStateTimeout: no answer")
        self._followers.update({k: v for k, v in out.items() if v is None or not v.error})
        return out

    def _ray_gcs(self, head_c: Container | None, full: bool, serving: bool) -> RayObservation:
        """Ray without its dashboard: the GCS asked inside the head container. It costs a Python start
        (about 0.4 s of CPU), so while a serve runs it is read at full observations only; in between the
        last reading stands (a lost node shows first as the serve's own death)."""
        last = self.last_ray
        if not full and serving and last is not None and last.via == "gcs" and last.reachable:
            return last
        if head_c is None or not head_c.running:
            return RayObservation(False, Kind.RAY_HEAD_NOT_RUNNING, via="gcs")
        view = self.world.view
        timeout = view.deadlines.ray_gcs.seconds
        try:
            code, out = guarded("ray nodes", lambda: self.world.head().docker.exec(
                head_c.name, commands.ray_nodes(view.dep, view.gcs, timeout), what="ray nodes"))
            if code != 0:
                return RayObservation(False, f"{Kind.RAY_GCS_UNREACHABLE}: exit {code}: {out.strip()[-200:]}", via="gcs")
            return guarded("ray nodes", lambda: read_nodes(out.strip().splitlines()[-1] if out.strip() else "", "gcs"))
        except AdapterError as e:
            return RayObservation(False, f"{Kind.RAY_GCS_UNREACHABLE}: {e}"[:200], via="gcs")

    def observe(self, full: bool) -> Observation:
        w, view = self.world, self.world.view
        dep, timeout = view.dep, view.deadlines.node.seconds
        last, ep = self._serve, self._endpoint  # a healthy serve's quick sweep may keep a node's listing
        steady = not full and last is not None and last.running and health_result(ep) == ProbeResult.SUCCESS
        futures = {name: w.pool.submit(observe_node, a, view, full, w.probes, steady) for name, a in w.nodes.items()}
        ray_recent = self.recent()[0] if not full else None
        ray_f = (w.pool.submit(w.ray.observe) if dep.uses_ray and self.ray_via == "dashboard"
                 and (ray_recent is None or not ray_recent.reachable) else None)
        nodes: dict[str, NodeObservation] = {}
        for name, f in futures.items():
            try:
                nodes[name] = f.result(timeout=timeout)
            except cf.TimeoutError:
                nodes[name] = NodeObservation(name, error=f"ObserveTimeout: no answer within {timeout:.0f}s")
        home = view.serve_node
        head_c = identity.named(nodes[home.name].containers, identity.node_container_name(dep, home))
        if head_c is not None and not nodes[home.name].error:
            self.ray_via = identity.ray_via(head_c)
        ray: RayObservation | None = ray_recent if dep.uses_ray and self.ray_via == "dashboard" else None
        if ray_f is not None:
            try:
                ray = ray_f.result(timeout=timeout)
            except cf.TimeoutError:
                ray = RayObservation(False, f"{Kind.RAY_DASHBOARD_UNREACHABLE}: no answer within {timeout:.0f}s")
        serve, endpoint = self._serve_and_endpoint(head_c, full, nodes[home.name].error)
        followers = self._followers_of(nodes)
        if dep.uses_ray and self.ray_via == "gcs":
            ray = self._ray_gcs(head_c, full, serve is not None and serve.running)
        self.last_ray = ray
        return Observation(self.clock(), full, nodes, ray, serve, endpoint, followers, self._engine(serve, endpoint))

    def _engine(self, serve: ServeObservation | None, endpoint: EndpointObservation | None) -> EngineStats | None:
        """The engine's heartbeat (its /metrics) of a serve whose API has listed the model: read also while its
        /health is slow or failing, when it matters most (a loaded server answers /health late, tokens flowing)."""
        if serve is None or not serve.running or not self.world.view.cfg.healing.heartbeat_stall:
            return None
        if endpoint is not None and endpoint.state == EndpointState.UP and endpoint.models:
            self._listed = serve.identity
        return self.world.api.engine() if self._listed == serve.identity else None
