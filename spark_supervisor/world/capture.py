"""`report --capture`: exactly what the daemon's parsers read on each node, as they read it, for an owner to send
(each file becomes a contract fixture: tests/unit/test_capture_contract.py). Reads only, every call bounded:
the host probes with the argument lists the observation runs (world/observe.py `_probes`), the start and the
NCCL lines of each serve node's current launch log (world/servelogs.py's files, read on the node), and Ray's
node table (the dashboard, else the GCS in the head container, as the observation reads it). Nothing here is
redacted: report/record/capture.py does that before anything is written."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from ..adapters import AdapterError
from ..adapters.docker import DockerEngine
from ..adapters.nvidia import parse_meminfo
from ..adapters.ray import read_nodes
from ..adapters.shell import NodeShell, Result
from ..adapters.sysfs import parse_host_facts
from ..config import Config, Node, identity
from ..config.view import DeploymentView, views
from ..judge import logscan
from ..judge.preflight import parse_ip_addr
from ..specs import commands, script
from . import observe, servelogs

MAX_BYTES = 1 << 20  # one captured file at most (nvidia-smi -q -x of a Spark is ~10 KiB, its sysfs ~5 KiB)
STARTUP_BYTES = 512 << 10  # the start of a launch's log: vLLM's startup to "Application startup complete"
NCCL_LINES, NCCL_LINE_BYTES = 2000, 2048  # logscan reads no more of a line than 2048 bytes either
CAPTURE_LOG = script.load("logs-safe.sh") + script.load("capture-log.sh")  # as servelogs joins its scripts


@dataclass(frozen=True)
class Format:
    """One kind of captured file: its name in the bundle and the parser the daemon reads it with."""

    file: str
    parser: str  # the function, for the manifest and the docs
    read: Callable[[str], object]  # raises on a file it cannot read (AdapterError, ValueError)


def _nvidia(text: str) -> object:
    r = observe._nvidia(Result(0, text, ""))
    if isinstance(r, str):
        raise ValueError(f"nvidia-smi lost the GPU: {r}")
    return r


def _ip(text: str) -> object:
    found = parse_ip_addr(text)
    if not found:
        raise ValueError("no inet or inet6 line")
    return found


def _ray(text: str) -> object:
    r = read_nodes(text, "capture")
    if not r.reachable:
        raise ValueError(r.error)
    return r


def _startup(text: str) -> object:
    p = logscan.scan(text)
    if not p.milestone:
        raise ValueError("no step of vLLM's startup recognised")
    return p


def _nccl(text: str) -> object:
    found = logscan.transports(text)
    if not found:
        raise ValueError("no rank's transport recognised")
    return found


FORMATS = {
    "nvidia-smi": Format("nvidia-smi.xml", "adapters.nvidia.parse_smi_xml", _nvidia),
    "host-facts": Format("host-facts.txt", "adapters.sysfs.parse_host_facts", parse_host_facts),
    "ip-addr": Format("ip-addr.txt", "judge.preflight.parse_ip_addr", _ip),
    "meminfo": Format("meminfo.txt", "adapters.nvidia.parse_meminfo", parse_meminfo),
    "vllm-startup": Format("vllm-startup.log", "judge.logscan.scan", _startup),
    "nccl": Format("nccl.log", "judge.logscan.transports", _nccl),
    "ray-nodes": Format("ray-nodes.json", "adapters.ray.read_nodes", _ray),
}


@dataclass(frozen=True)
class Captured:
    """One output as the parser reads it (``data``: its text's bytes, at most MAX_BYTES), or why it is not."""

    node: str
    format: str
    command: tuple[str, ...]  # what ran on the node (a script named, not inlined)
    rc: int | None  # None: it did not run to its end (``error`` says why)
    at: float  # when it was read (UTC seconds)
    data: bytes = b""
    truncated: bool = False
    deployment: str = ""  # the serve log's and Ray's: whose
    error: str = ""


def _shown(argv: list[str]) -> tuple[str, ...]:
    """An argv for the manifest: a fixed script is named by what it is, not copied in whole."""
    names = {commands.HOST_FACTS: "<specs/scripts/host-facts.sh>", CAPTURE_LOG: "<specs/scripts/capture-log.sh>",
             commands.RAY_NODES: "<specs/scripts/ray-nodes.sh>", commands.RAY_NODES_PY: "<specs/scripts/ray-nodes.py>"}
    return tuple(names.get(a, a) for a in argv)


def _bounded(text: str) -> tuple[bytes, bool]:
    raw = text.encode()
    return raw[:MAX_BYTES], len(raw) > MAX_BYTES


def _run(shell: NodeShell, node: str, fmt: str, argv: list[str], deployment: str = "") -> Captured:
    at = time.time()
    try:
        r = shell.run(argv)
    except AdapterError as e:
        return Captured(node, fmt, _shown(argv), None, at, deployment=deployment, error=str(e))
    data, cut = _bounded(r.out)
    return Captured(node, fmt, _shown(argv), r.rc, at, data, cut, deployment,
                    "" if r.rc == 0 else (r.err.strip() or f"exit {r.rc}")[-200:])


def host(cfg: Config, node: Node) -> list[Captured]:
    """The host probes of a full observation, each run alone with the observation's argv."""
    shell = servelogs._shell(cfg, node)
    return [_run(shell, node.name, fmt, argv) for fmt, argv in (
        ("nvidia-smi", [*node.nvidia_smi, "-q", "-x"]), ("host-facts", commands.host_facts(node)),
        ("ip-addr", list(node.ip)), ("meminfo", list(node.meminfo)))]


def serve_log(view: DeploymentView, node: Node) -> list[Captured]:
    """The start of the current launch's log on ``node`` and its NCCL lines (the lines logscan reads)."""
    cfg, dep, at = view.cfg, view.dep, time.time()
    directory = commands.serve_log_dir(dep, node)
    wanted = (("vllm-startup", "head", STARTUP_BYTES), ("nccl", "nccl", NCCL_LINES))
    try:
        if not directory:
            raise servelogs.Problem("log_host_dir is \"\": the serve's log is kept in the container only")
        shell = servelogs._shell(cfg, node)
        names = servelogs._list(shell, directory, node.name)
        launch = servelogs.pick(servelogs.launches(names, node.name))
        if launch is None:
            raise servelogs.Problem(f"no launch of the serve logged on {node.name} in {directory}")
        files = servelogs.parts(launch, names)
    except servelogs.Problem as e:
        return [Captured(node.name, fmt, (), None, at, deployment=dep.name, error=str(e)) for fmt, _, _ in wanted]
    return [_run(shell, node.name, fmt, ["sh", "-c", CAPTURE_LOG, "spark-capture", directory, mode, str(n),
                                         str(NCCL_LINE_BYTES), *files], dep.name) for fmt, mode, n in wanted]


def ray_nodes(view: DeploymentView) -> Captured:
    """Ray's node table as the daemon reads it: the dashboard's answer, else the GCS's line in the head container."""
    dep, head, at = view.dep, view.serve_node, time.time()
    timeout = view.cfg.supervisor.io_timeout
    url = f"{view.dashboard.rstrip('/')}/api/v0/nodes?limit=100"
    try:
        with httpx.Client(trust_env=False) as http:
            r = http.get(url, timeout=timeout)
        if r.status_code == 200:
            data, cut = _bounded(r.text)
            return Captured(head.name, "ray-nodes", ("GET", url), 0, at, data, cut, dep.name)
        why = f"the dashboard answered {r.status_code}"
    except httpx.HTTPError as e:
        why = f"the dashboard: {type(e).__name__}"
    argv = commands.ray_nodes(dep, view.gcs, view.deadlines.ray_gcs.seconds)
    engine = DockerEngine(head.name, head.docker, timeout=view.deadlines.docker.seconds)
    try:
        code, out = engine.exec(identity.node_container_name(dep, head), argv, what="ray nodes")
    except AdapterError as e:
        return Captured(head.name, "ray-nodes", _shown(argv), None, at, deployment=dep.name, error=f"{why}; {e}")
    finally:
        engine.close()
    data, cut = _bounded(out.strip().splitlines()[-1] if out.strip() else "")  # the line the daemon parses
    return Captured(head.name, "ray-nodes", ("docker", "exec", "<head container>", *_shown(argv)), code, at, data, cut,
                    dep.name, "" if code == 0 else f"{why}; exit {code}")


def capture(cfg: Config) -> list[Captured]:
    """Every format from every node, nodes in parallel: each node's host probes, each deployment's serve logs
    (on each node that runs a rank of it) and, for a Ray deployment, Ray's node table."""
    jobs: list[Callable[[], list[Captured]]] = [functools.partial(host, cfg, n) for n in cfg.nodes]
    for view in views(cfg).values():
        jobs += [functools.partial(serve_log, view, n) for n in view.serve_nodes]
        if view.dep.uses_ray:
            jobs.append(functools.partial(lambda v: [ray_nodes(v)], view))
    with cf.ThreadPoolExecutor(max_workers=min(16, len(jobs)), thread_name_prefix="capture") as pool:
        return [c for f in [pool.submit(j) for j in jobs] for c in f.result()]


def manifest_entry(c: Captured, name: str) -> dict[str, object]:
    """The manifest's line for one file (before redaction: report/record/capture.py redacts it with the file)."""
    return {"file": name, "node": c.node, "deployment": c.deployment, "format": c.format,
            "parser": FORMATS[c.format].parser, "command": list(c.command), "exit_code": c.rc,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.at)), "bytes": len(c.data),
            "truncated": c.truncated, "error": c.error}


def read_back(fmt: str, data: bytes) -> object:
    """A captured file through the parser the daemon reads it with (the contract a fixture is held to)."""
    return FORMATS[fmt].read(data.decode("utf-8", errors="backslashreplace"))

