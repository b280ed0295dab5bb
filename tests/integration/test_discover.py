"""`discover` on the testbed: from the head (local) and the worker (over the testbed's SSH), with a --base that
carries only the testbed's stand-ins (its nodes' nvidia-smi, host trees, engines and the stand-in vLLM; no fabric
address, interface or GID index, no [stale] containers), it writes a config that `check --preflight` passes and
that the daemon takes to SERVING; and it changes nothing on a node (the containers before and after alike, no
probe container left). A stale container planted on the worker is written commented out, with why; uncommented by
the operator, the daemon removes it and serves."""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path

import tomli_w

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, containers, verify_serving


def base(tmp_path: Path) -> Path:
    """etc/testbed.toml without what discovery is to find."""
    d = tomllib.loads((testbed.SRC / "etc" / "testbed.toml").read_text())
    for n in d["nodes"]:
        del n["fabric_ip"], n["fabric_interface"]
    del d["deployments"][0]["ray"]["env"]["NCCL_IB_GID_INDEX"]
    del d["stale"]["containers"]
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "base.toml"
    path.write_text(tomli_w.dumps(d))
    return path


def discover(tmp_path: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), "discover", "--head", "spark-1=local", "--worker", "spark-2",
                           "--base", str(base(tmp_path)), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)


def test_discover_writes_a_config_that_serves_and_changes_nothing(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    testbed.plant_stale("spark-2", ("vllm_node",))  # the old stack's container, holding the worker's GPU
    before = {n: containers(n) for n in testbed.NODES}
    out = tmp_path / "discovered.toml"
    run = discover(tmp_path, out)
    said = run.stdout + run.stderr
    assert {n: containers(n) for n in testbed.NODES} == before, "discover changed the containers of a node"
    text = out.read_text()
    lines = text.splitlines()
    cfg = tomllib.loads(text)
    assert [(n["name"], n["fabric_ip"], n["fabric_interface"]) for n in cfg["nodes"]] == [
        ("spark-1", "127.0.0.2", "lo"), ("spark-2", "127.0.0.3", "lo")], said
    assert 'fabric_ip = "127.0.0.3"  # from spark-2: lo 127.0.0.1/8, shared subnet 127.0.0.0/8' in lines
    assert any(ln.startswith('NCCL_IB_GID_INDEX = "3"  # the RoCE v2 GID holding each fabric IP: spark-1: rocep1s0f1 '
                             "GID 3, spark-2: rocep1s0f1 GID 3") for ln in lines), text
    assert any(ln.startswith("image = ") and "checked: spark-testbed/hostfs:latest" in ln for ln in lines), text
    assert cfg["stale"]["containers"] == []  # the candidate is never enabled by discovery ...
    candidate = next(ln for ln in lines if ln.strip().startswith('# "vllm_node",'))
    assert "spark-2: GPU process VLLM::Worker_TP0" in candidate and "runs" not in candidate, candidate  # ... but named
    # The qualification ran on what was written, and it passes (the planted container is no fabric problem).
    assert "preflight: OK" in run.stdout and run.returncode == 0, said
    assert "== left to do, in order" in run.stdout
    # The operator uncomments the candidate: the daemon removes it, and serves.
    out.write_text(text.replace(candidate, candidate.replace('# "vllm_node",', '"vllm_node",', 1)))
    d = supervisor(out)
    d.wait_phase("SERVING", 240)
    verify_serving(d)
