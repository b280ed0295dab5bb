"""What the daemon keeps across its own restart (issue 42, item 7), on the testbed: a watchdog restart,
`systemctl restart` or the head's reboot must not lose the images that served (a repair before the next SERVING
starts them by ID, not what the tag names by then) nor the way back from a change on probation (the switched spec
that fails after the restart is still rolled back to the spec and images that served). One bring-up; each step
kills the daemon with SIGKILL and starts a new one on the same state directory."""

from __future__ import annotations

import signal
import time
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import testbed
from spark_testbed.harness import OWNED, Supervisor, verify_serving, write_config
from tests.integration.conftest import reset_testbed

pytestmark = pytest.mark.testbed


class Daemons:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.n = tmp, 0
        self.config = write_config(tmp, {"healing": {"deep_probe_interval": 30, "repair_budget": 20}})
        self.d = self.start()

    def start(self) -> Supervisor:
        self.n += 1
        return Supervisor(self.config, self.tmp, f"daemon-{self.n}")

    def restart(self, meanwhile: Any = None) -> Supervisor:
        """SIGKILL (nothing written on the way out), ``meanwhile()``, then a new daemon."""
        self.d.stop(signal.SIGKILL)
        if meanwhile is not None:
            meanwhile()
        self.d = self.start()
        return self.d


@pytest.fixture(scope="module")
def daemons(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    reset_testbed()
    ds = Daemons(tmp_path_factory.mktemp("restart-keeps"))
    ds.d.wait_phase("SERVING", 240)
    yield ds
    if ds.d.proc.poll() is None:
        ds.d.stop(signal.SIGKILL)
    testbed.docker("spark-2", "tag", testbed.HOSTFS, testbed.HOSTFS, check=False)
    reset_testbed()


def image_of(node: str, container: str) -> str:
    return testbed.docker(node, "inspect", "--format", "{{.Image}}", container).stdout.decode().strip()


def since(s: dict[str, Any]) -> float:
    return datetime.fromisoformat(s["since"]).timestamp()


def test_a_repair_right_after_a_restart_starts_the_images_that_served(daemons: Daemons) -> None:
    d = daemons.d
    verify_serving(d)
    name = OWNED["spark-2"]
    ran = image_of("spark-2", name)

    def tag_moves_and_the_worker_goes() -> None:
        testbed.docker("spark-2", "tag", testbed.BUSYBOX, testbed.HOSTFS)  # the tag now names other content
        testbed.docker("spark-2", "rm", "-f", name)
    t = time.time()
    try:
        d = daemons.restart(tag_moves_and_the_worker_goes)
        assert d.events("image.pins_restored") or d.wait(lambda _: bool(d.events("image.pins_restored")), 30,
                                                         "the pins restored")
        d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING after the repair")
        verify_serving(d)
        assert image_of("spark-2", name) == ran, "the repair started the re-tagged image, not the one that served"
    finally:
        testbed.docker("spark-2", "tag", ran, testbed.HOSTFS)


def test_a_switched_spec_failing_after_a_restart_is_still_rolled_back(daemons: Daemons) -> None:
    d = daemons.d
    st = verify_serving(d)
    ran = {n: image_of(n, c) for n, c in OWNED.items()}
    good = daemons.config.read_text()
    doc = tomllib.loads(good)
    dep = doc["deployments"][0]
    dep["serve"]["env"] = {**dep["serve"]["env"], "STANDIN_FAIL": "never-ready"}  # a new spec that never serves
    # It loads, then hangs: past the cold deadline a load that moved is left to the stall limit, which stops it.
    dep["readiness"] = {**dep["readiness"], "deadline": 20, "stall_timeout": 20}
    daemons.config.write_text(tomli_w.dumps(doc))
    try:
        d.proc.send_signal(signal.SIGHUP)
        d.wait(lambda s: s["config"]["hash"] != st["config"]["hash"] and s["phase"] == "LOADING", 180,
               "the new spec switched to, loading")
        t = time.time()
        d = daemons.restart()
        d.wait(lambda _: bool(d.events("change.way_back_restored")), 60, "the way back restored")
        d.wait(lambda _: bool(d.events("change.rolled_back")), 120, "the rollback")
        rolled = d.events("change.rolled_back")[0]
        assert "LoadStalled" in rolled["reason"], rolled
        d.wait(lambda s: s["phase"] == "SERVING" and since(s) > t, 240, "SERVING on the spec that served")
        verify_serving(d)
        assert {n: image_of(n, c) for n, c in OWNED.items()} == ran
    finally:
        daemons.config.write_text(good)
