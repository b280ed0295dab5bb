"""Side effects live here: Docker, SSH, systemctl, nvidia-smi, Ray's dashboard, vLLM's HTTP API.

Adapter failures are exception types: retries name the types they retry (``TransientError``), and
nothing parses a reason string back.
"""

from __future__ import annotations

import collections
import functools
import queue
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import structlog

T = TypeVar("T")
P = ParamSpec("P")


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


class UnexpectedError(AdapterError):
    """A probe raised what no adapter foresees (a bug, or bytes no parser expected): that probe's unknown."""


# Probe name -> how many times it raised an unexpected exception, in this process (the metric
# spark_supervisor_probe_unexpected_errors_total). The test suites hold it at 0: guarded() must not hide a bug.
UNEXPECTED: collections.Counter[str] = collections.Counter()
_UNEXPECTED_LOCK = threading.Lock()


def guarded(probe: str, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``, with any exception but an AdapterError turned into that probe's UnexpectedError: counted,
    logged with its traceback, and never the caller's crash (one odd byte must not blind every probe)."""
    try:
        return fn(*args, **kwargs)
    except AdapterError:
        raise
    except Exception as e:
        with _UNEXPECTED_LOCK:
            UNEXPECTED[probe] += 1
        structlog.get_logger().error("probe.unexpected", probe=probe, error=f"{type(e).__name__}: {e}"[:300],
                                     exc_info=True)
        raise UnexpectedError("ProbeFailed", f"{probe}: {type(e).__name__}: {e}"[:300]) from e


def probe(name: str, unknown: Callable[[UnexpectedError], T]) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A reading that answers an observation even when it fails: one that raised the unforeseen answers
    ``unknown(error)`` instead (guarded: counted and logged)."""
    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def read(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return guarded(name, fn, *args, **kwargs)
            except UnexpectedError as e:
                return unknown(e)
        return read
    return wrap


class _Workers:
    """Daemon threads that run within()'s calls, kept for the next one: a call then costs a hand-over instead
    of a thread's start (measured: 0.4 ms of CPU a Docker call, as much as docker-py's request itself). One
    more is started whenever none is idle, so that a hung call never holds up another, as with a thread per
    call; one idle for IDLE_S ends. Daemon threads: a call hung at exit does not hold the process."""

    IDLE_S = 60.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            start = self._idle == 0
            if not start:
                self._idle -= 1
        if start:
            threading.Thread(target=self._work, args=(job,), daemon=True, name="io").start()
        else:
            self._jobs.put(job)

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # not counted on by a submit that has not put its job yet
                        self._idle -= 1
                        return
                job = self._jobs.get()  # a submit counted on this one: its job is on the way


_WORKERS = _Workers()


def within(fn: Callable[[], T], timeout: float, what: str, *, heartbeat: Callable[[], None] | None = None,
           reason: str = "Timeout") -> T:
    """Run ``fn`` with a hard deadline: a hung peer must not hang the caller. On timeout the call is
    abandoned in its daemon thread (the adapter drops its connection) and TransientError is raised.
    ``heartbeat`` is called about once a second while waiting (the loop's systemd watchdog)."""
    box: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        threading.current_thread().name = f"io-{what[:20]}"
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller below
            box["error"] = e
        finally:
            done.set()

    _WORKERS.submit(run)
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
