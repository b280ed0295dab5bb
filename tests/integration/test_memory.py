"""Unified memory on the testbed (GB10's rule: vLLM reads MemFree; page cache counts as used). The
nvidia-smi stand-in reports MemFree/Cached/MemAvailable from its state file, its --drop-caches empties the
cache, and the vLLM stand-in refuses to start on a short MemFree like the real one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from spark_testbed import testbed
from spark_testbed.harness import OWNED, Supervisor, containers, serve_processes, write_config

PATCH = {"healing": {"repair_budget": 50}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}


def test_a_gang_repair_with_the_page_cache_full_drops_it_and_serves(clean: None, supervisor: Callable[..., Supervisor],
                                                                     tmp_path: Path) -> None:
    for node in testbed.NODES:  # a previous load's shards in the page cache on both nodes
        testbed.write_gpu(node, meminfo=testbed.page_cache_full())
    d = supervisor(write_config(tmp_path, PATCH))
    d.wait_phase("SERVING", 180)
    first = [e["node"] for e in d.events("memory.page_cache_dropped")]
    assert sorted(first) == ["spark-1", "spark-2"]  # dropped before the first start
    testbed.write_gpu("spark-2", meminfo=testbed.page_cache_full())  # the weights are cached again
    n = len(d.events("memory.page_cache_dropped"))
    testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"])
    st = d.wait(lambda s: s["phase"] == "SERVING" and s["repairs"]["in_window"] >= 1, 240, "SERVING after the repair")
    assert [e["node"] for e in d.events("memory.page_cache_dropped")[n:]] == ["spark-2"]
    assert [r["kind"] for r in d.events("repair.started")] == ["gang"]  # one budget unit, no retry burnt
    assert st["repairs"]["in_window"] == 1 and "FAILED" not in {h["phase"] for h in st["history"]}
    assert {node: set(containers(node)) for node in OWNED} == {n: {c} for n, c in OWNED.items()}
    assert serve_processes() == 1
    mem = st["nodes"]["spark-2"]["memory"]
    assert mem["free_mib"] > mem["total_mib"] // 2 and mem["cached_mib"] is not None


def test_page_cache_full_with_the_drop_disabled_is_failed_with_the_numbers(
        clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    testbed.write_gpu("spark-2", meminfo=testbed.page_cache_full())
    d = supervisor(write_config(tmp_path, {**PATCH, "memory": {"page_cache": "never"}}))
    st = d.wait_phase("FAILED", 120)
    assert st["reason"].startswith("FreeMemoryBelowUtilization: spark-2: MemFree 24576 MiB"), st["reason"]
    assert "page_cache = \"never\"" in st["reason"]
    assert not d.events("memory.page_cache_dropped") and not containers("spark-1")  # nothing started


def test_memavailable_short_is_failed_without_a_drop_loop(clean: None, supervisor: Callable[..., Supervisor],
                                                          tmp_path: Path) -> None:
    testbed.write_gpu("spark-2", meminfo=testbed.memory_held())
    # The wait for memory bounded at 5 s, not etc/testbed.toml's 20 s: held is held (a drop loop would show
    # within its first ticks, as it would within 20 s).
    d = supervisor(write_config(tmp_path, {**PATCH, "stale": {"memory_free_timeout": 5}}))
    st = d.wait_phase("FAILED", 120)
    assert st["reason"].startswith("GpuMemoryHeld: still held after 5s: spark-2: MemAvailable"), st["reason"]
    assert not d.events("memory.page_cache_dropped") and not d.events("repair.started")


def test_a_start_with_far_less_kv_cache_than_before_is_a_warning(clean: None, supervisor: Callable[..., Supervisor],
                                                                  tmp_path: Path) -> None:
    config = write_config(tmp_path, PATCH)
    from spark_supervisor import config as config_mod
    c = config_mod.load(config)
    state = Path(config_mod.deployment_dir(c.supervisor.state_dir, c.deployment.name))  # the deployment's own
    state.mkdir(parents=True, exist_ok=True)
    # The best start of this spec had twice the KV cache the stand-in reports now.
    (state / "kv.json").write_text(json.dumps({config_mod.serve_hash(c, c.deployment): 2 * 409856}))
    d = supervisor(config)
    st = d.wait_phase("SERVING", 180)
    st = d.wait(lambda s: (s.get("kv_cache") or {}).get("warning"), 30, "the KV-cache warning")
    assert st["kv_cache"]["tokens"] == 409856 and st["kv_cache"]["best"] == 2 * 409856
    assert st["kv_cache"]["warning"].startswith("KvCacheRegression: 409,856 tokens, 50% below the best")
    assert d.events("memory.kv_cache_regression")
