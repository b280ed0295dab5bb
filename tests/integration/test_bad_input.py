"""Bad input and broken surroundings: each is a reason in the status, the daemon keeps running and
retries with bounded backoff, and nothing it does not own is touched."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, containers, write_config

FAST = {"supervisor": {"backoff_base": 0.5, "backoff_max": 2}}


def test_unreachable_worker_is_a_reason_and_heals_when_it_answers(clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    testbed.plant_stale("spark-1", ("vllm_node",))
    testbed.stop_sshd()
    try:
        d = supervisor(write_config(tmp_path, FAST))
        st = d.wait(lambda s: s["phase"] == "BACKOFF" and s["failures"] >= 2, 60, "two failed attempts")
        assert st["reason"].startswith("NodeUnreachable: spark-2: SshUnreachable: spark-2 (127.0.0.1:2222)")
        assert st["nodes"]["spark-2"]["error"].startswith("SshUnreachable")
        # Nothing was touched while the gang was incomplete, not even the head's stale container.
        assert "vllm_node" in containers("spark-1")
        assert d.proc.poll() is None
    finally:
        testbed.start_sshd()
    d.wait_phase("SERVING", timeout=120)
    assert "vllm_node" not in containers("spark-1")


def test_a_stopped_docker_engine_is_a_reason(clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    pid = int((testbed.DIR / "spark-2" / "dockerd.pid").read_text())
    os.kill(pid, 15)
    testbed.until(lambda: not testbed._alive(testbed.DIR / "spark-2" / "dockerd.pid"), 30, "dockerd to stop")
    try:
        d = supervisor(write_config(tmp_path, FAST))
        st = d.wait(lambda s: s["phase"] == "BACKOFF" and "spark-2" in s["reason"], 60, "engine failure")
        assert st["reason"].startswith("NodeUnreachable: spark-2: DockerUnreachable")
        assert "Traceback" not in d.log_path.read_text()
        assert containers("spark-1") == {}  # no half cluster: the head was not started alone
    finally:
        testbed.start_dockerd("spark-2")
    d.wait(lambda s: s["phase"] in ("STARTING_RAY", "STARTING_VLLM", "LOADING", "SERVING"), 60, "recovery")


def test_a_missing_image_is_never_pulled_silently(clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, FAST, deployment={"ray": {"image": "spark-testbed/absent:1"}})
    d = supervisor(cfg)
    st = d.wait_phase("FAILED", 60)  # deterministic: retrying cannot make the image appear
    assert st["reason"].startswith("ImageMissing: spark-testbed/absent:1 is not on spark-1 and image_pull = \"never\"")
    assert containers("spark-1") == {} and containers("spark-2") == {}
    out = testbed.docker("spark-1", "images", "-q", "spark-testbed/absent").stdout
    assert out.strip() == b""
    assert d.proc.poll() is None, "FAILED keeps the daemon up and reporting"


def test_a_serve_that_exits_at_once_is_retried_within_the_budget(clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, FAST, deployment={"serve": {"env": {"STANDIN_FAIL": "exit"}}})
    d = supervisor(cfg)
    st = d.wait_phase("FAILED", 120)
    assert st["reason"].startswith("RestartBudgetExhausted: 3 repairs in 6h; last fault: ServeExited: exit code 1")
    assert len(d.events("serve.launched")) == 4, "the first launch and three repairs, no more"
    assert len(d.events("ray.container_started")) == 2, "only the serve was relaunched"
    assert d.proc.poll() is None


def test_a_free_memory_refusal_drops_the_page_cache_once_then_is_named_with_its_numbers(
        clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, FAST, deployment={"serve": {"env": {"STANDIN_FAIL": "free-memory"}}})
    d = supervisor(cfg)
    st = d.wait_phase("FAILED", 120)
    # Without a drop just before, the page cache is the likely cause: dropped, one more launch, which
    # fails the same way: now it is FAILED with the numbers, and no repair budget was used.
    assert st["reason"].startswith("ServeFailed: FreeMemoryBelowUtilization after dropping the page cache: "), st
    assert "lower gpu_memory_utilization" in st["reason"] and "MemAvailable" in st["reason"]
    assert sorted(e["node"] for e in d.events("memory.page_cache_dropped")) == ["spark-1", "spark-2"]
    assert len(d.events("serve.launched")) == 2 and not d.events("repair.started")


def test_gpu_memory_held_by_a_foreign_process_names_it_and_leaves_it_alone(clean: None, supervisor: Callable[..., Supervisor],
                                                                          tmp_path: Path) -> None:
    holder = subprocess.Popen(["sleep", "600"])
    try:
        testbed.write_gpu("spark-2", [{"pid": holder.pid, "name": "python3", "used_mib": 20480}])
        cfg = write_config(tmp_path, {**FAST, "stale": {"memory_free_timeout": 2}})
        d = supervisor(cfg)
        st = d.wait_phase("FAILED", 60)  # bounded: no endless wait and back-off loop
        assert st["reason"].startswith("GpuMemoryHeld: still held after 2s: ")
        assert f"spark-2: pid {holder.pid} (python3) 20480 MiB" in st["reason"]
        assert holder.poll() is None, "a process we do not own is never killed"
        assert containers("spark-1") == {}
    finally:
        holder.kill()
        holder.wait()
    testbed.write_gpu("spark-2")
    out = subprocess.run([str(BIN / "spark-supervisor"), "reset", "--config", str(cfg)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "will re-arm" in out.stdout, out
    d.wait(lambda s: s["phase"] in ("STARTING_RAY", "STARTING_VLLM", "LOADING", "SERVING"), 60, "memory freed")


def test_invalid_config_is_refused_before_anything_runs(tmp_path: Path) -> None:
    bad = write_config(tmp_path, {"supervisor": {"intervall": 3}})
    out = subprocess.run([str(BIN / "spark-supervisor"), "run", "--config", str(bad)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 78  # EX_CONFIG: the unit's RestartPreventExitStatus stops the restart loop
    assert out.stderr.strip().startswith(f"{bad}: supervisor.intervall: unknown key")
