"""A tick derives what it reads of its observation once (plan.seen.derive): the serve's log is scanned
once, the unknowns read once and /health judged once, for the trackers, the plan, the quick watch and the
status document alike, and what it derives is what each would have read for itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.judge import completion, logscan
from spark_supervisor.model import EndpointObservation, EndpointState, Phase, RayObservation, Status
from spark_supervisor.plan import derive, plan, unknowns
from spark_supervisor.plan import seen as seen_mod
from spark_supervisor.plan import unknown as unknown_mod
from tests.fakes import make
from tests.helpers import cfg, obs, serve_running, view_of

LOG = ("INFO 12-02 10:00:00 [loader.py:1] Loading safetensors checkpoint shards:  50% Completed | 15/30 "
       "[00:30<00:30,  2.00s/it]\n")


def counted(monkeypatch: pytest.MonkeyPatch, calls: Counter[str], where: object, name: str) -> None:
    real: Callable[..., Any] = getattr(where, name)

    def count(*a: Any, **k: Any) -> Any:
        calls[name] += 1
        return real(*a, **k)
    monkeypatch.setattr(where, name, count)


def test_one_tick_reads_the_log_the_unknowns_and_health_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    be.next = obs(c, deployed=True, serve=serve_running(c, LOG), endpoint=EndpointObservation(EndpointState.REFUSED))
    calls: Counter[str] = Counter()
    counted(monkeypatch, calls, logscan, "scan")
    for where in (seen_mod, unknown_mod):  # the tick's reading, and the planner's own when it has none
        counted(monkeypatch, calls, where, "unknowns")
    for where in (seen_mod, completion):
        counted(monkeypatch, calls, where, "health_result")
    daemon.tick()  # one tick of the one deployment, its status document written
    assert (tmp_path / "state" / "status.json").exists()
    assert calls == Counter(scan=1, unknowns=1, health_result=1), calls


@pytest.mark.parametrize("phase", [Phase.DETECTING, Phase.LOADING, Phase.STARTING_RAY, Phase.SERVING])
def test_what_is_derived_is_what_each_would_read(phase: Phase) -> None:
    c = cfg()
    o = obs(c, deployed=True, serve=serve_running(c, LOG), endpoint=EndpointObservation(EndpointState.UP, health=200))
    s = derive(o, phase, view_of(c))
    assert s.progress == logscan.scan(LOG) and s.unknown == unknowns(o, view_of(c), phase)
    assert s.health == completion.health_result(o.endpoint)
    st = Status()
    st.phase = phase
    assert plan(o, st, view_of(c), 10.0, s) == plan(o, st, view_of(c), 10.0)


def test_a_plan_for_another_phase_reads_its_own_unknowns() -> None:
    """A paused tick plans for the phase it paused from, and a second pass after image checks for the phase
    the first reached: the tick's unknowns (read for its starting phase) are not theirs."""
    c = cfg()
    o = obs(c, deployed=True, ray=RayObservation(False, "RayDashboardUnreachable: timed out"))
    loading = derive(o, Phase.LOADING, view_of(c))
    assert "ray dashboard" in loading.unknown and "ray dashboard" not in unknowns(o, view_of(c), Phase.STARTING_RAY)
    assert seen_mod.unknown_in(loading, o, view_of(c), Phase.STARTING_RAY) == unknowns(o, view_of(c), Phase.STARTING_RAY)
    assert seen_mod.unknown_in(loading, o, view_of(c), Phase.LOADING) is loading.unknown
