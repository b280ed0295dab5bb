"""The checks that need the whole config (nodes against deployments, deployments against each other,
directories, ports and programs across tables): small named rules, each taking the Config and returning
its problems as (key, message), run by Config in the order of RULES."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from .fields import _SSH_URL, _TCP_URL, _inside, _loopback, _overlap, _q
from .schema import Deployment, Node, Stale
from .settings import Alerts, Memory, Metrics, Supervisor


class Config(Protocol):
    """What the rules read of the whole config (root.Config, which runs them, is one): its tables, and a
    deployment's members. A protocol, so that this module need not import the Config that imports it."""

    @property
    def supervisor(self) -> Supervisor: ...
    @property
    def memory(self) -> Memory: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def alerts(self) -> Alerts: ...
    @property
    def nodes(self) -> list[Node]: ...
    @property
    def stale(self) -> Stale: ...
    @property
    def deployments(self) -> list[Deployment]: ...

    def members(self, dep: Deployment) -> list[Node]: ...


Rule = Callable[[Config], list[tuple[str, str]]]


def _node_names(cfg: Config) -> list[tuple[str, str]]:
    names = [n.name for n in cfg.nodes]
    return [(f"nodes[{i}].name", f"duplicate node {name!r}") for i, name in enumerate(names) if name in names[:i]]


def _fabric_ips(cfg: Config) -> list[tuple[str, str]]:
    ips = [n.fabric_ip for n in cfg.nodes]
    return [(f"nodes[{i}].fabric_ip", f"duplicate fabric IP {ip}") for i, ip in enumerate(ips) if ip in ips[:i]]


def _one_head(cfg: Config) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    heads = [i for i, n in enumerate(cfg.nodes) if n.role == "head"]
    if not heads:
        problems.append(("nodes", "no node has role = \"head\""))
    for i in heads[1:]:
        problems.append((f"nodes[{i}].role", "more than one head node"))
    return problems


def _remote_workers(cfg: Config) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for i, n in enumerate(cfg.nodes):
        if n.role == "worker" and not n.ssh:
            problems.append((f"nodes[{i}].ssh", "a worker needs an SSH target, e.g. \"root@spark-2\""))
        if n.role == "worker" and n.docker == "local":
            problems.append((f"nodes[{i}].docker", "a worker's engine is remote, e.g. \"ssh://root@spark-2\""))
    return problems


def _deployment_names(cfg: Config) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    deps = [dep.name for dep in cfg.deployments]
    if not cfg.deployments:
        problems.append(("deployments", "no deployment: add a [[deployments]] table"))
    for d, dep in enumerate(cfg.deployments):
        if dep.name in deps[:d]:
            problems.append((f"deployments[{d}].name", f"duplicate deployment {dep.name!r}: each needs its own name "
                             "(it names its containers and owns them)"))
        for j, a in enumerate(dep.after):
            if a not in deps or a == dep.name:
                problems.append((f"deployments[{d}].after[{j}]", f"{a!r} is not another deployment "
                                 f"(deployments: {', '.join(deps)})"))
    return problems


def _start_order(cfg: Config) -> list[tuple[str, str]]:
    cycle = _after_cycle(cfg.deployments)
    if cycle:
        return [("deployments", f"the start order goes round in a circle: {' -> '.join(cycle)}")]
    return []


def _after_cycle(deps: list[Deployment]) -> list[str]:
    """A circle in the deployments' ``after`` order, as names (empty: none)."""
    after = {d.name: d.after for d in deps}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> list[str]:
        if state.get(name) == 1:
            return [*path[path.index(name):], name]
        if state.get(name) == 2 or name not in after:
            return []
        state[name] = 1
        for a in after[name]:
            found = visit(a, [*path, name])
            if found:
                return found
        state[name] = 2
        return []

    for d in deps:
        found = visit(d.name, [])
        if found:
            return found
    return []


def _listed_nodes(d: int, dep: Deployment, names: list[str]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for j, nn in enumerate(dep.nodes):
        if nn not in names:
            problems.append((f"deployments[{d}].nodes[{j}]", f"unknown node {nn!r}"))
        elif nn in dep.nodes[:j]:
            problems.append((f"deployments[{d}].nodes[{j}]", f"{nn!r} is listed twice: list each node once"))
    return problems


def _gpu_count(d: int, dep: Deployment, members: list[Node]) -> list[tuple[str, str]]:
    """TP x PP must use exactly the GPUs configured on the deployment's nodes."""
    gpus = sum(n.gpus for n in members)
    want = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
    key = f"deployments[{d}].serve.tensor_parallel_size"
    if not members:
        return []  # unknown nodes: said by _listed_nodes
    if gpus == 0:
        return [(key, "its nodes have no GPUs: set nodes[].gpus")]
    if want > gpus:
        return [(key, f"TP x PP = {want} is larger than the {gpus} GPUs configured on its nodes: make "
                      f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or add GPUs "
                      "(nodes[].gpus, deployments.nodes)")]
    if want < gpus:
        return [(key, f"TP x PP = {want} is smaller than the {gpus} GPUs configured on its nodes "
                      f"({gpus - want} would sit idle or fail placement): make "
                      f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or list fewer "
                      "GPUs (nodes[].gpus, deployments.nodes)")]
    return []


def _ports_taken(cfg: Config) -> tuple[dict[tuple[str, int], str], dict[int, list[tuple[str, str]]]]:
    """What the deployments listen on, on their head node's host network: (node, port) -> the first key taking
    it, and, by deployment index, every later key taking one again (one port each, across deployments too)."""
    listening: dict[tuple[str, int], str] = {}
    clashes: dict[int, list[tuple[str, str]]] = {}
    for d, dep in enumerate(cfg.deployments):
        members = cfg.members(dep)
        if not members:
            continue
        host = members[0].name
        ports = ([(f"deployments[{d}].ray.port", dep.ray.port),
                  (f"deployments[{d}].ray.dashboard_port", dep.ray.dashboard_port)] if dep.uses_ray else [])
        ports.append((f"deployments[{d}].serve.port", dep.serve.port))
        if not dep.uses_ray and len(members) > 1:
            ports.append((f"deployments[{d}].serve.master_port", dep.serve.master_port))
        for key, port in ports:
            other = listening.setdefault((host, port), key)
            if other != key:
                clashes.setdefault(d, []).append((key, f"port {port} is also {other} on {host}: they share the "
                                                       "node's host network; give each its own port"))
    return listening, clashes


def _deployment_nodes(cfg: Config) -> list[tuple[str, str]]:
    """Each deployment in turn: the nodes it lists, their GPUs against its TP x PP, its host ports."""
    problems: list[tuple[str, str]] = []
    names = [n.name for n in cfg.nodes]
    clashes = _ports_taken(cfg)[1]
    for d, dep in enumerate(cfg.deployments):
        problems += _listed_nodes(d, dep, names)
        problems += _gpu_count(d, dep, cfg.members(dep))
        problems += clashes.get(d, [])
    return problems


def _metrics_port(cfg: Config) -> list[tuple[str, str]]:
    """The daemon's own metrics listener, on the head, takes no deployment's port."""
    head = next((n for n in cfg.nodes if n.role == "head"), None)
    if not cfg.metrics.listen or head is None:
        return []
    clash = _ports_taken(cfg)[0].get((head.name, cfg.metrics.port))
    if clash:
        return [("metrics.listen", f"port {cfg.metrics.port} is also {clash} on {head.name}: give the metrics "
                                   "their own port")]
    return []


def _gpu_memory_shares(cfg: Config) -> list[tuple[str, str]]:
    """Deployments sharing a node: their gpu_memory_utilization fit in it."""
    problems: list[tuple[str, str]] = []
    shares: dict[str, list[tuple[str, float]]] = {}
    for dep in cfg.deployments:
        for n in cfg.members(dep):
            shares.setdefault(n.name, []).append((dep.name, dep.serve.gpu_memory_utilization))
    limit = 1 - cfg.memory.share_margin
    for node, taken in shares.items():
        total = sum(u for _, u in taken)
        if len(taken) > 1 and total > limit + 1e-9:
            d = next(i for i, dep in enumerate(cfg.deployments) if dep.name == taken[-1][0])
            problems.append((f"deployments[{d}].serve.gpu_memory_utilization",
                             f"the deployments on {node} ask for {total:.2f} of its GPU memory "
                             f"({', '.join(f'{n} {u:g}' for n, u in taken)}), more than {limit:.2f} "
                             f"(1 - memory.share_margin): vLLM would refuse the last to start; lower them"))
    return problems


def _stale_not_ours(cfg: Config) -> list[tuple[str, str]]:
    """stale.containers names none of the supervisor's own containers."""
    own_containers: dict[str, str] = {}
    for dep in cfg.deployments:
        for n in cfg.members(dep):
            own_containers[f"{dep.name}-ray-{n.name}"] = n.name
            own_containers[f"{dep.name}-vllm-{n.name}"] = n.name
    return [(f"stale.containers[{i}]", f"{c!r} is the supervisor's own Ray container on "
                                       f"{own_containers[c]}: remove it from the list")
            for i, c in enumerate(cfg.stale.containers) if c in own_containers]


def _engine(node: Node) -> str:
    """The Docker engine a node's URL reaches, the same string for the same engine."""
    url = node.docker
    if url == "local":
        url = "unix:///var/run/docker.sock"
    if url.startswith("unix://"):
        path = os.path.normpath(url[len("unix://"):])
        return "unix://" + ("/run" + path[len("/var/run"):] if _inside(path, "/var/run") else path)
    m = (_SSH_URL if url.startswith("ssh://") else _TCP_URL).fullmatch(url)
    if not m:
        return url
    host = "localhost" if _loopback(m.group("host")) else m.group("host").lower()
    return f"{url[:3]}://{host}:{m.group('port') or ('22' if url.startswith('ssh') else '2375')}"


def _machine_keys(i: int, n: Node) -> list[tuple[str, str]]:
    """(key, what) naming the machine a node is: two nodes sharing one are one machine."""
    keys = [(f"nodes[{i}].docker", "engine " + _engine(n))]
    if n.ssh:
        host = n.ssh.rpartition("@")[2].lower()
        keys.append((f"nodes[{i}].ssh", "host " + ("localhost" if _loopback(host) else host)))
    elif n.role == "head":  # the daemon's own machine
        keys.append((f"nodes[{i}].ssh", "host localhost"))
    if n.docker.startswith(("ssh://", "tcp://")):
        m = (_SSH_URL if n.docker.startswith("ssh://") else _TCP_URL).fullmatch(n.docker)
        if m:
            host = m.group("host").lower()
            keys.append((f"nodes[{i}].docker", "host " + ("localhost" if _loopback(host) else host)))
    keys.append((f"nodes[{i}].fabric_ip", "host " + n.fabric_ip))
    return keys


def _same_machine(cfg: Config) -> list[tuple[str, str]]:
    """Two nodes that are one machine (the same engine, SSH host or address): the planner would see one
    node's containers as the other's and restart the deployment on every tick."""
    nodes = cfg.nodes
    out: list[tuple[str, str]] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, n in enumerate(nodes):
        clashed = False
        for key, what in _machine_keys(i, n):
            j, other_key = seen.setdefault(what, (i, key))
            if j != i and not clashed and not (what.startswith("host ") and key.endswith("fabric_ip")
                                               and other_key.endswith("fabric_ip")):  # said by "duplicate fabric IP"
                out.append((key, f"{nodes[i].name} and {nodes[j].name} ({other_key}) are the same machine: both reach "
                                 f"{what}; each node needs its own engine and SSH target"))
                clashed = True
    return out


def _host_dirs(cfg: Config) -> list[tuple[str, str]]:
    """A compile cache is pruned: it must be nobody else's directory on any node it is used on."""
    out: list[tuple[str, str]] = []
    for d, dep in enumerate(cfg.deployments):
        cache = dep.serve.cache_dir
        if not cache:
            continue
        key = f"deployments[{d}].serve.cache_dir"
        mine = {n.name for n in cfg.members(dep)}
        for e, other in enumerate(cfg.deployments):
            logs = other.serve.log_host_dir
            if logs and _overlap(cache, logs):
                out.append((key, f"{_q(cache)} overlaps deployments[{e}].serve.log_host_dir {_q(logs)}: the cache's "
                                 "prune and the logs' would delete each other's files; give each its own directory"))
            if not mine & {n.name for n in cfg.members(other)}:
                continue
            for v, (src, _, _) in enumerate(other.ray.mounts):
                # "/" (read-only: read-write is refused) holds everything: the host, not a data directory
                if src.startswith("/") and os.path.normpath(src) not in ("/", "//") and _overlap(cache, os.path.normpath(src)):
                    out.append((key, f"{_q(cache)} overlaps the volume source {_q(src)} "
                                     f"(deployments[{e}].ray.volumes[{v}]): the cache's prune would delete what is "
                                     "mounted there (models, data); give the cache a directory of its own"))
        state = os.path.normpath(cfg.supervisor.state_dir)
        if _inside(state, cache) or _inside(cache, os.path.join(state, "deployments")):
            out.append((key, f"{_q(cache)} overlaps supervisor.state_dir {_q(state)}'s own files: give the cache a "
                             "directory of its own"))
    return out


# Ray's own listeners on every node it runs on (ray start's defaults): the GCS, the dashboard, the client
# server and the dashboard agent. Ours (ray.port, dashboard_port) are checked among the deployment's ports.
_RAY_PORTS = {6379: "Ray's GCS", 8265: "Ray's dashboard", 10001: "Ray's client server",
              52365: "Ray's dashboard agent"}


def _ports_and_endpoints(cfg: Config) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    ray_nodes = {n.name for dep in cfg.deployments if dep.uses_ray for n in cfg.members(dep)}
    serves: dict[tuple[str, int], int] = {}  # (address, port) -> the deployment serving there
    for d, dep in enumerate(cfg.deployments):
        members = cfg.members(dep)
        if not members:
            continue
        head = members[0]
        mine = [(f"deployments[{d}].serve.port", dep.serve.port)]
        if not dep.uses_ray and len(members) > 1:
            mine.append((f"deployments[{d}].serve.master_port", dep.serve.master_port))
        for key, port in mine:
            if port in _RAY_PORTS and ray_nodes & {n.name for n in members}:
                out.append((key, f"port {port} is {_RAY_PORTS[port]} on {sorted(ray_nodes & {n.name for n in members})[0]}: "
                                 "give it a port Ray does not take"))
        for ip in {head.fabric_ip, dep.serve.host}:
            serves[(ip, dep.serve.port)] = d
    if cfg.metrics.listen and cfg.metrics.port in _RAY_PORTS and any(n.role == "head" and n.name in ray_nodes
                                                                      for n in cfg.nodes):
        out.append(("metrics.listen", f"port {cfg.metrics.port} is {_RAY_PORTS[cfg.metrics.port]} on the head: give "
                                      "the metrics a port Ray does not take"))
    for d, dep in enumerate(cfg.deployments):
        u = urlsplit(dep.readiness.endpoint) if dep.readiness.endpoint else None
        if u is None:
            continue
        key = f"deployments[{d}].readiness.endpoint"
        if u.username is not None or u.password is not None:
            out.append((key, "carries user:password@, and the endpoint is shown in status.json (world-readable): "
                             "give the API key in api_key_file or api_key_env instead"))
        port = u.port or (443 if u.scheme == "https" else 80)
        other = next((e for (ip, p), e in serves.items() if p == port and e != d
                      and (ip == u.hostname or ip == "0.0.0.0")
                      and (ip != "0.0.0.0" or u.hostname in {n.fabric_ip for n in cfg.members(cfg.deployments[e])})),
                     None)
        if other is not None:
            out.append((key, f"{u.hostname}:{port} is deployments[{other}] ({cfg.deployments[other].name})'s serve, "
                             "not this deployment's: probe this deployment's own port"))
    return out


def _program_problem(program: str) -> str:
    if not program.startswith("/"):
        return ""  # a name looked up on PATH where it runs
    try:
        st = os.stat(program)
    except OSError as e:
        return f"{_q(program)}: {e.strerror or type(e).__name__}: give the program's absolute path"
    if not stat.S_ISREG(st.st_mode):
        return f"{_q(program)} is not a regular file: give the program's absolute path"
    if not os.access(program, os.X_OK):
        return f"{_q(program)} is not executable: chmod +x it, or give the program's absolute path"
    return ""


def _local_programs(cfg: Config) -> list[tuple[str, str]]:
    """Programs run here, on the daemon's machine: each must be an executable file, or it raises on every
    tick instead of observing."""
    out: list[tuple[str, str]] = []
    for i, n in enumerate(cfg.nodes):
        argvs = {"oob": n.oob}
        if not n.remote:
            argvs.update(nvidia_smi=n.nvidia_smi, meminfo=n.meminfo, ip=n.ip, drop_caches=n.drop_caches)
        for name, argv in argvs.items():
            if argv and "/" in argv[0] and not argv[0].startswith("/"):
                out.append((f"nodes[{i}].{name}[0]", f"{_q(argv[0])} is a relative path: give an absolute path or a "
                                                     "name on PATH (the daemon's working directory is not yours)"))
            elif argv and (why := _program_problem(argv[0])):
                out.append((f"nodes[{i}].{name}[0]", why))
    if cfg.alerts.command:
        program = cfg.alerts.command[0]
        if not program.startswith("/"):
            out.append(("alerts.command[0]", f"{_q(program)} is not an absolute path: the daemon's PATH and working "
                                             "directory are not yours; give e.g. \"/usr/local/bin/page-oncall\""))
        elif why := _program_problem(program):
            out.append(("alerts.command[0]", why))
    return out


# The order of the problems a config gets: every rule's, in this order.
RULES: tuple[Rule, ...] = (
    _node_names, _fabric_ips, _one_head, _remote_workers, _deployment_names, _start_order, _deployment_nodes,
    _metrics_port, _gpu_memory_shares, _stale_not_ours, _same_machine, _host_dirs, _ports_and_endpoints,
    _local_programs,
)
