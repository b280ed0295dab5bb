"""The decision table, one situation at a time, with a fake clock (plain numbers)."""

from dataclasses import replace
from typing import Any

from spark_supervisor.model import (
    Container,
    EndpointObservation,
    EndpointState,
    GpuProcess,
    Memory,
    NodeObservation,
    Phase,
    RayNode,
    RayObservation,
    Reason,
    RemoveContainers,
    ServeObservation,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    StopUnits,
    Tracker,
    Unit,
    Verdict,
    Verify,
)
from spark_supervisor.plan import plan
from tests.helpers import cfg, data, free_gpu, images, node_obs, obs, ray_container, serve_running, view_of

C = cfg()


def status(phase: Phase = Phase.DETECTING, since: float = 0.0, **kw: Any) -> Status:
    kw.setdefault("images", images(C))
    st = Status(**kw)
    st.advance(phase, Reason(), since, since)
    return st


def stale(name: str) -> Container:
    return Container(f"id-{name}", name, "vllm/vllm-openai:v0.11", "running", {})


def test_after_a_reboot_stale_units_and_containers_are_cleaned_on_every_node_in_order() -> None:
    units = (Unit("vllm-cluster", "active", "enabled"), Unit("vllm-proxy", "active", "enabled"))
    o = obs(C, nodes={
        "spark-1": node_obs("spark-1", (stale("vllm_node"), stale("reranker")), units=units),
        "spark-2": node_obs("spark-2", (stale("vllm_node"),), units=(Unit("vllm-proxy", "inactive", "enabled"),)),
    })
    d = plan(o, status(), view_of(C), 100)
    assert d.phase == Phase.CLEANING and not d.failure
    assert d.actions == (
        StopUnits("spark-1", ("vllm-proxy", "vllm-cluster"), disable=True),  # configured order, not observed
        RemoveContainers("spark-1", ("vllm_node", "reranker"), "stale"),
        StopUnits("spark-2", ("vllm-proxy",), disable=True),  # inactive but still enabled: would return at boot
        RemoveContainers("spark-2", ("vllm_node",), "stale"),
    )


def test_units_that_are_absent_or_already_off_are_left_alone() -> None:
    units = (Unit("vllm-cluster", "inactive", "disabled"), Unit("vllm-proxy", "inactive", "", "not-found"))
    o = obs(C, nodes={n.name: node_obs(n.name, units=units) for n in C.nodes})
    assert plan(o, status(), view_of(C), 100).phase == Phase.STARTING_RAY


def test_foreign_containers_that_are_not_stale_are_never_touched() -> None:
    mine = Container("x", "grafana", "grafana/grafana", "running", {})
    o = obs(C, nodes={n.name: node_obs(n.name, (mine,)) for n in C.nodes})
    d = plan(o, status(), view_of(C), 100)
    assert d.phase == Phase.STARTING_RAY
    assert all(not isinstance(a, RemoveContainers) for a in d.actions)


def test_stale_by_image_pattern_and_label() -> None:
    d = data(stale={"units": [], "containers": [], "image_patterns": ["vllm/*"], "container_labels": ["stack=old"]})
    c = cfg(d)
    o = obs(c, nodes={"spark-1": node_obs("spark-1", (
        Container("a", "whatever", "vllm/vllm-openai:1", "exited", {}),
        Container("b", "other", "busybox", "running", {"stack": "old"}),
        Container("c", "keep", "busybox", "running", {"stack": "new"}))), "spark-2": node_obs("spark-2")})
    assert plan(o, status(), view_of(c), 100).actions == (RemoveContainers("spark-1", ("whatever", "other"), "stale"),)


def test_gpu_memory_still_held_waits_then_fails_naming_pid_name_and_mib() -> None:
    held = replace(free_gpu(), processes=(*free_gpu().processes, GpuProcess(4242, "VLLM::Worker_TP0", 19135)))
    o = obs(C, nodes={"spark-1": node_obs("spark-1", gpu=held), "spark-2": node_obs("spark-2")})
    d = plan(o, status(Phase.CLEANING, since=0), view_of(C), 10)
    assert d.phase == Phase.CLEANING and not d.failure and not d.actions
    assert "spark-1: pid 4242 (VLLM::Worker_TP0) 19135 MiB" in d.reason
    d = plan(o, status(Phase.CLEANING, since=0), view_of(C), 10 + C.stale.memory_free_timeout)
    assert d.fatal and d.phase == Phase.FAILED and not d.actions  # bounded: no endless wait/backoff loop
    assert d.reason.startswith("GpuMemoryHeld: still held after 120s: spark-1: pid 4242 (VLLM::Worker_TP0) 19135 MiB")


def test_allowed_processes_over_the_residual_threshold_block() -> None:
    xorg = replace(free_gpu(), processes=(GpuProcess(1, "/usr/lib/xorg/Xorg", 600),))
    o = obs(C, nodes={"spark-1": node_obs("spark-1", gpu=xorg), "spark-2": node_obs("spark-2")})
    assert "allowed processes hold 600 MiB > 512 MiB" in plan(o, status(), view_of(C), 1).reason


def test_unified_memory_uses_memavailable_against_the_utilisation() -> None:
    low = Memory(122880, 60000)  # 0.85 x 122880 = 104448 needed
    o = obs(C, nodes={"spark-1": node_obs("spark-1"), "spark-2": node_obs("spark-2", memory=low)})
    assert "spark-2: MemAvailable 60000 MiB < 104448 MiB" in plan(o, status(), view_of(C), 1).reason


def test_nothing_deployed_and_gpus_free_starts_ray_head_first() -> None:
    d = plan(obs(C), status(), view_of(C), 1)
    assert d.phase == Phase.STARTING_RAY
    assert d.actions == (StartContainer("spark-1"), StartContainer("spark-2"))


def test_a_fast_observation_never_starts_ray_without_the_gpu_check() -> None:
    assert plan(obs(C, full=False), status(), view_of(C), 1).phase == Phase.DETECTING


def test_unreachable_node_is_a_failure_and_nothing_is_touched() -> None:
    o = obs(C, nodes={"spark-1": node_obs("spark-1", (stale("vllm_node"),)),
                      "spark-2": NodeObservation("spark-2", error="SshUnreachable: ssh spark-2: timed out")})
    d = plan(o, status(), view_of(C), 1)
    assert d.failure and d.phase == Phase.BACKOFF and not d.actions
    assert d.reason == "NodeUnreachable: spark-2: SshUnreachable: ssh spark-2: timed out"


def test_backoff_holds_until_its_time() -> None:
    st = status(Phase.BACKOFF, since=0, backoff_until=50)
    st.why = Reason("X")
    assert plan(obs(C), st, view_of(C), 49) == plan(obs(C), st, view_of(C), 10)
    assert plan(obs(C), st, view_of(C), 49).phase == Phase.BACKOFF
    assert plan(obs(C), st, view_of(C), 50).phase == Phase.STARTING_RAY


def test_ray_waits_for_every_node_and_gpu_then_times_out_with_a_teardown() -> None:
    one = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0, True),))
    o = obs(C, deployed=True, ray=one)
    d = plan(o, status(Phase.STARTING_RAY, since=0), view_of(C), 5)
    assert (d.phase, d.reason, d.actions) == (Phase.STARTING_RAY, "1/2 nodes, 1.0/2.0 GPUs", ())
    d = plan(o, status(Phase.STARTING_RAY, since=0), view_of(C), C.deployment.ray.join_timeout + 1)
    assert d.repair == "gang" and d.reason.startswith("RayJoinTimeout: 1/2 nodes")
    assert d.actions == (RemoveContainers("spark-2", ("qwen-ray-spark-2",), "join timeout"),
                         RemoveContainers("spark-1", ("qwen-ray-spark-1",), "join timeout"))


def test_a_dead_node_entry_does_not_count_and_a_wrong_ip_is_named() -> None:
    dead = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0), RayNode("b", "192.168.200.13", False, 1.0)))
    assert plan(obs(C, deployed=True, ray=dead), status(Phase.STARTING_RAY), view_of(C), 1).reason == "1/2 nodes, 1.0/2.0 GPUs"
    wrong = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0), RayNode("b", "10.0.0.13", True, 1.0)))
    d = plan(obs(C, deployed=True, ray=wrong), status(Phase.STARTING_RAY, since=0), view_of(C), 1)
    assert d.phase == Phase.STARTING_RAY and not d.actions  # a stray joining meanwhile looks the same: wait
    assert d.reason == "1/2 nodes, 1.0/2.0 GPUs; 10.0.0.13 registered too, not a fabric IP"
    d = plan(obs(C, deployed=True, ray=wrong), status(Phase.STARTING_RAY, since=0), view_of(C), C.deployment.ray.join_timeout + 1)
    assert d.fatal and d.phase == Phase.FAILED  # a config problem: retrying cannot help
    assert d.reason.startswith("RayNodeWrongIp: spark-2 never registered on its fabric IP while 10.0.0.13 registered")


def test_half_a_deployment_is_torn_down_whole() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)), "spark-2": node_obs("spark-2")}
    d = plan(obs(C, nodes=nodes), status(), view_of(C), 1)
    assert d.phase == Phase.CLEANING and d.reason == "PartialDeployment: spark-2: no Ray container"
    assert d.repair == "gang"
    assert d.actions == (RemoveContainers("spark-1", ("qwen-ray-spark-1",), "gang restart"),)


def test_an_exited_ray_container_is_a_partial_deployment() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": node_obs("spark-2", (ray_container(C, "spark-2", state="exited"),))}
    d = plan(obs(C, nodes=nodes), status(), view_of(C), 1)
    assert d.reason == "PartialDeployment: spark-2: Ray container exited"
    assert len(d.actions) == 2


def test_an_old_spec_hash_replaces_the_deployment() -> None:
    nodes = {n.name: node_obs(n.name, (ray_container(C, n.name, spec="old"),)) for n in C.nodes}
    d = plan(obs(C, nodes=nodes), status(), view_of(C), 1)
    assert d.reason == "SpecChanged: replacing the deployment" and len(d.actions) == 2


def test_ray_formed_launches_the_serve_once() -> None:
    d = plan(obs(C, deployed=True), status(Phase.STARTING_RAY), view_of(C), 1)
    assert d.actions == (StartServe(),) and d.phase == Phase.STARTING_VLLM


def test_serve_of_an_old_spec_is_relaunched_without_touching_ray() -> None:
    s = replace(serve_running(C), spec_hash="old")
    d = plan(obs(C, deployed=True, serve=s), status(Phase.SERVING), view_of(C), 1)
    assert d.actions == (StopServe("spec changed"),)


def test_loading_is_refused_connections_with_progress_and_a_deadline() -> None:
    s = serve_running(C, log="Loading safetensors checkpoint shards:  30% Completed | 12/39 [00:40<01:30]\r")
    o = obs(C, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.REFUSED))
    d = plan(o, status(Phase.LOADING, since=0), view_of(C), 60)
    assert (d.phase, d.failure, d.actions) == (Phase.LOADING, False, ())
    d = plan(o, status(Phase.LOADING, since=0), view_of(C), C.deployment.readiness.deadline + 1)
    assert d.repair == "serve" and d.reason == "LoadTimeout: not ready after 3600s (12/39 shards)"
    assert d.actions == (StopServe("load timeout"),)


def test_a_load_that_moves_is_left_past_the_cold_budget_to_the_stall_limit() -> None:
    """A first load on GB10 pays compile and CUDA-graph capture after the weights: the cold deadline stops only a
    load that never moved; one that moved goes on until it falls silent for the stall limit."""
    s = serve_running(C, log="Loading safetensors checkpoint shards:  30% Completed | 12/39 [00:40<01:30]\r")
    o = obs(C, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.REFUSED))
    r = C.deployment.readiness
    past = r.deadline + 100
    moved = replace(status(Phase.LOADING, since=0), load_progress_at=past - r.stall_timeout)
    d = plan(o, moved, view_of(C), past)
    assert (d.phase, d.repair, d.actions) == (Phase.LOADING, "", ())
    assert d.reason == "past the cold budget of 3600s, still moving: left to the stall limit"
    d = plan(o, moved, view_of(C), past + 1)  # silent one second longer than the stall limit
    assert d.repair == "serve" and d.reason.startswith("LoadStalled: no progress for 900s")
    seen_once = replace(status(Phase.LOADING, since=0), load_progress_at=0.0)  # first seen as it entered LOADING
    d = plan(o, seen_once, view_of(C), r.deadline + 1)
    assert d.repair == "serve" and d.reason == "LoadTimeout: not ready after 3600s (12/39 shards)"
    late = 3 * r.deadline + 1
    d = plan(o, replace(moved, load_progress_at=late - 10), view_of(C), late)  # moving, for three budgets
    assert d.repair == "serve" and d.reason == ("LoadTimeout: not ready after 10800s, 3 x the cold budget, though "
                                                "still moving (12/39 shards)")


def test_serve_exit_is_read_from_its_log() -> None:
    log = ("(APIServer pid=1) ERROR 12-02 10:00:00 [api_server.py:1] api_server.py: error: unrecognized "
           "arguments: --no-such-flag\n")
    s = ServeObservation(True, 77, "c", False, 2, serve_running(C).spec_hash, "t", log)
    d = plan(obs(C, deployed=True, serve=s), status(Phase.LOADING), view_of(C), 1)
    assert d.fatal and d.phase == Phase.FAILED  # deterministic: no budget burnt on blind restarts
    assert d.reason.startswith("ServeFailed: BadArguments: ") and "--no-such-flag" in d.reason
    assert d.actions == (StopServe("failed"),)
    s = replace(s, log_tail="bye\n")
    d = plan(obs(C, deployed=True, serve=s), status(), view_of(C), 1)
    assert (d.reason, d.repair, d.actions) == ("ServeExited: exit code 2", "serve", (StopServe("exited"),))


def test_listed_model_is_verified_then_serving() -> None:
    s = serve_running(C)
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    d = plan(obs(C, deployed=True, serve=s, endpoint=up), status(Phase.LOADING), view_of(C), 1)
    assert d.actions == (Verify(s.identity),) and d.phase == Phase.VERIFYING
    st = status(Phase.VERIFYING, verdict=Verdict(True, "ok", s.identity))
    d = plan(obs(C, deployed=True, serve=s, endpoint=up), st, view_of(C), 1)
    assert (d.phase, d.reason, d.actions) == (Phase.SERVING, "Qwen3.5 on 2 nodes", ())


def test_a_verdict_on_another_serve_instance_does_not_count() -> None:
    s = serve_running(C)
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    st = status(Phase.SERVING, verdict=Verdict(True, "ok", replace(s, container_id="old").identity))
    assert plan(obs(C, deployed=True, serve=s, endpoint=up), st, view_of(C), 1).phase == Phase.VERIFYING


def test_api_up_without_the_model_keeps_loading() -> None:
    up = EndpointObservation(EndpointState.UP, health=200, models=("other",))
    d = plan(obs(C, deployed=True, serve=serve_running(C), endpoint=up), status(Phase.LOADING), view_of(C), 1)
    assert d.phase == Phase.LOADING and "not listed" in d.reason


def test_ray_node_lost_while_serving_is_a_gang_restart() -> None:
    lost = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0),
                                       RayNode("b", "192.168.200.13", False, 1.0)))  # marked DEAD by Ray
    d = plan(obs(C, deployed=True, ray=lost, serve=serve_running(C)), status(Phase.SERVING), view_of(C), 1)
    assert d.phase == Phase.CLEANING and d.reason.startswith("RayNodeLost: spark-2")
    assert {a.node for a in d.actions if isinstance(a, RemoveContainers)} == {"spark-1", "spark-2"}


def test_a_ray_node_merely_missing_from_the_list_is_held_not_torn_down() -> None:
    partial = RayObservation(True, nodes=(RayNode("a", "192.168.200.12", True, 1.0),))
    d = plan(obs(C, deployed=True, ray=partial, serve=serve_running(C)), status(Phase.SERVING), view_of(C), 1)
    assert d.phase == Phase.SERVING and not d.repair and not d.actions
    assert d.reason.startswith("RayNodeNotListed: spark-2")


def test_containers_owned_by_a_renamed_deployment_are_orphans() -> None:
    other = replace(ray_container(C, "spark-2"), labels={"spark-supervisor.owner": "old-name"}, name="old-ray")
    nodes = {"spark-1": node_obs("spark-1"), "spark-2": node_obs("spark-2", (other,))}
    d = plan(obs(C, nodes=nodes), status(), view_of(C), 1)
    assert d.actions == (RemoveContainers("spark-2", ("old-ray",), "orphan"),)


UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))


def serving_status(**kw: Any) -> Status:
    s = serve_running(C)
    return status(Phase.SERVING, since=0, verdict=Verdict(True, "ok", s.identity), **kw)


def test_failed_is_sticky_until_rearmed() -> None:
    st = status(Phase.FAILED)
    st.why = Reason("ServeFailed", "X")
    assert plan(obs(C), st, view_of(C), 1) == plan(obs(C), st, view_of(C), 1000)
    assert plan(obs(C), st, view_of(C), 1).actions == ()


def test_liveness_thresholds_then_a_serve_only_repair() -> None:
    o = obs(C, deployed=True, serve=serve_running(C), endpoint=UP)
    assert plan(o, serving_status(health=Tracker(failures=1)), view_of(C), 10).phase == Phase.SERVING
    d = plan(o, serving_status(health=Tracker(failures=2, detail="refused")), view_of(C), 10)
    assert d.repair == "serve" and d.reason == "ServeUnhealthy: /health failed 2 times (refused)"
    assert d.actions == (StopServe("unhealthy"),)
    d = plan(o, serving_status(deep=Tracker(failures=2, detail="no answer within 30s", last_at=9)), view_of(C), 10)
    assert d.repair == "serve" and d.reason.startswith("ServeWedged: 2 deep probes failed (no answer")


def test_the_deep_probe_runs_at_its_interval() -> None:
    o = obs(C, deployed=True, serve=serve_running(C), endpoint=UP)
    assert plan(o, serving_status(deep=Tracker(last_at=100)), view_of(C), 159).actions == ()
    assert plan(o, serving_status(deep=Tracker(last_at=100)), view_of(C), 160).actions == (
        Verify(serve_running(C).identity, deep=True),)


def test_repairs_are_spaced_and_bounded_by_the_budget() -> None:
    s = replace(serve_running(C), running=False, exit_code=1)
    o = obs(C, deployed=True, serve=s)
    d = plan(o, status(Phase.SERVING, next_repair_at=50), view_of(C), 10)
    assert (d.phase, d.actions, d.reason) == (Phase.BACKOFF, (), "RepairDelayed: ServeExited: exit code 1")
    d = plan(o, status(Phase.SERVING, repairs_in_window=3), view_of(C), 10)
    assert d.fatal and d.reason.startswith("RestartBudgetExhausted: 3 repairs in 6h; last fault: ServeExited")


def test_an_unreachable_peer_is_unknown_and_nothing_is_torn_down_for_it() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),)),
             "spark-2": NodeObservation("spark-2", error="SshUnreachable: timed out")}
    for now in (10, C.healing.node_patience + 1):
        d = plan(obs(C, nodes=nodes), serving_status(), view_of(C), now)
        assert (d.phase, d.actions, d.failure, d.repair) == (Phase.SERVING, (), False, "")
        assert d.reason == "ObservationUnknown: spark-2: SshUnreachable: timed out"


def test_stale_things_reappearing_while_serving_are_cleaned_without_touching_the_deployment() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"), stale("reranker"))),
             "spark-2": node_obs("spark-2", (ray_container(C, "spark-2"),))}
    d = plan(obs(C, nodes=nodes, serve=serve_running(C), endpoint=UP), serving_status(), view_of(C), 10)
    assert d.actions == (RemoveContainers("spark-1", ("reranker",), "stale"),) and not d.repair


def test_a_deployment_that_vanished_is_a_gang_repair_then_a_normal_start() -> None:
    d = plan(obs(C), serving_status(), view_of(C), 10)
    assert (d.phase, d.repair, d.reason, d.actions) == (Phase.CLEANING, "gang", "DeploymentLost: no Ray container on any node", ())
    assert plan(obs(C), status(Phase.CLEANING), view_of(C), 10).phase == Phase.STARTING_RAY


def test_a_serve_that_never_answers_its_first_completion_is_repaired() -> None:
    s = serve_running(C)
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    st = status(Phase.VERIFYING, deep=Tracker(failures=2, detail="no answer within 60s"))
    d = plan(obs(C, deployed=True, serve=s, endpoint=up), st, view_of(C), 10)
    assert d.repair == "serve" and d.reason == "ServeWedged: 2 sanity completions failed (no answer within 60s)"


def test_a_load_without_progress_is_a_stall() -> None:
    s = serve_running(C, log="Loading safetensors checkpoint shards:   2% Completed | 1/39 [00:18<11:00, 18.0s/it]\r")
    o = obs(C, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.REFUSED))
    st = status(Phase.LOADING, since=0, load_progress_at=100)
    assert plan(o, st, view_of(C), 100 + C.deployment.readiness.stall_timeout).phase == Phase.LOADING
    d = plan(o, st, view_of(C), 101 + C.deployment.readiness.stall_timeout)
    assert d.repair == "serve" and d.reason.startswith("LoadStalled: no progress for 900s at 1/39 shards, ETA")
