"""The checks that need the whole config (nodes against deployments, deployments against each other,
directories, ports and programs across tables): the helpers of Config._cross_checks, each returning
its problems as (key, message)."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .fields import _SSH_URL, _TCP_URL, _inside, _loopback, _overlap, _q
from .schema import Deployment, Node

if TYPE_CHECKING:
    from .root import Config


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


def _same_machine(nodes: list[Node]) -> list[tuple[str, str]]:
    """Two nodes that are one machine (the same engine, SSH host or address): the planner would see one
    node's containers as the other's and restart the deployment on every tick."""
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
            for v, vol in enumerate(other.ray.volumes):
                src = vol.split(":")[0]
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

