"""The real two-node testbed: two Docker engines, SSH to the worker, Ray in containers, a real notify socket.

Started by the tests themselves (spark_testbed.testbed.up is idempotent); `make test` installs what it needs.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import testbed
from spark_testbed.testbed import until

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

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


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_config(tmp_path: Path, patch: dict[str, Any] | None = None, *,
                 deployment: dict[str, Any] | None = None) -> Path:
    d = tomllib.loads((ROOT / "etc" / "testbed.toml").read_text())
    d = merge(d, {"supervisor": {"state_dir": str(tmp_path / "state")}})
    d = merge(d, patch or {})
    if deployment:
        d["deployments"][0] = merge(d["deployments"][0], deployment)
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(d))
    return path


def containers(node: str) -> dict[str, dict[str, Any]]:
    """name -> {id, state, labels} on one node's engine, read with the docker CLI (not our adapter)."""
    out = testbed.docker(node, "ps", "-a", "--format", "{{json .}}").stdout.decode()
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["Names"]: {"id": r["ID"], "state": r["State"], "labels": r["Labels"]} for r in rows}


class Supervisor:
    """`spark-supervisor run` as a child process with a real sd_notify socket."""

    def __init__(self, config: Path, tmp_path: Path, name: str = "daemon"):
        self.config, self.tmp = config, tmp_path
        self.state_dir = Path(tomllib.loads(config.read_text())["supervisor"]["state_dir"])
        self.log_path = tmp_path / f"{name}.log"
        self.notifications: list[str] = []
        self.addr = f"@spark-test-{uuid.uuid4().hex[:12]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.addr[1:])
        self.sock.settimeout(0.2)
        self._reading = True
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(BIN / "spark-supervisor"), "run", "--config", str(config)],
                                     stdout=self._logf, stderr=subprocess.STDOUT,
                                     env={**os.environ, "NOTIFY_SOCKET": self.addr})

    def _read(self) -> None:
        while self._reading:
            try:
                self.notifications.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.state_dir / "status.json").read_text())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if name is None or e.get("event") == name:
                out.append(e)
        return out

    def wait(self, cond: Callable[[dict[str, Any]], object], timeout: float, what: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.tail()}")
            st = self.status()
            return st if st is not None and cond(st) else None
        try:
            return until(check, timeout, what, every=0.2)  # type: ignore[return-value]
        except TimeoutError as e:
            raise AssertionError(f"{e}; last status: {json.dumps(self.status())[:1500]}\n{self.tail()}") from None

    def wait_phase(self, phase: str, timeout: float = 120) -> dict[str, Any]:
        return self.wait(lambda s: s["phase"] == phase, timeout, f"phase {phase}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self._reading = False
            self._reader.join(timeout=2)
            self.sock.close()
            self._logf.close()
        return code


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
