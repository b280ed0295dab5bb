"""Below vLLM, on the testbed (issue 24): the transport NCCL chose, the fabric's own facts, who rebooted, who
lost the GPU. Each node has its own stand-in host tree (spark_testbed.hosttree: sysfs, boot ID, machine-id in
the real formats, held to them by tests/unit/test_standin_fabric.py) with a fault switch; the stand-in vLLM
prints NCCL's INFO lines in the real format and has a socket mode; the stand-in nvidia-smi can lose NVML.
One bring-up, shared: each test starts from a verified SERVING on a healthy fabric and leaves one behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from spark_testbed import faults, hosttree, testbed
from spark_testbed.harness import (
    BACKEND,
    BIN,
    OWNED,
    Supervisor,
    containers,
    fault_file,
    serve_processes,
    verify_serving,
    write_config,
)
from tests.integration.conftest import reset_testbed

pytestmark = pytest.mark.testbed

FAULT = fault_file()
# Full observations (where the hosts are read) every 3 s, so that a fault shows within a few ticks.
PATCH = {"supervisor": {"full_observe_interval": 3}}


@pytest.fixture(scope="module")
def daemon(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    reset_testbed()
    tmp = tmp_path_factory.mktemp("below")
    d = Supervisor(write_config(tmp, PATCH), tmp)
    d.wait_phase("SERVING", 240)
    yield d
    if d.proc.poll() is None:
        d.stop(signal.SIGKILL)
    reset_testbed()


@pytest.fixture
def healthy(daemon: Supervisor) -> Iterator[Supervisor]:
    """A verified SERVING on a healthy fabric to start from; the fabric, the GPUs and the serve's faults are
    put back afterwards, and SERVING awaited again, whatever the test did."""
    for node in testbed.NODES:
        hosttree.reset(node)
    daemon.wait(lambda s: s["phase"] == "SERVING", 240, "SERVING on a healthy fabric")
    verify_serving(daemon)
    yield daemon
    FAULT.unlink(missing_ok=True)
    for node in testbed.NODES:
        hosttree.reset(node)
        testbed.gpu_access_lost(node, False)
    if daemon.proc.poll() is None:
        os.kill(daemon.proc.pid, signal.SIGCONT)


def since(st: dict[str, Any]) -> float:
    return datetime.fromisoformat(st["since"]).timestamp()


def cli(d: Supervisor, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args, "--config", str(d.config)], capture_output=True,
                          text=True, timeout=timeout)


def test_a_start_on_sockets_is_fabric_fallback_and_nothing_is_repaired(healthy: Supervisor) -> None:
    d = healthy
    st = d.wait(lambda s: bool(s.get("transports")), 60, "the ranks' transports")
    assert {t["net"] for t in st["transports"]} == {"IB"}, st["transports"]
    t = time.time()
    FAULT.write_text("socket\n")  # NCCL finds no usable RDMA device at the next start: TCP between the nodes
    out = cli(d, "restart", "--serve-only")
    assert out.returncode == 0, out.stdout + out.stderr
    st = d.wait(lambda s: s["phase"] == "DEGRADED" and since(s) > t, 240, "DEGRADED on sockets")
    assert st["reason_kind"] == "FabricFallback", st["reason"]
    assert "uses NET/Socket on lo" in st["reason"] and "NCCL INFO Using network Socket" in st["reason"], st["reason"]
    assert any(x["net"] == "Socket" and x["node"] == "spark-2" for x in st["transports"]), st["transports"]
    shown = cli(d, "status").stdout
    assert "nccl rank 1 on spark-2: NET/Socket" in shown, shown
    assert not d.repairs(t), "slow is shown and alerted, never repaired"
    FAULT.unlink()
    assert cli(d, "restart", "--serve-only").returncode == 0
    st = d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING on RDMA again")
    assert {x["net"] for x in st["transports"]} == {"IB"}, st["transports"]


def test_an_mtu_mismatch_is_degraded_while_serving_and_holds_a_start(healthy: Supervisor) -> None:
    d = healthy
    t = time.time()
    hosttree.mtu("spark-2", 1500)  # a firmware update reset one NIC
    st = d.wait(lambda s: s["phase"] == "DEGRADED", 60, "DEGRADED on the MTU")
    assert st["reason_kind"] == "FabricMtuMismatch" and "spark-1 lo 9000, spark-2 lo 1500" in st["reason"], st["reason"]
    assert not d.repairs(t)
    assert cli(d, "restart", "--serve-only").returncode == 0  # a start: it must not begin on this fabric
    st = d.wait(lambda s: s["phase"] == "STARTING_VLLM" and s["reason_kind"] == "FabricMtuMismatch", 120,
                "the start held on the MTU")
    assert serve_processes() == 0, "a serve was launched on a broken fabric"
    hosttree.mtu("spark-2", 9000)
    d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING once the MTU is fixed")
    verify_serving(d)


def test_a_moved_gid_before_a_gang_repair_is_named_before_any_container_starts(healthy: Supervisor) -> None:
    d = healthy
    hosttree.move_gid("spark-2", 4)  # the peer rebooted and its RoCE v2 GID came back at another index
    st = d.wait(lambda s: s["reason_kind"] == "GidIndexMoved", 60, "GidIndexMoved while serving")
    assert st["phase"] == "DEGRADED" and "spark-2 rocep1s0f1: 127.0.0.3 is at index 4, NCCL_IB_GID_INDEX=3" in st["reason"]
    t = time.time()
    testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"])  # the worker's container lost: a gang repair
    d.wait(lambda _: bool(d.repairs(t)), 60, "the gang repair")
    st = d.wait(lambda s: s["phase"] in ("DETECTING", "CLEANING") and s["reason_kind"] == "GidIndexMoved", 120,
                "the start held on the GID")
    assert not containers("spark-1") and not containers("spark-2"), "a container started on a moved GID"
    hosttree.move_gid("spark-2", 3)
    d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING once the GID is back")
    verify_serving(d)


def test_a_worker_that_rebooted_is_a_gang_repair_even_with_its_containers_back(healthy: Supervisor) -> None:
    d = healthy
    st = d.wait(lambda s: bool((s["nodes"]["spark-2"].get("host") or {}).get("boot_id_at_serving")), 30,
                "spark-2's boot ID recorded for the serve")
    before = st["nodes"]["spark-2"]["host"]["boot_id"]
    assert before and st["nodes"]["spark-2"]["host"]["boot_id_at_serving"] == before
    t = time.time()
    os.kill(d.proc.pid, signal.SIGSTOP)  # while the supervisor does not look: spark-2 reboots, its engine
    try:                                 # brings its container back, and its raylet joins the head again
        hosttree.reboot("spark-2")
        testbed.docker("spark-2", "restart", "-t", "1", OWNED["spark-2"])
        testbed.until(lambda: containers("spark-2")[OWNED["spark-2"]]["state"] == "running", 60, "its container back")
        if BACKEND == "ray":  # back in Ray too: nothing but its boot ID says it went away
            testbed.until(lambda: "127.0.0.3" in (faults.ray_alive_ips() or set()), 60, "spark-2 alive in Ray again")
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    d.wait(lambda _: bool(d.repairs(t)), 120, "the repair")
    r = d.repairs(t)[0]
    if BACKEND == "mp" and r["kind"] == "serve":
        # mp: the restarted container took its rank with it. A tick the stop caught half-way may read that
        # before the next full observation reads the boot ID: a repair of every rank, as legitimate.
        assert r["reason"].startswith(("ServeRankExited: spark-2", "ServeRankMissing: no serve on spark-2")), r
    else:
        assert r["kind"] == "gang" and r["reason"].startswith("PeerRebooted: spark-2 (boot ID "), r
    st = d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING after the gang repair")
    after = st["nodes"]["spark-2"]["host"]
    assert after["boot_id"] != before and after["boot_id_at_serving"] == after["boot_id"]
    verify_serving(d)


def test_nvidia_smi_that_lost_nvml_is_gpu_access_lost_with_its_hint(healthy: Supervisor) -> None:
    d = healthy
    t = time.time()
    testbed.gpu_access_lost("spark-2")
    st = d.wait(lambda s: s["reason_kind"] == "GpuAccessLost", 60, "GpuAccessLost")
    assert st["phase"] == "DEGRADED", st
    assert "spark-2: Failed to initialize NVML: Unknown Error: " in st["reason"] and "CDI refresh" in st["reason"]
    assert st["nodes"]["spark-2"]["gpu_lost"] == "Failed to initialize NVML: Unknown Error"
    assert not d.repairs(t)
    testbed.gpu_access_lost("spark-2", False)
    d.wait(lambda s: s["phase"] == "SERVING", 60, "SERVING once the GPU answers again")


def test_nvml_lost_inside_the_containers_only_is_gpu_access_lost(healthy: Supervisor) -> None:
    """What a host `systemctl daemon-reload` does on a real Spark: the host's nvidia-smi still works, the
    containers' GPU is gone (NVIDIA/nvidia-container-toolkit #48). Seen by asking inside the deployment's own
    containers; the host's reading stays whole."""
    d = healthy
    t = time.time()
    testbed.gpu_access_lost("spark-2", where="container")
    try:
        st = d.wait(lambda s: s["reason_kind"] == "GpuAccessLost", 60, "GpuAccessLost from inside a container")
        assert st["phase"] == "DEGRADED", st
        lost = st["nodes"]["spark-2"]["gpu_lost"]
        assert lost == f"Failed to initialize NVML: Unknown Error (in {OWNED['spark-2']})", lost
        assert st["nodes"]["spark-1"]["gpu_lost"] == "" and not d.repairs(t)
    finally:
        testbed.gpu_access_lost("spark-2", False, where="container")
    d.wait(lambda s: s["phase"] == "SERVING", 60, "SERVING once the containers see the GPU again")


def test_two_nodes_with_one_machine_id_is_a_warning_in_check_and_diagnose(healthy: Supervisor) -> None:
    d = healthy
    one = "0123456789abcdef0123456789abcdef"
    for node in ("spark-1", "spark-2"):
        hosttree.machine_id(node, one)
    said = "spark-1, spark-2 share /etc/machine-id 01234567"
    check = cli(d, "check", "--preflight")
    assert f"warning: {said}" in check.stderr, check.stdout + check.stderr
    diag = cli(d, "diagnose")
    assert f"warning: {said}" in diag.stdout, diag.stdout + diag.stderr
    assert d.status() is not None and d.wait(lambda s: s["phase"] == "SERVING", 30, "still SERVING")
