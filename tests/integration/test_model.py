"""The model on every node before the load, on the testbed: each node has its own Hugging Face cache
(HF_HOME=<testbed>/<node>/hf, filled by `spark-testbed up` with a tiny stand-in of the testbed's model).

One bring-up per scenario: a shard missing on one node is FAILED ModelMissing before anything starts, and
serves once restored and reset; a node without the model gets it copied from a local directory (the
prefetch, its progress in status) and the deployment serves."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, containers, verify_serving, write_config

FAST = {"healing": {"deep_probe_interval": 30}}
VOLUMES = tomllib.loads((testbed.SRC / "etc" / "testbed.toml").read_text())["deployments"][0]["ray"]["volumes"]


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout)


def started(d: Supervisor, action: str) -> list[dict[str, Any]]:
    return [e for e in d.events("action.started") if e.get("action") == action]


def test_a_shard_missing_on_one_node_is_failed_before_anything_starts_and_serves_once_restored(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    shard = testbed.MODEL_SHARDS[1]
    (testbed.model_snapshot("spark-2") / shard).resolve().unlink()  # an interrupted download: a dangling link
    config = write_config(tmp_path, FAST)
    out = cli("check", "--preflight", "--config", str(config))  # the operator's look, before any daemon
    assert out.returncode == 1 and f"preflight: ModelMissing: {testbed.MODEL} incomplete: spark-2: {shard}" in out.stdout, \
        out.stdout + out.stderr
    d = supervisor(config)
    st = d.wait_phase("FAILED", 120)
    assert st["reason_kind"] == "ModelMissing", st["reason"]
    facts, hint = st["reason"].split(" Hint: ")
    assert f"spark-2: {shard} (dangling link) in {testbed.model_snapshot('spark-2')}" in facts, facts
    assert "spark-1" not in facts
    assert hint.startswith(f"on spark-2 run `hf download {testbed.MODEL} --cache-dir {testbed.DIR}/spark-2/hf/hub`"), hint
    assert st["nodes"]["spark-2"]["model"]["missing"] == [f"{shard} (dangling link)"]
    assert st["nodes"]["spark-1"]["model"]["missing"] == [] and st["nodes"]["spark-1"]["model"]["files"] == 4
    # before anything started: no Ray/serve container, no serve, no repair, no budget
    assert not started(d, "StartContainer") and not started(d, "StartServe")
    for node in testbed.NODES:
        assert containers(node) == {}, containers(node)
    assert not d.repairs() and st["repairs"]["in_window"] == 0
    status = cli("status", "--config", str(config))
    assert f"  model {testbed.MODEL}: MISSING in {testbed.model_snapshot('spark-2')}: {shard} (dangling link)" \
        in status.stdout, status.stdout
    # restored, then reset: checked again, and it serves
    testbed.fake_model("spark-2")
    out = cli("reset", "--config", str(config), timeout=30)
    assert out.returncode == 0, out
    d.wait_phase("SERVING", 240)
    verify_serving(d)
    checks = [e for e in d.events("model.checked") if e["node"] == "spark-2"]
    assert [e["complete"] for e in checks] == [False, True], checks
    assert not d.repairs()


def test_a_node_without_the_model_gets_it_copied_from_a_local_directory_and_serves(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    # The source: the model as a plain directory, seen by the image at /model-src; its last file a FIFO that
    # holds the copy until the test has seen its progress in status (a slow disk, made deterministic).
    src = tmp_path / "src"
    shutil.copytree(testbed.model_snapshot("spark-1"), src)  # the links followed: plain files
    fifo = src / "zz-slow.bin"
    os.mkfifo(fifo)
    repo = testbed.model_snapshot("spark-2").parent.parent
    shutil.rmtree(repo)  # spark-2 has never had the model
    hf = [f"{testbed.DIR}/{n}/hf:{testbed.DIR}/{n}/hf" for n in testbed.NODES]  # writable, under the read-only testbed mount
    config = write_config(tmp_path, FAST, deployment={
        "ray": {"volumes": [*VOLUMES, *hf, f"{src}:/model-src:ro"]},
        "model": {"prefetch": True, "prefetch_from": "/model-src"}})
    d = supervisor(config)
    try:
        st = d.wait(lambda s: (s["nodes"]["spark-2"].get("model") or {}).get("files_done") == 6, 120,
                    "the prefetch at the slow file")
        assert st["reason_kind"] == "PrefetchingModel" and "on spark-2 from /model-src" in st["reason"], st["reason"]
        m = st["nodes"]["spark-2"]["model"]
        assert m["prefetch"] == "running" and m["files_total"] == 7 and m["summary"].startswith("prefetching into "), m
        status = cli("status", "--config", str(config))
        assert "  model " + testbed.MODEL + ": prefetching into " in status.stdout, status.stdout
        assert not started(d, "StartContainer")
    finally:
        writer = threading.Thread(target=lambda: fifo.write_bytes(b"x" * 1000), daemon=True)
        writer.start()  # (opening a FIFO for writing waits for its reader)
        writer.join(60)
    d.wait_phase("SERVING", 240)
    verify_serving(d)  # the prefetch's container is gone too
    assert [e["node"] for e in d.events("model.prefetch_started")] == ["spark-2"]
    ended = d.events("model.prefetch_ended")
    assert [e["state"] for e in ended] == ["done"], ended
    checks = [e for e in d.events("model.checked") if e["node"] == "spark-2"]
    assert [e["complete"] for e in checks] == [False, True], checks
    assert not d.repairs()
    snap = repo / "snapshots" / (repo / "refs" / "main").read_text().strip()
    assert (snap / testbed.MODEL_SHARDS[3]).stat().st_size == 4096 and (snap / "config.json").is_file()


def test_a_model_complete_at_its_last_check_is_checked_while_ray_joins_and_one_gone_since_leaves_nothing(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    config = write_config(tmp_path, FAST)
    d = supervisor(config)
    d.wait_phase("SERVING", 240)
    first = [e["event"] for e in d.events() if e["event"] in ("model.checked", "ray.container_started")]
    assert first[:2] == ["model.checked"] * 2, first  # no finding kept yet: checked before anything starts
    assert d.stop() == 0
    assert cli("teardown", "--config", str(config)).returncode == 0
    shard = testbed.MODEL_SHARDS[2]
    (testbed.model_snapshot("spark-2") / shard).resolve().unlink()  # gone since it was found complete
    try:
        d = supervisor(config, "again")
        st = d.wait_phase("FAILED", 120)
        assert st["reason_kind"] == "ModelMissing" and f"spark-2: {shard}" in st["reason"], st["reason"]
        order = [e.get("action") or e["event"] for e in d.events()
                 if e["event"] in ("action.started", "model.checked", "clean.container_removed")]
        # the containers started, the model was checked while Ray joined, found gone: the containers went,
        # and the start that followed checked before it started (FAILED as on a first start)
        assert order.index("StartContainer") < order.index("CheckModel") < order.index("RemoveContainers"), order
        assert order.count("StartContainer") == 2 and "StartServe" not in order, order
        for node in testbed.NODES:
            assert containers(node) == {}, containers(node)
        assert not d.repairs() and st["repairs"]["in_window"] == 0
    finally:
        testbed.fake_model("spark-2")
