"""The vLLM stand-in run for real as a subprocess (mp mode, no Ray) on a free port: unit tests use it to
compare it with the real server's captured output and to check its memory rule."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_testbed.testbed import until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StandinProcess:
    def __init__(self, tmp: Path, args: list[str], env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = tmp / f"standin-{self.port}.log"
        full = {**{k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")},
                "STANDIN_SHARDS": "3", "STANDIN_SHARD_SECONDS": "0.01", **env}
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "spark_testbed.vllm_standin", "serve", "--distributed-executor-backend",
                 "mp", "--host", "127.0.0.1", "--port", str(self.port), *args],
                stdout=f, stderr=subprocess.STDOUT, env=full, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def until(self, cond: Callable[[], object], what: str, timeout: float = 30) -> None:
        """The testbed's own deadline wait; a timeout shows the stand-in's log."""
        try:
            until(cond, timeout, what, every=0.02)
        except TimeoutError as e:
            raise AssertionError(f"{e}:\n{self.text()[-2000:]}") from None

    def started(self) -> str:
        self.until(lambda: "Application startup complete." in self.text() or self.proc.poll() is not None,
                   "the start")
        assert "Application startup complete." in self.text(), self.text()
        return self.text()

    def exited(self) -> int:
        self.until(lambda: self.proc.poll() is not None, "the stand-in exits")
        return int(self.proc.returncode)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def close(self) -> None:
        """The whole process group: rank 0's "worker" outlives a killed rank 0, as the real one does."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
