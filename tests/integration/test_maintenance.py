"""Alerts to a real local HTTP receiver, and maintenance mode, on the testbed: a repair and its recovery
are announced; `teardown` on a running daemon pauses it first, so the removal is seen and reported but
neither repaired nor charged to the budget; `resume` brings the deployment back."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import testbed
from spark_testbed.harness import BIN, OWNED, Supervisor, containers, write_config
from tests.unit.test_maintenance import Receiver

EVENTS = ["failed", "degraded", "repair", "recovered", "paused", "resumed"]


def cli(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def now(d: Supervisor) -> dict[str, Any]:
    """The daemon's status document as it is now (one is written by then)."""
    doc = d.status()
    assert doc is not None
    return doc


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_alerts_then_a_teardown_under_pause_spends_no_budget(
        supervisor: Callable[..., Supervisor], tmp_path: Path, receiver: Receiver) -> None:
    d = supervisor(write_config(tmp_path, {"alerts": {"webhook": receiver.url, "events": EVENTS,
                                                      "min_interval": 1}}))
    d.wait_phase("SERVING", 240)
    conf = str(d.config)

    # A repair and its recovery, each announced.
    testbed.docker("spark-1", "exec", OWNED["spark-1"], "sh", "-c", "kill -9 $(cat /tmp/spark-supervisor/testbed/pid)")
    docs = receiver.wait(2, timeout=180)
    assert [x["event"] for x in docs[:2]] == ["repair", "recovered"], docs
    assert docs[0]["deployment"] == "testbed" and docs[0]["budget_used"] == 1
    st = d.wait_phase("SERVING", 120)
    used = st["repairs"]["in_window"]
    repairs_before = len(d.repairs())

    # teardown while it serves: paused first, then everything removed.
    out = cli("teardown", "-c", conf)
    assert out.returncode == 0, out.stderr
    assert "paused by " in out.stdout and "removed " in out.stdout, out.stdout
    for node in testbed.NODES:
        assert OWNED[node] not in containers(node)
    # The loss is seen and reported (what it would do), and nothing is done about it.
    st = d.wait(lambda s: s["phase"] == "PAUSED" and "would " in s["reason"], 60, "PAUSED, seeing the loss")
    assert st["pause"]["reason"] == "teardown" and st["reason"].startswith("Paused: by ")
    assert receiver.wait(3)[2]["event"] == "paused"
    status = cli("status", "-c", conf)
    assert status.stdout.startswith("PAUSED") and "would " in status.stdout, status.stdout
    seen = now(d)["daemon"]["updated"]
    d.wait(lambda s: s["daemon"]["updated"] != seen, 60, "another pass while paused")
    assert all(OWNED[node] not in containers(node) for node in testbed.NODES), "nothing was started while paused"
    assert len(d.repairs()) == repairs_before and now(d)["repairs"]["in_window"] == used, "no budget spent"

    # resume: detected afresh, brought up again, announced.
    out = cli("resume", "-c", conf)
    assert out.returncode == 0 and "resumed" in out.stdout, out
    d.wait_phase("SERVING", 240)
    assert "resumed" in [x["event"] for x in receiver.wait(4)]
    assert now(d)["repairs"]["in_window"] == used
