"""Maintenance mode and alerts, one tick at a time: fake backend and clock; the alerts go to a real local
HTTP receiver and a real command."""

from __future__ import annotations

import http.server
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from spark_supervisor.config import Alerts
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import EndpointObservation, EndpointState, Pause, Phase, StartServe
from spark_supervisor.report.alerts import Alerter, RateLimit, webhook_label
from spark_supervisor.state import control, statefile
from spark_supervisor.state.maintenance import parse_duration
from tests.fakes import FakeBackend, make
from tests.helpers import data, obs, serve_running, sole


class Receiver:
    """A real HTTP server on loopback that records the JSON documents POSTed to it; fails the first
    ``fail_first`` requests with HTTP 500."""

    def __init__(self, fail_first: int = 0) -> None:
        self.docs: list[dict[str, Any]] = []
        self.requests = 0
        self.fail_first = fail_first
        self.cond = threading.Condition()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.cond:
                    outer.requests += 1
                    fail = outer.requests <= outer.fail_first
                    if not fail:
                        outer.docs.append(json.loads(body))
                    outer.cond.notify_all()
                self.send_response(500 if fail else 204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, count: int, timeout: float = 30) -> list[dict[str, Any]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.docs) >= count, timeout), self.docs
            return list(self.docs)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def to_serving(daemon: Daemon, be: FakeBackend) -> None:
    c = daemon.cfg
    s = serve_running(c)
    be.next = obs(c, deployed=True, serve=s, endpoint=EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",)))
    for _ in range(4):
        daemon.tick()
    assert sole(daemon).status.phase == Phase.SERVING


def test_paused_it_observes_and_reports_but_acts_on_nothing_and_spends_no_budget(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    to_serving(daemon, be)
    daemon.set_pause(Pause(by="ops", reason="kernel update", at=1.7e9 + clock.t, until=1.7e9 + clock.t + 600))
    daemon.tick()
    assert sole(daemon).status.phase == Phase.PAUSED
    assert notes.sent[-1].startswith("STATUS=PAUSED by ops at ") and "kernel update" in notes.sent[-1]
    doc = statefile.read(str(tmp_path / "state"))
    assert doc["phase"] == "PAUSED" and doc["pause"] is not None and doc["pause"]["by"] == "ops" and "sees SERVING" in doc["reason"]
    # The serve dies during the maintenance: seen and shown, not repaired.
    n = len(be.ran)
    c = daemon.cfg
    be.next = obs(c, deployed=True, serve=replace(serve_running(c), running=False, exit_code=137),
                  endpoint=EndpointObservation(EndpointState.REFUSED))
    for _ in range(3):
        clock.t += 5
        daemon.tick()
    assert len(be.ran) == n and sole(daemon).status.phase == Phase.PAUSED
    assert "would " in sole(daemon).status.reason and sole(daemon).repairs.recent(1.7e9 + clock.t, 3600) == []
    # A restart of the daemon keeps the pause.
    again, be2, clock2, _, _ = make(tmp_path)
    assert again.pause is not None and again.pause.reason == "kernel update"
    # The deadline passes: it resumes by itself, detects afresh and acts.
    clock.t += 600
    daemon.tick()
    assert daemon.pause is None and sole(daemon).status.phase != Phase.PAUSED
    assert statefile.read_pause(str(tmp_path / "state")) is None
    assert any(isinstance(a, StartServe) for a in be.ran[n:]) or len(be.ran) > n


def test_a_daemon_started_under_a_pause_is_ready_and_paused(tmp_path: Path) -> None:
    statefile.write_pause(str(tmp_path / "state"), Pause(by="ops", reason="", at=1.0))
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()
    assert sole(daemon).status.phase == Phase.PAUSED and be.ran == []
    assert any(n.startswith("READY=1\nSTATUS=PAUSED by ops") for n in notes.sent)


def test_pause_and_resume_through_the_control_socket_answer_once_the_loop_took_them(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()  # the state directory exists
    state = str(tmp_path / "state")
    server = control.ControlServer(state, daemon._on_request)
    replies: list[str] = []
    try:
        t = threading.Thread(target=lambda: replies.append(
            control.request(state, "pause", timeout=30, reason="disk swap", by="alice", until=None)))
        t.start()
        # The loop's turn: it takes the request between ticks (here, once it has arrived).
        while not daemon._signals and t.is_alive():
            t.join(0.01)
        daemon.dispatch()
        t.join(30)
        assert replies and "paused by alice (as " in replies[0] and "disk swap" in replies[0]
        assert daemon.pause is not None and "pid " in daemon.pause.by
        t = threading.Thread(target=lambda: replies.append(control.request(state, "resume", timeout=30)))
        t.start()
        while not daemon._signals and t.is_alive():
            t.join(0.01)
        daemon.dispatch()
        t.join(30)
        assert "resumed" in replies[1] and daemon.pause is None
    finally:
        server.close()


@pytest.mark.parametrize("text,seconds", [("30m", 1800), ("1h30m", 5400), ("90s", 90), ("2 hours", 7200),
                                          ("1:30:00", 5400), ("45", 2700)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["abc", "-5m", "0", ""])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        parse_duration(text)


# ------------------------------------------------------------------------------------------- alerts
def test_rate_limit_holds_back_and_counts() -> None:
    r = RateLimit(300)
    assert r.allow(("a", "repair"), 0) == (True, 0)
    assert r.allow(("a", "repair"), 10) == (False, 0)
    assert r.allow(("b", "repair"), 10) == (True, 0)  # another deployment
    assert r.allow(("a", "failed"), 10) == (True, 0)  # another event
    assert r.allow(("a", "repair"), 20) == (False, 0)
    assert r.allow(("a", "repair"), 300) == (True, 2)


def test_the_webhook_is_retried_and_never_logged_whole(receiver: Receiver) -> None:
    receiver.fail_first = 2
    logs = structlog.testing.LogCapture()
    structlog.configure(processors=[logs])
    try:
        a = Alerter(Alerts(webhook=receiver.url, attempts=3, timeout=5), log=structlog.get_logger())
        a.emit("testbed", "failed", phase="FAILED", reason="ImageLacksRay: no ray", reason_kind="ImageLacksRay")
        doc = receiver.wait(1)[0]
        a.close()
    finally:
        structlog.reset_defaults()
    assert receiver.requests == 3
    assert doc["event"] == "failed" and doc["deployment"] == "testbed" and doc["reason_kind"] == "ImageLacksRay"
    assert doc["summary"].endswith("testbed: failed: ImageLacksRay: no ray")
    assert "secret-token" not in json.dumps(logs.entries) and webhook_label(receiver.url) == receiver.url[:22]


def test_an_unreachable_webhook_is_given_up_on_and_logged() -> None:
    logs = structlog.testing.LogCapture()
    structlog.configure(processors=[logs])
    sent: list[tuple[str, str, str, bool]] = []
    try:
        a = Alerter(Alerts(webhook="http://127.0.0.1:9/x", attempts=2, timeout=1), log=structlog.get_logger(),
                    on_sent=lambda *x: sent.append(x))
        a.emit("testbed", "repair", phase="SERVING", reason="ServeExited")
        a.close(timeout=30)
    finally:
        structlog.reset_defaults()
    assert sent == [("testbed", "repair", "webhook", False)]
    assert [e["event"] for e in logs.entries if e["log_level"] == "error"] == ["alert.failed"]


def test_the_command_gets_the_document_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "got.json"
    prog = f"import sys, os; open({str(out)!r}, 'w').write(os.environ['SPARK_ALERT_EVENT'] + sys.stdin.read())"
    a = Alerter(Alerts(command=[sys.executable, "-c", prog]), log=structlog.get_logger())
    a.emit("testbed", "recovered", phase="SERVING", reason="")
    a.close(timeout=30)
    text = out.read_text()
    assert text.startswith("recovered") and json.loads(text[len("recovered"):])["event"] == "recovered"


def test_the_daemon_alerts_on_repair_failed_and_recovery(tmp_path: Path, receiver: Receiver) -> None:
    d = data()
    d["alerts"] = {"webhook": receiver.url, "min_interval": 60}
    daemon, be, clock, notes, _ = make(tmp_path, d)
    to_serving(daemon, be)
    c = daemon.cfg
    dead = replace(serve_running(c), running=False, exit_code=137)
    be.next = obs(c, deployed=True, serve=dead, endpoint=EndpointObservation(EndpointState.REFUSED))
    daemon.tick()  # the serve is gone: a repair
    docs = receiver.wait(1)
    assert docs[0]["event"] == "repair" and docs[0]["budget_used"] == 1 and docs[0]["budget"] == 3
    to_serving(daemon, be)
    docs = receiver.wait(2)
    assert docs[1]["event"] == "recovered" and docs[1]["phase"] == "SERVING"
    daemon.stack.alerter.close()
