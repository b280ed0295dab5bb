"""Past two Sparks: the testbed with a third node (its own Docker engine, reached over its own sshd), and a
tensor-parallel deployment over all three."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import testbed
from spark_testbed.harness import Supervisor, containers, serve_processes, write_config

PATCH: dict[str, Any] = {"healing": {"repair_budget": 50}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}
NAMES = {n: f"testbed-ray-{n}" for n in testbed.nodes(3)}


@pytest.fixture
def third_node(clean: None) -> Iterator[None]:
    testbed.up(3)
    testbed.write_gpu("spark-3")
    yield


def verify(d: Supervisor, since: float = 0.0) -> dict[str, Any]:
    st = d.wait(lambda s: s["phase"] == "SERVING" and s["ray"] and s["ray"]["nodes_alive"] == 3
                and datetime.fromisoformat(s["since"]).timestamp() > since
                and not s["reason"].startswith("ObservationUnknown"), 240, "SERVING on three nodes")
    for node, name in NAMES.items():
        now = containers(node)
        assert set(now) == {name} and now[name]["state"] == "running", f"{node}: {now}"
    assert serve_processes("spark-1") == 1
    assert st["ray"]["gpus"] == 3.0 and sorted(n["ip"] for n in st["ray"]["nodes"] if n["alive"]) == [
        "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    return st


def test_a_deployment_over_three_nodes_serves_and_the_third_nodes_loss_is_a_gang_repair(
        supervisor: Callable[..., Supervisor], third_node: None, tmp_path: Path) -> None:
    d = supervisor(write_config(tmp_path, PATCH, deployment={"serve": {"tensor_parallel_size": 3}}, nodes=3))
    d.wait_phase("SERVING", 240)
    verify(d)
    assert [e["node"] for e in d.events("image.checked")].count("spark-3") == 1
    t = time.time()
    testbed.docker("spark-3", "rm", "-f", NAMES["spark-3"])
    d.wait(lambda _: d.repairs(t), 60, "a repair")
    verify(d, t)
    first = d.repairs(t)[0]
    assert first["kind"] == "gang" and first["reason_kind"] in ("PartialDeployment", "RayNodeLost"), first
