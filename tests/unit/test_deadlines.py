"""Deadlines learned from history (issue 23, item 3): the good loads of a key give the next load of that key its
deadline and stall limit; a first load after a change of the key gets the configured cold budget and says so.
Driven through the daemon with a fake clock, as the loads happen (tests.fakes.make)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from spark_supervisor.cli import status
from spark_supervisor.config import Config
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    EndpointObservation,
    EndpointState,
    LoadLimits,
    NodeObservation,
    Observation,
    Phase,
    ServeObservation,
    StartServe,
)
from spark_supervisor.reconcile import loadtimes
from tests.fakes import Clock, FakeBackend, make
from tests.helpers import cfg, data, node_obs, obs, phase_now, ray_container, serve_running, sole

IMAGE = "sha256:" + "a" * 64
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
REFUSED = EndpointObservation(EndpointState.REFUSED)


# The limits these tests step through (the defaults are wider: 300 s, 120 s, x3).
LEARNING = {"deadline_floor": 120, "stall_floor": 60, "deadline_margin": 2.0}


def learning() -> dict[str, Any]:
    d = data()
    d["deployments"][0]["readiness"] = {**d["deployments"][0].get("readiness", {}), **LEARNING}
    return d


def loads_file(tmp_path: Path) -> Path:
    return tmp_path / "state" / "deployments" / "qwen" / loadtimes.FILE


def deployed(c: Config, image: str = IMAGE, serve: ServeObservation | None = None,
             endpoint: EndpointObservation | None = None, driver: str = "580.95.05") -> Observation:
    """The deployment's containers up, running ``image`` (by ID) on a GPU with ``driver``."""
    nodes: dict[str, NodeObservation] = {}
    for n in c.nodes:
        base = node_obs(n.name)
        assert base.gpu is not None
        nodes[n.name] = node_obs(n.name, (dataclasses.replace(ray_container(c, n.name), image_id=image),),
                                 gpu=dataclasses.replace(base.gpu, driver=driver))
    return obs(c, deployed=True, nodes=nodes, serve=serve, endpoint=endpoint)


def bar(shard: int) -> str:
    return f"Loading safetensors checkpoint shards:  {shard * 100 // 39}% Completed | {shard}/39 [00:40<01:30]\r"


def launch(tmp_path: Path, pid: int = 77, **kw: Any) -> tuple[Daemon, FakeBackend, Clock, ServeObservation]:
    """A fresh daemon that launches the serve and sees it loading (LOADING, just entered)."""
    daemon, be, clock, _, _ = make(tmp_path, learning())
    c = daemon.cfg
    be.next = deployed(c, **kw)
    daemon.tick()
    assert be.ran[-1] == StartServe()
    s = serve_running(c, pid=pid)
    be.next = deployed(c, serve=s, endpoint=REFUSED, **kw)
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.LOADING
    return daemon, be, clock, s


def good_load(tmp_path: Path, seconds: float, pid: int = 77, **kw: Any) -> Daemon:
    """One load launched, LOADING for ``seconds`` without a sign of progress, then SERVING."""
    daemon, be, clock, s = launch(tmp_path, pid, **kw)
    clock.t += seconds
    be.next = deployed(daemon.cfg, serve=s, endpoint=UP, **kw)
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.VERIFYING
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.SERVING
    return daemon


def kept(tmp_path: Path) -> list[dict[str, Any]]:
    doc = json.loads(loads_file(tmp_path).read_text())
    loads: list[dict[str, Any]] = doc["keys"][doc["last"]]["loads"]
    return loads


def test_learning_applies_after_the_configured_number_of_good_loads(tmp_path: Path) -> None:
    for i in range(2):
        good_load(tmp_path, 100, pid=70 + i)
    assert [x["load_s"] for x in kept(tmp_path)] == [100, 100]
    daemon, *_ = launch(tmp_path, pid=72)
    lim = sole(daemon).status.load_limits
    assert lim is not None and not lim.learned and not lim.cold  # the same key, too little history: said, not cold
    assert (lim.deadline, lim.deadline_why) == (3600, "configured cold budget: 2 of 3 good loads recorded for this key")
    good_load(tmp_path, 100, pid=73)
    daemon, *_ = launch(tmp_path, pid=74)
    lim = sole(daemon).status.load_limits
    assert lim == LoadLimits(200, 200, "learned: p95 100s x 2 of 3 good loads", "learned: p95 100s x 2 of 3 good loads",
                             learned=True)


def test_a_tighter_learned_deadline_fires_a_load_timeout_that_says_it_was_learned(tmp_path: Path) -> None:
    for i in range(3):
        good_load(tmp_path, 100, pid=70 + i)
    daemon, be, clock, s = launch(tmp_path, pid=80)
    for shard in range(1, 5):  # it moves (no stall), just too slowly: 4 x 55 s is past the learned 200 s
        clock.t += 55
        be.next = deployed(daemon.cfg, serve=dataclasses.replace(s, log_tail=bar(shard)), endpoint=REFUSED)
        daemon.tick()
    assert sole(daemon).status.reason.startswith("LoadTimeout: not ready after 200s (learned: p95 100s x 2 of 3 good loads; ")
    assert sole(daemon).repairs.recent(daemon.wall(), 3600)
    assert len(kept(tmp_path)) == 3  # a failed load is never kept


def test_a_learned_stall_limit_fires_a_load_stall_that_says_it_was_learned(tmp_path: Path) -> None:
    for i in range(3):
        good_load(tmp_path, 25, pid=70 + i)  # silent for 25 s at most: 2 x 25 s is below the 60 s floor
    daemon, be, clock, s = launch(tmp_path, pid=80)
    lim = sole(daemon).status.load_limits
    assert lim is not None and lim.stall == 60 and lim.stall_why == "learned: stall_floor 60s (p95 25s x 2 of 3 good loads is below it)"
    clock.t += 61
    daemon.tick()
    assert sole(daemon).status.reason.startswith("LoadStalled: no progress for 60s (learned: stall_floor 60s")


def test_a_first_start_after_an_image_change_gets_the_cold_budget_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        good_load(tmp_path, 100, pid=70 + i)
    new = "sha256:" + "b" * 64
    with capture_logs() as logs:
        daemon, be, clock, s = launch(tmp_path, pid=80, image=new)
        clock.t += 800  # far past the learned 200 s, within the cold budget (and its 900 s stall limit)
        be.next = deployed(daemon.cfg, serve=s, endpoint=REFUSED, image=new)
        daemon.tick()
    said = "cold start expected: image changed since the last load"
    lim = sole(daemon).status.load_limits
    assert lim == LoadLimits(3600, 900, "configured cold budget", "configured cold budget", said)
    assert phase_now(sole(daemon).status) == Phase.LOADING
    assert [x["cold"] for x in logs if x["event"] == "load.limits"] == [said]  # logged once
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["load_limits"]["cold"] == said
    status._print_status(doc)
    out = capsys.readouterr().out
    assert f"  {said}\n  deadline 3600s (configured cold budget), stall limit 900s" in out
    # Made good, the new image's load is the last: its next start is no longer cold (and has its own history).
    be.next = deployed(daemon.cfg, serve=s, endpoint=UP, image=new)
    daemon.tick()
    daemon.tick()
    daemon, *_ = launch(tmp_path, pid=81, image=new)
    lim = sole(daemon).status.load_limits
    assert lim is not None and not lim.cold and lim.deadline_why.endswith("1 of 3 good loads recorded for this key")


def test_a_driver_change_is_named_too(tmp_path: Path) -> None:
    good_load(tmp_path, 100)
    daemon, *_ = launch(tmp_path, pid=80, driver="590.10.01", image="sha256:" + "c" * 64)
    lim = sole(daemon).status.load_limits
    assert lim is not None and lim.cold == "cold start expected: image and driver changed since the last load"


def test_a_load_that_missed_its_learned_deadline_gives_the_next_the_cold_budget(tmp_path: Path) -> None:
    for i in range(3):
        good_load(tmp_path, 100, pid=70 + i)
    daemon, be, clock, s = launch(tmp_path, pid=80)
    clock.t += 201
    daemon.tick()
    assert sole(daemon).status.reason.startswith("LoadStalled: no progress for 200s (learned:")
    be.next = deployed(daemon.cfg)  # stopped; launched again once the repair's backoff has passed
    for _ in range(5):
        clock.t += 60
        daemon.tick()
    assert be.ran[-1] == StartServe()
    be.next = deployed(daemon.cfg, serve=serve_running(daemon.cfg, pid=81), endpoint=REFUSED)
    daemon.tick()
    lim = sole(daemon).status.load_limits
    assert phase_now(sole(daemon).status) == Phase.LOADING and lim is not None and not lim.learned
    assert lim.cold == "cold start expected: the last load missed its learned stall limit"


def test_a_load_found_under_way_is_not_timed(tmp_path: Path) -> None:
    """A daemon started mid-load (a restart of the supervisor) cannot tell how long it has loaded."""
    daemon, be, clock, _, _ = make(tmp_path, learning())
    s = serve_running(daemon.cfg)
    be.next = deployed(daemon.cfg, serve=s, endpoint=REFUSED)
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.LOADING
    clock.t += 30
    be.next = deployed(daemon.cfg, serve=s, endpoint=UP)
    daemon.tick()
    daemon.tick()
    assert phase_now(sole(daemon).status) == Phase.SERVING and not loads_file(tmp_path).exists()


def test_a_damaged_loads_file_is_ignored_not_fatal(tmp_path: Path) -> None:
    f = loads_file(tmp_path)
    f.parent.mkdir(parents=True)
    f.write_text("{not json")
    daemon, *_ = launch(tmp_path)
    lim = sole(daemon).status.load_limits
    assert lim is not None and lim.cold == "cold start expected: no good load recorded yet"
    good_load(tmp_path, 100, pid=78)
    doc = json.loads(f.read_text())
    doc["keys"][doc["last"]]["loads"] += [{"load_s": "a", "gap_s": 1}, 7, None, {"load_s": True, "gap_s": 1},
                                          {"load_s": 50}, {"load_s": -1, "gap_s": 1}]
    doc["keys"]["junk"] = []
    f.write_text(json.dumps(doc))
    daemon, *_ = launch(tmp_path, pid=79)  # only the well-formed load counts
    lim = sole(daemon).status.load_limits
    assert lim is not None and lim.deadline_why.endswith(": 1 of 3 good loads recorded for this key")
    good_load(tmp_path, 90, pid=80)  # written afresh without what was malformed
    assert [x["load_s"] for x in kept(tmp_path)] == [100, 90] and "junk" not in json.loads(f.read_text())["keys"]


def test_the_history_stays_bounded(tmp_path: Path) -> None:
    state = str(tmp_path)
    for i in range(loadtimes.KEEP + 5):
        loadtimes.record(state, "k", {"model": "m"}, 100 + i, 10, 1.7e9 + i)
    for j in range(loadtimes.KEYS + 3):
        loadtimes.record(state, f"other{j}", {"model": "m"}, 50, 5, 1.8e9 + j)
    doc = json.loads((tmp_path / loadtimes.FILE).read_text())
    assert len(doc["keys"]) == loadtimes.KEYS and "k" not in doc["keys"]  # the oldest keys went first
    assert doc["last"] == f"other{loadtimes.KEYS + 2}"
    loadtimes.record(state, "k", {"model": "m"}, 1, 1, 1.9e9)
    for i in range(loadtimes.KEEP + 5):
        loadtimes.record(state, "k", {"model": "m"}, 100 + i, 10, 1.9e9 + i)
    loads = loadtimes.history(json.loads((tmp_path / loadtimes.FILE).read_text()), "k")
    assert len(loads) == loadtimes.KEEP and loads[0][0] == 105 and loads[-1][0] == 124


def test_limits_are_never_above_the_configured_budget_and_learning_can_be_turned_off() -> None:
    r = cfg(learning()).deployment.readiness
    doc = {"last": "k", "keys": {"k": {"loads": [{"load_s": 2000, "gap_s": 10}] * 3}}}
    lim = loadtimes.limits(r, doc, "k", {})
    assert lim.deadline == 3600 and lim.deadline_why == "configured cold budget (learned p95 2000s x 2 of 3 good loads is not below it)"
    assert lim.stall == 60
    off = loadtimes.limits(r.model_copy(update={"learn_deadlines": False}), doc, "k", {})
    assert (off.deadline, off.stall, off.learned, off.cold) == (3600, 900, False, "")
    assert loadtimes.p95([float(x) for x in range(1, 21)]) == 19 and loadtimes.p95([3.0]) == 3
