"""`spark-supervisor restart [DEPLOYMENT] [--serve-only]`: the operator's relaunch, carried out by the loop,
shown with who asked and never charged to the repair budget (issue 22, item 4). The daemon's side, on fakes;
over the real control socket and the testbed: tests/integration/test_operator.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import Kind, Phase, StartContainer, StartServe, StopServe
from tests.fakes import FakeBackend
from tests.helpers import obs
from tests.unit.test_stack import EMBED, make, serving, stack, ticks_until


def two_serving(tmp_path: Path) -> tuple[Daemon, dict[str, FakeBackend]]:
    daemon, be, clock, _, path = make(tmp_path, stack({**EMBED, "after": []}))
    serving(daemon, be, "qwen")
    serving(daemon, be, "embed")
    ticks_until(daemon, lambda: daemon.status_line() == "SERVING 2/2 deployments")
    for b in be.values():
        b.ran.clear()
    return daemon, be


def test_a_serve_only_restart_stops_the_serve_and_launches_it_again_without_a_repair(tmp_path: Path) -> None:
    daemon, be = two_serving(tmp_path)
    q = daemon.reconcilers["qwen"]
    answer = daemon._request("restart", {"deployment": "qwen", "serve_only": True, "by": "alice, pid 42"})
    assert answer == "qwen: serve stopped; starting again (serve-only restart asked by alice, pid 42)"
    assert be["qwen"].ran == [StopServe("serve-only restart asked by alice, pid 42")] and be["embed"].ran == []
    assert q.status.why.kind == Kind.RESTARTING and q.status.phase.value == "STARTING_VLLM"
    v = q.view.cfg
    be["qwen"].next = obs(v, deployed=True)  # the serve gone, the containers there
    daemon.tick()
    assert StartServe() in be["qwen"].ran
    serving(daemon, be, "qwen")
    ticks_until(daemon, lambda: q.status.phase == Phase.SERVING)
    assert not q.repairs.entries and q.status.repairs_in_window == 0  # a start, not a repair
    assert daemon.reconcilers["embed"].status.phase == Phase.SERVING


def test_a_full_restart_tears_down_and_starts_as_on_a_boot(tmp_path: Path) -> None:
    daemon, be = two_serving(tmp_path)
    torn: list[str] = []

    def teardown() -> list[str]:
        torn.append("qwen")
        return ["spark-1/qwen-ray-spark-1"]
    be["qwen"].teardown = teardown  # type: ignore[method-assign]
    daemon._request("restart", {"deployment": "", "serve_only": False, "by": "bob, pid 7"})
    assert torn == ["qwen"] and daemon.reconcilers["qwen"].status.phase == Phase.DETECTING
    be["qwen"].next = obs(daemon.reconcilers["qwen"].view.cfg)  # nothing of it left
    daemon.tick()
    assert StartContainer("spark-1") in be["qwen"].ran  # started, not repaired (DeploymentLost)
    assert not daemon.reconcilers["qwen"].repairs.entries


def test_an_unknown_deployment_is_refused_and_nothing_is_stopped(tmp_path: Path) -> None:
    daemon, be = two_serving(tmp_path)
    with pytest.raises(ValueError, match="no deployment 'nope'"):
        daemon._request("restart", {"deployment": "nope", "serve_only": True, "by": "?"})
    assert all(b.ran == [] for b in be.values())


def test_a_restart_while_paused_is_refused_and_stops_nothing(tmp_path: Path) -> None:
    """Issue 42 (LOW): paused, a restart would stop the serve and start nothing until a resume; refused."""
    from spark_supervisor.model import Pause
    daemon, be = two_serving(tmp_path)
    daemon.set_pause(Pause(by="bob", reason="disk swap", at=1.7e9))
    with pytest.raises(ValueError, match="paused by bob.*resume first"):
        daemon._request("restart", {"deployment": "qwen", "serve_only": True, "by": "alice, pid 42"})
    assert be["qwen"].ran == [] and be["embed"].ran == []
    daemon.set_pause(None, "by bob")
    assert daemon._request("restart", {"deployment": "qwen", "serve_only": True, "by": "alice"}).startswith(
        "qwen: serve stopped; starting again")
