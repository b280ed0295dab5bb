"""Issue 19 item 5: an incomplete Ray answer is unknown, never evidence. Every field the planner reads from
Ray's node table, missing or malformed, by hand-built answers: no repair, no FAILED, no teardown; shown and
counted as an unknown. A node that is none of ours is a warning. Positive evidence still acts."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from spark_supervisor.adapters.ray import parse, read_nodes
from spark_supervisor.model import (
    Decision,
    EndpointObservation,
    EndpointState,
    NodeObservation,
    Observation,
    Phase,
    RayNode,
    RayObservation,
    Reason,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    Verdict,
)
from spark_supervisor.plan import plan, unknowns
from tests.helpers import cfg, obs, serve_running, view_of

C = cfg()
HEAD, WORKER = "192.168.200.12", "192.168.200.13"
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))


def row(ip: object = HEAD, state: object = "ALIVE", gpu: object = 1.0, **kw: object) -> dict[str, Any]:
    resources = {"CPU": 2.0} if gpu is ... else {"CPU": 2.0, "GPU": gpu}
    r = {"node_id": f"id-{ip}", "node_ip": ip, "state": state, "is_head_node": ip == HEAD,
         "resources_total": resources, **kw}
    return {k: v for k, v in r.items() if v is not ...}


def envelope(*rows: object, **result: object) -> dict[str, Any]:
    return {"result": True, "data": {"result": {"result": list(rows), **result}}}


def serving() -> Status:
    st = Status(verdict=Verdict(True, "ok", serve_running(C).identity))
    st.advance(Phase.SERVING, Reason(), 0, 0)
    return st


def starting(since: float = 0.0) -> Status:
    st = Status()
    st.advance(Phase.STARTING_RAY, Reason(), since, since)
    return st


def destructive(d: Decision) -> bool:
    return bool(d.repair) or d.fatal or d.phase == Phase.FAILED or any(
        isinstance(a, (RemoveContainers, StopServe, StartServe, StartContainer)) for a in d.actions)


def decide(ray: RayObservation, st: Status | None = None, now: float = 10.0) -> tuple[Observation, Decision]:
    o = obs(C, deployed=True, ray=ray, serve=serve_running(C), endpoint=UP)
    return o, plan(o, st or serving(), view_of(C), now)


# ------------------------------------------------------------------------------------------ the parser
@pytest.mark.parametrize("gpu", [..., None, "1", "lots", math.nan, math.inf, -1, True, [1]])
def test_a_missing_or_malformed_gpu_figure_is_none_not_zero(gpu: object) -> None:
    r = row(WORKER)
    if gpu is ...:
        del r["resources_total"]["GPU"]
    else:
        r["resources_total"]["GPU"] = gpu
    assert parse(envelope(row(), r)).nodes[1].gpus is None


@pytest.mark.parametrize("resources", [..., None, [], "GPU", 3])
def test_missing_or_malformed_resources_are_no_gpu_figure(resources: object) -> None:
    assert parse(envelope(row(WORKER, resources_total=resources))).nodes[0].gpus is None


@pytest.mark.parametrize("ip", [..., None, "", "spark-2", "999.1.1.1", 3, ["192.168.200.13"]])
def test_a_missing_or_malformed_address_is_unknown(ip: object) -> None:
    assert parse(envelope(row(ip))).nodes[0].ip == ""


@pytest.mark.parametrize("state", [..., None, "", "alive", "PENDING", 1, True])
def test_a_state_that_is_neither_alive_nor_dead_is_unknown(state: object) -> None:
    n = parse(envelope(row(WORKER, state))).nodes[0]
    assert n.alive is None and n.ip == WORKER


def test_alive_and_dead_are_read_as_such() -> None:
    nodes = parse(envelope(row(), row(WORKER, "DEAD"))).nodes
    assert [(n.ip, n.alive, n.gpus, n.is_head) for n in nodes] == [(HEAD, True, 1.0, True), (WORKER, False, 1.0, False)]


@pytest.mark.parametrize("result", [{"total": 5}, {"num_after_truncation": 3}, {"partial_failure_warning": "gcs slow"}])
def test_a_truncated_or_partial_table_is_incomplete(result: dict[str, Any]) -> None:
    r = parse(envelope(row(), row(WORKER), **result))
    assert r.reachable and r.incomplete


def test_rows_that_are_not_objects_make_the_table_incomplete() -> None:
    r = parse(envelope(row(), "garbage", None))
    assert r.reachable and len(r.nodes) == 1 and r.incomplete == "2 unreadable rows"


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"data": null}', '{"data": {"result": {"result": {}}}}', "nan"])
def test_an_answer_that_is_no_node_table_is_unreadable(text: str) -> None:
    r = read_nodes(text, "gcs")
    assert not r.reachable and r.error.startswith("RayStateUnreadable")


def test_the_gcs_path_reads_the_same_way() -> None:
    r = read_nodes(json.dumps(envelope(row(), row(WORKER, gpu=...))), "gcs")
    assert r.via == "gcs" and r.nodes[1].gpus is None


# --------------------------------------------------------------------------------------------- the plan
def test_a_node_alive_without_a_gpu_figure_is_no_gang_restart_but_an_unknown() -> None:
    r = parse(envelope(row(), row(WORKER, gpu=...)))
    o, d = decide(r)
    assert not destructive(d) and d.phase == Phase.SERVING
    assert unknowns(o, view_of(C)) == {"ray nodes": "spark-2: no GPU figure"}
    assert d.reason == "ObservationUnknown: ray nodes: spark-2: no GPU figure"


def test_every_gpu_figure_missing_is_unknown_too() -> None:
    o, d = decide(parse(envelope(row(gpu=...), row(WORKER, gpu=...))))
    assert not destructive(d) and set(unknowns(o, view_of(C))) == {"ray nodes"}


def test_a_row_without_node_ip_is_neither_a_wrong_ip_nor_a_teardown() -> None:
    o, d = decide(parse(envelope(row(), row(ip=...))))
    assert not destructive(d) and d.phase == Phase.SERVING
    assert "RayNodeWrongIp" not in d.reason and d.reason.startswith("ObservationUnknown: ray nodes: spark-2")
    assert unknowns(o, view_of(C))["ray nodes"] == "1 node without an address"


def test_a_row_without_a_state_is_not_a_lost_node() -> None:
    o, d = decide(parse(envelope(row(), row(WORKER, state=...))))
    assert not destructive(d) and "spark-2: no state" in unknowns(o, view_of(C))["ray nodes"]


def test_a_dead_entry_beside_a_row_that_may_be_its_rejoin_is_not_evidence() -> None:
    o, d = decide(parse(envelope(row(), row(WORKER, "DEAD"), row("", "ALIVE"))))
    assert not destructive(d) and d.reason.startswith("ObservationUnknown")


def test_a_dead_entry_in_a_truncated_table_is_not_evidence() -> None:
    o, d = decide(parse(envelope(row(), row(WORKER, "DEAD"), total=100)))
    assert not destructive(d) and "truncated" in unknowns(o, view_of(C))["ray nodes"]


def test_a_stray_node_joining_the_head_is_a_warning_not_a_teardown() -> None:
    for st in (serving(), starting()):
        o, d = decide(parse(envelope(row(), row(WORKER), row("10.0.0.9"))), st)
        assert not destructive(d), d
        assert unknowns(o, view_of(C)) == {}
    o, d = decide(parse(envelope(row(), row(WORKER), row("10.0.0.9"))))
    assert d.phase == Phase.SERVING and d.why.kind == "RayStrayNode" and "10.0.0.9" in d.reason


def test_a_stray_beside_a_node_not_listed_while_serving_holds() -> None:
    o, d = decide(parse(envelope(row(), row("10.0.0.9"))))
    assert not destructive(d) and d.reason.startswith("RayNodeNotListed: spark-2")


def test_a_join_whose_answer_cannot_place_a_node_is_held_at_the_deadline_not_repaired() -> None:
    r = parse(envelope(row(), row(WORKER, state="PENDING")))
    o = obs(C, deployed=True, ray=r)
    d = plan(o, starting(), view_of(C), C.deployment.ray.join_timeout + 1)
    assert not destructive(d) and d.phase == Phase.DEGRADED and d.why.kind == "ObservationUnknown"


def test_a_node_unreachable_over_ssh_whose_ray_row_is_unknown_is_not_called_lost() -> None:
    nodes = dict(obs(C, deployed=True).nodes)
    nodes["spark-2"] = NodeObservation("spark-2", error="SshUnreachable: timed out")
    o = obs(C, nodes=nodes, ray=parse(envelope(row(), row(WORKER, state=...))), serve=serve_running(C), endpoint=UP)
    d = plan(o, serving(), view_of(C), 10)
    assert d.why.kind == "ObservationUnknown" and not destructive(d)


# ------------------------------------------------------------------------------ evidence still counts
def test_a_dead_node_in_a_whole_answer_still_repairs_the_gang() -> None:
    o, d = decide(parse(envelope(row(), row(WORKER, "DEAD"))))
    assert d.repair == "gang" and d.reason.startswith("RayNodeLost: spark-2")


def test_ray_saying_zero_gpus_is_a_figure_and_repairs() -> None:
    o, d = decide(RayObservation(True, nodes=(RayNode("a", HEAD, True, 1.0), RayNode("b", WORKER, True, 0.0))))
    assert d.repair == "gang" and d.reason.startswith("RayNodeLost: spark-2")


def test_a_wrong_ip_is_still_failed_once_the_join_deadline_passed() -> None:
    o = obs(C, deployed=True, ray=parse(envelope(row(), row("10.0.0.13"))))
    d = plan(o, starting(), view_of(C), C.deployment.ray.join_timeout + 1)
    assert d.fatal and d.why.kind == "RayNodeWrongIp" and "spark-2" in d.reason
