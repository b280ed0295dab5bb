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
        m.update(st, obs(c, deployed=True), 70.0)
        m.repaired("gang", "RayNodeLost")
        m.probed("deep", "success", Verdict(True, "ok", latency_s=0.8))
        m.ready_after(912.5)
        port = m.server.server_address[1]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        m.close()
    for line in ('spark_supervisor_phase{phase="LOADING"} 1.0', 'spark_supervisor_phase{phase="SERVING"} 0.0',
                 "spark_supervisor_phase_seconds 60.0", "spark_supervisor_load_progress_ratio 0.25",
                 "spark_supervisor_load_eta_seconds 480.0", "spark_supervisor_ray_nodes_alive 2.0",
                 "spark_supervisor_ray_gpus 2.0", "spark_supervisor_time_to_ready_seconds 912.5",
                 'spark_supervisor_repairs_total{kind="gang",reason="RayNodeLost"} 1.0',
                 'spark_supervisor_probe_results_total{probe="deep",result="success"} 1.0',
                 'spark_supervisor_probe_latency_seconds{probe="deep"} 0.8'):
        assert line in text, line


def test_metrics_off_costs_nothing() -> None:
    NoMetrics().update(Status(), None, 0.0)
    NoMetrics().close()
