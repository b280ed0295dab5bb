"""Alerts keep secrets in (issue 19, item 6): a webhook's credentials never reach a log line, whatever the
failure; the alert command runs with a minimal environment, not the daemon's (HF_TOKEN, the API key)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from spark_supervisor.config import Alerts
from spark_supervisor.report.alerts import Alerter
from tests.unit.test_maintenance import Receiver


@pytest.fixture
def failing() -> Iterator[Receiver]:
    f = Receiver(fail_first=1 << 30)  # a real HTTP server on loopback that answers every POST with HTTP 500
    yield f
    f.close()


def send(alerts: Alerts) -> list[MutableMapping[str, Any]]:
    logs = structlog.testing.LogCapture()
    structlog.configure(processors=[structlog.processors.format_exc_info, logs])
    try:
        a = Alerter(alerts, log=structlog.get_logger())
        a.emit("testbed", "failed", phase="FAILED", reason="ImageLacksRay: no ray")
        a.close(timeout=30)
    finally:
        structlog.reset_defaults()
    return logs.entries


@pytest.mark.parametrize("where", [
    "http://alice:hunter2-pass@127.0.0.1:{port}/hook/tok-path-secret",  # answers HTTP 500
    "http://alice:hunter2-pass@127.0.0.1:9/hook/tok-path-secret",  # refused
    "http://alice:hunter2-pass@[::1/hook/tok-path-secret",  # httpx cannot even parse it
    "ftp://alice:hunter2-pass@127.0.0.1:9/hook/tok-path-secret",  # not a protocol httpx speaks
])
def test_a_failed_webhook_never_logs_its_credentials_or_path(failing: Receiver, where: str) -> None:
    url = where.format(port=failing.server.server_address[1])
    entries = send(Alerts.model_construct(webhook=url, command=[], events=["failed"], min_interval=1, timeout=5,
                                          attempts=2))
    failed = [e for e in entries if e["event"] == "alert.failed"]
    assert len(failed) == 1, entries
    text = json.dumps(entries)
    for secret in ("hunter2-pass", "alice", "tok-path-secret"):
        assert secret not in text, text
    assert failed[0]["error"], failed


def test_the_command_gets_a_minimal_environment_and_its_own_variables(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_leaked_token")
    monkeypatch.setenv("VLLM_API_KEY", "sk-leaked-key")
    monkeypatch.setenv("SOME_OTHER", "x")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    out = tmp_path / "env"
    entries = send(Alerts(command=["/bin/sh", "-c", f"env > {out}"], events=["failed"], min_interval=1))
    assert [e["event"] for e in entries] == ["alert.sent"], entries
    env = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    assert "hf_leaked_token" not in out.read_text() and "sk-leaked-key" not in out.read_text()
    assert env["SPARK_ALERT_EVENT"] == "failed" and env["SPARK_ALERT_DEPLOYMENT"] == "testbed"
    assert env["SPARK_ALERT_SUMMARY"].endswith("testbed: failed: ImageLacksRay: no ray")
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env.get("LANG") == "C.UTF-8"
    # sh itself adds PWD (and dash OLDPWD): nothing else of the daemon's gets through
    assert set(env) - {"PWD", "OLDPWD", "SHLVL", "_"} <= {
        "PATH", "LANG", "HOME", "TZ", "SPARK_ALERT_EVENT", "SPARK_ALERT_DEPLOYMENT", "SPARK_ALERT_SUMMARY"}, env


def test_a_command_that_fails_or_hangs_never_logs_its_arguments() -> None:
    hang = [sys.executable, "-c", "import signal; signal.pause()", "--token", "cmd-secret-arg"]
    entries = send(Alerts(command=hang, events=["failed"], min_interval=1, timeout=1, attempts=1))
    failed = [e for e in entries if e["event"] == "alert.failed"]
    assert len(failed) == 1 and "timed out after 1" in failed[0]["error"], entries
    assert "cmd-secret-arg" not in json.dumps(entries)


def test_a_command_that_answers_bytes_not_utf8_fails_with_them_escaped_never_a_crash() -> None:
    """Bytes from outside never crash anything: an alert command's stderr is its own."""
    bad = [sys.executable, "-c", "import sys; sys.stderr.buffer.write(b'nope \\xff\\xfe'); sys.exit(3)"]
    entries = send(Alerts(command=bad, events=["failed"], min_interval=1, timeout=5, attempts=1))
    failed = [e for e in entries if e["event"] == "alert.failed"]
    assert len(failed) == 1 and "exited 3: nope \\xff\\xfe" in failed[0]["error"], entries
    assert not [e for e in entries if e["event"] == "alert.crashed"]
