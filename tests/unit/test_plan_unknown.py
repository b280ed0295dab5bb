"""Unknown is not absent: each observation that could not be made, one at a time, with a fake clock.

An observation that failed holds the phase and is shown; only positive evidence of loss repairs."""

from dataclasses import replace
from typing import Any

from spark_supervisor.model import (
    Decision,
    EndpointObservation,
    EndpointState,
    NodeObservation,
    Phase,
    RayNode,
    RayObservation,
    Reason,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    Tracker,
    Verdict,
)
from spark_supervisor.plan import plan, unknowns
from tests.helpers import cfg, data, images, node_obs, obs, ray_container, ray_ok, serve_running, view_of

C = cfg()
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
RAY_TIMEOUT = RayObservation(False, "RayDashboardUnreachable: ReadTimeout timed out")


def serving(since: float = 0.0, unknown: dict[str, float] | None = None, **kw: Any) -> Status:
    st = Status(verdict=Verdict(True, "ok", serve_running(C).identity), **kw)
    st.advance(Phase.SERVING, Reason(), since, since)
    st.unknown_since = dict(unknown or {})
    st.unknown_run_since = min(st.unknown_since.values(), default=0.0)
    return st


def destructive(d: Decision) -> bool:
    return bool(d.repair) or any(isinstance(a, (RemoveContainers, StopServe, StartServe, StartContainer)) for a in d.actions)


def test_a_ray_dashboard_timeout_while_serving_holds_serving_and_says_so() -> None:
    o = obs(C, deployed=True, ray=RAY_TIMEOUT, serve=serve_running(C), endpoint=UP)
    assert unknowns(o, view_of(C)) == {"ray dashboard": RAY_TIMEOUT.error}
    d = plan(o, serving(unknown={"ray dashboard": 5}), view_of(C), 10)
    assert d.phase == Phase.SERVING and not destructive(d)
    assert d.reason == f"ObservationUnknown: ray dashboard: {RAY_TIMEOUT.error}"


def test_an_unknown_that_lasts_past_the_patience_degrades_but_still_tears_nothing_down() -> None:
    o = obs(C, deployed=True, ray=RAY_TIMEOUT, serve=serve_running(C), endpoint=UP)
    late = 5 + C.healing.unknown_patience + 1
    d = plan(o, serving(unknown={"ray dashboard": 5}), view_of(C), late)
    assert d.phase == Phase.DEGRADED and not destructive(d)
    assert d.reason.startswith("ObservationUnknown: ray dashboard:") and d.reason.endswith(
        f"(longer than {C.healing.unknown_patience:.0f}s)")


def test_ray_saying_a_node_is_dead_is_evidence_and_repairs_the_gang() -> None:
    lost = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0),
                                       RayNode("b", "192.168.200.13", False, 1.0)))
    d = plan(obs(C, deployed=True, ray=lost, serve=serve_running(C), endpoint=UP), serving(), view_of(C), 10)
    assert d.repair == "gang" and d.reason.startswith("RayNodeLost: spark-2")


def test_a_failed_serve_state_exec_never_launches_a_second_serve() -> None:
    unknown = replace(serve_running(C), error="DockerTimeout: exec on spark-1: no answer within 25s")
    d = plan(obs(C, deployed=True, serve=unknown, endpoint=UP), serving(), view_of(C), 10)
    assert d.phase == Phase.SERVING and not destructive(d)
    assert d.reason.startswith("ObservationUnknown: serve state: DockerTimeout")


def test_a_failed_serve_state_exec_with_nothing_seen_before_holds_without_launching() -> None:
    from spark_supervisor.model import ServeObservation
    unknown = ServeObservation(False, error="ServeStateFailed: the serve-state script exited 126")
    st = Status(images=images(C))
    st.advance(Phase.DETECTING, Reason(), 0, 0)
    d = plan(obs(C, deployed=True, serve=unknown), st, view_of(C), 10)
    assert d.phase == Phase.DETECTING and not destructive(d)
    assert d.reason == "ObservationUnknown: serve state: ServeStateFailed: the serve-state script exited 126"


def test_health_failing_past_its_threshold_is_evidence_even_while_the_serve_state_is_unknown() -> None:
    unknown = replace(serve_running(C), error="DockerTimeout: exec")
    refused = EndpointObservation(EndpointState.REFUSED)
    d = plan(obs(C, deployed=True, serve=unknown, endpoint=refused),
             serving(health=Tracker(failures=2, detail="refused")), view_of(C), 10)
    assert d.repair == "serve" and d.reason.startswith("ServeUnhealthy")


def test_an_endpoint_that_could_not_be_read_while_serving_is_not_a_load() -> None:
    err = EndpointObservation(EndpointState.ERROR, "/health: ReadTimeout")
    d = plan(obs(C, deployed=True, serve=serve_running(C), endpoint=err), serving(), view_of(C), 10)
    assert d.phase == Phase.SERVING and not destructive(d)


def test_an_unreachable_worker_holds_even_past_the_node_patience_while_ray_sees_it_alive() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": NodeObservation("spark-2", error="SshUnreachable: timed out")}
    o = obs(C, nodes=nodes, serve=serve_running(C), endpoint=UP, ray=RayObservation(True, nodes=(
        RayNode("a", "192.168.200.12", True, 1.0), RayNode("b", "192.168.200.13", True, 1.0))))
    d = plan(o, serving(unknown={"node spark-2": 5}), view_of(C), 10)
    assert d.phase == Phase.SERVING and not destructive(d) and not d.actions
    assert d.reason == "ObservationUnknown: spark-2: SshUnreachable: timed out"
    for now in (6 + C.healing.unknown_patience, C.healing.node_patience + 10):  # DEGRADED, still nothing done
        d = plan(o, serving(unknown={"node spark-2": 5}), view_of(C), now)
        assert d.phase == Phase.DEGRADED and not destructive(d) and not d.actions
        assert d.reason.startswith("ObservationUnknown: spark-2: SshUnreachable: timed out (longer than")


def test_an_unreachable_worker_that_ray_reports_dead_is_lost_but_nothing_is_half_torn_down() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": NodeObservation("spark-2", error="SshUnreachable: timed out")}
    dead = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0),
                                       RayNode("b", "192.168.200.13", False, 1.0)))
    d = plan(obs(C, nodes=nodes, ray=dead, serve=serve_running(C)), serving(), view_of(C), 10)
    assert d.phase == Phase.DEGRADED and not destructive(d) and not d.actions
    assert d.reason.startswith("NodeLost: spark-2 unreachable and not alive in Ray")


def test_an_unreachable_worker_with_nothing_deployed_backs_off() -> None:
    nodes = {"spark-1": node_obs("spark-1"), "spark-2": NodeObservation("spark-2", error="DockerTimeout: x")}
    st = Status(images=images(C))
    st.advance(Phase.DETECTING, Reason(), 0, 0)
    d = plan(obs(C, nodes=nodes), st, view_of(C), 1)
    assert d.phase == Phase.BACKOFF and d.failure and not d.actions


def test_a_paused_container_is_neither_running_nor_gone() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": node_obs("spark-2", (ray_container(C, "spark-2", state="paused"),))}
    d = plan(obs(C, nodes=nodes, ray=ray_ok(C), serve=serve_running(C), endpoint=UP), serving(), view_of(C), 10)
    assert d.phase == Phase.SERVING and not destructive(d)
    assert d.reason == "ContainerInTransition: spark-2: Ray container paused"


def test_an_exited_container_is_evidence() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": node_obs("spark-2", (ray_container(C, "spark-2", state="exited"),))}
    d = plan(obs(C, nodes=nodes, serve=serve_running(C), endpoint=UP), serving(), view_of(C), 10)
    assert d.repair == "gang" and d.reason == "PartialDeployment: spark-2: Ray container exited"


def test_gpu_memory_that_could_not_be_read_starts_nothing() -> None:
    blind = node_obs("spark-2", gpu=None, memory=None,
                     probe_errors=("nvidia-smi: CommandTimeout: nvidia-smi did not finish within 20s",
                                   "meminfo: CommandTimeout: cat did not finish within 20s"))
    st = Status(images=images(C))
    st.advance(Phase.CLEANING, Reason(), 0, 0)
    d = plan(obs(C, nodes={"spark-1": node_obs("spark-1"), "spark-2": blind}), st, view_of(C), 1)
    assert d.phase == Phase.CLEANING and not d.actions
    assert d.reason.startswith("ObservationUnknown: GPU memory: spark-2: nvidia-smi: CommandTimeout")
    d = plan(obs(C, nodes={"spark-1": node_obs("spark-1"), "spark-2": blind}), st, view_of(C),
             2 + C.healing.unknown_patience)
    assert d.phase == Phase.DEGRADED and not d.actions


def test_ray_unknown_before_the_serve_launch_launches_nothing() -> None:
    st = Status(images=images(C))
    st.advance(Phase.STARTING_VLLM, Reason(), 0, 0)
    d = plan(obs(C, deployed=True, ray=RAY_TIMEOUT), st, view_of(C), 1)
    assert d.phase == Phase.STARTING_VLLM and not d.actions
    assert d.reason.startswith("ObservationUnknown: ray dashboard")


def test_the_patience_counts_an_unbroken_run_of_unknowns_whatever_part_was_unseen() -> None:
    # Full ticks could not see the node, quick ticks the serve state: one run, started at t=5.
    unknown = replace(serve_running(C), error="DockerTimeout: exec")
    st = serving(unknown={"serve state": 50})  # this key is new, the run is not
    st.unknown_run_since = 5
    d = plan(obs(C, deployed=True, serve=unknown, endpoint=UP), st, view_of(C), 6 + C.healing.unknown_patience)
    assert d.phase == Phase.DEGRADED and not destructive(d)


def test_a_dashboard_that_does_not_answer_yet_while_ray_starts_is_the_join_not_an_unknown() -> None:
    st = Status(images=images(C))
    st.advance(Phase.STARTING_RAY, Reason(), 0, 0)
    st.unknown_run_since = 0
    o = obs(C, deployed=True, ray=RayObservation(False, "RayDashboardUnreachable: ConnectError"))
    assert unknowns(o, view_of(C), Phase.STARTING_RAY) == {}
    d = plan(o, st, view_of(C), 30)
    assert d.phase == Phase.STARTING_RAY and d.reason.startswith("0/2 nodes")
    d = plan(o, st, view_of(C), C.deployment.ray.join_timeout + 1)
    assert d.repair == "gang" and d.reason.startswith("RayJoinTimeout")


def test_a_stale_log_carried_over_a_failed_exec_is_never_judged_a_stalled_load() -> None:
    s = replace(serve_running(C, log="Loading safetensors checkpoint shards:  2% Completed | 1/39 [00:18<11:00]\r"),
                error="DockerTimeout: exec")
    st = Status(load_progress_at=100, images=images(C))
    st.advance(Phase.LOADING, Reason(), 0, 0)
    d = plan(obs(C, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.REFUSED)), st, view_of(C),
             200 + C.deployment.readiness.stall_timeout + C.deployment.readiness.deadline)
    assert d.phase == Phase.LOADING and not destructive(d)
    assert d.reason.startswith("ObservationUnknown: serve state")


def test_nvidia_smi_failing_alone_still_starts_nothing() -> None:
    blind = node_obs("spark-2", gpu=None, probe_errors=("nvidia-smi: CommandTimeout: nvidia-smi did not finish",))
    st = Status(images=images(C))
    st.advance(Phase.CLEANING, Reason(), 0, 0)
    d = plan(obs(C, nodes={"spark-1": node_obs("spark-1"), "spark-2": blind}), st, view_of(C), 1)
    assert not d.actions and d.reason.startswith("ObservationUnknown: GPU memory: spark-2: nvidia-smi")


def test_a_node_outside_the_deployment_that_cannot_be_seen_does_not_degrade_it() -> None:
    d0 = data()
    d0["deployments"][0]["nodes"] = ["spark-1"]
    d0["deployments"][0]["serve"].update(tensor_parallel_size=1, distributed_executor_backend="mp")
    c = cfg(d0)
    o = obs(c, deployed=True, nodes={"spark-1": node_obs("spark-1", (ray_container(c, "spark-1"),)),
                                      "spark-2": NodeObservation("spark-2", error="SshUnreachable: x")})
    assert unknowns(o, view_of(c)) == {}
