"""A port the deployment needs, held by a foreign process on the head's fabric IP (a busy machine, issue 19):
FAILED PortInUse naming node and port before anything starts (no container, no repair, no budget); once the
holder is gone, `spark-supervisor reset` brings it to SERVING."""

from __future__ import annotations

import os
import socket
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, containers, verify_serving, write_config


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout)


@contextmanager
def listening(address: str, port: int) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the last test's connections may be in TIME_WAIT
    try:
        s.bind((address, port))
        s.listen()
        yield s
    finally:
        s.close()


def started(d: Supervisor, action: str) -> list[dict[str, Any]]:
    return [e for e in d.events("action.started") if e.get("action") == action]


def assert_nothing_started(d: Supervisor, st: dict[str, Any]) -> None:
    assert not started(d, "StartContainer") and not started(d, "StartServe")
    for node in testbed.NODES:
        assert containers(node) == {}, containers(node)
    assert not d.repairs() and st["repairs"]["in_window"] == 0


def test_a_foreign_holder_of_rays_gcs_port_is_failed_before_any_repair_then_serves_after_reset(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    d = tomllib.loads(config.read_text())
    head = next(n for n in d["nodes"] if n.get("role") == "head")
    port = int(d["deployments"][0].get("ray", {}).get("port", 6379))
    with listening(head["fabric_ip"], port):
        daemon = supervisor(config)
        st = daemon.wait_phase("FAILED", 180)
        assert st["reason_kind"] == "PortInUse", st["reason"]
        assert f"{head['name']}: {port} (Ray's GCS) held by" in st["reason"], st["reason"]
        # the node can name the holder (the daemon runs as root): this very process
        assert f"pid {os.getpid()}" in st["reason"] or "does not name" in st["reason"], st["reason"]
        assert_nothing_started(daemon, st)
    out = cli("reset", "--config", str(config))
    assert out.returncode == 0, out
    daemon.wait_phase("SERVING", 240)
    verify_serving(daemon)
    assert not daemon.repairs()


def test_a_holder_of_the_serve_port_on_every_address_is_named_before_ray_starts(
        supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    port = int(tomllib.loads(config.read_text())["deployments"][0]["serve"]["port"])
    with listening("0.0.0.0", port):
        daemon = supervisor(config)
        st = daemon.wait_phase("FAILED", 180)
        assert st["reason_kind"] == "PortInUse", st["reason"]
        assert f": {port} (the serve" in st["reason"] and "on 0.0.0.0" in st["reason"], st["reason"]
        assert_nothing_started(daemon, st)
