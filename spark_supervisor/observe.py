"""Read the world through the adapters, nodes in parallel, every call bounded. No decisions here."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

import httpx

from . import commands
from .adapters import AdapterError, Unreachable
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
    Gpu,
    Memory,
    NodeObservation,
    Observation,
    RayObservation,
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
        head = cfg.serve_node(dep)
        self.ray = RayDashboard(self.http, f"http://{head.fabric_ip}:{dep.ray.dashboard_port}", sup.io_timeout)
        self.api = VllmApi(self.http, cfg.endpoint(dep), api_key=dep.api_key,
                           timeout=min(sup.io_timeout, 5))
        self.pool = cf.ThreadPoolExecutor(max_workers=len(cfg.nodes) + 2, thread_name_prefix="observe")
        self.probes = cf.ThreadPoolExecutor(max_workers=4 * len(cfg.nodes), thread_name_prefix="probe")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.probes.shutdown(wait=False, cancel_futures=True)
        self.http.close()
        for a in self.nodes.values():
            a.docker.reset()

    def head(self) -> NodeAdapters:
        """The node the serve runs on."""
        return self.nodes[self.cfg.serve_node(self.cfg.deployment).name]


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


def _nvidia(a: NodeAdapters) -> Gpu:
    r = a.shell.run([*a.node.nvidia_smi, "-q", "-x"])
    if r.rc != 0:
        raise AdapterError("NvidiaSmiFailed", (r.err.strip() or r.out.strip() or f"exit {r.rc}")[-200:])
    return parse_smi_xml(r.out)


def _meminfo(a: NodeAdapters) -> Memory:
    r = a.shell.run(a.node.meminfo)
    if r.rc != 0:
        raise AdapterError("MeminfoFailed", f"exit {r.rc}")
    return parse_meminfo(r.out)


def _interfaces(a: NodeAdapters) -> dict[str, tuple[str, ...]]:
    r = a.shell.run(a.node.ip)
    if r.rc != 0:
        raise AdapterError("IpFailed", f"exit {r.rc}")
    return parse_ip_addr(r.out)


def observe_node(a: NodeAdapters, cfg: Config, full: bool, probes: cf.Executor | None = None) -> NodeObservation:
    """Containers every tick; on a full observation also units, GPU, memory and interfaces, read in
    parallel with the Docker calls (on a worker each is an SSH round trip)."""
    name = a.node.name
    pending: dict[str, cf.Future[Any]] = {}
    if full and probes is not None:
        if cfg.stale.units:
            pending["units"] = probes.submit(_units, a, cfg.stale.units)
        pending["nvidia-smi"] = probes.submit(_nvidia, a)
        pending["meminfo"] = probes.submit(_meminfo, a)
        pending["ip"] = probes.submit(_interfaces, a)
    try:
        if a.node.remote and not a.docker.connected:
            a.shell.reachable()  # fail fast on a dead host before docker-py's SSH transport hangs on it
        containers = tuple(a.docker.containers())
    except AdapterError as e:
        return NodeObservation(name, error=str(e))
    if not full:
        return NodeObservation(name, containers=containers)
    errors: list[str] = []
    try:  # the engine's version goes through containerd too: failing, it is a probe's problem, not the node's
        version = a.docker.version()
    except AdapterError as e:
        version = ""
        errors.append(f"docker version: {e}")
    got: dict[str, Any] = {"units": None if cfg.stale.units else ()}
    for what, fut in pending.items():
        try:
            got[what] = fut.result(timeout=cfg.supervisor.io_timeout + cfg.supervisor.ssh_connect_timeout)
        except Unreachable as e:
            return NodeObservation(name, error=str(e))
        except AdapterError as e:
            errors.append(f"{what}: {e}")
        except cf.TimeoutError:
            errors.append(f"{what}: no answer")
    return NodeObservation(name, containers=containers, docker_version=version, units=got.get("units"),
                           gpu=got.get("nvidia-smi"), memory=got.get("meminfo"), interfaces=got.get("ip"),
                           probe_errors=tuple(errors))


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
    """None: no running head container to look in. Raises AdapterError when the exec fails: unknown."""
    if head_container is None or not head_container.running:
        return None
    dep = world.cfg.deployment
    code, out = world.head().docker.exec(head_container.name, commands.serve_state(dep), what="serve state")
    if code == 3:
        return ServeObservation(False)
    if code != 0:
        raise AdapterError("ServeStateFailed", f"the serve-state script exited {code}: {out.strip()[-200:]}")
    serve = parse_serve_state(out, head_container.id)
    key = dep.api_key
    if key and key in serve.log_tail:  # vLLM echoes its arguments and environment in some versions
        serve = dataclasses.replace(serve, log_tail=serve.log_tail.replace(key, "[redacted]"))
    return serve


class Observer:
    def __init__(self, world: World, clock: Callable[[], float] = time.monotonic):
        self.world, self.clock = world, clock
        self._serve: ServeObservation | None = None
        self._endpoint: EndpointObservation | None = None

    def _serve_and_endpoint(self, head_c: Container | None, full: bool, node_error: str) -> tuple[
            ServeObservation | None, EndpointObservation | None]:
        w = self.world
        last, ep_last = self._serve, self._endpoint
        if node_error:  # the serve's node could not be seen: its serve is unknown, not gone
            return (dataclasses.replace(last or ServeObservation(False), error=f"its node: {node_error}"),
                    w.api.observe())
        if (not full and last is not None and last.running and head_c is not None and head_c.running
                and head_c.id == last.container_id and ep_last is not None and ep_last.state == "up"):
            # Watching a healthy serve: /health 200 proves the same process still listens, so skip the
            # exec into the container and the model list until the next full observation.
            health = w.api.observe_health()
            if health.state == "up" and health.health == 200:
                return last, EndpointObservation("up", "", 200, ep_last.models)
        try:
            serve = observe_serve(w, head_c)
        except AdapterError as e:
            # Could not look: carry the last state seen, marked unknown; never read as "no serve".
            seen = last if last is not None and head_c is not None and last.container_id == head_c.id else None
            serve = dataclasses.replace(seen or ServeObservation(False), error=str(e))
        endpoint = w.api.observe() if serve is not None and (serve.running or serve.error) else None
        if endpoint is None and serve is not None:
            endpoint = EndpointObservation("unknown")
        if serve is None or not serve.error:
            self._serve = serve
        self._endpoint = endpoint
        return serve, endpoint

    def observe(self, full: bool) -> Observation:
        w, cfg = self.world, self.world.cfg
        timeout = cfg.supervisor.io_timeout + cfg.supervisor.ssh_connect_timeout + 5
        futures = {name: w.pool.submit(observe_node, a, cfg, full, w.probes) for name, a in w.nodes.items()}
        ray_f = w.pool.submit(w.ray.observe) if cfg.deployment.uses_ray else None
        nodes: dict[str, NodeObservation] = {}
        for name, f in futures.items():
            try:
                nodes[name] = f.result(timeout=timeout)
            except cf.TimeoutError:
                nodes[name] = NodeObservation(name, error=f"ObserveTimeout: no answer within {timeout:.0f}s")
        try:
            ray = ray_f.result(timeout=timeout) if ray_f is not None else None
        except cf.TimeoutError:
            ray = RayObservation(False, f"RayDashboardUnreachable: no answer within {timeout:.0f}s")
        dep = cfg.deployment
        home = cfg.serve_node(dep)
        head_name = commands.node_container_name(dep, home)
        head_c = next((c for c in nodes[home.name].containers if c.name == head_name), None)
        serve, endpoint = self._serve_and_endpoint(head_c, full, nodes[home.name].error)
        return Observation(self.clock(), full, nodes, ray, serve, endpoint)
