"""systemd as an operator meets it (issue 44, item 5), under the real systemd of test_systemd.py's head
container (its `head` fixture: the supervisor installed with `make install`, the unit, the config):

- pulled bytes are start progress: with image_pull = "if-missing" and an image that must come from a slow
  registry (spark_testbed.registry, on loopback: CI reaches none), the pull outlasts the unit's start
  timeout and the daemon still reaches SERVING, never killed nor restarted;
- `make install-unit` (the end of `make install`) reloads systemd only when the unit file changed."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
import tomli_w

from spark_testbed import registry, testbed
from spark_testbed.harness import ROOT
from spark_testbed.testbed import head_exec
from tests.integration.test_systemd import (  # noqa: F401 (head: the fixture, used by name)
    CONFIG,
    STALE_UNITS,
    UNIT,
    events,
    expanded_config,
    head,
    put,
    serving,
    wait_unit,
)

TIMEOUT_START_S = 20  # the test's TimeoutStartSec (the shipped unit's is 5 min)
PULL_S = 50  # about how long each node's pull takes: over twice the start timeout
PULLED_BYTES = 1 << 20  # the random layer every node must download
DROP_IN = f"/etc/systemd/system/{UNIT}.service.d/test-pull.conf"


@pytest.fixture
def slow_registry(head: str) -> Iterator[registry.Registry]:  # noqa: F811 (the imported fixture)
    """The testbed's hostfs image with a new random layer, served at PULL_S per pull. Afterwards: the unit
    stopped, its containers gone and the pulled image removed from both engines, as the testbed was."""
    saved = testbed.docker("spark-1", "save", testbed.HOSTFS, timeout=120).stdout
    image = registry.from_saved(saved, PULLED_BYTES)
    reg = registry.Registry(image, "spark-testbed/pulled", "slow", rate=image.added[1] / PULL_S)
    for node in testbed.NODES:
        assert testbed.docker(node, "image", "inspect", reg.reference, check=False).returncode != 0
    try:
        yield reg
    finally:
        head_exec("systemctl", "stop", UNIT, check=False, timeout=180)
        head_exec("rm", "-f", DROP_IN)
        head_exec("systemctl", "daemon-reload")
        reg.stop()
        testbed.clean_containers()
        for node in testbed.NODES:
            testbed.docker(node, "rmi", "-f", reg.reference, check=False)


def _at(event: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(event["timestamp"]))


def test_a_pull_longer_than_the_start_timeout_ends_in_serving_without_a_restart(
        slow_registry: registry.Registry) -> None:
    # Nothing to clean (the old stack's units stopped by hand): the daemon's first pass is then the image
    # check, and so the pull, with no pass reported before it (each report extends the start by 3 min).
    head_exec("systemctl", "disable", "--now", *STALE_UNITS)
    d = expanded_config()
    d["stale"]["units"] = []
    d["deployments"][0]["ray"].update(image=slow_registry.reference, image_pull="if-missing", pull_min_free_gib=1)
    put(CONFIG, tomli_w.dumps(d))
    put(DROP_IN, f"[Service]\nTimeoutStartSec={TIMEOUT_START_S}s\n")
    head_exec("systemctl", "daemon-reload")
    assert head_exec("systemctl", "show", UNIT, "-p", "TimeoutStartUSec").stdout.strip() == \
        f"TimeoutStartUSec={TIMEOUT_START_S}s"
    head_exec("systemctl", "start", "--no-block", UNIT)
    pid = wait_unit(lambda p: p["ActiveState"] == "activating" and p["MainPID"] != "0", 30, "activating")["MainPID"]
    p = wait_unit(serving, PULL_S + 150, "active and SERVING")
    assert (p["NRestarts"], p["MainPID"], p["Result"]) == ("0", pid, "success"), p
    assert len(events("daemon.started")) == 1
    # The pulls went through the registry, whole, and outlasted the start timeout.
    added, size = slow_registry.image.added
    assert slow_registry.served.blob_bytes(added) == 2 * size  # once to each node, whole
    pulled = {e["node"]: _at(e) for e in events("image.pulled")}
    assert set(pulled) == set(testbed.NODES) and all(e["image"] == slow_registry.reference
                                                     for e in events("image.pulled"))
    started = _at(events("daemon.started")[0])
    took = max((t - started).total_seconds() for t in pulled.values())
    assert took > TIMEOUT_START_S + 10, took
    print(f"\npulls ended {took:.0f}s after the start (TimeoutStartSec={TIMEOUT_START_S}s), "
          f"{slow_registry.served.blob_bytes()} blob bytes served at {slow_registry.rate:.0f} B/s a connection")


def _reloads() -> int:
    """How many times systemd has reloaded: PID 1 logs each ("Reloading."), and `journalctl --sync` returns
    once every message logged before it is stored."""
    head_exec("journalctl", "--sync")
    out = head_exec("journalctl", "_PID=1", "-o", "cat", "--no-pager").stdout
    return sum(line.startswith("Reloading") for line in out.splitlines())


def test_make_install_reloads_systemd_only_when_the_unit_changed(head: str) -> None:  # noqa: F811
    unit = f"/etc/systemd/system/{UNIT}.service"
    shipped = (ROOT / "systemd" / f"{UNIT}.service").read_text()
    assert head_exec("cat", unit).stdout == shipped  # the fixture's `make install` put it there
    before = _reloads()
    assert before > 0  # the fixture's `make install` and daemon-reload: the count sees reloads
    out = head_exec("make", "--no-print-directory", "-C", str(ROOT), "install-unit").stdout
    assert "unchanged: no systemctl daemon-reload" in out and _reloads() == before
    put(unit, shipped + "# an older version's unit\n")
    out = head_exec("make", "--no-print-directory", "-C", str(ROOT), "install-unit").stdout
    assert "systemctl daemon-reload" in out and "unchanged" not in out
    assert _reloads() == before + 1  # systemctl daemon-reload returns once systemd has reloaded
    assert head_exec("cat", unit).stdout == shipped
