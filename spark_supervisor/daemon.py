"""The daemon: one reconciler per configured deployment (``reconciler.Reconciler``), and what they share:
signals, reload, shutdown, systemd's notify socket, the control socket, metrics and the status file.

Signal handlers only record the signal and wake the loop; the loop dispatches them between ticks. Each
deployment ticks on its own schedule; a deployment that waits for others (``after``) is woken when they
come to serve.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import fcntl
import math
import os
import random
import signal
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import config as config_mod
from . import logs, statefile
from .act import ActionFailed
from .alerts import Alerter
from .backend import Backend, RealBackend
from .config import Config
from .control import ControlServer
from .metrics import Metrics, NoMetrics
from .model import Pause, Phase, Reason, Status
from .notify import Notifier
from .reconciler import Reconciler
from .retry import backoff_delay

# Phases that count as "answers" for a deployment that starts after it (its memory profiling is over).
_ANSWERS = {Phase.VERIFYING, Phase.SERVING}


@dataclasses.dataclass
class _Request:
    """A control request on its way from the control socket's thread to the loop, and its answer."""

    command: str
    args: dict[str, Any]
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    state: str = "queued"  # "taken" by the loop, or "cancelled" by the caller that gave up waiting
    reply: str = ""
    error: str = ""


@dataclasses.dataclass
class _Staged:
    """A reload that would remove or replace a deployment, waiting to find the file the same again."""

    file_hash: str  # "" when the file changed while it was read: it must be read again in any case
    due: float  # the daemon's clock: when the file is read again
    changes: list[str]


class Daemon:
    def __init__(self, config_path: str, cfg: Config, *, log: Any,
                 backend_factory: Callable[[Config], Backend] | None = None,
                 notifier: Notifier | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 rng: Callable[[], float] = random.random):
        self.config_path, self.cfg, self.log = config_path, cfg, log
        self.config_hash = config_mod.file_hash(config_path)
        self.notifier = notifier or Notifier()
        self._backend_factory = backend_factory or (
            lambda c: RealBackend(c, log.bind(deployment=c.deployment.name),
                                  heartbeat=lambda: self.notifier.watchdog(self.clock())))
        self.clock, self.wall, self.rng = clock, wall, rng
        self.metrics = self._metrics(cfg)
        self.alerter = self._alerter(cfg)
        self._pause_problem = ""  # a saved pause that was set aside, or that could not be saved
        self._pause_deadline: float | None = None  # the daemon's clock: when the pause ends
        self.pause = self._load_pause(cfg)
        self.reconcilers: dict[str, Reconciler] = {}
        for dep in cfg.deployments:
            self.reconcilers[dep.name] = self._reconciler(cfg.view(dep))
        self._last_doc: dict[str, Any] | None = None  # the change key of the last status written
        self._written_at = 0.0
        # Signals and control requests: (command, arguments, set when the loop has carried it out).
        self._signals: collections.deque[int | str | _Request] = collections.deque()
        self._requests_lock = threading.Lock()
        self.control: ControlServer | None = None
        self._wake = threading.Event()
        self._stall_logged = False
        self._last_status = ""
        self._state_write_error = ""
        self.ready_sent = False
        self.reload_error = ""  # kept in STATUS= and the status file until a reload succeeds
        self.reload_at = 0.0  # wall clock of the last reload
        self.staged: _Staged | None = None
        self.stopped = False

    def _reconciler(self, view: Config, backend: Backend | None = None) -> Reconciler:
        name = view.deployment.name
        r = Reconciler(view, backend or self._backend_factory(view), log=self.log.bind(deployment=name),
                       metrics=self.metrics.bound(name), watchdog=lambda: self.notifier.watchdog(self.clock()),
                       clock=self.clock, wall=self.wall, rng=self.rng,
                       alert=lambda *a, **k: self.alerter.emit(*a, **k))
        r.paused = self.pause
        return r

    def _alerter(self, cfg: Config) -> Alerter:
        return Alerter(cfg.alerts, log=self.log, clock=self.clock, wall=self.wall,
                       on_sent=lambda dep, event, via, ok: self.metrics.bound(dep).alerted(event, via, ok))

    # ------------------------------------------------------------------------------ maintenance mode
    def _load_pause(self, cfg: Config) -> Pause | None:
        """A pause outlives a restart of the daemon (maintenance often includes one); an expired one does
        not; a file that is not a valid pause is moved aside (the daemon starts unpaused, and says so)."""
        p, self._pause_problem = statefile.load_pause(cfg.supervisor.state_dir, self.wall())
        if self._pause_problem:
            self.log.error("state.pause_unusable", problem=self._pause_problem)
        if p is not None and p.expired(self.wall()):
            return None
        if p is not None:
            self._pause_deadline = self._deadline(p)
            self.log.warning("daemon.paused", pause=p.text(), since="before this start")
        return p

    def _deadline(self, pause: Pause) -> float | None:
        """When the pause ends on the daemon's (monotonic) clock: a wall clock stepped forward or back
        while it runs neither ends nor stretches it."""
        return None if pause.until is None else self.clock() + max(0.0, pause.until - self.wall())

    def set_pause(self, pause: Pause | None, why: str = "") -> None:
        """Pause (or resume with None) every deployment; kept in the state directory."""
        was, self.pause = self.pause, pause
        self._pause_deadline = None if pause is None else self._deadline(pause)
        try:
            statefile.write_pause(self.cfg.supervisor.state_dir, pause)
            self._pause_problem = ""
        except OSError as e:  # still paused (or resumed) in memory; a restart would not know
            self.log.error("state.write_failed", file=statefile.PAUSE, error=str(e))
            self._pause_problem = (f"cannot save the {'pause' if pause else 'resume'} in {statefile.PAUSE}: "
                                   f"{e.strerror or e}; a restart of the daemon would not know it")
        if pause is not None:
            self.log.warning("daemon.paused", pause=pause.text())
            for r in self.reconcilers.values():
                r.paused = pause
                r.due_at = 0.0  # show PAUSED at once
            event, reason = "paused", pause.text()
        else:
            self.log.warning("daemon.resumed", why=why, was=was.text() if was else "")
            for r in self.reconcilers.values():
                r.resume(why)
            event, reason = "resumed", why
        if (was is None) != (pause is None):
            for name in self.reconcilers:
                self.alerter.emit(name, event, phase=Phase.PAUSED.value if pause else Phase.DETECTING.value,
                                  reason=reason)
        self._last_doc = None

    # The first deployment: what a one-deployment config (and its tests) calls "the" status and backend.
    @property
    def first(self) -> Reconciler:
        return next(iter(self.reconcilers.values()))

    @property
    def status(self) -> Status:
        return self.first.status

    @property
    def backend(self) -> Backend:
        return self.first.backend

    def _metrics(self, cfg: Config) -> Metrics | NoMetrics:
        if not cfg.metrics.listen:
            return NoMetrics()
        try:
            m = Metrics(cfg.metrics.listen)
        except OSError as e:
            self.log.error("metrics.unavailable", listen=cfg.metrics.listen, error=str(e))
            return NoMetrics()
        self.log.info("metrics.serving", listen=cfg.metrics.listen)
        return m

    # ------------------------------------------------------------------------------------ one tick
    def tick(self) -> float:
        """One reconcile pass over every deployment; returns the seconds until the next is due."""
        return self._tick(due_only=False)

    def _tick(self, *, due_only: bool) -> float:
        now = self.clock()
        if self.staged is not None and now >= self.staged.due:
            self.reload()  # the file read again: applied if it is the same, staged afresh if not
        if self._pause_deadline is not None and now >= self._pause_deadline:
            self.set_pause(None, "the pause's deadline passed")
        for name, r in list(self.reconcilers.items()):
            if due_only and r.due_at > now:
                continue
            r.status.waiting_for = self._waiting_for(r)
            before = r.status.phase
            try:
                wait = r.tick()
            except Exception as e:  # a bug must not kill the supervisor, nor stop the other deployments
                r.log.exception("reconcile.crashed", error=f"{type(e).__name__}: {e}")
                r.status.failures += 1
                r.changed()
                wait = backoff_delay(r.status.failures, self.cfg.supervisor.backoff_base,
                                     self.cfg.supervisor.backoff_max, self.rng())
            r.due_at = self._due(wait)
            if r.status.phase in _ANSWERS and before not in _ANSWERS:
                for other in self.reconcilers.values():  # those waiting for it look again at once
                    if name in other.cfg.deployment.after and other.status.phase == Phase.WAITING:
                        other.due_at = 0.0
        self._announce()
        self._extend_start(now)
        self._write_status(now)
        due = min(r.due_at for r in self.reconcilers.values())
        if self.staged is not None:
            due = min(due, self.staged.due)
        if self._pause_deadline is not None:
            due = min(due, self._pause_deadline)
        return max(0.0, due - self.clock())

    def _due(self, wait: float) -> float:
        """When a tick `wait` seconds away falls. With several deployments a steady tick (serving, failed,
        waiting: the interval) is put on a grid of its length, so that their sweeps fall in one pass: one
        status write and one listing of each shared node's containers instead of one per deployment."""
        now = self.clock()
        if len(self.reconcilers) > 1 and wait >= self.cfg.supervisor.interval > 0:
            return math.ceil((now + wait / 2) / wait) * wait
        return now + wait

    def _waiting_for(self, r: Reconciler) -> str:
        """The deployments it starts after that do not answer yet, with their phases."""
        out = []
        for name in r.cfg.deployment.after:
            other = self.reconcilers.get(name)
            if other is not None and other.status.phase not in _ANSWERS and not (
                    other.status.phase == Phase.DEGRADED and other.status.verdict is not None
                    and other.status.verdict.passed):
                out.append(f"{name} ({other.status.phase.value})")
        return ", ".join(out)

    def _required(self) -> list[Reconciler]:
        req = [r for r in self.reconcilers.values() if r.cfg.deployment.required]
        return req or list(self.reconcilers.values())

    def _announce(self) -> None:
        """STATUS= when the line changed; READY=1 once every required deployment serves."""
        line = self.status_line()
        if line != self._last_status:
            self._last_status = line
            self.notifier.status(line)
        if not self.ready_sent and (self.cfg.supervisor.ready_when == "started" or self.pause is not None
                                    or all(r.status.phase == Phase.SERVING for r in self._required())):
            self.ready_sent = True
            self.notifier.ready(line)
            self.log.info("daemon.ready", phase=self.status.phase.value)

    # While nothing but the probes' counts changes, the status file is rewritten this often (seconds).
    STATUS_REFRESH_S = 30.0

    # How long each EXTEND_TIMEOUT_USEC buys: more than the longest tick, so the next one arrives in time.
    EXTEND_S = 180.0

    def _extend_start(self, now: float) -> None:
        """While not yet READY, keep systemd's start timeout alive as long as the start makes progress."""
        if self.ready_sent:
            return
        last = max(r.last_progress for r in self._required())
        if now - last <= self.cfg.supervisor.start_stall_timeout:
            self.notifier.extend_timeout(self.EXTEND_S)
        elif not self._stall_logged:
            self._stall_logged = True
            self.log.error("start.stalled", phase=self.status.phase.value, reason=self.status.reason,
                           no_progress_s=round(now - last))

    def status_line(self) -> str:
        line = self._phase_line()
        if self.reload_error:
            return f"{line} (reload failed: {self.reload_error})"
        if self.staged is not None:
            return f"{line} (reload staged: {self._staged_text()})"
        return line

    def _staged_text(self) -> str:
        assert self.staged is not None
        return (f"{', '.join(self.staged.changes)}; applied once the file is read again unchanged "
                f"{self.SETTLE_S:g}s later")

    def reload_doc(self) -> dict[str, Any] | None:
        """The last reload, when it failed or waits: the status file's "reload"."""
        if not self.reload_error and self.staged is None:
            return None
        return {"error": self.reload_error or None, "at": statefile.iso(self.reload_at),
                "staged": self._staged_text() if self.staged is not None and not self.reload_error else None}

    def _phase_line(self) -> str:
        rs = list(self.reconcilers.values())
        if self.pause is not None:
            return f"PAUSED {self.pause.text()}"
        if len(rs) == 1:
            return rs[0].phase_line()
        serving = sum(r.status.phase == Phase.SERVING for r in rs)
        if serving == len(rs):
            return f"SERVING {serving}/{len(rs)} deployments"
        worst = min((r for r in rs if r.status.phase != Phase.SERVING), key=_severity)
        return f"{serving}/{len(rs)} serving; {worst.name} {worst.phase_line()}"

    def _write_status(self, now: float) -> None:
        problems = tuple(p for p in (self._state_write_error, self._pause_problem) if p)
        docs = [r.document(self.config_path, self.config_hash, problems, now) for r in self.reconcilers.values()]
        # The first deployment's document at the top, as with one deployment; every one under "deployments".
        doc = {**docs[0], "summary": self._phase_line(), "deployments": docs,
               "pause": self.pause.to_json() if self.pause else None, "reload": self.reload_doc()}
        key = _change_key(doc)  # compared as dicts: the documents of deployments that did not tick are the same objects
        if key != self._last_doc or now - self._written_at >= self.STATUS_REFRESH_S:
            self._last_doc, self._written_at = key, now
            try:
                statefile.write(self.cfg.supervisor.state_dir, doc)
                self._state_write_error = ""
            except OSError as e:
                if not self._state_write_error:
                    self.log.error("status.write_failed", error=str(e), state_dir=self.cfg.supervisor.state_dir)
                self._state_write_error = f"cannot write the status file: {e.strerror or e}"
                self._last_doc = None  # try again next tick
                self.metrics.state_write_failed("status")

    # --------------------------------------------------------------------------- signals and loop
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM and signal.SIGTERM in self._signals:
            raise SystemExit(1)  # a second SIGTERM: leave at once
        self._signals.append(signum)
        self._wake.set()

    # How long a control request waits for the loop to carry it out (a tick may be in the middle of an action).
    REQUEST_WAIT_S = 120.0

    def _on_request(self, command: str, args: dict[str, Any] | None = None) -> str:
        """From the control socket's thread: record and wake, like a signal; the loop acts on it between
        ticks. pause and resume answer once done, so that what the caller does next runs under them.
        A request the loop refuses or fails at is a ValueError with its reason (answered as an error)."""
        if command == "ping":
            return f"spark-supervisor {os.getpid()}: {self.status.phase.value}"
        if command == "reset":
            self._signals.append(command)
            self._wake.set()
            return f"spark-supervisor (pid {os.getpid()}) will re-arm and forget its repair budget"
        req = _Request(command, dict(args or {}))
        self._signals.append(req)
        self._wake.set()
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
        if command == "pause":
            pause = Pause(by=str(args.get("by") or "?"), reason=args.get("reason") or "", at=self.wall(),
                          until=args.get("until"))
            self.set_pause(pause)
            return f"{me} paused {pause.text()}" + (f" ({self._pause_problem})" if self._pause_problem else "")
        if command == "resume":
            if self.pause is None:
                return f"{me} was not paused; nothing was changed"
            self.set_pause(None, f"by {args.get('by') or '?'}")
            return f"{me} resumed" + (f" ({self._pause_problem})" if self._pause_problem else "")
        raise ValueError(f"unknown request {command[:20]!r}")

    # A reload that would remove or replace a deployment is applied only once the file, read again this much
    # later, is found byte for byte the same: a file caught while being written must not tear anything down.
    SETTLE_S = 2.0

    def reload(self) -> None:
        """SIGHUP: read the config again (config.load: bounded, regular files only) and move to it."""
        self.notifier.reloading()
        self.reload_at = self.wall()
        try:
            self._reload()
        except Exception as e:  # whatever the file holds, a reload must never take the supervisor down
            self.log.exception("config.unusable", path=self.config_path, kept="previous config")
            self.reload_error = f"{self.config_path}: cannot set up: {type(e).__name__}: {e}"[:300]
            self.staged = None
        self._last_doc = None
        self._reload_done()

    def _reload(self) -> None:
        before = config_mod.file_hash(self.config_path)
        try:
            new = config_mod.load(self.config_path)
        except config_mod.ConfigError as e:
            self.log.error("config.invalid", path=self.config_path, problems=e.problems, kept="previous config")
            self.reload_error, self.staged = e.problems[0], None
            return
        if new.supervisor.state_dir != self.cfg.supervisor.state_dir:
            # The lock and the control socket live there: moving it would let a second daemon in.
            self.reload_error = (f"{self.config_path}: supervisor.state_dir cannot change on reload "
                                 f"(restart the service to move it to {new.supervisor.state_dir})")
            self.log.error("config.invalid", path=self.config_path, problems=[self.reload_error],
                           kept="previous config")
            self.staged = None
            return
        self.reload_error = ""
        read_as = before if before and config_mod.file_hash(self.config_path) == before else ""
        changes = self._destructive(new)
        if changes and not self._settled(read_as, changes):
            return
        self.staged = None
        changed = new != self.cfg
        logs.register_config(new)  # a key or secret the new file brings is redacted from here on
        for w in new.warnings:
            self.log.warning("config.warning", problem=w)
        self.log.info("config.reloaded", path=self.config_path, changed=changed,
                      deployments={d.name: {"ray_hash": config_mod.ray_hash(new, d),
                                            "serve_hash": config_mod.serve_hash(new, d)} for d in new.deployments})
        if changed:
            self._apply(new)

    def _settled(self, file_hash: str, changes: list[str]) -> bool:
        """True when a reload that removes or replaces deployments read the same file SETTLE_S after it was
        staged; else it is staged (afresh if the file changed) and read again at its time by the loop."""
        now, st = self.clock(), self.staged
        if st is not None and file_hash and st.file_hash == file_hash:
            if now >= st.due:
                return True
            return False  # the same file, not settled yet: the loop reads it again at st.due
        self.staged = _Staged(file_hash, now + self.SETTLE_S, changes)
        self.log.warning("config.staged", path=self.config_path, changes=changes, read_again_in_s=self.SETTLE_S,
                         why="a reload that removes or replaces a deployment waits for the file to be the same again")
        return False

    def _destructive(self, new: Config) -> list[str]:
        """What a move to ``new`` would tear down: deployments no longer configured, and those whose Ray or
        serve spec changes (replaced). Additions and other settings are not."""
        wanted = {d.name: new.view(d) for d in new.deployments}
        out = []
        for name, r in self.reconcilers.items():
            view = wanted.get(name)
            if view is None:
                out.append(f"removes {name!r}")
            elif (config_mod.ray_hash(view, view.deployment), config_mod.serve_hash(view, view.deployment)) != (
                    config_mod.ray_hash(r.cfg, r.cfg.deployment), config_mod.serve_hash(r.cfg, r.cfg.deployment)):
                out.append(f"replaces {name!r}")
        return out

    def _apply(self, new: Config) -> None:
        """Move to a new config, deployment by deployment: an unchanged one is not touched, a changed one is
        re-armed on its new view, a new one starts, and one no longer configured is torn down (only it)."""
        views = {d.name: new.view(d) for d in new.deployments}
        backends: dict[str, Backend] = {}
        try:  # every new backend first: a config that cannot be set up leaves everything as it was
            for name, view in views.items():
                old = self.reconcilers.get(name)
                if old is None or _view_key(old.cfg) != _view_key(view):
                    backends[name] = self._backend_factory(view)
        except Exception:
            for b in backends.values():
                b.close()
            raise
        for name in [n for n in self.reconcilers if n not in views]:
            gone = self.reconcilers.pop(name)
            self.log.warning("deployment.removed", deployment=name, action="teardown")
            try:
                removed = gone.backend.teardown()
                self.log.info("deployment.torn_down", deployment=name, removed=removed)
            except ActionFailed as e:
                self.log.error("teardown.incomplete", deployment=name, reason=e.reason)
            gone.backend.close()
        old_metrics = self.cfg.metrics
        if new.metrics != old_metrics:
            self.metrics.close()
            self.metrics = self._metrics(new)
        if new.alerts != self.cfg.alerts:
            self.alerter.close()
            self.alerter = self._alerter(new)
        rebuilt: dict[str, Reconciler] = {}
        for name, view in views.items():
            r = self.reconcilers.get(name)
            if r is None:
                r = self._reconciler(view, backends[name])
                self.log.info("deployment.added", deployment=name)
            else:
                r.metrics = self.metrics.bound(name)
                if name in backends:
                    r.reconfigure(view, backends[name], "config change")
                else:
                    r.cfg = view  # the same deployment; only who else is configured may differ
                    r.changed()
            rebuilt[name] = r
        self.reconcilers = rebuilt
        self.cfg, self.config_hash = new, config_mod.file_hash(self.config_path)

    def _reload_done(self) -> None:
        # READY=1 ends the reload; before the first READY it would also end the start, so not then.
        self._last_status = self.status_line()
        if self.ready_sent:
            self.notifier.ready(self._last_status)
        else:
            self.notifier.status(self._last_status)

    def shutdown(self) -> None:
        on_stop = self.cfg.supervisor.on_stop
        self.notifier.stopping(f"STOPPING on_stop={on_stop}")
        self.log.info("daemon.stopping", on_stop=on_stop)
        for r in self.reconcilers.values():
            if on_stop == "teardown":
                try:
                    r.backend.teardown()
                except ActionFailed as e:
                    r.log.error("teardown.incomplete", reason=e.reason)
            r.status.advance(Phase.STOPPING, Reason(detail=f"on_stop={on_stop}"), self.clock(), self.wall())
            r.changed()
        self._last_doc = None
        self._write_status(self.clock())
        for r in self.reconcilers.values():
            r.backend.close()
        self.metrics.close()
        self.alerter.close()  # what is queued (a FAILED just before the stop) still goes out, within its timeout
        if self.control is not None:
            self.control.close()
        self.stopped = True

    def run(self) -> int:
        for handled in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(handled, self._on_signal)
        try:
            self.control = ControlServer(self.cfg.supervisor.state_dir, self._on_request)
        except OSError as e:  # `reset` then says it cannot reach us; the daemon itself goes on
            self.log.error("control.unavailable", error=str(e))
        self.log.info("daemon.started", config=self.config_path, config_hash=self.config_hash,
                      deployments=list(self.reconcilers), nodes=[n.name for n in self.cfg.nodes],
                      state_dir=self.cfg.supervisor.state_dir)
        while True:
            if self.dispatch():
                return 0
            hang = os.environ.get("SPARK_SUPERVISOR_TEST_HANG_FILE")
            if hang and os.path.exists(hang):  # test-only fault switch: a hung main loop
                self.log.warning("test.hanging", file=hang)
                threading.Event().wait()
            try:
                wait = self._tick(due_only=True)
            except Exception as e:  # a bug must not kill the supervisor: report it, back off, go on
                self.log.exception("reconcile.crashed", error=f"{type(e).__name__}: {e}")
                wait = backoff_delay(2, self.cfg.supervisor.backoff_base, self.cfg.supervisor.backoff_max, self.rng())
            self._wait(wait)

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

    def _wait(self, seconds: float) -> None:
        """Sleep until the next tick is due, a signal, or a change seen by a deployment's quick check."""
        deadline = self.clock() + seconds
        while True:
            self.notifier.watchdog(self.clock())
            left = deadline - self.clock()
            if left <= 0:
                break
            step = left
            if self.notifier.watchdog_interval:
                step = min(step, self.notifier.watchdog_interval)
            quick = [r for r in self.reconcilers.values() if r.quick_interval()]
            if quick:
                step = min(step, *(r.quick_interval() for r in quick))
            if self._wake.wait(step):
                break
            if self.clock() < deadline:
                changed = [r for r in quick if r.quick()]
                for r in changed:
                    r.due_at = 0.0
                if changed:
                    break
        self._wake.clear()

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budgets when the operator asks for a reset)."""
        for r in self.reconcilers.values():
            r.rearm(why)


def _severity(r: Reconciler) -> int:
    order = [Phase.FAILED, Phase.DEGRADED, Phase.BACKOFF, Phase.PAUSED, Phase.STOPPING, Phase.DETECTING, Phase.CLEANING,
             Phase.WAITING, Phase.STARTING_RAY, Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING, Phase.SERVING]
    return order.index(r.status.phase)


def _view_key(view: Config) -> tuple[dict[str, Any], str]:
    """What a deployment runs on: its view, and its API key (read from a file or the environment)."""
    return view.model_dump(), view.deployment.api_key


def _change_key(doc: dict[str, Any]) -> dict[str, Any]:
    """What makes a new status file worth writing at once: all but the daemon's clock and the probes'
    running counts and times (their last result stays in; the counts are refreshed every STATUS_REFRESH_S)."""
    def one(d: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in d.items() if k not in ("daemon", "liveness", "deployments")}
        out["liveness"] = {k: v.get("last") for k, v in (d.get("liveness") or {}).items()}
        return out
    return {**one(doc), "deployments": [one(d) for d in doc["deployments"]]}


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
    path = os.path.join(state_dir, "lock")
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
