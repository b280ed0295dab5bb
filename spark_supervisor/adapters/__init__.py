"""Side effects live here: Docker, SSH, systemctl, nvidia-smi, Ray's dashboard, vLLM's HTTP API.

Adapter failures are exception types: retries name the types they retry (``TransientError``), and
nothing parses a reason string back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class AdapterError(Exception):
    """An I/O operation failed; ``reason`` is a CamelCase tag for status, ``str()`` the detail."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.args[0]}"


class TransientError(AdapterError):
    """Could not reach the other side this time (refused, reset, timed out): worth a retry soon."""


class Unreachable(TransientError):
    """The node itself does not answer (its sshd, its Docker engine)."""


class NotFoundError(AdapterError):
    """The engine answered: there is no such object (container, image)."""


class ImageMissingError(NotFoundError):
    pass


def within(fn: Callable[[], T], timeout: float, what: str, *, heartbeat: Callable[[], None] | None = None,
           reason: str = "Timeout") -> T:
    """Run ``fn`` with a hard deadline: a hung peer must not hang the caller. On timeout the call is
    abandoned in its daemon thread (the adapter drops its connection) and TransientError is raised.
    ``heartbeat`` is called about once a second while waiting (the loop's systemd watchdog)."""
    box: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name=f"io-{what[:20]}").start()
    if heartbeat is None:
        finished = done.wait(timeout)
    else:
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.daemon = True
        timer.start()
        while not (finished := done.wait(1.0)) and not deadline.is_set():
            heartbeat()
        timer.cancel()
    if not finished:
        raise TransientError(reason, f"{what}: no answer within {timeout:.0f}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
