"""The daemon: the process shell around the stack of reconcilers (``stack.Stack``, one per configured
deployment): signals, reload, shutdown, systemd's watchdog, the control socket, the state directory's
lock; after each pass the reporter (``reporting.Reporter``) tells systemd and the status file.

Signal handlers only record the signal and wake the loop; the loop dispatches them between ticks."""

from __future__ import annotations

import collections
import dataclasses
import errno
import fcntl
import os
import random
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from .. import config as config_mod
from ..adapters.retry import backoff_delay
from ..base.log import Log
from ..change import proof
from ..config import Config
from ..config.view import DeploymentView
from ..model import Pause
from ..reconcile.reconciler import Reconciler
from ..reconcile.restart import restart
from ..report.notify import Notifier
from ..state import names, statefile
from ..state.control import ControlServer
from ..world.backend import Backend, on_exec_ended
from .reload import Reloader
from .reporting import Reporter
from .stack import Stack
from .waiting import Waiting


@dataclasses.dataclass
class _Request:
    """A control request on its way from the control socket's thread to the loop, and its answer."""

    command: str
    args: dict[str, Any]
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    state: str = "queued"  # "taken" by the loop, or "cancelled" by the caller that gave up waiting
    reply: str = ""
    error: str = ""


class Daemon:
    SETTLE_S = Reloader.SETTLE_S

    def __init__(self, config_path: str, cfg: Config, *, log: Log,
                 backend_factory: Callable[[DeploymentView], Backend] | None = None,
                 notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 rng: Callable[[], float] = random.random, prove: proof.Start = proof.start,
                 cues: Callable[[Callable[[], None]], Callable[[], None]] = on_exec_ended):
        self.config_path, self.log = config_path, log
        config_hash = config_mod.file_hash(config_path)
        self.notifier = notifier or Notifier()
        self.clock, self.wall, self.rng = clock, wall, rng
        self.stack = Stack(cfg, log=log, backend_factory=backend_factory,
                           watchdog=lambda: self.notifier.watchdog(self.clock()), clock=clock, wall=wall, rng=rng,
                           pull_moved=lambda: self.reporter.pull_moved(self.clock()))
        self.reloader = Reloader(config_path, config_hash, self.stack, self.notifier, log=log, clock=clock, wall=wall,
                                 prove=prove)
        self.reporter = Reporter(self.stack, self.reloader, self.notifier, log=log)
        # Signals and control requests: (command, arguments, set when the loop has carried it out).
        self._signals: collections.deque[int | str | _Request] = collections.deque()
        self._requests_lock = threading.Lock()
        self.control: ControlServer | None = None
        self.waiting = Waiting(clock, self.notifier)
        self._cues = cues
        self._stop_cues: Callable[[], None] = lambda: None
        self.stopped = False

    # What the stack holds, as the daemon's callers (and its tests) name it.
    @property
    def cfg(self) -> Config:
        return self.stack.cfg

    @property
    def reconcilers(self) -> dict[str, Reconciler]:
        return self.stack.reconcilers

    @property
    def pause(self) -> Pause | None:
        return self.stack.pause

    def set_pause(self, pause: Pause | None, why: str = "") -> None:
        """Pause (or resume with None) every deployment; kept in the state directory."""
        self.stack.set_pause(pause, why)
        self.reporter.changed()

    def status_line(self) -> str:
        return self.reporter.status_line()

    # ------------------------------------------------------------------------------------ one tick
    def tick(self) -> float:
        """One reconcile pass over every deployment; returns the seconds until the next is due."""
        return self._tick(due_only=False)

    def _tick(self, *, due_only: bool) -> float:
        now = self.clock()
        if self.reloader.due(now):  # the file read again: applied if it is the same (and proven), staged afresh if not
            self.reloader.reload(again=True)
            self.reporter.reloaded()
        if self.stack.pausing.ends(now):
            self.set_pause(None, "the pause's deadline passed")
        self.stack.tick(now, due_only=due_only)
        self.reporter.report(now)
        return max(0.0, min(self.stack.next_due(), self.reloader.next_due()) - self.clock())

    def reload(self) -> None:
        """SIGHUP: read the config again and move to it (or keep the previous one, and say why)."""
        self.reloader.reload()
        self.reporter.reloaded()

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budgets when the operator asks for a reset)."""
        self.stack.rearm(why)

    def shutdown(self) -> None:
        on_stop = self.cfg.supervisor.on_stop
        self.notifier.stopping(f"STOPPING on_stop={on_stop}")
        self.log.info("daemon.stopping", on_stop=on_stop)
        self.stack.stop(on_stop)
        self.reporter.changed()
        self.reporter.write_status(self.clock())
        self.stack.close()
        if self.control is not None:
            self.control.close()
        self._stop_cues()
        self.stopped = True

    # --------------------------------------------------------------------------- signals and loop
    def run(self) -> int:
        for handled in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(handled, self._on_signal)
        try:
            self.control = ControlServer(self.cfg.supervisor.state_dir, self._on_request)
        except OSError as e:  # `reset` then says it cannot reach us; the daemon itself goes on
            self.log.error("control.unavailable", error=str(e))
        self._stop_cues = self._cues(self.waiting.cue)
        self.log.info("daemon.started", config=self.config_path, config_hash=self.reloader.config_hash,
                      deployments=list(self.reconcilers), nodes=[n.name for n in self.cfg.nodes],
                      state_dir=self.cfg.supervisor.state_dir)
        while True:
            if self.dispatch():
                return 0
            try:
                wait = self._tick(due_only=True)
            except Exception as e:  # a bug must not kill the supervisor: report it, back off, go on
                self.log.exception("reconcile.crashed", error=f"{type(e).__name__}: {e}")
                wait = backoff_delay(2, self.cfg.supervisor.backoff_base, self.cfg.supervisor.backoff_max, self.rng())
            self.waiting.wait(wait, self.reconcilers.values(), lambda: bool(self._signals))

    def dispatch(self) -> bool:
        """Carry out the signals and control requests received, in order; True once it has shut down.
        Nothing carried out here can end the daemon but a stop: each is guarded, logged and answered."""
        while self._signals:
            sig = self._signals.popleft()
            if isinstance(sig, _Request):
                self._carry_out(sig)
                continue
            stop = sig not in (signal.SIGHUP, signal.SIGUSR1, "reset")
            try:
                if sig == signal.SIGHUP:
                    self.reload()
                elif not stop:
                    self.rearm("reset")
                else:
                    self.shutdown()
            except Exception as e:
                self.log.exception("daemon.signal_failed", signal=str(sig), error=f"{type(e).__name__}: {e}")
            if stop:
                return True
        return False

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGTERM and signal.SIGTERM in self._signals:
            raise SystemExit(1)  # a second SIGTERM: leave at once
        self._signals.append(signum)
        self.waiting.wake()

    # ------------------------------------------------------------------------------ control requests
    # How long a control request waits for the loop to carry it out (a tick may be in the middle of an action).
    REQUEST_WAIT_S = 120.0

    def _on_request(self, command: str, args: dict[str, Any] | None = None) -> str:
        """From the control socket's thread: record and wake, like a signal; the loop acts on it between
        ticks. pause and resume answer once done, so that what the caller does next runs under them.
        A request the loop refuses or fails at is a ValueError with its reason (answered as an error)."""
        if command == "ping":
            return f"spark-supervisor {os.getpid()}: {self.status_line()}"
        if command == "reset":
            self._signals.append(command)
            self.waiting.wake()
            return f"spark-supervisor (pid {os.getpid()}) will re-arm and forget its repair budget"
        req = _Request(command, dict(args or {}))
        self._signals.append(req)
        self.waiting.wake()
        if not req.done.wait(self.REQUEST_WAIT_S):
            with self._requests_lock:
                if req.state == "queued":  # never carried out now: the answer can say so
                    req.state = "cancelled"
                    raise TimeoutError(f"the daemon's loop did not take the {command} within "
                                       f"{self.REQUEST_WAIT_S:.0f}s; nothing was changed")
            if not req.done.wait(self.REQUEST_WAIT_S):
                raise TimeoutError(f"the daemon's loop took the {command} but has not finished it within "
                                   f"{2 * self.REQUEST_WAIT_S:.0f}s: see `spark-supervisor status`")
        if req.error:
            raise ValueError(req.error)
        return req.reply

    def _carry_out(self, req: _Request) -> None:
        """One control request, in the loop: whatever it holds, it is answered and the loop goes on."""
        with self._requests_lock:
            if req.state == "cancelled":
                return
            req.state = "taken"
        try:
            req.reply = self._request(req.command, req.args)
        except ValueError as e:  # what the request asked for cannot be done: nothing was changed
            self.log.warning("control.refused", command=req.command, error=str(e))
            req.error = f"{e}; nothing was changed"
        except Exception as e:  # a bug: answered and logged, never the end of the daemon
            self.log.exception("control.failed", command=req.command, error=f"{type(e).__name__}: {e}")
            req.error = (f"the daemon failed to carry out the {req.command} ({type(e).__name__}: {e}); "
                         "see its journal and `spark-supervisor status`")
        finally:
            req.done.set()

    def _request(self, command: str, args: dict[str, Any]) -> str:
        """A control request, in the loop: the answer; ValueError when the request is not one to carry out."""
        me = f"spark-supervisor (pid {os.getpid()})"
        pausing = self.stack.pausing
        if command == "pause":
            pause = Pause(by=str(args.get("by") or "?"), reason=args.get("reason") or "", at=self.wall(),
                          until=args.get("until"))
            self.set_pause(pause)
            return f"{me} paused {pause.text()}" + (f" ({pausing.problem})" if pausing.problem else "")
        if command == "resume":
            if self.pause is None:
                return f"{me} was not paused; nothing was changed"
            self.set_pause(None, f"by {args.get('by') or '?'}")
            return f"{me} resumed" + (f" ({pausing.problem})" if pausing.problem else "")
        if command == "restart":
            wanted = str(args.get("deployment") or "")
            if wanted and wanted not in self.stack.reconcilers:
                raise ValueError(f"no deployment {wanted[:40]!r} (configured: {', '.join(self.stack.reconcilers)})")
            if self.pause is not None:  # it would stop what serves, and start nothing until a resume
                raise ValueError(f"paused {self.pause.text()}: a restart now would stop the serve and start nothing "
                                 "until `spark-supervisor resume`; resume first")
            return "\n".join(restart(r, serve_only=bool(args.get("serve_only")), by=str(args.get("by") or "?"))
                             for name, r in self.stack.reconcilers.items() if not wanted or name == wanted)
        raise ValueError(f"unknown request {command[:20]!r}")


class AlreadyRunning(Exception):
    pass


class StateDirUnfit(Exception):
    """The state directory is not the daemon's own (owner, mode, a link, a special file in it)."""


def lock_state_dir(state_dir: str) -> int:
    """Hold an exclusive lock for the process lifetime: two supervisors would fight over one cluster.
    The state directory must be the daemon's own (statefile.check_state_dir), the lock a regular file
    opened without following a link (a planted link would have it overwrite another file)."""
    problems = statefile.check_state_dir(state_dir)
    if not problems:
        statefile.make_dirs(Path(state_dir))
        problems = statefile.check_state_dir(state_dir)
    if problems:
        raise StateDirUnfit("; ".join(problems))
    path = os.path.join(state_dir, names.LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise StateDirUnfit(f"{path}: is a symbolic link or a special file: remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StateDirUnfit(f"{path}: is not a regular file: remove it")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another spark-supervisor (pid {other}) holds {state_dir}/lock") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
