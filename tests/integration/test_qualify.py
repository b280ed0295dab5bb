"""Day-one qualification on the testbed (real Docker, SSH, Ray; the nodes' host trees carry a Spark's RDMA device
names): each break an audit of real Sparks found is named by `check --preflight` and by the daemon before any serve
starts, and clears once fixed. The image without Ray and the model missing on the worker have their own tests
(test_images.py, test_model.py)."""

from __future__ import annotations

import signal
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import hosttree, testbed
from spark_testbed.harness import BIN, Supervisor, serve_processes, verify_serving, write_config


def preflight(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), "check", "--preflight", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def trees(tb: dict[str, str]) -> Iterator[None]:
    for node in testbed.NODES:
        hosttree.reset(node)
    yield
    for node in testbed.NODES:
        hosttree.reset(node)


def hca(d: dict[str, Any]) -> None:
    d["deployments"][0]["ray"]["env"]["NCCL_IB_HCA"] = "mlx5"  # vLLM's InfiniBand docs; no Spark has it


def per_node(d: dict[str, Any]) -> None:
    d["nodes"][1].setdefault("env", {})["NCCL_IB_GID_INDEX"] = "5"  # the head's is 3: vLLM would give it 3


BREAKS: list[tuple[str, Callable[[dict[str, Any]], None] | None, str]] = [
    ("hca", hca, "NcclHcaUnmatched: spark-1: NCCL_IB_HCA entry 'mlx5' matches no RDMA device (has rocep1s0f1)"),
    ("per-node", per_node, "PerNodeEnvOverwritten: spark-2: NCCL_IB_GID_INDEX=5 (head: 3)"),
    ("earlyoom", None, "OomKillerActive: spark-2: earlyoom runs and may kill one rank's engine"),
]


@pytest.mark.parametrize(("name", "change", "said"), BREAKS, ids=[b[0] for b in BREAKS])
def test_preflight_names_each_break_and_clears_when_fixed(
        name: str, change: Callable[[dict[str, Any]], None] | None, said: str, tmp_path: Path, trees: None) -> None:
    good = write_config(tmp_path)
    before = preflight(good)
    assert before.returncode == 0 and "preflight: OK" in before.stdout, before.stdout + before.stderr
    d = tomllib.loads(good.read_text())
    if change is not None:
        change(d)
    else:  # an OOM killer runs on the worker's host
        hosttree.write("spark-2", processes=["earlyoom"])
    broken = tmp_path / "broken.toml"
    broken.write_text(tomli_w.dumps(d))
    out = preflight(broken)
    assert out.returncode == 1 and f"preflight: {said}" in out.stdout, out.stdout + out.stderr
    hosttree.reset("spark-2")
    fixed = preflight(good)
    assert fixed.returncode == 0 and "preflight: OK" in fixed.stdout, fixed.stdout + fixed.stderr


def test_the_daemon_fails_an_hca_filter_before_any_serve_and_serves_once_it_is_fixed(tmp_path: Path,
                                                                                    trees: None) -> None:
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    cfg = write_config(tmp_path)
    good = cfg.read_text()
    d = tomllib.loads(good)
    hca(d)
    cfg.write_text(tomli_w.dumps(d))
    sup = Supervisor(cfg, tmp_path)
    try:
        st = sup.wait_phase("FAILED", 180)
        assert st["reason"].startswith("PreflightFailed: NcclHcaUnmatched: spark-1: NCCL_IB_HCA entry 'mlx5'"), st
        assert serve_processes() == 0, "a serve was started before the qualification"
        assert not [e for e in sup.events("action.started") if e.get("action") == "StartServe"]
        cfg.write_text(good)
        sup.proc.send_signal(signal.SIGHUP)
        sup.wait_phase("SERVING", 240)
        verify_serving(sup)
    finally:
        sup.stop()
