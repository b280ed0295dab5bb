"""The real two-node testbed: two Docker engines, SSH to the worker, Ray in containers, a real notify socket.

Started by the tests themselves (spark_testbed.testbed.up is idempotent); `make test` installs what it needs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_testbed import testbed
from spark_testbed.harness import Supervisor

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="session")
def tb() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or not Path("/usr/sbin/dockerd").exists():
        pytest.fail("the testbed needs root and the Debian packages from `make deps`")
    testbed.up()
    env = testbed.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the daemon and docker-py's SSH transport read HOME/.ssh
    yield env
    testbed.clean_containers()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def clean(tb: dict[str, str]) -> Iterator[None]:
    """Each test starts from empty engines and idle GPUs, and leaves nothing behind."""
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    yield
    testbed.clean_containers()


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def start(config: Path, name: str = "daemon") -> Supervisor:
        s = Supervisor(config, tmp_path, name)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop(signal.SIGKILL)
