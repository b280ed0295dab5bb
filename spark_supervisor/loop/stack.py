"""The stack: one reconciler per configured deployment (``reconciler.Reconciler``), their schedule, the
pause they are all under, and what a new config does to them; with what they share of the process: the
metrics endpoint and the alerter.

Each deployment ticks on its own schedule; a deployment that waits for others (``after``) is woken when
they come to serve."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..adapters.retry import backoff_delay
from ..base.log import Log
from ..change.classify import Change, DeploymentChange, deployment_changes
from ..change.rollback import Rollbacks, pin_what_serves, spec_hashes
from ..config import Config
from ..config.view import DeploymentView, views
from ..model import Pause, Phase, Reason
from ..reconcile.pause import PauseState
from ..reconcile.reconciler import Reconciler, unpin
from ..report.alerts import Alerter
from ..report.metrics import Metrics, NoMetrics
from ..world.act import ActionFailed
from ..world.backend import Backend, RealBackend

# Phases that count as "answers" for a deployment that starts after it (its memory profiling is over).
_ANSWERS = {Phase.VERIFYING, Phase.SERVING}


class Stack:
    def __init__(self, cfg: Config, *, log: Log, backend_factory: Callable[[DeploymentView], Backend] | None,
                 watchdog: Callable[[], None], clock: Callable[[], float], wall: Callable[[], float],
                 rng: Callable[[], float], pull_moved: Callable[[], None] | None = None):
        """pull_moved: told (from a pull's heartbeat) when bytes of an image pull arrived: start progress."""
        self.cfg, self.log = cfg, log
        self.backend_factory = backend_factory or self._real_backend
        self.watchdog, self.clock, self.wall, self.rng = watchdog, clock, wall, rng
        self.pull_moved = pull_moved
        self.metrics = self._metrics(cfg)
        self.alerter = self._alerter(cfg)
        self.pausing = PauseState(cfg.supervisor.state_dir, log=log, clock=clock, wall=wall)
        self.rollbacks = Rollbacks(log)
        self.reconcilers: dict[str, Reconciler] = {}
        for name, view in views(cfg).items():
            self.reconcilers[name] = r = self._reconciler(view)
            self.rollbacks.restore(name, r, cfg)

    def _real_backend(self, view: DeploymentView) -> Backend:
        backend = RealBackend(view, self.log.bind(deployment=view.name), heartbeat=self.watchdog)
        backend.actor.pull_moved = self.pull_moved
        return backend

    def _reconciler(self, view: DeploymentView, backend: Backend | None = None) -> Reconciler:
        name = view.name
        r = Reconciler(view, backend or self.backend_factory(view), log=self.log.bind(deployment=name),
                       metrics=self.metrics.bound(name), watchdog=self.watchdog,
                       clock=self.clock, wall=self.wall, rng=self.rng,
                       alert=lambda *a, **k: self.alerter.emit(*a, **k))
        r.paused = self.pause
        return r

    def _alerter(self, cfg: Config) -> Alerter:
        return Alerter(cfg.alerts, log=self.log, clock=self.clock, wall=self.wall,
                       on_sent=lambda dep, event, via, ok: self.metrics.bound(dep).alerted(event, via, ok))

    def _metrics(self, cfg: Config) -> Metrics | NoMetrics:
        at = cfg.metrics.address
        if at is None:
            return NoMetrics()
        try:
            m = Metrics(at.host, at.port)
        except OSError as e:
            self.log.error("metrics.unavailable", listen=cfg.metrics.listen, error=str(e))
            return NoMetrics()
        self.log.info("metrics.serving", listen=cfg.metrics.listen)
        return m

    # ------------------------------------------------------------------------------ maintenance mode
    @property
    def pause(self) -> Pause | None:
        return self.pausing.pause

    def set_pause(self, pause: Pause | None, why: str = "") -> None:
        """Pause (or resume with None) every deployment; kept in the state directory."""
        was = self.pausing.set(pause)
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

    # ------------------------------------------------------------------------------- the schedule
    def tick(self, now: float, *, due_only: bool) -> None:
        """One reconcile pass over every deployment (only those due, with ``due_only``)."""
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
            if r.status.phase == Phase.SERVING and before != Phase.SERVING:
                pin_what_serves(r)
            r.recorder.after_tick(r)  # what its record takes in after the fact: a verdict, a page-cache drop
            self.rollbacks.roll_back_if_due(name, r, self.backend_factory, self.alerter)
            self.rollbacks.keep(name, r)
            if r.status.phase in _ANSWERS and before not in _ANSWERS:
                for other in self.reconcilers.values():  # those waiting for it look again at once
                    if name in other.view.dep.after and other.status.phase == Phase.WAITING:
                        other.due_at = 0.0

    def next_due(self) -> float:
        """When (the daemon's clock) the next deployment's tick, or the pause's end, is due."""
        due = min(r.due_at for r in self.reconcilers.values())
        if self.pausing.deadline is not None:
            due = min(due, self.pausing.deadline)
        return due

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
        for name in r.view.dep.after:
            other = self.reconcilers.get(name)
            if other is not None and other.status.phase not in _ANSWERS and not (
                    other.status.phase == Phase.DEGRADED and other.status.verdict is not None
                    and other.status.verdict.passed):
                out.append(f"{name} ({other.status.phase.value})")
        return ", ".join(out)

    def required(self) -> list[Reconciler]:
        """The deployments READY=1 waits for: those marked required, or all when none is."""
        req = [r for r in self.reconcilers.values() if r.view.dep.required]
        return req or list(self.reconcilers.values())

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budgets when the operator asks for a reset)."""
        for r in self.reconcilers.values():
            r.rearm(why)

    @staticmethod
    def retry_failed(r: Reconciler, why: str) -> None:
        """A reload is the operator's "fixed, try again" (the FAILED hint says so): a FAILED deployment is re-armed
        and starts what its tags name (a pinned image pruned is a way past it)."""
        if r.status.phase == Phase.FAILED:
            unpin(r, why)
            r.rearm(why)

    # ----------------------------------------------------------------------------- a new config
    def _changes(self, wanted: dict[str, DeploymentView]) -> list[DeploymentChange]:
        return deployment_changes({name: r.view for name, r in self.reconcilers.items()}, wanted)

    def destructive(self, wanted: dict[str, DeploymentView]) -> list[str]:
        """What a move to ``wanted`` (a new config's views, config.view.views) would tear down: deployments no
        longer configured, and those whose Ray or serve spec changes (replaced). Additions and other settings
        are not."""
        return [f"{'removes' if c.change == Change.REMOVED else 'replaces'} {c.name!r}"
                for c in self._changes(wanted) if c.stops]

    def to_prove(self, wanted: dict[str, DeploymentView]) -> dict[str, DeploymentView]:
        """The deployments a move to ``wanted`` would replace while they serve (SERVING or DEGRADED), with their
        new views: what must be proven startable before anything of theirs is stopped (change.proof)."""
        return {c.name: wanted[c.name] for c in self._changes(wanted) if c.stops and c.name in wanted
                and self.reconcilers[c.name].status.phase in (Phase.SERVING, Phase.DEGRADED)}

    def apply(self, new: Config, wanted: dict[str, DeploymentView]) -> None:
        """Move to a new config (``wanted``: its views), deployment by deployment: an unchanged one is not touched, a changed one is
        re-armed on its new view, a new one starts, and one no longer configured is torn down (only it)."""
        backends = self._new_backends(wanted)
        for name in [n for n in self.reconcilers if n not in wanted]:
            self._remove(name)
        old_metrics = self.cfg.metrics
        if new.metrics != old_metrics:
            self.metrics.close()
            self.metrics = self._metrics(new)
        if new.alerts != self.cfg.alerts:
            self.alerter.close()
            self.alerter = self._alerter(new)
        rebuilt: dict[str, Reconciler] = {}
        for name, view in wanted.items():
            r = self.reconcilers.get(name)
            if r is None:
                r = self._reconciler(view, backends[name])
                self.log.info("deployment.added", deployment=name)
            else:
                r.metrics = self.metrics.bound(name)
                if name in backends:
                    if spec_hashes(view) != spec_hashes(r.view):
                        self.rollbacks.switched(name, r, view)
                        r.status.pinned = {}  # the new spec starts from its tag
                    failed = r.status.phase == Phase.FAILED
                    r.reconfigure(view, backends[name], "config change")
                    if failed:  # the operator's way past it: a pinned image pruned, say; the tags from now on
                        unpin(r, "reload")
                    elif r.status.pinned:  # the same spec on a new backend (other settings changed): still pinned
                        r.backend.pin(r.status.pinned)
                else:
                    r.view = view  # the same deployment; only who else is configured may differ
                    self.retry_failed(r, "reload")
                    r.changed()
            rebuilt[name] = r
        self.reconcilers = rebuilt
        self.cfg = new
        for name, r in rebuilt.items():
            self.rollbacks.keep(name, r)

    def _new_backends(self, wanted: dict[str, DeploymentView]) -> dict[str, Backend]:
        """A backend for each deployment new or changed in ``wanted``: every one first, so that a config
        that cannot be set up leaves everything as it was."""
        backends: dict[str, Backend] = {}
        try:
            for name, view in wanted.items():
                old = self.reconcilers.get(name)
                if old is None or _view_key(old.view) != _view_key(view):
                    backends[name] = self.backend_factory(view)
        except Exception:
            for b in backends.values():
                b.close()
            raise
        return backends

    def _remove(self, name: str) -> None:
        """A deployment no longer configured: torn down, and its backend closed."""
        gone = self.reconcilers.pop(name)
        self.log.warning("deployment.removed", deployment=name, action="teardown")
        try:
            removed = gone.backend.teardown()
            self.log.info("deployment.torn_down", deployment=name, removed=removed)
        except ActionFailed as e:
            self.log.error("teardown.incomplete", deployment=name, reason=e.reason)
        gone.backend.close()

    # --------------------------------------------------------------------------------- the stop
    def stop(self, on_stop: str) -> None:
        """Every deployment to STOPPING, torn down first when ``on_stop`` says so."""
        for r in self.reconcilers.values():
            if on_stop == "teardown":
                try:
                    r.backend.teardown()
                except ActionFailed as e:
                    r.log.error("teardown.incomplete", reason=e.reason)
            r.status.advance(Phase.STOPPING, Reason(detail=f"on_stop={on_stop}"), self.clock(), self.wall())
            r.changed()

    def close(self) -> None:
        """The backends, the metrics endpoint and the alerter closed (what the alerter holds still goes out)."""
        for r in self.reconcilers.values():
            r.backend.close()
        self.metrics.close()
        self.alerter.close()  # what is queued (a FAILED just before the stop) still goes out, within its timeout


def _view_key(view: DeploymentView) -> tuple[dict[str, Any], str]:
    """What a deployment runs on: its settings, and its API key (read from a file or the environment)."""
    return view.cfg.model_dump(), view.dep.api_key.get_secret_value()


