"""Read the world through the adapters, nodes in parallel, every call bounded. No decisions here."""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from . import commands
from .adapters import AdapterError
from .adapters.docker import DockerEngine
from .adapters.nvidia import parse_meminfo, parse_smi_xml
from .adapters.ray import RayDashboard
from .adapters.shell import NodeShell
from .adapters.vllm import VllmApi
from .config import Config, Node
from .preflight import parse_ip_addr
from .model import (
    Container,
    EndpointObservation,
    NodeObservation,
    Observation,
    ServeObservation,
    Unit,
)


@dataclass
class NodeAdapters:
    node: Node
    shell: NodeShell
    docker: DockerEngine


class World:
    """The real adapters for one config (rebuilt on reload)."""

    def __init__(self, cfg: Config, control_dir: str = ""):
        sup = cfg.supervisor
        dep = cfg.deployment
        docker_timeout = max(sup.io_timeout, dep.serve.stop_timeout + 15)
        self.cfg = cfg
        self.nodes = {
            n.name: NodeAdapters(n, NodeShell(n.name, n.ssh, timeout=sup.io_timeout,
                                              connect_timeout=sup.ssh_connect_timeout, control_dir=control_dir),
                                 DockerEngine(n.name, n.docker, timeout=docker_timeout))
            for n in cfg.nodes
        }
        self.http = httpx.Client(trust_env=False)
        head = cfg.head
        self.ray = RayDashboard(self.http, f"http://{head.fabric_ip}:{dep.ray.dashboard_port}", sup.io_timeout)
        self.api = VllmApi(self.http, cfg.endpoint(dep), api_key=dep.readiness.api_key,
                           timeout=min(sup.io_timeout, 5))
        self.pool = cf.ThreadPoolExecutor(max_workers=len(cfg.nodes) + 2, thread_name_prefix="observe")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        for a in self.nodes.values():
            a.docker.reset()

    def head(self) -> NodeAdapters:
        return self.nodes[self.cfg.head.name]


def _units(a: NodeAdapters, names: list[str]) -> tuple[Unit, ...]:
    r = a.shell.run(commands.systemctl_show(names))
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


def observe_node(a: NodeAdapters, cfg: Config, full: bool) -> NodeObservation:
    name = a.node.name
    try:
        if a.node.remote and not a.docker.connected:
            a.shell.check()  # fail fast on a dead host before docker-py's SSH transport hangs on it
        containers = tuple(a.docker.containers())
        version = a.docker.version() if full else ""
    except AdapterError as e:
        return NodeObservation(name, error=str(e))
    if not full:
        return NodeObservation(name, containers=containers)
    errors: list[str] = []
    units = gpu = memory = None
    try:
        units = _units(a, cfg.stale.units) if cfg.stale.units else ()
    except AdapterError as e:
        if e.reason == "SshUnreachable":
            return NodeObservation(name, error=str(e))
        errors.append(f"units: {e}")
    try:
        r = a.shell.run([*a.node.nvidia_smi, "-q", "-x"])
        if r.rc != 0:
            raise AdapterError("NvidiaSmiFailed", (r.err.strip() or r.out.strip() or f"exit {r.rc}")[-200:])
        gpu = parse_smi_xml(r.out)
    except AdapterError as e:
        errors.append(f"nvidia-smi: {e}")
    try:
        r = a.shell.run(a.node.meminfo)
        memory = parse_meminfo(r.out) if r.rc == 0 else None
    except AdapterError as e:
        errors.append(f"meminfo: {e}")
    interfaces = None
    try:
        r = a.shell.run(a.node.ip)
        if r.rc == 0:
            interfaces = parse_ip_addr(r.out)
        else:
            errors.append(f"ip: exit {r.rc}")
    except AdapterError as e:
        errors.append(f"ip: {e}")
    return NodeObservation(name, containers=containers, docker_version=version, units=units, gpu=gpu,
                           memory=memory, interfaces=interfaces, probe_errors=tuple(errors))


def parse_serve_state(out: str, container_id: str = "") -> ServeObservation:
    head, _, tail = out.partition("\n")
    parts = head.split()
    if len(parts) < 2 or parts[0] == "0":
        return ServeObservation(False, log_tail=tail)
    pid, spec = int(parts[0]), parts[1]
    started = parts[2] if len(parts) > 2 else ""
    running = len(parts) > 3 and parts[3] == "1"
    code = int(parts[4]) if len(parts) > 4 and parts[4].lstrip("-").isdigit() else None
    return ServeObservation(True, pid, container_id, running, code, spec, started, tail)


def observe_serve(world: World, head_container: Container | None) -> ServeObservation | None:
    if head_container is None or not head_container.running:
        return None
    dep = world.cfg.deployment
    try:
        code, out = world.head().docker.exec(head_container.name, commands.serve_state(dep))
    except AdapterError:
        return None
    if code == 3:
        return ServeObservation(False)
    return parse_serve_state(out, head_container.id)


class Observer:
    def __init__(self, world: World, clock: Callable[[], float] = time.monotonic):
        self.world, self.clock = world, clock

    def observe(self, full: bool) -> Observation:
        w, cfg = self.world, self.world.cfg
        timeout = cfg.supervisor.io_timeout + cfg.supervisor.ssh_connect_timeout + 5
        futures = {name: w.pool.submit(observe_node, a, cfg, full) for name, a in w.nodes.items()}
        ray_f = w.pool.submit(w.ray.observe)
        nodes: dict[str, NodeObservation] = {}
        for name, f in futures.items():
            try:
                nodes[name] = f.result(timeout=timeout)
            except cf.TimeoutError:
                nodes[name] = NodeObservation(name, error=f"ObserveTimeout: no answer within {timeout:.0f}s")
        try:
            ray = ray_f.result(timeout=timeout)
        except cf.TimeoutError:
            ray = None
        dep = cfg.deployment
        head_name = commands.ray_container_name(dep, cfg.head)
        head_c = next((c for c in nodes[cfg.head.name].containers if c.name == head_name), None)
        serve = observe_serve(w, head_c)
        endpoint = w.api.observe() if serve is not None and serve.running else None
        if endpoint is None and serve is not None:
            endpoint = EndpointObservation("unknown")
        return Observation(self.clock(), full, nodes, ray, serve, endpoint)
