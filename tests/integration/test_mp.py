"""vLLM's own multi-node mode (distributed_executor_backend = "mp") on the two testbed nodes: a serve rank in
a container on each node, rank 0 on the head with the API, no Ray. The stand-in speaks this mode (the CPU
build of vLLM cannot run it: docs/testbed.md, "The real vLLM CPU server"); its rendezvous is a real TCP connection between the nodes.

`make test-mp` runs the whole fault matrix on this backend; these are the cases `make test` always runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import testbed
from spark_testbed.harness import Supervisor, containers, serve_processes, write_config

DEPLOYMENT: dict[str, Any] = {"serve": {"distributed_executor_backend": "mp"}}
PATCH: dict[str, Any] = {"healing": {"repair_budget": 50}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}
NAMES = {n: f"testbed-vllm-{n}" for n in testbed.NODES}


def verify(d: Supervisor, since: float = 0.0) -> dict[str, Any]:
    """SERVING (entered after `since`), exactly one container and one serve rank on each node."""
    st = d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > since
                and not s["reason"].startswith("ObservationUnknown"), 180, "SERVING")
    for node, name in NAMES.items():
        now = containers(node)
        assert set(now) == {name} and now[name]["state"] == "running", f"{node}: {now}"
        assert serve_processes(node, name) == 1, f"{node}: not exactly one serve rank"
    assert st["ray"] is None and st["serve"]["ranks"]["spark-2"]["running"], st["serve"]
    return st


@pytest.fixture
def mp(shared: Callable[..., Supervisor]) -> Supervisor:
    """The mp deployment SERVING, shared with the previous test if it passed (conftest.shared: its starting
    state verified, a fresh bring-up otherwise); each test counts repairs from its own start."""
    d = shared(PATCH, DEPLOYMENT, owned=NAMES, ranks=dict.fromkeys(NAMES, 1))
    verify(d)
    return d


def ids() -> dict[str, str]:
    return {n: containers(n)[c]["id"] for n, c in NAMES.items()}


def test_an_mp_deployment_serves_on_two_nodes_without_ray(mp: Supervisor) -> None:
    launched = {e["node"]: e["argv"] for e in mp.events("serve.launched")}  # the serves running now: the last
    assert launched["spark-1"][-8:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.2",
                                        "--master-port", "29501"]
    assert launched["spark-2"][-1] == "--headless" and "1" == launched["spark-2"][-6]
    assert not mp.events("ray.container_started") or all(
        e["container"] in NAMES.values() for e in mp.events("ray.container_started"))


def test_a_worker_container_removed_is_a_gang_repair_of_the_deployment(mp: Supervisor) -> None:
    t = datetime.now().timestamp()
    testbed.docker("spark-2", "rm", "-f", NAMES["spark-2"])
    mp.wait(lambda _: mp.repairs(t), 60, "a repair")
    verify(mp, t)
    kinds = [e["kind"] for e in mp.repairs(t)]
    assert kinds and kinds[0] == "gang", mp.repairs(t)


def test_a_worker_rank_killed_is_a_serve_repair_of_every_rank(mp: Supervisor) -> None:
    before, t = ids(), datetime.now().timestamp()
    testbed.docker("spark-2", "exec", NAMES["spark-2"], "sh", "-c", "kill -9 $(cat /tmp/spark-supervisor/testbed/pid)")
    mp.wait(lambda _: mp.repairs(t), 60, "a repair")
    verify(mp, t)
    first = mp.repairs(t)[0]
    assert first["kind"] == "serve", first
    # Its own exit, or the head's: whichever the daemon saw first ends the serve of every rank.
    assert first["reason"].startswith(("ServeRankExited: spark-2 (rank 1)", "ServeExited", "ServeFailed",
                                       "ServeUnhealthy")), first
    assert ids() == before  # the containers stayed: only the serves were restarted


def test_the_master_port_taken_is_named_before_anything_starts_and_served_after_reset(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    import socket
    import subprocess

    from spark_testbed.harness import BIN
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.2", 29501))  # the head's fabric IP and the default master_port
    squatter.listen()
    config = write_config(tmp_path, PATCH, deployment=DEPLOYMENT)
    try:
        d = supervisor(config)
        # The port pre-check names it before any container starts or any budget is spent (issue 19).
        st = d.wait_phase("FAILED", 180)
        assert st["reason_kind"] == "PortInUse", st["reason"]
        assert "spark-1: 29501 (the serve's rank 0 (master_port)) held by" in st["reason"], st["reason"]
        assert not d.repairs() and all(containers(n) == {} for n in testbed.NODES)
    finally:
        squatter.close()
    out = subprocess.run([str(BIN / "spark-supervisor"), "reset", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out
    verify(d)
    assert not d.repairs(), d.repairs()
