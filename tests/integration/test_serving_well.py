"""Serving well, on the testbed (issue 23): the performance verdict after a start and on a schedule while idle,
and the engine's heartbeat as liveness, with the watch at the production defaults (5 s ticks, 1 s quick
checks, a 60 s deep probe with a 30 s timeout, a 20 s heartbeat stall). The stand-in serves at a settable
speed, holds its requests with its counters frozen in its wedge mode and answers /health late in its
slow-health mode (its /metrics and stream held to the real server's by tests/unit/test_standin_perf.py).
One bring-up, shared: each test starts from a verified SERVING and leaves one behind."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
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
DEFAULTS = {"supervisor": {"interval": 5, "transition_interval": 1},
            "healing": {"quick_check_interval": 1, "deep_probe_interval": 60, "deep_probe_timeout": 30,
                        "heartbeat_stall": 20}}
REMEASURE_S = 15  # the verdict's schedule, short here so a test can see it


@pytest.fixture(scope="module")
def daemon(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    reset_testbed()
    tmp = tmp_path_factory.mktemp("serving-well")
    # A load the daemon's ticks see (the testbed's 39 x 0.01 s can be over before the first one after the launch,
    # and a load never seen LOADING gets no limits): the last test reads the limits its load was given.
    config = write_config(tmp, DEFAULTS, deployment={"performance": {"interval": REMEASURE_S},
                                                     "serve": {"env": {"STANDIN_SHARD_SECONDS": "0.1"}}})
    d = Supervisor(config, tmp)
    d.wait_phase("SERVING", 240)
    yield d
    FAULT.unlink(missing_ok=True)
    if d.proc.poll() is None:
        d.stop(signal.SIGKILL)
    reset_testbed()


def engine(st: dict[str, Any]) -> dict[str, Any]:
    return dict(st["liveness"].get("engine") or {})


def since(st: dict[str, Any]) -> float:
    return datetime.fromisoformat(st["since"]).timestamp()


def measured(d: Supervisor, after: float) -> list[dict[str, Any]]:
    return [e for e in d.events("perf.measured") if event_time(e) >= after]


def serving_again(d: Supervisor, t: float, timeout: float = 240) -> dict[str, Any]:
    st = d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, timeout, "SERVING again")
    verify_serving(d)
    return st


def test_a_start_is_measured_and_a_slow_one_is_degraded_never_repaired(daemon: Supervisor) -> None:
    d = daemon
    verify_serving(d)
    st = d.wait(lambda s: bool((s.get("performance") or {}).get("decode_tps")), 60, "the verdict after the start")
    fast = st["performance"]
    assert fast["ttft_s"] > 0 and fast["decode_tps"] > 50 and not fast["regression"], fast  # the stand-in: 200 tok/s
    t = time.time()
    FAULT.write_text("slow 20\n")  # the next serve decodes at a tenth of the speed: a degraded cable, say
    try:
        out = subprocess.run([str(BIN / "spark-supervisor"), "restart", "--serve-only", "--config", str(d.config)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        st = d.wait(lambda s: s["phase"] == "DEGRADED" and since(s) > t, 240, "DEGRADED on the slow serve")
        assert st["reason_kind"] == "ThroughputRegression", st["reason"]
        assert "tok/s, best" in st["reason"] and "for this spec" in st["reason"], st["reason"]
        assert st["performance"]["decode_tps"] < fast["decode_tps"] * 0.75, st["performance"]
        status = subprocess.run([str(BIN / "spark-supervisor"), "status", "--config", str(d.config)],
                                capture_output=True, text=True, timeout=30)
        assert "performance: REGRESSION: " in status.stdout, status.stdout
        assert not d.repairs(t), "slow is shown and alerted, never repaired"
    finally:
        FAULT.unlink(missing_ok=True)
    # Back to speed: the next measurement while idle (on its schedule) clears it, with nothing restarted.
    st = d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, REMEASURE_S + 90, "SERVING after a re-measure")
    assert not st["performance"]["regression"] and not d.repairs(t)


def test_the_scheduled_measurement_waits_while_users_are_served(daemon: Supervisor) -> None:
    d = daemon
    verify_serving(d)
    users = Streams(d, 1)
    try:
        d.wait(lambda s: engine(s).get("running", 0) >= 1, 60, "the user's request seen running")
        t = time.time()
        # Past the verdict's schedule by two ticks, with the request running all along: nothing measured.
        d.wait(lambda s: time.time() > t + REMEASURE_S + 10 and engine(s).get("running", 0) >= 1, REMEASURE_S + 60,
               "the schedule passed with the request running")
        assert users.threads[0].is_alive() and not measured(d, t), "measured while a user was served"
    finally:
        users.close()
    d.wait(lambda _: bool(measured(d, t)), 60, "the measurement once idle")
    verify_serving(d)


def test_a_wedge_with_requests_held_is_caught_by_the_heartbeat_and_the_serve_repaired(daemon: Supervisor) -> None:
    d = daemon
    st = verify_serving(d)
    users = Streams(d, 2)
    try:
        d.wait(lambda s: engine(s).get("running", 0) >= 2, 60, "the users' requests seen running")
        t = time.time()
        FAULT.write_text("wedge\n")
        d.wait(lambda _: bool([e for e in d.events("engine.heartbeat_stalled") if event_time(e) >= t]), 120,
               "the heartbeat's stall")
        caught = min(event_time(e) for e in d.events("engine.heartbeat_stalled") if event_time(e) >= t)
        d.wait(lambda _: bool(d.repairs(t)), 120, "the repair")
        r = d.repairs(t)[0]
        assert r["kind"] == "serve" and r["reason"].startswith("ServeWedged: the engine's heartbeat stopped"), r
        print(f"wedge caught {caught - t:.1f}s after it began; repair started {event_time(r) - t:.1f}s after")
    finally:
        FAULT.unlink(missing_ok=True)
        users.close()
    assert serving_again(d, t)["since"] != st["since"]


def test_a_slow_health_under_load_is_no_failure_while_tokens_flow(daemon: Supervisor) -> None:
    d = daemon
    verify_serving(d)
    users = Streams(d, 2)
    t = time.time()
    try:
        d.wait(lambda s: engine(s).get("running", 0) >= 2, 60, "the users' requests seen running")
        FAULT.write_text("slow-health 40\n")
        slow = time.time()
        # Longer than the heartbeat's stall (20 s) and than two /health failures at 5 s ticks, with tokens flowing.
        d.wait(lambda s: time.time() > slow + 25 and engine(s).get("running", 0) >= 2, 120, "25 s of slow /health")
        st = d.status()
        assert st is not None and st["phase"] == "SERVING", st and st["reason"]
        assert st["liveness"]["health"]["last"] in ("unknown", "success"), st["liveness"]
        assert users.tokens[0] > 0 and not d.repairs(t), "a slow /health with tokens flowing is no failure"
    finally:
        FAULT.unlink(missing_ok=True)
        users.close()
    verify_serving(d)


def test_the_status_file_names_the_verdict_and_the_heartbeat(daemon: Supervisor) -> None:
    verify_serving(daemon)
    # The engine's figures reach the file at its refresh (they move every tick: not news by themselves).
    st = daemon.wait(lambda s: engine(s).get("read") and engine(s).get("running") == 0, 90, "the engine idle, read")
    assert st["performance"]["best_tps"] > 0 and st["performance"]["reference"] in ("best", "")


def test_a_first_start_after_an_image_change_gets_the_cold_budget_and_says_so(daemon: Supervisor) -> None:
    """Deadlines learned from history: a reload to an image with other content (a new image ID; here the
    same files committed anew) is a new key; its first load gets the configured cold budget, and says why.
    Last in the module: the deployment it leaves runs the new image."""
    import tomllib

    import tomli_w

    from spark_testbed import testbed
    d = daemon
    verify_serving(d)
    cold = "spark-testbed/hostfs:cold"
    for node in testbed.NODES:  # a new image ID, the same content: a never-started container of it, committed
        testbed.docker(node, "create", "--name", "cold-source", testbed.HOSTFS, "true")
        testbed.docker(node, "commit", "cold-source", cold)
        testbed.docker(node, "rm", "-f", "cold-source")
    good = d.config.read_text()
    doc = tomllib.loads(good)
    doc["deployments"][0]["ray"]["image"] = cold
    t = time.time()
    try:
        d.config.write_text(tomli_w.dumps(doc))
        d.proc.send_signal(signal.SIGHUP)
        serving_again(d, t, 300)
        limits = [e for e in d.events("load.limits") if event_time(e) >= t]
        assert limits and limits[-1]["cold"] == "cold start expected: image changed since the last load", limits
        assert limits[-1]["deadline"].startswith("configured cold budget"), limits[-1]
        assert not d.repairs(t)
    finally:
        d.config.write_text(good)
        for node in testbed.NODES:
            testbed.docker(node, "rmi", "-f", cold, check=False)
