import math
import socket

import httpx

from spark_supervisor.metrics import Metrics, NoMetrics
from spark_supervisor.model import NodeObservation, Phase, RayObservation, Reason, Status, Verdict
from tests.helpers import cfg, data, node_obs, obs, ray_container
from tests.unit.test_daemon import make


def test_prometheus_endpoint_reports_phase_progress_ray_and_repairs() -> None:
    m = Metrics("127.0.0.1:0")
    try:
        st = Status()
        st.advance(Phase.LOADING, Reason(), 10.0, 1.0)
        st.load_fraction, st.eta_s = 0.25, 480.0
        c = cfg()
        q = m.bound("qwen")
        q.update(st, obs(c, deployed=True), 70.0)
        q.repaired("gang", "RayNodeLost")
        q.probed("deep", "success", Verdict(True, "ok", latency_s=0.8))
        q.ready_after(912.5)
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
    m = Metrics("127.0.0.1:0")
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
    m = Metrics("127.0.0.1:0")
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


def test_the_daemon_serves_the_series_the_alert_rules_read(tmp_path) -> None:
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
    m = Metrics("127.0.0.1:0")
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
