import httpx

from spark_supervisor.metrics import Metrics, NoMetrics
from spark_supervisor.model import Reason, Phase, Status, Verdict
from tests.helpers import cfg, obs


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
