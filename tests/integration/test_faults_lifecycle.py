"""The daemon itself interrupted: SIGTERM during a load, SIGKILL in the middle of each phase. Whatever the
moment, the next start converges to one deployment: never two serves, never orphan containers."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import testbed
from spark_testbed.harness import OWNED, Supervisor, containers, serve_processes, write_config
from spark_testbed.testbed import until

SLOW_LOAD = {"serve": {"env": {"STANDIN_SHARDS": "39", "STANDIN_SHARD_SECONDS": "0.2",
                               "STANDIN_FAULT_FILE": str(testbed.DIR / "serve-fault")}}}


def converged(d: Supervisor) -> dict[str, Any]:
    st = d.wait_phase("SERVING", 180)
    for node, name in OWNED.items():
        assert set(containers(node)) == {name}, containers(node)
    assert serve_processes() == 1
    return st


def test_sigterm_during_load_exits_promptly_and_the_next_start_adopts_the_load(
        clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    config = write_config(tmp_path, deployment=SLOW_LOAD)
    first = supervisor(config, "first")
    first.wait(lambda s: s["phase"] == "LOADING" and "shards" in s["progress"], 120, "loading shards")
    serve = first.status()["serve"]  # type: ignore[index]
    first.proc.send_signal(signal.SIGTERM)
    assert first.proc.wait(timeout=10) == 0
    assert any(n.startswith("STOPPING=1") for n in first.notifications)
    assert first.status()["phase"] == "STOPPING"  # type: ignore[index]

    second = supervisor(config, "second")
    st = converged(second)
    assert (st["serve"]["pid"], st["serve"]["started_at"]) == (serve["pid"], serve["started_at"])
    assert not second.events("serve.launched") and not second.events("ray.container_started")


def _first(event: str, **match: str) -> Callable[[Supervisor], bool]:
    return lambda d: any(all(e.get(k) == v for k, v in match.items()) for e in d.events(event))


# The slow load only where the kill falls in the load: a kill before it leaves no load to catch, and the
# testbed's own (39 shards of 0.01 s) is all the restart then waits for.
@pytest.mark.parametrize("phase, moment, load", [
    ("CLEANING", _first("clean.container_removed"), None),
    ("STARTING_RAY", _first("ray.container_started", role="head"), None),
    ("LOADING", _first("load.progress", milestone="shards"), SLOW_LOAD),
])
def test_sigkill_in_the_middle_of_a_phase_then_restart_converges(
        clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path, phase: str,
        moment: Callable[[Supervisor], bool], load: dict[str, Any] | None) -> None:
    for node in testbed.NODES:
        testbed.plant_stale(node)
    config = write_config(tmp_path, deployment=load)
    first = supervisor(config, "first")
    until(lambda: moment(first), 120, f"the middle of {phase}", every=0.05)
    first.proc.kill()
    first.proc.wait(timeout=10)

    second = supervisor(config, "second")
    converged(second)
    launched = sum(e.get("node", "spark-1") == "spark-1" for d in (first, second) for e in d.events("serve.launched"))
    assert launched == 1, "a serve that was already loading is adopted, not launched twice"
