"""The real two-node testbed: two Docker engines, SSH to the worker, Ray in containers, a real notify socket.

Started by the tests themselves (spark_testbed.testbed.up is idempotent); `make test` installs what it needs.

Isolation, so that a test that fails (or a noisy machine that slows everything down) cannot cascade into
the next one: every test that uses `clean` (and so `supervisor` and `serving_daemon`) starts from a reset
testbed and resets it again afterwards, whatever happened: processes a fault stopped are continued, the
engines and sshd are up, the daemons it started are killed, every node container is removed, the GPUs are
idle and no serve fault is armed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import faults, hosttree, testbed
from spark_testbed.harness import Supervisor, verify_serving, write_config

pytestmark = pytest.mark.testbed

FAULT_FILE = testbed.DIR / "serve-fault"


def reset_testbed() -> None:
    """Back to an empty, healthy testbed."""
    faults.thaw_all()  # first: a stopped dockerd would hang everything below
    FAULT_FILE.unlink(missing_ok=True)
    testbed.up()  # an engine or sshd a test stopped is started again (idempotent)
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
        hosttree.reset(node)  # a healthy fabric again, the boot ID kept (a test that rebooted one keeps it)


@pytest.fixture(scope="session")
def tb() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or not Path("/usr/sbin/dockerd").exists():
        pytest.fail("the testbed needs root and the Debian packages from `make deps`")
    faults.thaw_all()
    testbed.up()
    env = testbed.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the daemon and docker-py's SSH transport read HOME/.ssh
    yield env
    faults.thaw_all()
    testbed.clean_containers()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def clean(tb: dict[str, str]) -> Iterator[None]:
    """Each test starts from empty engines and idle GPUs, and leaves nothing behind."""
    reset_testbed()
    yield
    reset_testbed()


@pytest.fixture
def supervisor(clean: None, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start daemons; each is killed after the test, before the testbed is reset (it would re-create)."""
    started: list[Supervisor] = []

    def start(config: Path, name: str = "daemon") -> Supervisor:
        s = Supervisor(config, tmp_path, name)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
        s.stop(signal.SIGKILL)


@pytest.fixture
def serving_daemon(request: pytest.FixtureRequest, supervisor: Callable[..., Supervisor],
                   tmp_path: Path) -> Supervisor:
    """A daemon brought to SERVING from a clean testbed, verified: exactly our containers, running, on
    each node, and exactly one serve process. The config is etc/testbed.toml patched with the test
    module's PATCH (and DEPLOYMENT) if it has them."""
    patch: dict[str, Any] | None = getattr(request.module, "PATCH", None)
    d = supervisor(write_config(tmp_path, patch, deployment=getattr(request.module, "DEPLOYMENT", None)))
    d.wait_phase("SERVING", 240)
    verify_serving(d)
    return d
