"""`copy-model` on the testbed: each node its own Hugging Face cache (HF_HOME=<testbed>/<node>/hf), the worker
reached over a real sshd. A worker's copy that is not the head's is named before any load (a folder of links
without their blobs: ModelMissing; a shard a little short, which the index's total_size does not show:
ModelCopyDiffers), `copy-model` sends what differs through a partial directory, checks sizes and sha256 and
renames it into place, and the check passes; refused while the worker serves.

`--via ssh` throughout: the testbed's sshd listens on 127.0.0.1 only, not on the worker's fabric IP."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, write_config

FAST = {"healing": {"deep_probe_interval": 30}}
SNAP = testbed.model_snapshot("spark-2")
PARTIAL = SNAP.parent / f".{SNAP.name}.spark-partial"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout)


def copy(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli("copy-model", "--config", str(config), "--to", "spark-2", "--via", "ssh", *extra)


def listing(d: Path) -> dict[str, tuple[bool, int]]:
    """Each name: (a link?, its size through the link, -1 when dangling)."""
    return {p.name: (p.is_symlink(), p.stat().st_size if p.exists() else -1) for p in sorted(d.iterdir())}


@pytest.fixture
def worker_model(clean: None) -> Iterator[None]:
    """spark-2's cache as `spark-testbed up` leaves it, before and after."""
    testbed.fake_model("spark-2")
    yield
    shutil.rmtree(PARTIAL, ignore_errors=True)
    testbed.fake_model("spark-2")


def test_a_shard_a_little_short_is_named_before_the_load_and_the_copy_makes_it_whole(
        worker_model: None, tmp_path: Path) -> None:
    shard = testbed.MODEL_SHARDS[1]
    with open((SNAP / shard).resolve(), "r+b") as f:  # an interrupted copy: 96 bytes short, within total_size's 1%
        f.truncate(4000)
    config = write_config(tmp_path, FAST)
    out = cli("check", "--preflight", "--config", str(config))
    assert out.returncode == 1 and f"preflight: ModelCopyDiffers: spark-2: {shard} 3.9 KiB, head 4.0 KiB" in out.stdout, \
        out.stdout + out.stderr
    assert "`spark-supervisor copy-model testbed --to spark-2`" in out.stdout
    plan = copy(config, "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["send"] == [shard] and f"send {shard} (3.9 KiB, head 4.0 KiB)" in plan.stderr
    assert listing(SNAP)[shard] == (True, 4000)  # a dry run changes nothing
    done = copy(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 files, 4.0 KiB in" in done.stdout and "the sha256 of 1" in done.stdout, done.stdout
    assert "model check: spark-2 has the head's model" in done.stdout, done.stdout
    assert listing(SNAP)[shard] == (False, 4096) and not PARTIAL.exists()  # renamed into place, whole
    out = cli("check", "--preflight", "--config", str(config))
    assert "ModelCopyDiffers" not in out.stdout and "ModelMissing" not in out.stdout, out.stdout


def test_a_folder_of_links_without_their_blobs_is_named_before_the_load_and_the_copy_ships_the_weights(
        worker_model: None, tmp_path: Path) -> None:
    # What eight public threads report: the snapshot's links copied, blobs/ not: every file a dangling link.
    shutil.rmtree(SNAP.parent.parent / "blobs")
    config = write_config(tmp_path, FAST)
    out = cli("check", "--preflight", "--config", str(config))
    assert out.returncode == 1 and "preflight: ModelMissing:" in out.stdout, out.stdout + out.stderr
    assert "spark-2: config.json (dangling link), model.safetensors.index.json (unreadable" in out.stdout, out.stdout
    assert "or on spark-1 `spark-supervisor copy-model testbed --to spark-2`" in out.stdout, out.stdout
    done = copy(config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 files to send" in done.stdout and "the sha256 of 6" in done.stdout, done.stdout
    assert all(not link and size > 0 for link, size in listing(SNAP).values()), listing(SNAP)
    assert sum(size for _, size in listing(SNAP).values()) >= 4 * 4096
    out = cli("check", "--preflight", "--config", str(config))
    assert "ModelMissing" not in out.stdout and "ModelCopyDiffers" not in out.stdout, out.stdout
    again = copy(config)  # nothing left to send
    assert again.returncode == 0 and "0 files to send" in again.stdout, again.stdout


def test_a_copy_to_a_worker_that_serves_is_refused(supervisor: Callable[..., Supervisor], worker_model: None,
                                                   tmp_path: Path) -> None:
    config = write_config(tmp_path, FAST)
    d = supervisor(config)
    d.wait_phase("SERVING", 240)
    before = listing(SNAP)
    out = copy(config, "--resend")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "copy-model: refused: spark-2 runs" in out.stderr and "page cache" in out.stderr, out.stderr
    assert listing(SNAP) == before and not PARTIAL.exists()
    plan = copy(config, "--dry-run")  # the plan is shown, with why it would be refused
    assert plan.returncode == 0 and "would be refused now: spark-2 runs" in plan.stdout, plan.stdout
