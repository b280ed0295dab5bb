"""Logging: level -> syslog priority, the journal entry made of an event, the readable MESSAGE, and the sink
against a real AF_UNIX datagram socket in journald's wire format (and its "<N>" fallback on stderr)."""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from spark_supervisor.report import journal as journal_mod


def parse(datagram: bytes) -> dict[str, str]:
    """journald's native protocol: KEY=value\\n, or KEY\\n<64-bit LE length><bytes>\\n for a value with a
    newline (systemd.io/JOURNAL_NATIVE_PROTOCOL)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            out[k.decode()] = v.decode()
            i = nl + 1
        else:
            (n,) = struct.unpack("<Q", datagram[nl + 1:nl + 9])
            out[line.decode()] = datagram[nl + 9:nl + 9 + n].decode()
            assert datagram[nl + 9 + n:nl + 10 + n] == b"\n"
            i = nl + 10 + n
    return out


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "socket")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.settimeout(10)
    yield path, rx
    rx.close()


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    if journal_mod.sink is not None:
        journal_mod.sink.close()


@pytest.mark.parametrize(("level", "prio"), [("debug", 7), ("info", 6), ("warning", 4), ("warn", 4), ("error", 3),
                                             ("exception", 3), ("critical", 2), ("CRITICAL", 2), (None, 6),
                                             ("something", 6)])
def test_priority_per_level(level: str | None, prio: int) -> None:
    assert journal_mod.priority(level) == prio


def test_message_is_the_event_then_key_values_on_one_line() -> None:
    ev = {"deployment": "main", "from": "LOADING", "to": "SERVING", "reason": "all good now", "event": "phase.changed",
          "level": "warning", "timestamp": "2026-12-03T08:00:00Z", "problems": ["a", "b c"], "n": 3, "ok": True,
          "path": "/etc/x.toml", "empty": "", "multi": "line one\nline two"}
    assert journal_mod.message(ev) == ('phase.changed deployment=main from=LOADING to=SERVING reason="all good now" '
                                'problems=["a","b c"] n=3 ok=true path=/etc/x.toml empty="" '
                                'multi="line one\\nline two"')
    long = journal_mod.message({"event": "x", "blob": "y" * 100_000})
    assert len(long) < journal_mod.MAX_MESSAGE + 100 and long.endswith("more characters)")


def test_an_exception_is_its_last_line_in_the_message_and_whole_in_traceback() -> None:
    tb = 'Traceback (most recent call last):\n  File "x.py", line 1\nZeroDivisionError: division by zero\n'
    ev = {"event": "reconcile.crashed", "level": "error", "exception": tb}
    assert journal_mod.message(ev) == 'reconcile.crashed exception="ZeroDivisionError: division by zero"'
    fields = dict(journal_mod.journal_fields(ev))
    assert fields["TRACEBACK"] == tb and fields["PRIORITY"] == 3


def test_journal_fields() -> None:
    ev = {"deployment": "main", "node": "spark-2", "from": "LOADING", "to": "SERVING", "event": "phase.changed",
          "level": "warning", "timestamp": "t"}
    fields = journal_mod.journal_fields(ev)
    d = dict(fields)
    assert len(d) == len(fields), "each field once"
    assert d == {"MESSAGE": journal_mod.message(ev), "PRIORITY": 4, "SYSLOG_IDENTIFIER": "spark-supervisor",
                 "EVENT": "phase.changed", "DEPLOYMENT": "main", "NODE": "spark-2", "PHASE": "SERVING",
                 "JSON": json.dumps(ev)}
    assert json.loads(str(d["JSON"])) == ev
    # `phase` names the phase where there is one; absent keys give no field.
    d = dict(journal_mod.journal_fields({"event": "start.stalled", "level": "error", "phase": "LOADING", "to": "x"}))
    assert d["PHASE"] == "LOADING" and "NODE" not in d and "DEPLOYMENT" not in d and "TRACEBACK" not in d


def test_an_oversized_event_keeps_valid_json() -> None:
    ev = {"event": "x", "level": "info", "timestamp": "t", "deployment": "d", "blob": "y" * 200_000}
    doc = json.loads(journal_mod.to_json(ev))
    assert doc["event"] == "x" and doc["deployment"] == "d" and doc["truncated"] > 200_000 and "blob" not in doc


@pytest.mark.parametrize(("value", "st", "expect"), [
    ("12:34", (12, 34), True), ("12:35", (12, 34), False), (None, (12, 34), False), ("", (12, 34), False),
    ("garbage", (12, 34), False), ("12:x", (12, 34), False), ("12:34", None, False)])
def test_journal_stream_must_be_stderr(value: str | None, st: tuple[int, int] | None, expect: bool) -> None:
    stat = os.stat_result((0, st[1], st[0], 0, 0, 0, 0, 0, 0, 0)) if st else None
    assert journal_mod.journal_stream_is_stderr(value, stat) is expect


def test_the_real_stderr_decides_journal_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = (tmp_path / "err").open("w")
    st = os.fstat(f.fileno())
    monkeypatch.setattr("sys.stderr", f)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    assert journal_mod.under_journald()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino + 1}")  # a child whose stderr was redirected
    assert not journal_mod.under_journald()
    f.close()


def test_structlog_events_arrive_as_native_journal_entries(journal: tuple[str, socket.socket],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path, rx = journal
    monkeypatch.setattr(journal_mod, "SOCKET", path)
    journal_mod.setup(journal=True)
    log = journal_mod.get(deployment="main")
    log.info("daemon.started", config="/etc/x.toml")
    log.warning("phase.changed", **{"from": "LOADING"}, to="BACKOFF", reason="NodeUnreachable: spark-2")
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("reconcile.crashed")
    got = [parse(rx.recv(1 << 20)) for _ in range(3)]
    assert [(e["EVENT"], e["PRIORITY"]) for e in got] == [("daemon.started", "6"), ("phase.changed", "4"),
                                                           ("reconcile.crashed", "3")]
    assert all(e["SYSLOG_IDENTIFIER"] == "spark-supervisor" and e["DEPLOYMENT"] == "main" for e in got)
    assert got[0]["MESSAGE"] == "daemon.started deployment=main config=/etc/x.toml"
    assert got[1]["PHASE"] == "BACKOFF"
    assert got[2]["MESSAGE"] == 'reconcile.crashed deployment=main exception="ValueError: bad"'
    assert got[2]["TRACEBACK"].startswith("Traceback") and "ValueError: bad" in got[2]["TRACEBACK"]
    doc = json.loads(got[1]["JSON"])
    assert doc["event"] == "phase.changed" and doc["level"] == "warning" and doc["to"] == "BACKOFF"
    assert "timestamp" in doc


def test_a_huge_event_is_cut_to_one_datagram(journal: tuple[str, socket.socket]) -> None:
    path, rx = journal
    sink = journal_mod.JournalSink(path, stream=io.StringIO())
    try:
        sink.emit({"event": "x", "level": "error", "blob": "y" * 1_000_000, "exception": "z\n" * 500_000})
        e = parse(rx.recv(1 << 21))
    finally:
        sink.close()
    assert e["EVENT"] == "x" and e["PRIORITY"] == "3"
    assert len(e["MESSAGE"]) < journal_mod.MAX_MESSAGE + 100 and len(e["TRACEBACK"]) < journal_mod.MAX_TRACEBACK + 100
    assert json.loads(e["JSON"])["truncated"] > 1_000_000
    assert sink.stream.getvalue() == ""  # type: ignore[union-attr]


def test_without_the_socket_the_priority_goes_as_a_prefix_on_stderr_and_the_socket_is_retried_later(
        tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    out, clock = io.StringIO(), Clock()
    sink = journal_mod.JournalSink(path, stream=out, clock=clock)
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sink.emit({"event": "repair.started", "level": "warning", "deployment": "main"})
        sink.emit({"event": "reconcile.failed", "level": "error"})
        lines = out.getvalue().splitlines()
        assert [line[:3] for line in lines] == ["<4>", "<3>"]
        assert json.loads(lines[0][3:]) == {"event": "repair.started", "level": "warning", "deployment": "main"}
        rx.bind(path)  # journald is back, but the sink waits out its pause before trying it again
        sink.emit({"event": "a", "level": "info"})
        assert out.getvalue().splitlines()[-1].startswith("<6>")
        clock.t += journal_mod.RETRY_SOCKET_S
        sink.emit({"event": "b", "level": "info"})
        rx.settimeout(10)
        assert parse(rx.recv(1 << 20))["EVENT"] == "b"
        assert len(out.getvalue().splitlines()) == 3
    finally:
        sink.close()
        rx.close()


def test_a_journal_that_does_not_read_never_stalls_the_daemon(journal: tuple[str, socket.socket]) -> None:
    path, _ = journal  # bound, never read: its queue fills
    out = io.StringIO()
    sink = journal_mod.JournalSink(path, stream=out)
    t0 = time.monotonic()
    try:
        for i in range(3000):
            sink.emit({"event": "load.progress", "level": "info", "i": i})
    finally:
        sink.close()
    assert time.monotonic() - t0 < 30  # one send timeout, then stderr until the pause ends
    lines = out.getvalue().splitlines()
    assert lines and all(line.startswith("<6>{") for line in lines)
    assert json.loads(lines[-1][3:])["i"] == 2999


def test_a_failure_inside_the_sink_is_swallowed(tmp_path: Path) -> None:
    class Broken(io.StringIO):
        def write(self, _s: str) -> int:
            raise OSError("stderr gone")
    sink = journal_mod.JournalSink(str(tmp_path / "none"), stream=Broken())
    try:
        sink.emit({"event": "x", "level": "error"})  # no socket, no stderr: nothing raises
    finally:
        sink.close()


def test_off_journald_json_lines_or_a_readable_console(capsys: pytest.CaptureFixture[str]) -> None:
    journal_mod.setup(json=True)
    journal_mod.get(deployment="main").warning("repair.started", kind="serve")
    line = json.loads(capsys.readouterr().err)
    assert (line["event"], line["level"], line["deployment"], line["kind"]) == ("repair.started", "warning",
                                                                               "main", "serve")
    structlog.reset_defaults()
    journal_mod.setup(json=False)
    journal_mod.get(deployment="main").warning("repair.started", kind="serve")
    err = capsys.readouterr().err
    assert "repair.started" in err and "kind" in err and not err.startswith("{")
