"""A busy engine is not a wedged one (issue 42, items 2 and 3): a probe that timed out while the engine's own
counters moved waited behind others' work -- busy, unknown, never a failure; readiness of an engine that
generates for others meanwhile is proven by its counters; a key the engine refuses is "cannot ask"; requests
waiting with nothing running and nothing moving is a stall (a stuck scheduler), corroborated by a short probe."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx

from spark_supervisor.adapters.vllm import VllmApi
from spark_supervisor.judge import completion
from spark_supervisor.judge.completion import beside_heartbeat, deep_result
from spark_supervisor.model import (
    Action,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Heartbeat,
    ImageReport,
    Kind,
    Phase,
    ProbeResult,
    StopServe,
    Tracker,
    Verdict,
    Verify,
)
from spark_supervisor.plan import plan
from spark_supervisor.specs import requests
from tests.fakes import make
from tests.helpers import cfg, obs, serve_running, sole, view_of
from tests.unit.test_plan import serving_status, status

C = cfg()
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
TIMED_OUT = Verdict(False, "no answer within 30s", "s1", 30.0, timed_out=True)


def stats(generated: float, prompted: float = 0, kv: float = 0.1, running: float = 1, waiting: float = 3,
          error: str = "") -> EngineStats:
    return EngineStats(running, waiting, generated, prompted, kv, error)


# ------------------------------------------------------------------------------ the verdict beside the heartbeat
def test_a_deep_probe_that_timed_out_while_tokens_flowed_is_busy_not_failed() -> None:
    v = beside_heartbeat(TIMED_OUT, stats(100), stats(160), deep=True)
    assert (v.passed, v.ran, v.busy) == (False, False, True)
    assert v.why == "busy: probe waited behind 1 running, 3 waiting (no answer within 30s; its counters moved)"
    assert deep_result(v) == ProbeResult.BUSY


def test_any_work_counter_moving_is_busy_a_long_prefill_too() -> None:
    assert beside_heartbeat(TIMED_OUT, stats(100), stats(100, prompted=8000), deep=True).busy
    assert beside_heartbeat(TIMED_OUT, stats(100, kv=0.1), stats(100, kv=0.4), deep=True).busy


def test_nothing_moved_or_a_heartbeat_unread_leaves_the_failure_standing() -> None:
    assert beside_heartbeat(TIMED_OUT, stats(100), stats(100), deep=True) == TIMED_OUT
    assert beside_heartbeat(TIMED_OUT, stats(100, error="/metrics: ReadTimeout"), stats(160), deep=True) == TIMED_OUT
    assert beside_heartbeat(TIMED_OUT, stats(100), stats(160, error="/metrics: ReadTimeout"), deep=True) == TIMED_OUT
    assert deep_result(TIMED_OUT) == ProbeResult.FAILURE
    wrong = Verdict(False, "empty answer (finish_reason=stop)", "s1", 0.4)  # an answer, judged: not a timeout
    assert beside_heartbeat(wrong, stats(100), stats(160), deep=True) == wrong


def test_readiness_of_an_engine_generating_for_others_is_proven_by_its_counters() -> None:
    v = beside_heartbeat(dataclasses.replace(TIMED_OUT, why="no answer within 10s"), stats(100), stats(292),
                         deep=False)
    assert (v.passed, v.ran, v.busy, v.field) == (True, True, False, "engine counters")
    assert v.why == "busy (probe waited behind 1 running, 3 waiting): it generated 192 tokens for others meanwhile"
    only_prefill = beside_heartbeat(TIMED_OUT, stats(100), stats(100, prompted=9000), deep=False)
    assert (only_prefill.passed, only_prefill.busy) == (False, True)  # no token yet: asked again, not failed


def test_a_busy_probe_neither_counts_nor_breaks_a_run_of_failures() -> None:
    t = Tracker().record("failure", 1).record("busy", 2, "busy: ...")
    assert (t.failures, t.last) == (1, "busy")
    assert t.record("failure", 3).failures == 2


def test_a_refused_api_key_is_cannot_ask_not_a_failure() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer wrong"
        return httpx.Response(401, json={"error": "Unauthorized"})
    with httpx.Client(transport=httpx.MockTransport(refuse)) as client:
        api = VllmApi(client, "http://127.0.0.1:8000", api_key="wrong", timeout=5)
        got = api.sanity(*requests.sanity_request("chat", "m", "Reply with the single word: ready", 8), 5, "s1")
        v = completion.judged("chat", got, "s1")
        api.kept.close()
    assert (v.passed, v.ran) == (False, False) and v.why.startswith("HTTP 401: cannot ask")
    assert deep_result(v) == ProbeResult.UNKNOWN


# ------------------------------------------------------------------------------ the planner
def test_serving_busy_is_shown_and_never_repaired() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    busy = Tracker(1, 0, "busy", 100, "busy: probe waited behind 1 running, 3 waiting (...)")
    d = plan(o, serving_status(deep=busy), view_of(C), 101)
    assert d.phase == Phase.SERVING and d.repair == "" and d.actions == ()
    assert d.reason.endswith("; busy: probe waited behind 1 running, 3 waiting (...)")


def test_verifying_behind_others_work_waits_for_a_slot_and_says_so() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    v = Verdict(False, "busy: probe waited behind 1 running, 0 waiting (x)", s.identity, ran=False, busy=True)
    d = plan(o, status(Phase.VERIFYING, since=0, verdict=v), view_of(C), 10)
    assert d.phase == Phase.VERIFYING and d.repair == "" and d.actions == (Verify(s.identity),)
    assert d.reason == f"sanity completion when a slot frees ({v.why})"


def test_requests_waiting_with_nothing_running_or_moving_is_a_stall() -> None:
    hb = Heartbeat().beat(stats(10, running=0, waiting=4), "s1", 100, 20)
    hb = hb.beat(stats(10, running=0, waiting=4), "s1", 120, 20)
    assert hb.stalled_at == 120 and hb.frozen(125).startswith("0 requests running, 4 waiting")
    idle = Heartbeat().beat(stats(10, running=0, waiting=0), "s1", 100, 20)
    assert not idle.beat(stats(10, running=0, waiting=0), "s1", 130, 20).stalled_at


def test_a_stall_is_corroborated_by_a_short_probe_and_a_frozen_one_repaired() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    stalled = Heartbeat(s.identity, (10, 0, 0), moved_at=100, running=0, waiting=4, stalled_at=120)
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(last="success", last_at=90)), view_of(C), 121)
    assert d.actions == (Verify(s.identity, deep=True, timeout=3.0),) and d.repair == ""
    failed = Tracker(1, 0, "failure", 126, "no answer within 5s")
    d = plan(o, serving_status(heartbeat=stalled, deep=failed), view_of(C), 126)
    assert d.repair == "serve" and d.actions == (StopServe("wedged"),) and d.why.kind == Kind.SERVE_WEDGED


# ------------------------------------------------------------------------------ the daemon, on a fake clock
def test_a_saturated_engine_stays_serving_busy_on_the_default_settings(tmp_path: Path) -> None:
    """Every deep probe times out behind a client's work for ten minutes while tokens flow: 0 repairs."""
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    s = serve_running(c)
    be.next = obs(c, deployed=True, serve=s, endpoint=UP)
    for _ in range(3):
        daemon.tick()
        clock.t += 5
    assert sole(daemon).status.phase == Phase.SERVING
    answer = be.run
    probed = 0

    def behind(action: Action) -> Verdict | ImageReport | None:
        nonlocal probed
        answer(action)
        if isinstance(action, Verify):
            probed += 1
            return beside_heartbeat(dataclasses.replace(TIMED_OUT, serve=s.identity), stats(probed * 10),
                                    stats(probed * 10 + 9), deep=action.deep)
        return None
    be.run = behind  # type: ignore[method-assign]
    generated = 100.0
    end = clock.t + 600
    while clock.t < end:
        generated += 30
        be.next = dataclasses.replace(be.next, engine=stats(generated, running=1, waiting=3))
        daemon.tick()
        assert sole(daemon).status.phase == Phase.SERVING and not sole(daemon).status.repairs_in_window, sole(daemon).status.reason
        clock.t += 5
    assert probed >= 9 and not any(isinstance(a, StopServe) for a in be.ran)
    assert "busy: probe waited behind 1 running, 3 waiting" in sole(daemon).status.reason
