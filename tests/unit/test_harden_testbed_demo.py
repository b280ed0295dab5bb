"""Issue 19, "make demo ends with a Python traceback when SERVING is not reached in time": the demo says
what the daemon said (its last status: phase, reason, hint) and exits non-zero, no traceback. Docker,
the testbed and the daemon are replaced by fakes; the wait's deadline is stepped, not slept."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import testbed

BACKOFF = {"phase": "BACKOFF", "since": "2025-01-01T00:00:00.000+00:00", "reason_kind": "ServeFailed",
           "reason": "ServeFailed: FreeMemoryBelowUtilization: drop the page cache or lower "
                     "--gpu-memory-utilization (ValueError: Free memory on device cuda:0 ...)",
           "progress": "", "history": [
               {"phase": "STARTING_VLLM", "reason": "", "at": "2025-01-01T00:00:00.000+00:00"},
               {"phase": "BACKOFF", "reason": "ServeFailed: FreeMemoryBelowUtilization: ...",
                "at": "2025-01-01T00:00:01.000+00:00"}]}


class FakeDaemon:
    """`spark-supervisor run` that writes one status (or none) and keeps running, or exits."""

    def __init__(self, state_dir: Path, doc: dict[str, Any] | None, exit_code: int | None) -> None:
        if doc is not None:
            (state_dir / "status.json").write_text(json.dumps(doc))
        self.returncode = exit_code
        self.terminated = False

    def poll(self) -> int | None:
        return self.returncode

    def terminate(self) -> None:
        self.terminated = True
        self.returncode = -15

    def wait(self, timeout: float | None = None) -> int | None:  # noqa: ARG002  (Popen.wait's, given as timeout=)
        return self.returncode


Demo = Callable[..., "tuple[int, FakeDaemon, list[list[str]]]"]  # demo(doc, exit_code=None)


@pytest.fixture
def demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Demo:
    monkeypatch.setattr(testbed, "DIR", tmp_path)
    (tmp_path / "supervisor").mkdir()
    for name in ("up", "clean_containers"):
        monkeypatch.setattr(testbed, name, lambda *_, **__: None)
    monkeypatch.setattr(testbed, "plant_stale", lambda _: [])
    monkeypatch.setattr(testbed, "env", lambda: {})
    ran: list[list[str]] = []
    monkeypatch.setattr("spark_testbed.testbed.subprocess.run", lambda argv, **_: ran.append(argv))

    def deadline(cond: Any, timeout: float, what: str, every: float = 0.1) -> object:  # noqa: ARG001  (until's, given as every=)
        value = cond()  # one look, then the deadline has passed
        if value:
            return value
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
    monkeypatch.setattr(testbed, "until", deadline)

    def run(doc: dict[str, Any] | None, exit_code: int | None = None) -> tuple[int, FakeDaemon, list[list[str]]]:
        daemons: list[FakeDaemon] = []

        def popen(_argv: list[str], **_: Any) -> FakeDaemon:
            daemons.append(FakeDaemon(tmp_path / "supervisor", doc, exit_code))
            return daemons[0]
        monkeypatch.setattr("spark_testbed.testbed.subprocess.Popen", popen)
        rc = testbed.main(["demo"])
        return rc, daemons[0], ran
    return run


def test_serving_not_reached_says_what_the_daemon_said_and_exits_1(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, daemon, ran = demo(BACKOFF)
    out, err = capsys.readouterr()
    assert rc == 1 and daemon.terminated and "Traceback" not in out + err
    assert "SERVING was not reached within" in err and "The daemon's last status:" in err
    assert "phase:  BACKOFF since 2025-01-01T00:00:00.000+00:00" in err
    assert "reason: ServeFailed: FreeMemoryBelowUtilization: drop the page cache" in err
    assert "STARTING_VLLM" in err and "hint:" in err
    assert "keeps serving" not in out and not ran  # no status printed as if it served


def test_failed_is_the_end_of_the_wait_with_its_reason_and_a_hint(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, _ = demo({**BACKOFF, "phase": "FAILED", "reason_kind": "GpuMemoryHeld",
                     "reason": "GpuMemoryHeld: still held after 20s: spark-2: pid 41 python3 20480 MiB"})
    err = capsys.readouterr().err
    assert rc == 1 and "the daemon gave up (FAILED)" in err
    assert "reason: GpuMemoryHeld: still held after 20s: spark-2: pid 41 python3 20480 MiB" in err
    assert "hint:   fix the cause (GpuMemoryHeld)" in err


def test_a_daemon_that_exited_is_said_with_its_code(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, _ = demo(None, exit_code=2)
    err = capsys.readouterr().err
    assert rc == 1 and "the daemon exited with 2" in err and "wrote no status" in err and "Traceback" not in err


def test_serving_is_still_a_success(demo: Demo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, daemon, ran = demo({**BACKOFF, "phase": "SERVING", "reason": ""})
    out = capsys.readouterr().out
    assert rc == 0 and daemon.terminated and "SERVING after" in out and ran and ran[0][1] == "status"


@pytest.mark.parametrize("doc", [None, {}, {"phase": None, "history": "bad"}, {"history": [1, None, {}]}])
def test_the_message_holds_for_any_status(doc: dict[str, Any] | None) -> None:
    text = testbed.demo_outcome(doc, 600.4, None)
    assert text.startswith("SERVING was not reached within 600s")


def test_a_daemon_that_does_not_stop_is_killed() -> None:
    class Stuck:
        killed = False

        def poll(self) -> None:
            return None

        def terminate(self) -> None:
            pass

        def kill(self) -> None:
            self.killed = True

        def wait(self, timeout: float | None = None) -> int:
            if not self.killed:
                raise subprocess.TimeoutExpired("spark-supervisor", timeout or 0)
            return -9
    d = Stuck()
    testbed._stop(d)  # type: ignore[arg-type]
    assert d.killed
