"""Unified memory (GB10): admission on MemFree, the page cache dropped when it is what stands in the way,
vLLM's free-memory refusal classified by its cause. One situation at a time, fake clock."""

from dataclasses import replace
from typing import Any

from spark_supervisor.config import Config
from spark_supervisor.model import (
    DropPageCache,
    Memory,
    NodeObservation,
    Phase,
    Reason,
    ServeObservation,
    StartContainer,
    StartServe,
    Status,
    StopServe,
)
from spark_supervisor.plan import plan
from tests.helpers import cfg, data, images, node_obs, obs, ray_ok, serve_running, view_of

C = cfg()  # gpu_memory_utilization 0.85 of 122880 MiB: vLLM asks for 104448 MiB
FREE = Memory(122880, 118000, 117000, 800)
CACHE_FULL = Memory(122880, 118000, 40000, 78000)  # MemFree short, MemAvailable enough: the page cache
SHORT = Memory(122880, 60000, 20000, 40000)  # MemAvailable short too
REFUSED = ("(EngineCore pid=1) ERROR 12-02 10:00:00 [core.py:1] ValueError: Free memory on device cuda:0 "
           "(39.06/120.00 GiB) on startup is less than desired GPU memory utilization (0.85, 102.00 GiB).\n")


def st(phase: Phase = Phase.DETECTING, since: float = 0.0, **kw: Any) -> Status:
    kw.setdefault("images", images(C))
    s = Status(**kw)
    s.advance(phase, Reason(), since, since)
    return s


def nodes(m2: Memory, m1: Memory = FREE, deployed: bool = False) -> dict[str, NodeObservation]:
    from tests.helpers import ray_container
    return {"spark-1": node_obs("spark-1", (ray_container(C, "spark-1"),) if deployed else (), memory=m1),
            "spark-2": node_obs("spark-2", (ray_container(C, "spark-2"),) if deployed else (), memory=m2)}


def test_a_page_cache_in_the_way_is_dropped_before_anything_starts() -> None:
    d = plan(obs(C, nodes=nodes(CACHE_FULL)), st(), view_of(C), 1)
    assert d.phase == Phase.CLEANING and d.actions == (DropPageCache("spark-2", "page cache in the way"),)
    assert d.reason.startswith("PageCacheInTheWay: spark-2: MemFree 40000 MiB, Cached 78000 MiB, "
                               "MemAvailable 118000 MiB; vLLM will ask for 104448 MiB")
    assert not d.repair and not d.fatal


def test_with_the_drop_disabled_it_is_failed_with_the_numbers() -> None:
    d0 = data()
    d0["memory"] = {"page_cache": "never"}
    c = cfg(d0)
    d = plan(obs(c, nodes=nodes(CACHE_FULL)), st(), view_of(c), 1)
    assert d.fatal and d.reason.startswith("FreeMemoryBelowUtilization: spark-2: MemFree 40000 MiB")
    assert "page_cache = \"never\"" in d.reason and not d.actions


def test_still_short_after_a_drop_is_failed_not_a_drop_loop() -> None:
    d = plan(obs(C, nodes=nodes(CACHE_FULL)), st(page_cache_dropped=frozenset({"spark-2"})), view_of(C), 1)
    assert d.fatal and "even after dropping the page cache" in d.reason and not d.actions


def test_memavailable_short_waits_then_fails_without_dropping() -> None:
    d = plan(obs(C, nodes=nodes(SHORT)), st(Phase.CLEANING), view_of(C), 1)
    assert d.phase == Phase.CLEANING and d.reason.startswith("WaitingForGpuMemory") and not d.actions
    d = plan(obs(C, nodes=nodes(SHORT)), st(Phase.CLEANING), view_of(C), 2 + C.stale.memory_free_timeout)
    assert d.fatal and d.reason.startswith("GpuMemoryHeld") and not d.actions


def test_free_memory_everywhere_starts() -> None:
    assert plan(obs(C, nodes=nodes(FREE)), st(), view_of(C), 1).actions == (StartContainer("spark-1"), StartContainer("spark-2"))


def test_every_serve_launch_is_admitted_on_a_full_observation() -> None:
    o = obs(C, nodes=nodes(CACHE_FULL, deployed=True), ray=ray_ok(C), full=False)
    d = plan(o, st(Phase.STARTING_VLLM), view_of(C), 1)
    assert d.phase == Phase.STARTING_VLLM and not d.actions  # no launch on an observation without memory
    d = plan(replace(o, full=True), st(Phase.STARTING_VLLM), view_of(C), 1)
    assert d.actions == (DropPageCache("spark-2", "page cache in the way"),)
    d = plan(obs(C, nodes=nodes(FREE, deployed=True), ray=ray_ok(C)), st(Phase.STARTING_VLLM), view_of(C), 1)
    assert d.actions == (StartServe(),)


def _refused(c: Config = C) -> ServeObservation:
    return ServeObservation(True, 77, "id-spark-1", False, 1, serve_running(c).spec_hash, "t", REFUSED)


def test_vllm_refusing_on_free_memory_without_a_drop_first_drops_and_retries_once_without_budget() -> None:
    d = plan(obs(C, nodes=nodes(FREE, deployed=True), ray=ray_ok(C), serve=_refused()), st(Phase.LOADING), view_of(C), 1)
    assert d.phase == Phase.STARTING_VLLM and not d.fatal and not d.repair
    assert d.actions == (StopServe("free memory"), DropPageCache("spark-1", "vLLM refused on free memory"),
                         DropPageCache("spark-2", "vLLM refused on free memory"))


def test_vllm_refusing_right_after_a_drop_is_failed_with_the_numbers() -> None:
    d = plan(obs(C, nodes=nodes(FREE, deployed=True), ray=ray_ok(C), serve=_refused()),
             st(Phase.LOADING, page_cache_dropped=frozenset({"spark-2"})), view_of(C), 1)
    assert d.fatal and d.phase == Phase.FAILED and d.actions == (StopServe("failed"),)
    assert d.reason.startswith("ServeFailed: FreeMemoryBelowUtilization after dropping the page cache: spark-1: MemFree")


def test_vllm_refusing_with_memavailable_short_is_failed_without_a_drop() -> None:
    d = plan(obs(C, nodes=nodes(SHORT, deployed=True), ray=ray_ok(C), serve=_refused()), st(Phase.LOADING), view_of(C), 1)
    assert d.fatal and "with MemAvailable short too" in d.reason
    assert not any(isinstance(a, DropPageCache) for a in d.actions)


def test_a_free_memory_refusal_seen_on_a_quick_tick_is_decided_on_the_next_full_one() -> None:
    d = plan(obs(C, nodes=nodes(FREE, deployed=True), ray=ray_ok(C), serve=_refused(), full=False),
             st(Phase.LOADING), view_of(C), 1)
    assert d.look_closer and not d.actions and not d.fatal


def test_the_reading_that_started_the_containers_lets_their_launch_go_on_while_fresh_and_once() -> None:
    quick = obs(C, nodes=nodes(FREE, deployed=True), ray=ray_ok(C), full=False)
    s = st(Phase.STARTING_RAY, starts=1, admitted=(1, 90.0))
    assert plan(quick, s, view_of(C), 100).actions == (StartServe(),)  # Ray formed: launched at once, no tick of reading
    late = C.supervisor.full_observe_interval + 91
    assert plan(quick, s, view_of(C), late).look_closer  # too old: every member read again first
    assert plan(quick, st(Phase.STARTING_RAY, starts=2, admitted=(1, 90.0)), view_of(C), 100).look_closer  # another start's
    assert plan(quick, st(Phase.STARTING_RAY, starts=1), view_of(C), 100).look_closer  # a serve-only start: read first


def test_the_admitting_reading_is_trusted_a_minute_at_most_whatever_the_full_observation_interval() -> None:
    d = data()
    d["supervisor"]["full_observe_interval"] = 3600
    c = cfg(d)
    quick = obs(c, nodes=nodes(FREE, deployed=True), ray=ray_ok(c), full=False)
    s = st(Phase.STARTING_RAY, starts=1, admitted=(1, 90.0))
    assert plan(quick, s, view_of(c), 150).actions == (StartServe(),)
    assert plan(quick, s, view_of(c), 151).look_closer
