"""A busy engine is not a wedged one, on the testbed (issue 42, items 2 and 3). The serve runs one request at a
time (--max-num-seqs 1) at a slow decode ("slow 3"), and a client keeps that slot busy with long streamed
requests, reconnecting the moment a serve is back, as agent fleets do. Every probe then times out behind the
client while tokens flow: busy, never a repair -- neither while SERVING nor in VERIFYING after a restart. A
stuck scheduler (requests accepted and held waiting, nothing running, nothing moving) is a stall, caught and
repaired. Short timeouts keep this to a few minutes; the same load under the daemon's defaults is held for
several minutes in `make bench`."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spark_testbed.harness import (
    BIN,
    Streams,
    Supervisor,
    event_time,
    fault_file,
    verify_serving,
    write_config,
)
from tests.integration.conftest import reset_testbed

pytestmark = pytest.mark.testbed

FAULT = fault_file()
PATCH = {"supervisor": {"interval": 2, "transition_interval": 1, "backoff_base": 0.5, "backoff_max": 2},
         "healing": {"quick_check_interval": 1, "deep_probe_interval": 5, "deep_probe_timeout": 3,
                     "deep_failure_threshold": 2, "heartbeat_stall": 8, "repair_budget": 50}}
DEPLOYMENT = {"serve": {"extra_args": ["--max-num-seqs", "1"]}}


@pytest.fixture(scope="module")
def daemon(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    reset_testbed()
    FAULT.unlink(missing_ok=True)
    tmp = tmp_path_factory.mktemp("busy")
    d = Supervisor(write_config(tmp, PATCH, deployment=DEPLOYMENT), tmp)
    d.wait_phase("SERVING", 240)
    yield d
    FAULT.unlink(missing_ok=True)
    if d.proc.poll() is None:
        d.stop(signal.SIGKILL)
    reset_testbed()


def engine(st: dict[str, Any]) -> dict[str, Any]:
    return dict(st["liveness"].get("engine") or {})


def events_since(d: Supervisor, name: str, t: float) -> list[dict[str, Any]]:
    return [e for e in d.events(name) if event_time(e) >= t]


def held_serving(d: Supervisor, agent: Streams, seconds: float) -> list[str]:
    """Every status for ``seconds`` SERVING (or VERIFYING on the way back to it) with no repair; its reasons."""
    reasons: list[str] = []
    end = time.time() + seconds

    def check(s: dict[str, Any]) -> bool:
        assert s["phase"] in ("SERVING", "VERIFYING"), f"{s['phase']}: {s['reason']}"
        reasons.append(s["reason"])
        return time.time() > end and sum(agent.tokens) > 0
    d.wait(check, seconds + 60, f"{seconds:.0f} s under the load")
    return reasons


def test_a_saturated_engine_is_busy_never_repaired_serving_and_after_a_restart(daemon: Supervisor) -> None:
    d = daemon
    verify_serving(d)
    t = time.time()
    FAULT.write_text("slow 3\n")
    agent = Streams(d, 1, again=True)
    try:
        d.wait(lambda s: engine(s).get("running", 0) >= 1, 60, "the client's request seen running")
        reasons = held_serving(d, agent, 25)
        busy = events_since(d, "probe.deep_busy", t)
        assert len(busy) >= 2 and not events_since(d, "probe.deep_failed", t), busy
        assert any("busy: probe waited behind 1 running" in r for r in reasons), reasons[-5:]
        assert not d.repairs(t), [r["reason"] for r in d.repairs(t)]
        # A restart (the operator's): the client takes the slot the moment the new serve listens, and the
        # sanity completion waits behind it. Proven by the tokens the engine makes for the client meanwhile.
        restarted = time.time()
        out = subprocess.run([str(BIN / "spark-supervisor"), "restart", "--serve-only", "--config", str(d.config)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        d.wait(lambda s: s["phase"] == "SERVING" and bool(events_since(d, "probe.sanity_passed", restarted)), 180,
               "SERVING again behind the client")
        held_serving(d, agent, 10)
        assert not d.repairs(t), [r["reason"] for r in d.repairs(t)]  # the operator's restart is no repair
        assert not events_since(d, "probe.sanity_failed", restarted) and not events_since(d, "probe.deep_failed", t)
        print(f"{sum(agent.tokens)} tokens streamed; {len(events_since(d, 'probe.deep_busy', t))} busy deep probes")
    finally:
        FAULT.unlink(missing_ok=True)
        agent.close()
    d.wait(lambda s: s["phase"] == "SERVING" and engine(s).get("running", 0) == 0, 60, "idle SERVING")


def test_a_stuck_scheduler_with_requests_waiting_is_a_stall_caught_and_repaired(daemon: Supervisor) -> None:
    d = daemon
    verify_serving(d)
    t = time.time()
    FAULT.write_text("scheduler-stall\n")
    users = Streams(d, 2)
    try:
        d.wait(lambda s: engine(s).get("waiting", 0) >= 2 and engine(s).get("running", 1) == 0, 60,
               "the requests held waiting, none running")
        d.wait(lambda _: bool(d.repairs(t)), 120, "the repair")
        r = d.repairs(t)[0]
        assert r["kind"] == "serve" and r["reason"].startswith("ServeWedged: the engine's heartbeat stopped"), r
        assert re.search(r"\(0 requests running, [2-9] waiting", r["reason"]), r["reason"]  # the probes wait too
        stalled = min(event_time(e) for e in events_since(d, "engine.heartbeat_stalled", t))
        print(f"stall flagged {stalled - t:.1f}s after the fault; repair started {event_time(r) - t:.1f}s after")
    finally:
        FAULT.unlink(missing_ok=True)
        users.close()
    d.wait(lambda s: s["phase"] == "SERVING" and event_time({"timestamp": s["since"]}) > t, 240, "SERVING again")
    verify_serving(d)
