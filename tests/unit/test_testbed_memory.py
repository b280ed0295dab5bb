"""The testbed's unified memory (issue "Unified memory on GB10"): the nvidia-smi stand-in's /proc/meminfo
with page-cache figures and its `--drop-caches`, and the vLLM stand-in's start-up check on MemFree (as the
real one on GB10: page cache counts as used) and its KV-cache lines. No testbed needed: the stand-ins run
here for real, the vLLM one in mp mode on a free port."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_supervisor.adapters.nvidia import parse_meminfo
from spark_supervisor.judge import logscan
from spark_testbed import nvidia_smi, testbed
from tests.standin_process import StandinProcess

SMI = [sys.executable, "-m", "spark_testbed.nvidia_smi"]
UTIL = 0.5  # the testbed's serve (etc/testbed.toml)


def _state(path: Path, meminfo: dict[str, int] | None = None, **extra: object) -> Path:
    state: dict[str, object] = {"name": "NVIDIA GB10", "driver": "580.95.05", "total_mib": None,
                                "processes": [{"pid": 1, "name": "/usr/lib/xorg/Xorg", "used_mib": 40, "type": "G"}],
                                **extra}
    if meminfo is not None:
        state["meminfo"] = meminfo
    path.write_text(json.dumps(state))
    return path


def _smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SMI, *args], capture_output=True, text=True, timeout=30)


def _kb(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+) kB$", text, re.M)}


# ------------------------------------------------------------------------------------------ the figures
def test_page_cache_full_is_short_on_memfree_only() -> None:
    m = testbed.page_cache_full()
    assert m["total_mib"] == 122880
    assert m["free_mib"] < UTIL * m["total_mib"] <= m["available_mib"]
    assert m["free_mib"] + m["cached_mib"] == m["available_mib"]
    m = testbed.page_cache_full(total_mib=65536, cached_mib=40000, used_mib=4096)
    assert m == {"total_mib": 65536, "free_mib": 21440, "cached_mib": 40000, "available_mib": 61440}
    with pytest.raises(ValueError):
        testbed.page_cache_full(total_mib=1000, cached_mib=999, used_mib=10)


def test_memory_held_is_short_on_memavailable_too() -> None:
    m = testbed.memory_held()
    assert m["free_mib"] <= m["available_mib"] < UTIL * m["total_mib"]
    assert m["free_mib"] + m["cached_mib"] == m["available_mib"]


def test_write_gpu_keeps_the_meminfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbed, "DIR", tmp_path)
    (tmp_path / "spark-1").mkdir()
    testbed.write_gpu("spark-1", meminfo=testbed.page_cache_full())
    state = json.loads((tmp_path / "spark-1" / "gpu.json").read_text())
    assert state["meminfo"] == testbed.page_cache_full()
    testbed.write_gpu("spark-1")
    assert "meminfo" not in json.loads((tmp_path / "spark-1" / "gpu.json").read_text())


# ------------------------------------------------------------------------------------------- --meminfo
def test_meminfo_prints_the_kernel_lines(tmp_path: Path) -> None:
    m = testbed.page_cache_full()
    r = _smi("--state", str(_state(tmp_path / "gpu.json", m)), "--meminfo")
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == [
        "MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached"]
    assert _kb(r.stdout) == {"MemTotal": m["total_mib"] * 1024, "MemFree": m["free_mib"] * 1024,
                             "MemAvailable": m["available_mib"] * 1024, "Buffers": 0,
                             "Cached": m["cached_mib"] * 1024}
    assert r.stdout.splitlines()[3] == "Buffers:               0 kB"  # the kernel's "%-16s%8lu kB"
    parsed = parse_meminfo(r.stdout)  # what the supervisor reads
    assert (parsed.total_mib, parsed.available_mib) == (m["total_mib"], m["available_mib"])


def test_meminfo_reads_the_older_state(tmp_path: Path) -> None:
    r = _smi("--state", str(_state(tmp_path / "gpu.json", {"total_mib": 122880, "available_mib": 110592})),
             "--meminfo")
    assert r.returncode == 0, r.stderr
    assert _kb(r.stdout) == {"MemTotal": 125829120, "MemFree": 113246208, "MemAvailable": 113246208,
                             "Buffers": 0, "Cached": 0}


# --------------------------------------------------------------------------------------- --drop-caches
def test_drop_caches_frees_the_page_cache(tmp_path: Path) -> None:
    m = testbed.page_cache_full()
    path = _state(tmp_path / "gpu.json", m, processes=[{"pid": 999999999, "name": "gone", "used_mib": 1}])
    before = json.loads(path.read_text())
    ino = path.stat().st_ino
    r = _smi("--state", str(path), "--drop-caches")
    assert r.returncode == 0, r.stderr
    freed = m["cached_mib"] - nvidia_smi.CACHE_RESIDUE_MIB
    assert len(r.stdout.splitlines()) == 1 and f"freed {freed} MiB" in r.stdout
    after = json.loads(path.read_text())
    assert after["meminfo"] == {"total_mib": m["total_mib"], "free_mib": m["free_mib"] + freed,
                                "cached_mib": nvidia_smi.CACHE_RESIDUE_MIB, "available_mib": m["available_mib"]}
    assert {k: v for k, v in after.items() if k != "meminfo"} == {k: v for k, v in before.items() if k != "meminfo"}
    assert path.stat().st_ino != ino  # replaced by a rename, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]  # no temporary file left
    # Now vLLM's check passes; MemAvailable did not move.
    assert after["meminfo"]["free_mib"] >= UTIL * m["total_mib"]
    kb = _kb(_smi("--state", str(path), "--meminfo").stdout)
    assert (kb["MemFree"], kb["Cached"]) == ((m["free_mib"] + freed) * 1024, nvidia_smi.CACHE_RESIDUE_MIB * 1024)
    # Twice: nothing more to free, and the file is left alone.
    ino = path.stat().st_ino
    r = _smi("--state", str(path), "--drop-caches")
    assert r.returncode == 0 and "freed 0 MiB" in r.stdout and path.stat().st_ino == ino


def test_drop_caches_does_not_help_when_processes_hold_the_memory(tmp_path: Path) -> None:
    m = testbed.memory_held()
    path = _state(tmp_path / "gpu.json", m)
    assert _smi("--state", str(path), "--drop-caches").returncode == 0
    after = json.loads(path.read_text())["meminfo"]
    assert after["available_mib"] == m["available_mib"]
    assert after["free_mib"] < UTIL * m["total_mib"]


def test_drop_caches_leaves_the_older_state_alone(tmp_path: Path) -> None:
    path = _state(tmp_path / "gpu.json", {"total_mib": 122880, "available_mib": 110592})
    r = _smi("--state", str(path), "--drop-caches")
    assert r.returncode == 0 and "freed 0 MiB" in r.stdout
    assert json.loads(path.read_text())["meminfo"] == {"total_mib": 122880, "available_mib": 110592}


def test_drop_caches_without_a_state_directory_fails_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "none" / "gpu.json"
    r = _smi("--state", str(missing), "--drop-caches")
    assert r.returncode == 1 and str(missing) in r.stderr and "Traceback" not in r.stderr
    assert not missing.parent.exists()


def test_drop_caches_keeps_the_file_mode(tmp_path: Path) -> None:
    path = _state(tmp_path / "gpu.json", testbed.page_cache_full())
    path.chmod(0o644)
    assert nvidia_smi.main(["--state", str(path), "--drop-caches"]) == 0
    assert path.stat().st_mode & 0o777 == 0o644


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    m = testbed.page_cache_full()
    path = _state(tmp_path / "gpu.json", m)
    text = path.read_text()

    def boom(_src: str, _dst: str) -> None:
        raise OSError("disk full")
    monkeypatch.setattr("spark_testbed.nvidia_smi.os.replace", boom)
    assert nvidia_smi.main(["--state", str(path), "--drop-caches"]) == 1
    assert "disk full" in capsys.readouterr().err
    assert path.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]


def test_readers_never_see_half_a_file(tmp_path: Path) -> None:
    path = _state(tmp_path / "gpu.json", testbed.page_cache_full())
    bad: list[str] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                json.loads(path.read_text())["meminfo"]
            except (ValueError, KeyError, FileNotFoundError) as e:
                bad.append(repr(e))
    t = threading.Thread(target=read)
    t.start()
    try:
        for _ in range(100):
            nvidia_smi._write_atomic(str(path), {"meminfo": testbed.page_cache_full()})
            assert nvidia_smi.main(["--state", str(path), "--drop-caches"]) == 0
    finally:
        done.set()
        t.join()
    assert not bad


# ------------------------------------------------------------------------------------ the vLLM stand-in
class Serve(StandinProcess):
    def __init__(self, tmp: Path, states: list[Path], **env: str) -> None:
        super().__init__(tmp, ["--model", "/", "--gpu-memory-utilization", str(UTIL)],
                         {"STANDIN_GPU_STATES": ",".join(str(p) for p in states), **env})

    def failed(self) -> str:
        assert self.exited() == 1, self.text()
        return self.text()


Start = Callable[..., "Serve"]  # serve(*state_files, **env)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Start]:
    started: list[Serve] = []

    def start(*states: Path, **env: str) -> Serve:
        s = Serve(tmp_path, list(states), **env)
        started.append(s)
        return s
    yield start
    for s in started:
        s.close()


def _error_line(m: dict[str, int]) -> str:
    free, total = m["free_mib"] / 1024, m["total_mib"] / 1024
    return (f"ValueError: Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less than "
            f"desired GPU memory utilization ({UTIL}, {UTIL * total:.2f} GiB). Decrease GPU memory utilization "
            "or reduce GPU memory used by other processes.")


def test_a_full_page_cache_fails_the_start_like_vllm(serve: Start, tmp_path: Path) -> None:
    m = testbed.page_cache_full()
    text = serve(_state(tmp_path / "gpu.json", m)).failed()
    assert _error_line(m) in text
    assert "(24.00/120.00 GiB)" in text and "(0.5, 60.00 GiB)" in text
    assert "Failed core proc(s): {}" in text
    lines = text.splitlines()
    engine = next(i for i, x in enumerate(lines) if "Initializing a V1 LLM engine" in x)
    error = next(i for i, x in enumerate(lines) if "Free memory on device" in x)
    assert engine < error and "Starting to load model" not in text  # where vLLM checks: before the weights
    f = logscan.classify(text)
    assert f is not None and (f.reason, f.deterministic) == ("FreeMemoryBelowUtilization", True)
    # The same shape as STANDIN_FAIL=free-memory (which the supervisor's tests already read).
    canned = serve(STANDIN_FAIL="free-memory").failed()
    shape = re.compile(r"Free memory on device cuda:0 \([\d.]+/[\d.]+ GiB\) on startup is less than desired GPU "
                       r"memory utilization \(0\.5, [\d.]+ GiB\)\. Decrease GPU memory utilization or reduce GPU "
                       r"memory used by other processes\.")
    assert shape.search(text) and shape.search(canned)


def test_the_start_succeeds_once_the_caches_are_dropped(serve: Start, tmp_path: Path) -> None:
    path = _state(tmp_path / "gpu.json", testbed.page_cache_full())
    serve(path).failed()
    assert _smi("--state", str(path), "--drop-caches").returncode == 0
    serve(path).started()


def test_every_node_is_checked(serve: Start, tmp_path: Path) -> None:
    ok = _state(tmp_path / "spark-1.json", testbed.page_cache_full(cached_mib=0))
    short = testbed.memory_held()
    text = serve(ok, _state(tmp_path / "spark-2.json", short)).failed()
    assert _error_line(short) in text  # the worker's figures


@pytest.mark.parametrize("meminfo", [None, {"total_mib": 122880, "available_mib": 110592}])
def test_the_default_figures_or_enough_free_start(serve: Start, tmp_path: Path, meminfo: dict[str, int] | None) -> None:
    s = serve(_state(tmp_path / "gpu.json", meminfo), tmp_path / "missing.json")
    assert "Free memory" not in s.started()


def test_no_check_without_state_files(serve: Start) -> None:
    serve().started()


def test_kv_cache_follows_the_knob(serve: Start) -> None:
    text = serve().started()
    assert "Available KV cache memory: 37.52 GiB" in text and "GPU KV cache size: 409,856 tokens" in text
    assert "Maximum concurrency for 65,536 tokens per request: 6.25x" in text
    assert logscan.scan(text).kv_cache_tokens == 409856
    text = serve(STANDIN_KV_TOKENS="102464").started()
    assert "Available KV cache memory: 9.38 GiB" in text and "GPU KV cache size: 102,464 tokens" in text
    assert "Maximum concurrency for 65,536 tokens per request: 1.56x" in text
    assert logscan.scan(text).kv_cache_tokens == 102464
