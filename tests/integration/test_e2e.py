"""From what a reboot leaves behind to a verified serving deployment, then adoption after a restart."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, containers, write_config

OWNED = {"spark-1": "testbed-ray-spark-1", "spark-2": "testbed-ray-spark-2"}


def test_reboot_mess_to_serving_then_a_restarted_daemon_adopts(clean: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    for node in testbed.NODES:
        testbed.plant_stale(node)
    assert set(containers("spark-2")) == set(testbed.STALE)
    # A load a tick cannot miss (the testbed's 39 x 0.01 s may be over before the first tick after the launch):
    # the phases below name LOADING.
    config = write_config(tmp_path, deployment={"serve": {"env": {"STANDIN_SHARD_SECONDS": "0.1"}}})

    first = supervisor(config, "first")
    st = first.wait_phase("SERVING", timeout=180)

    # Ray: every node alive on its fabric IP, 2.0 GPUs.
    assert st["ray"]["nodes_alive"] == 2 and st["ray"]["gpus"] == 2.0
    assert sorted(n["ip"] for n in st["ray"]["nodes"] if n["alive"]) == ["127.0.0.2", "127.0.0.3"]
    # Only our containers remain, on both engines.
    for node, name in OWNED.items():
        now = containers(node)
        assert set(now) == {name}, now
        assert now[name]["state"] == "running"
    # The sanity verdict passed, read reasoning-aware.
    assert st["verdict"]["passed"] and st["verdict"]["finish_reason"] == "length"
    assert st["verdict"]["field"] == "reasoning"
    # READY=1 arrived on the real notify socket, once, with a STATUS line.
    ready = [n for n in first.notifications if "READY=1" in n]
    assert ready == ["READY=1\nSTATUS=SERVING Qwen3.5-122B-A10B-FP8 on 2 nodes"]
    # The log tells the story in structured events.
    removed = {(e["node"], e["container"]) for e in first.events("clean.container_removed")}
    assert removed == {(n, c) for n in testbed.NODES for c in testbed.STALE}
    phases = [e["to"] for e in first.events("phase.changed")]
    assert phases == ["CLEANING", "STARTING_RAY", "STARTING_VLLM", "LOADING", "VERIFYING", "SERVING"]
    # `status --json` says SERVING.
    out = subprocess.run([str(BIN / "spark-supervisor"), "status", "--json", "--config", str(config)],
                         capture_output=True, text=True, timeout=10, check=True)
    assert json.loads(out.stdout)["phase"] == "SERVING"

    before = {node: containers(node)[name]["id"] for node, name in OWNED.items()}
    serve_before = st["serve"]
    assert first.stop() == 0  # on_stop = "leave"
    assert "STOPPING=1" in "\n".join(first.notifications)

    second = supervisor(config, "second")
    st2 = second.wait_phase("SERVING", timeout=60)
    after = {node: containers(node)[name]["id"] for node, name in OWNED.items()}
    assert after == before, "adoption must not restart any container"
    assert (st2["serve"]["pid"], st2["serve"]["started_at"]) == (serve_before["pid"], serve_before["started_at"])
    assert not second.events("action.started") or all(
        e["action"] == "Verify" for e in second.events("action.started"))
    assert [e["to"] for e in second.events("phase.changed")] == ["VERIFYING", "SERVING"]
    assert second.stop() == 0


def test_plan_changes_nothing_and_teardown_removes_only_what_we_own(clean: None, tmp_path: Path) -> None:
    testbed.plant_stale("spark-1", ("vllm_node",))
    config = write_config(tmp_path)
    out = subprocess.run([str(BIN / "spark-supervisor"), "plan", "--json", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, check=True)
    plan = json.loads(out.stdout)
    assert plan["phase"] == "CLEANING"
    assert {"action": "RemoveContainers", "node": "spark-1", "containers": ["vllm_node"], "why": "stale"} in plan["actions"]
    assert "vllm_node" in containers("spark-1")

    # Something of ours on both nodes, next to a foreign container.
    for node, name in OWNED.items():
        testbed.docker(node, "run", "-d", "--name", name, "--label", "spark-supervisor.owner=testbed",
                       testbed.BUSYBOX, "sleep", "1000")
    out = subprocess.run([str(BIN / "spark-supervisor"), "teardown", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "removed 2 containers" in out.stdout
    assert set(containers("spark-1")) == {"vllm_node"} and containers("spark-2") == {}


def test_status_without_a_daemon_says_so(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "spark_supervisor.cli", "status", "--state-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 3 and "is spark-supervisor running?" in out.stderr
