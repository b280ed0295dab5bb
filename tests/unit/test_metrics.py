import ast
import inspect
import math
import socket
from pathlib import Path

import httpx
import pytest

import spark_supervisor
from spark_supervisor.config import Config
from spark_supervisor.model import (
    Gid,
    HostFacts,
    Link,
    NodeObservation,
    Phase,
    RayObservation,
    RdmaPort,
    Reason,
    Status,
    Transport,
    Verdict,
)
from spark_supervisor.report.metrics import Metrics, NoMetrics
from tests.fakes import make
from tests.helpers import cfg, counted, data, node_obs, obs, ray_container, view_of


def test_prometheus_endpoint_reports_phase_progress_ray_and_repairs() -> None:
    m = Metrics("127.0.0.1", 0)
    try:
        st = Status()
        st.advance(Phase.LOADING, Reason(), 10.0, 1.0)
        st.load_fraction, st.eta_s = 0.25, 480.0
        c = cfg()
        qm = m.bound("qwen")
        qm.update(st, obs(c, deployed=True), 70.0)
        qm.repaired("gang", "RayNodeLost")
        qm.probed("deep", "success", Verdict(True, "ok", latency_s=0.8))
        qm.ready_after(912.5)
        m.bound("embed").update(Status(), None, 70.0)  # another deployment: its own series
        port = m.server.server_address[1]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        m.close()
    q = 'deployment="qwen"'
    for line in (f'spark_supervisor_phase{{{q},phase="LOADING"}} 1.0', f'spark_supervisor_phase{{{q},phase="SERVING"}} 0.0',
                 f"spark_supervisor_phase_seconds{{{q}}} 60.0", f"spark_supervisor_load_progress_ratio{{{q}}} 0.25",
                 f"spark_supervisor_load_eta_seconds{{{q}}} 480.0", f"spark_supervisor_ray_nodes_alive{{{q}}} 2.0",
                 f"spark_supervisor_ray_gpus{{{q}}} 2.0", f"spark_supervisor_time_to_ready_seconds{{{q}}} 912.5",
                 f'spark_supervisor_repairs_total{{{q},kind="gang",reason="RayNodeLost"}} 1.0',
                 f'spark_supervisor_probe_results_total{{{q},probe="deep",result="success"}} 1.0',
                 f'spark_supervisor_probe_latency_seconds{{{q},probe="deep"}} 0.8',
                 'spark_supervisor_phase{deployment="embed",phase="DETECTING"} 1.0'):
        assert line in text, line


def test_metrics_off_costs_nothing() -> None:
    NoMetrics().bound("x").update(Status(), None, 0.0)
    NoMetrics().close()


def test_alert_rule_inputs_limits_stall_nodes_unknowns_and_alerts_sent() -> None:
    """The series monitoring/prometheus-rules.yml reads: the budget and the stall timeout beside what is
    measured against them, per-node reachability, how long something has gone unseen, alerts sent."""
    m = Metrics("127.0.0.1", 0)
    try:
        c = cfg()
        st = Status()
        st.advance(Phase.LOADING, Reason("LoadingModel"), 10.0, 1.0)
        st.load_progress_at, st.repairs_in_window = 40.0, 2
        st.unknown_since = {"ray dashboard": 50.0}
        down = {"spark-1": node_obs("spark-1", (ray_container(c, "spark-1"),)),
                "spark-2": NodeObservation("spark-2", error="SshUnreachable: timed out")}
        q = m.bound("qwen")
        q.update(st, obs(c, deployed=True, nodes=down, ray=RayObservation(False, "RayDashboardUnreachable")), 100.0, view_of(c))
        q.alerted("failed", "webhook", False)
        q.alerted("failed", "command", True)
        v = m.registry.get_sample_value
        d = {"deployment": "qwen"}
        assert v("spark_supervisor_repair_budget_used", d) == 2 and v("spark_supervisor_repair_budget", d) == 3
        assert v("spark_supervisor_repair_window_seconds", d) == 6 * 3600
        assert v("spark_supervisor_load_stalled_seconds", d) == 60.0
        assert v("spark_supervisor_load_stall_timeout_seconds", d) == 900
        assert v("spark_supervisor_node_up", {**d, "node": "spark-1"}) == 1
        assert v("spark_supervisor_node_up", {**d, "node": "spark-2"}) == 0
        assert v("spark_supervisor_ray_nodes_expected", d) == 2
        alive = v("spark_supervisor_ray_nodes_alive", d)
        assert alive is not None and math.isnan(alive)  # not answered: unknown, so no rule compares true
        assert v("spark_supervisor_observation_unknown_seconds", {**d, "what": "ray dashboard"}) == 50.0
        assert v("spark_supervisor_phase_reason_info", {**d, "phase": "LOADING", "reason": "LoadingModel"}) == 1
        assert v("spark_supervisor_alerts_total", {**d, "event": "failed", "via": "webhook", "result": "failed"}) == 1
        assert v("spark_supervisor_alerts_total", {**d, "event": "failed", "via": "command", "result": "ok"}) == 1

        # Seen again, the load moving, then FAILED: the unknown series drops to 0 (its alert ends), a stall is
        # counted only while LOADING, the reason follows the phase, and no head container means 0 Ray nodes.
        st.unknown_since = {}
        st.advance(Phase.FAILED, Reason("ModelMissing", "no shards"), 120.0, 2.0)
        q.update(st, obs(c, deployed=True, ray=RayObservation(False, "RayHeadNotRunning")), 130.0, view_of(c))
        assert v("spark_supervisor_observation_unknown_seconds", {**d, "what": "ray dashboard"}) == 0
        assert v("spark_supervisor_load_stalled_seconds", d) == 0
        assert v("spark_supervisor_phase", {**d, "phase": "FAILED"}) == 1
        assert v("spark_supervisor_phase_reason_info", {**d, "phase": "FAILED", "reason": "ModelMissing"}) == 1
        assert v("spark_supervisor_phase_reason_info", {**d, "phase": "LOADING", "reason": "LoadingModel"}) is None
        assert v("spark_supervisor_ray_nodes_alive", d) == 0
        assert v("spark_supervisor_node_up", {**d, "node": "spark-2"}) == 1

        # Reloaded with spark-2 no longer one of its nodes: its series goes, not stays at its last value.
        alone = cfg(data(deployments=[{"name": "qwen", "nodes": ["spark-1"], "serve": {"model": "m"}}]))
        q.update(st, obs(alone, deployed=True), 140.0, view_of(alone))
        assert v("spark_supervisor_node_up", {**d, "node": "spark-2"}) is None
        assert v("spark_supervisor_node_up", {**d, "node": "spark-1"}) == 1
    finally:
        m.close()


def test_every_phase_has_a_series_paused_included() -> None:
    m = Metrics("127.0.0.1", 0)
    try:
        st = Status()
        st.advance(Phase.PAUSED, Reason("Paused", "by ops"), 1.0, 1.0)
        m.bound("qwen").update(st, None, 2.0)
        values = {p: m.registry.get_sample_value("spark_supervisor_phase", {"deployment": "qwen", "phase": p.value})
                  for p in Phase}
    finally:
        m.close()
    assert values == {p: 1.0 if p == Phase.PAUSED else 0.0 for p in Phase}


def test_metrics_off_takes_the_alert_call() -> None:
    NoMetrics().bound("x").alerted("failed", "webhook", True)


def test_metrics_off_refuses_what_metrics_on_would_refuse() -> None:
    """Off, a misspelt method or arguments Metrics' method does not take fail as they do with metrics on."""
    off = NoMetrics()
    off.state_write_failed("status")
    off.bound("x").probed("health", "failed")
    with pytest.raises(AttributeError, match="repaird"):
        off.bound("x").repaird("gang", "RayNodeLost")
    with pytest.raises(AttributeError, match="state_write_faild"):
        off.state_write_faild("status")
    with pytest.raises(AttributeError):
        off.registry  # noqa: B018  (an attribute of a Metrics instance, not a call)
    with pytest.raises(TypeError):
        off.bound("x").repaired("gang")  # the reason's kind missing
    with pytest.raises(TypeError):
        off.bound("x").ready_after(seconds=1.0, late=True)


# ------------------------------------------------------------------------------------- below vLLM
FABRIC_IF = "enp1s0f1np1"  # the helpers' nodes[].fabric_interface


def host(ip: str, *, operstate: str = "up", mtu: int | None = 9000, speed: int | None = 200_000,
         state: str = "ACTIVE", rate: float | None = 200.0, roce_v2_at: int | None = 3) -> HostFacts:
    """A member's reading: its fabric link, one RDMA port whose GID table holds ``ip`` (as RoCE v2 at
    ``roce_v2_at``, or as RoCE v1 only when None), and a link and port that are not the fabric's."""
    gids: tuple[Gid, ...] = (Gid(2, "fe80", "", "RoCE v2", FABRIC_IF), Gid(1, "v1", ip, "IB/RoCE v1", FABRIC_IF))
    if roce_v2_at is not None:
        gids += (Gid(roce_v2_at, "v2", ip, "RoCE v2", FABRIC_IF),)
    return HostFacts("boot", "machine", (Link("lo", "unknown", 65536), Link(FABRIC_IF, operstate, mtu, speed),
                                         Link("enP7s7", "down", 1500, None)),
                     (RdmaPort("rocep1s0f1", 1, state, rate, "28.45", gids),
                      RdmaPort("roceP2p1s0f0", 1, "DOWN", 200.0, "28.45", (Gid(0, "x", "10.0.0.9", "RoCE v2", "enP2"),))))


def fabric_cfg(nodes: tuple[str, ...] = ("spark-1", "spark-2")) -> Config:
    return cfg(data(deployments=[{"name": "qwen", "nodes": list(nodes),
                                  "serve": {"model": "m", "tensor_parallel_size": len(nodes)},
                                  "ray": {"env": {"NCCL_IB_GID_INDEX": "3"}}, "fabric": {"min_rate_gbps": 100}}]))


def samples(m: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every series of one gauge: its labels (sorted) -> its value."""
    family = next(f for f in m.registry.collect() if f.name == name)
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def series(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"deployment": "qwen", **labels}.items()))


IP1, IP2 = "192.168.200.12", "192.168.200.13"  # the helpers' nodes[].fabric_ip


def test_fabric_gpu_and_nccl_series_per_member_and_rank() -> None:
    """Each member's fabric link and RDMA port (not the other links and ports of the host), the GID index of
    its fabric IPv4 as RoCE v2 (-1: none), GPU access, the fabric problems found, and NCCL's transport per rank."""
    m = Metrics("127.0.0.1", 0)
    try:
        c = fabric_cfg()
        st = Status()
        st.hosts = {"spark-1": host(IP1),
                    "spark-2": host(IP2, mtu=1500, speed=25_000, state="DOWN", rate=25.0, roce_v2_at=None)}
        st.gpu_lost = {"spark-2": "Unable to determine the device handle for GPU0: Unknown Error"}
        st.transports = (Transport(0, IP1, "IB", "NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]"),
                         Transport(1, IP1, "Socket", "NET/Socket : Using [0]enp1s0f1np1:192.168.200.12<0>"),
                         Transport(None, "10.9.9.9", "Socket"))
        m.bound("qwen").update(st, obs(c, deployed=True), 100.0, view_of(c))
        port = m.server.server_address[1]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        link1, link2 = {"node": "spark-1", "interface": FABRIC_IF}, {"node": "spark-2", "interface": FABRIC_IF}
        port1 = {"node": "spark-1", "device": "rocep1s0f1", "port": "1"}
        port2 = {"node": "spark-2", "device": "rocep1s0f1", "port": "1"}
        assert samples(m, "spark_supervisor_fabric_link_up") == {series(**link1): 1, series(**link2): 1}
        assert samples(m, "spark_supervisor_fabric_mtu_bytes") == {series(**link1): 9000, series(**link2): 1500}
        assert samples(m, "spark_supervisor_fabric_speed_gbps") == {series(**link1): 200, series(**link2): 25}
        assert samples(m, "spark_supervisor_rdma_port_active") == {series(**port1): 1, series(**port2): 0}
        assert samples(m, "spark_supervisor_rdma_port_rate_gbps") == {series(**port1): 200, series(**port2): 25}
        assert samples(m, "spark_supervisor_rdma_gid_index") == {series(**port1): 3, series(**port2): -1}
        assert samples(m, "spark_supervisor_gpu_access_lost") == {series(node="spark-1"): 0,
                                                                  series(node="spark-2"): 1}
        assert samples(m, "spark_supervisor_fabric_problem") == {
            series(kind=k): 1 for k in ("FabricLinkDown", "FabricMtuMismatch", "GidIndexMoved", "FabricDegraded",
                                        "FabricFallback")}
        assert samples(m, "spark_supervisor_nccl_transport") == {
            series(rank="0", node="spark-1", transport="IB"): 1, series(rank="1", node="spark-1", transport="Socket"): 1,
            series(rank="?", node="", transport="Socket"): 1}
        assert ('spark_supervisor_fabric_link_up{deployment="qwen",interface="enp1s0f1np1",node="spark-2"} 1.0'
                in text)  # as Prometheus scrapes it
    finally:
        m.close()


def test_operstate_unknown_is_up_and_what_was_not_read_has_no_series() -> None:
    """"unknown" (a driver that does not say) is not down, so up; an operstate, speed or rate not read gives no
    series (unknown is not up, nor 0 Gb/s)."""
    m = Metrics("127.0.0.1", 0)
    try:
        c = fabric_cfg()
        st = Status()
        st.hosts = {"spark-1": host(IP1, operstate="unknown"),
                    "spark-2": host(IP2, operstate="", speed=None, state="", rate=None, mtu=None)}
        m.bound("qwen").update(st, None, 100.0, view_of(c))
        assert samples(m, "spark_supervisor_fabric_link_up") == {series(node="spark-1", interface=FABRIC_IF): 1}
        assert samples(m, "spark_supervisor_fabric_speed_gbps") == {series(node="spark-1", interface=FABRIC_IF): 200}
        assert samples(m, "spark_supervisor_fabric_mtu_bytes") == {series(node="spark-1", interface=FABRIC_IF): 9000}
        one = {"node": "spark-1", "device": "rocep1s0f1", "port": "1"}
        assert samples(m, "spark_supervisor_rdma_port_active") == {series(**one): 1}
        assert samples(m, "spark_supervisor_rdma_port_rate_gbps") == {series(**one): 200}
        assert samples(m, "spark_supervisor_fabric_problem") == {}
    finally:
        m.close()


def test_stale_fabric_series_go_a_member_not_read_leaves_none_and_a_reload_drops_a_node() -> None:
    m = Metrics("127.0.0.1", 0)
    try:
        c = fabric_cfg()
        st = Status()
        st.hosts = {"spark-1": host(IP1), "spark-2": host(IP2, mtu=1500)}
        st.gpu_lost = {"spark-2": "Unknown Error"}
        st.transports = (Transport(0, IP1, "IB"), Transport(1, IP2, "IB"))
        q = m.bound("qwen")
        q.update(st, None, 100.0, view_of(c))
        m.bound("embed").update(Status(hosts={"spark-1": host(IP1)}), None, 100.0, view_of(cfg()))  # its own series
        assert samples(m, "spark_supervisor_fabric_problem") == {series(kind="FabricMtuMismatch"): 1}
        assert len(samples(m, "spark_supervisor_fabric_link_up")) == 3

        # spark-2's reading failed (absent from hosts): its series go, none stays saying up; its GPU is still
        # a member's; with one member read, no mismatch is known; a new serve's ranks replace the old.
        st.hosts = {"spark-1": host(IP1)}
        st.gpu_lost = {}
        st.transports = (Transport(0, IP1, "Socket"),)
        q.update(st, None, 110.0, view_of(c))
        mine = {k: v for k, v in samples(m, "spark_supervisor_fabric_link_up").items() if ("deployment", "qwen") in k}
        assert mine == {series(node="spark-1", interface=FABRIC_IF): 1}
        for name in ("spark_supervisor_fabric_mtu_bytes", "spark_supervisor_fabric_speed_gbps",
                     "spark_supervisor_rdma_port_active", "spark_supervisor_rdma_port_rate_gbps",
                     "spark_supervisor_rdma_gid_index"):
            assert not [k for k in samples(m, name) if ("node", "spark-2") in k], name
        assert samples(m, "spark_supervisor_gpu_access_lost")[series(node="spark-2")] == 0
        assert samples(m, "spark_supervisor_fabric_problem") == {series(kind="FabricFallback"): 1}
        assert samples(m, "spark_supervisor_nccl_transport") == {series(rank="0", node="spark-1", transport="Socket"): 1}

        # Nothing known of the hosts or the ranks any more: no problem, no rank, no link left.
        q.update(Status(), None, 120.0, view_of(c))
        assert samples(m, "spark_supervisor_fabric_problem") == {}
        assert samples(m, "spark_supervisor_nccl_transport") == {}
        assert [k for k in samples(m, "spark_supervisor_fabric_link_up") if ("deployment", "qwen") in k] == []

        # Reloaded onto spark-1 alone: spark-2 is no member, so not even its GPU has a series.
        q.update(st, None, 130.0, view_of(fabric_cfg(("spark-1",))))
        assert [k for k in samples(m, "spark_supervisor_gpu_access_lost") if ("deployment", "qwen") in k] == [
            series(node="spark-1")]
        assert samples(m, "spark_supervisor_fabric_problem") == {}  # one member: no fabric between members
        assert ("embed" in str(samples(m, "spark_supervisor_fabric_link_up")))  # the other deployment's stay
    finally:
        m.close()


def test_fabric_series_are_recomputed_only_when_the_facts_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tick calls update: the same facts (the same objects, or equal ones) cost no judgment."""
    from spark_supervisor.judge import fabric
    judged = counted(monkeypatch, fabric, "problems")
    m = Metrics("127.0.0.1", 0)
    try:
        c = fabric_cfg()
        view = view_of(c)
        st = Status(hosts={"spark-1": host(IP1), "spark-2": host(IP2)})
        q = m.bound("qwen")
        for t in range(5):
            q.update(st, None, 100.0 + t, view)
        assert len(judged) == 1
        st.hosts = dict(st.hosts)  # another dict of the same facts
        q.update(st, None, 106.0, view)
        assert len(judged) == 1
        st.hosts = {**st.hosts, "spark-2": host(IP2, operstate="down")}
        q.update(st, None, 107.0, view)
        assert len(judged) == 2
        assert samples(m, "spark_supervisor_fabric_link_up")[series(node="spark-2", interface=FABRIC_IF)] == 0
        st.transports = (Transport(0, IP1, "IB"),)
        q.update(st, None, 108.0, view)
        assert len(judged) == 3
        q.update(st, None, 109.0, view_of(fabric_cfg()))  # an equal view (another object): the same
        assert len(judged) == 3
        q.update(st, None, 110.0, view_of(fabric_cfg(("spark-1",))))  # the same facts, another view: judged again
        assert len(judged) == 4
        assert [k for k in samples(m, "spark_supervisor_fabric_link_up")] == [series(node="spark-1", interface=FABRIC_IF)]
    finally:
        m.close()


def metrics_calls() -> list[tuple[str, int, ast.Call]]:
    """Every call on a metrics object in spark_supervisor, (module, line, call): `<x>.metrics.NAME(...)` and
    `<x>.metrics.bound(dep).NAME(...)` (`metrics` is the attribute the daemon and the reconcilers hold it in,
    and the parameter the reconcilers' trackers take it by)."""
    def is_metrics(node: ast.expr) -> bool:  # `x.metrics`, or a parameter `metrics` a tracker is handed
        return (isinstance(node, ast.Attribute) and node.attr == "metrics") or (
            isinstance(node, ast.Name) and node.id == "metrics")

    found = []
    for path in sorted(Path(spark_supervisor.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            on = node.func.value
            bound = (isinstance(on, ast.Call) and isinstance(on.func, ast.Attribute) and on.func.attr == "bound"
                     and is_metrics(on.func.value))
            if is_metrics(on) or bound:
                found.append((path.name, node.lineno, node))
    return found


def test_every_call_the_daemon_makes_on_its_metrics_is_a_metrics_method_and_fits_it() -> None:
    """The calls are checked against the real Metrics, not against NoMetrics or DeploymentMetrics (which
    take any name through __getattr__). A method whose first parameter is the deployment (`dep`) is called
    on a bound handle, which gives it; the others on Metrics itself."""
    calls = metrics_calls()
    for module, line, call in calls:
        assert isinstance(call.func, ast.Attribute)
        name = call.func.attr
        method = getattr(Metrics, name, None)
        assert not name.startswith("_") and callable(method), f"{module}:{line}: Metrics has no method {name}"
        per_deployment = list(inspect.signature(method).parameters)[1:2] == ["dep"]
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        given = [None] * (len(call.args) + (1 if per_deployment else 0))
        try:
            inspect.signature(method).bind(None, *given, **{k.arg: None for k in call.keywords if k.arg})
        except TypeError as e:
            raise AssertionError(f"{module}:{line}: {name}{inspect.signature(method)}: {e}") from None
    names = {call.func.attr for _, _, call in calls if isinstance(call.func, ast.Attribute)}
    assert {"bound", "close", "update", "repaired", "probed", "alerted", "state_write_failed"} <= names, names


def test_the_daemon_serves_the_series_the_alert_rules_read(tmp_path: Path) -> None:
    """Through the real daemon and reconciler (scripted observations): the limits come from the config, a
    peer that cannot be reached is node_up 0 on the endpoint Prometheus scrapes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = data(metrics={"listen": f"127.0.0.1:{port}"}, healing={"repair_budget": 5, "repair_window": 3600})
    daemon, be, _clock, _notes, _ = make(tmp_path, d)
    try:
        c = daemon.cfg
        be.next = obs(c, deployed=True, nodes={"spark-1": node_obs("spark-1", (ray_container(c, "spark-1"),)),
                                               "spark-2": NodeObservation("spark-2", error="SshUnreachable")})
        daemon.tick()
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        daemon.stack.metrics.close()
    q = 'deployment="qwen"'
    for line in (f"spark_supervisor_repair_budget{{{q}}} 5.0", f"spark_supervisor_repair_window_seconds{{{q}}} 3600.0",
                 f"spark_supervisor_load_stall_timeout_seconds{{{q}}} 900.0",
                 f"spark_supervisor_ray_nodes_expected{{{q}}} 2.0",
                 f'spark_supervisor_node_up{{{q},node="spark-1"}} 1.0',
                 f'spark_supervisor_node_up{{{q},node="spark-2"}} 0.0'):
        assert line in text, line


def test_idle_connections_past_the_caps_are_closed_and_a_scrape_from_elsewhere_answers() -> None:
    """Issue 42 (LOW): 16 idle connections from one local user blocked every scrape. Now one address holds at
    most PER_PEER slots, all at most MAX_CONNECTIONS, and an idle one is shut at its header deadline."""
    import threading
    import time

    from spark_supervisor.report.metrics import CappedServer
    from spark_testbed.testbed import until
    m = Metrics("0.0.0.0", 0)
    port = m.server.server_address[1]
    before = threading.active_count()
    held: list[socket.socket] = []

    def connect(source: str) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        held.append(s)
        return s
    try:
        mine = [connect("127.0.0.1") for _ in range(CappedServer.PER_PEER)]  # each holds a thread, no request
        until(lambda: threading.active_count() >= before + CappedServer.PER_PEER, 30, "their threads")
        assert connect("127.0.0.1").recv(1) == b""  # this address has its share: closed at once
        # another address scrapes while the first holds its share
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=5) as client:
            assert "spark_supervisor_phase" in client.get(f"http://127.0.0.1:{port}/metrics").text
        for i in range(1, CappedServer.MAX_CONNECTIONS // CappedServer.PER_PEER):  # every slot taken
            for _ in range(CappedServer.PER_PEER):
                connect(f"127.0.1.{i}")
        until(lambda: threading.active_count() >= before + CappedServer.MAX_CONNECTIONS, 30, "every slot held")
        assert connect("127.0.2.1").recv(1) == b""  # none left: closed at once
        t0 = time.monotonic()
        for s in mine:  # idle: shut at the header deadline, not held for the socket's timeout
            assert s.recv(1) == b""
        assert time.monotonic() - t0 < CappedServer.TIMEOUT_S
        for s in held:
            s.close()
        until(lambda: threading.active_count() <= before, 30, "their threads gone")
        assert "spark_supervisor_phase" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        for s in held:
            s.close()
        m.close()
