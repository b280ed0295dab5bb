import ast
import inspect
import math
import socket
from pathlib import Path

import httpx
import pytest

import spark_supervisor
from spark_supervisor.metrics import Metrics, NoMetrics
from spark_supervisor.model import NodeObservation, Phase, RayObservation, Reason, Status, Verdict
from tests.fakes import make
from tests.helpers import cfg, data, node_obs, obs, ray_container


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
        q.update(st, obs(c, deployed=True, nodes=down, ray=RayObservation(False, "RayDashboardUnreachable")), 100.0, c)
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
        q.update(st, obs(c, deployed=True, ray=RayObservation(False, "RayHeadNotRunning")), 130.0, c)
        assert v("spark_supervisor_observation_unknown_seconds", {**d, "what": "ray dashboard"}) == 0
        assert v("spark_supervisor_load_stalled_seconds", d) == 0
        assert v("spark_supervisor_phase", {**d, "phase": "FAILED"}) == 1
        assert v("spark_supervisor_phase_reason_info", {**d, "phase": "FAILED", "reason": "ModelMissing"}) == 1
        assert v("spark_supervisor_phase_reason_info", {**d, "phase": "LOADING", "reason": "LoadingModel"}) is None
        assert v("spark_supervisor_ray_nodes_alive", d) == 0
        assert v("spark_supervisor_node_up", {**d, "node": "spark-2"}) == 1

        # Reloaded with spark-2 no longer one of its nodes: its series goes, not stays at its last value.
        alone = cfg(data(deployments=[{"name": "qwen", "nodes": ["spark-1"], "serve": {"model": "m"}}]))
        q.update(st, obs(alone, deployed=True), 140.0, alone)
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


def test_idle_connections_past_the_cap_are_closed_and_a_scrape_answers_once_they_go() -> None:
    import threading

    from spark_supervisor.metrics import CappedServer
    from spark_testbed.testbed import until
    m = Metrics("127.0.0.1", 0)
    port = m.server.server_address[1]
    before = threading.active_count()
    idle = []
    try:
        for _ in range(CappedServer.MAX_CONNECTIONS):  # each holds a thread: connected, never a request
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            idle.append(s)
        until(lambda: threading.active_count() >= before + CappedServer.MAX_CONNECTIONS, 30, "their threads")
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert extra.recv(1) == b""  # closed at once: no thread for it
        extra.close()
        assert threading.active_count() <= before + CappedServer.MAX_CONNECTIONS
        for s in idle:
            s.close()
        until(lambda: threading.active_count() <= before, 30, "their threads gone")
        assert "spark_supervisor_phase" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        for s in idle:
            s.close()
        m.close()
