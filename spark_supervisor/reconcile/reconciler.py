"""One deployment's reconcile loop: observe -> plan -> act on its own nodes, with its own phase, probes,
trackers, repair budget, history and load progress. The daemon runs one per configured deployment, each
on its view (``config.view.DeploymentView``, made once per load), and shares what is process-wide (signals, systemd, metrics,
the status file) between them. What it keeps track of between ticks is in ``tracking``."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable

from ..adapters.retry import backoff_delay
from ..base.log import Log
from ..config.view import DeploymentView
from ..judge import completion
from ..judge.preflight import preflight
from ..model import (
    Action,
    CheckImage,
    CheckModel,
    Decision,
    DropPageCache,
    ImageReport,
    Kind,
    ModelReport,
    Observation,
    Outcome,
    Pause,
    Phase,
    Reason,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    Throughput,
    Verify,
    describe,
)
from ..plan import Seen, derive, plan
from ..report import statusdoc
from ..report.metrics import DeploymentMetrics, NoMetrics
from ..state import statefile
from ..world import perf
from ..world.act import ActionFailed
from ..world.backend import Backend
from .loadtimes import LoadClock
from .recording import Recorder
from .tracking import Below, Liveness, LoadProgress, QuickWatch, RepairBudget, StartProgress

# Phases during which a full observation (units, nvidia-smi, meminfo) is needed every tick.
_FULL_PHASES = {Phase.DETECTING, Phase.CLEANING, Phase.BACKOFF, Phase.FAILED, Phase.DEGRADED, Phase.STARTING_VLLM}

Result = Outcome | ActionFailed


class Reconciler:
    def __init__(self, view: DeploymentView, backend: Backend, *, log: Log, metrics: DeploymentMetrics | NoMetrics,
                 watchdog: Callable[[], None], clock: Callable[[], float], wall: Callable[[], float],
                 rng: Callable[[], float], alert: Callable[..., object] | None = None):
        self.view, self.backend, self.log, self.metrics = view, backend, log, metrics
        self.alert = alert or (lambda *_, **__: None)
        self.paused: Pause | None = None  # set by the daemon: observe and report, act on nothing
        self._paused_from = Phase.DETECTING  # the phase it was in when paused: what the plan is judged from
        self._trouble = False  # an alert about it went out (failed, degraded, repair): recovery is news
        self.watchdog, self.clock, self.wall, self.rng = watchdog, clock, wall, rng
        self.name = view.name
        self.status = Status()
        self.last_obs: Observation | None = None
        self.last_seen: Seen | None = None  # what the tick derived from last_obs (plan.seen)
        self.last_full: Observation | None = None
        self.due_at = 0.0  # when its next tick is due (the daemon's clock)
        self.start = StartProgress(clock)
        self.load = LoadProgress(log)
        self.loads = LoadClock(log, wall)  # the load's limits, learned from its key's good loads (reconcile.loadtimes)
        self.liveness, self.below, self.recorder = Liveness(log), Below(log), Recorder()  # recorder: reconcile.recording
        self._look_closer = False
        self._eager = 0  # consecutive ticks run at once after acting
        self.watch = QuickWatch(log)
        self.budget = RepairBudget(view.cfg, log=log, wall=wall, rng=rng)
        self._doc: statusdoc.DeploymentDoc | None = None  # its part of the status file, kept until something changes
        self._doc_key: tuple[object, ...] = ()

    @property
    def repairs(self) -> statefile.RepairLog:
        return self.budget.repairs

    @property
    def last_progress(self) -> float:
        """When its start last made progress (systemd's start timeout)."""
        return self.start.last_progress

    # ------------------------------------------------------------------------------------ one tick
    def _want_full(self, now: float) -> bool:
        return wants_full(self.last_full, self.status.phase, self._look_closer, self.last_seen, now, self.view)

    def tick(self) -> float:
        """One reconcile pass; returns the seconds until the next one."""
        st, now = self.status, self.clock()
        obs = self.backend.observe(self._want_full(now))
        self.last_obs = obs
        self.last_seen = seen = derive(obs, st.phase, self.view)  # once: trackers, plan, quick watch, status
        if obs.full:
            self.last_full = obs
            st.preflight = tuple(preflight(self.view, obs))
        self.below.update(st, obs, self.view)
        self.liveness.track(st, obs, seen, self.metrics, now, self.view.cfg.healing.heartbeat_stall)
        if self.paused is not None:
            return self._paused_tick(obs, seen, now)
        return self._reconcile(obs, seen, now)

    def _paused_tick(self, obs: Observation, seen: Seen, now: float) -> float:
        """Paused: plan as usual, to report what would be done, but do none of it and count no repair."""
        st = self.status
        assert self.paused is not None
        if st.phase != Phase.PAUSED:
            self._paused_from = st.phase
        self.load.update(st, obs, seen, self.view.cfg, self.metrics, now)
        decision = plan(obs, dataclasses.replace(st, phase=self._paused_from), self.view, now, seen)
        sees = _would(decision, self._paused_from)
        if st.advance(Phase.PAUSED, Reason(Kind.PAUSED, f"{self.paused.text()}; {sees}"), now, self.wall()):
            self.log.info("phase.paused", phase=Phase.PAUSED.value, sees=sees, by=self.paused.by,
                          reason=self.paused.reason)
        self.watch.saw(obs, seen)
        self.metrics.update(st, obs, self.clock(), self.view)
        self.changed()
        return self.view.cfg.supervisor.interval

    def resume(self, why: str) -> None:
        """Leave PAUSED: detect afresh (a serve left running is adopted, not restarted)."""
        self.paused = None
        st = self.status
        if st.phase == Phase.PAUSED:
            self.start.restart()
            st.failures, st.backoff_until, st.next_repair_at = 0, 0.0, 0.0
            st.advance(Phase.DETECTING, Reason(detail=f"resumed: {why}"), self.clock(), self.wall())
            self.log.info("reconcile.resumed", by=why)
        self.changed()
        self.due_at = 0.0

    def _reconcile(self, obs: Observation, seen: Seen, now: float, *, again: bool = True) -> float:
        """Plan and act on one observation; returns the seconds until the next tick."""
        st, cfg = self.status, self.view.cfg
        st.repairs_in_window = self.budget.used(cfg)
        progress_before = st.progress
        self.load.update(st, obs, seen, cfg, self.metrics, now)  # before the plan: a load that moved this tick is not judged stalled
        decision = plan(obs, st, self.view, now, seen)
        self._look_closer = decision.look_closer
        if decision.repair:
            self._start_repair(decision, now)
        failure, fatal = self._act(decision)
        _admitted(st, obs, decision, failure)
        self._advance(decision, failure, fatal, now)
        self.below.boots(st, obs)  # the tick it turned SERVING (or DEGRADED) too: what status says at once
        self.loads.note(st, obs, self.last_full, self.view, now)
        self.start.note(st, progress_before, now)
        self.watch.saw(obs, seen)
        self.metrics.update(st, obs, self.clock(), self.view)
        self.changed()
        if (again and decision.actions and not failure and st.phase != Phase.FAILED
                and all(isinstance(a, CheckImage | CheckModel) for a in decision.actions)):
            # Only looked at the images (or the model): decide on at once with the same (fresh) observation.
            return self._reconcile(obs, seen, self.clock(), again=False)
        if (decision.actions or decision.look_closer) and not failure and (
                st.phase not in (Phase.SERVING, Phase.FAILED) or _corroborated(decision)):
            self._eager += 1
            if self._eager <= 3:  # bounded: something that comes back as fast as it is removed must not spin us
                return 0.0  # something was done: look again at once rather than idle for an interval
        else:
            self._eager = 0
        return _interval(st, self.view, self.clock)

    def _act(self, decision: Decision) -> tuple[Reason | None, bool]:
        """Run the decision's actions and take in what they found; returns the failure (if any) and whether
        it is deterministic (FAILED, not retried)."""
        st = self.status
        failure = decision.why if decision.failure else None
        fatal = False
        for action, result in _run(self.backend, decision.actions, self.watchdog, self.log):
            if isinstance(result, ActionFailed):
                self.log.warning("action.failed", action=type(action).__name__, reason=result.reason)
                failure, fatal = result.why, result.deterministic
                break
            if isinstance(result, ImageReport | ModelReport):
                _take_report(st, result)
                continue
            if isinstance(result, Throughput):
                perf.record(st, result, self.view, self.metrics, self.log, self.clock())
                continue
            verdict = result
            if isinstance(action, DropPageCache):
                st.page_cache_dropped = st.page_cache_dropped | {action.node}
                self.metrics.page_cache_dropped(action.node)
            if isinstance(action, StartContainer):  # a new stage of the start: it may drop once more
                st.page_cache_dropped = frozenset()
                st.starts += action.node == self.view.serve_node.name  # the next checks again
            if isinstance(action, Verify) and verdict is not None:
                # Readiness and the periodic deep probe feed one tracker: a serve that never answers
                # its first completion is as wedged as one that stops answering later.
                st.deep = st.deep.record(completion.deep_result(verdict), self.clock(), verdict.why)
                self.metrics.probed("deep" if action.deep else "sanity", st.deep.last, verdict)
                if not action.deep:
                    st.verdict = verdict
                    if not verdict.passed and not verdict.busy:  # busy: asked again, unknown meanwhile
                        failure = Reason(Kind.SANITY_FAILED, verdict.why)
        return failure, fatal

    def _start_repair(self, decision: Decision, now: float) -> None:
        st, h = self.status, self.view.cfg.healing
        self.start.restart()
        st.page_cache_dropped = frozenset()
        self.start.bringup_at = now
        n = self.budget.spend(st, decision, self.view.cfg, self.metrics, now)
        self._trouble = True
        self.alert(self.name, "repair", phase=st.phase.value, reason=decision.reason, reason_kind=decision.why.kind,
                   repair=decision.repair, budget_used=n, budget=h.repair_budget)

    def _advance(self, decision: Decision, failure: Reason | None, fatal: bool, now: float) -> None:
        st, sup = self.status, self.view.cfg.supervisor
        phase, why = decision.phase, decision.why
        if decision.fatal or fatal:
            phase, why = Phase.FAILED, failure or why
            self.log.error("reconcile.failed", reason=str(why), reason_kind=why.kind,
                           hint="fix the cause, then `systemctl reload spark-supervisor` or `spark-supervisor reset`")
        elif failure:
            st.failures += 1
            delay = backoff_delay(st.failures, sup.backoff_base, sup.backoff_max, self.rng())
            st.backoff_until = now + delay
            phase, why = Phase.BACKOFF, failure
            self.log.warning("reconcile.retry_scheduled", attempt=st.failures, in_s=round(delay, 1), reason=str(why),
                             reason_kind=why.kind)
        elif phase == Phase.SERVING:
            st.failures = 0
            st.page_cache_dropped = frozenset()
        before = st.phase
        if st.advance(phase, why, now, self.wall()):
            if before != phase:
                log = self.log.warning if phase == Phase.BACKOFF else self.log.info
                log("phase.changed", **{"from": before.value}, to=phase.value, reason=str(why), reason_kind=why.kind)
                if phase == Phase.SERVING:
                    self.metrics.ready_after(now - self.start.bringup_at)
                self.recorder.entered(self)
                self._alert_phase(before, phase, why)
            else:
                self.log.info("phase.progress", phase=phase.value, reason=str(why), reason_kind=why.kind)

    def _alert_phase(self, before: Phase, phase: Phase, why: Reason) -> None:
        event = {Phase.FAILED: "failed", Phase.DEGRADED: "degraded"}.get(phase)
        if event is None and phase == Phase.SERVING and self._trouble:
            event = "recovered"
        if event is None:
            return
        self._trouble = event != "recovered"
        self.alert(self.name, event, phase=phase.value, reason=str(why), reason_kind=why.kind,
                   previous_phase=before.value, changed=self.status.changed)  # since the last good record

    def phase_line(self) -> str:
        return _phase_line(self.status, self.view, self.clock())

    def quick(self) -> bool:
        """The cheap check between ticks: True when Ray's nodes or /health changed since the last tick."""
        return self.watch.changed(self.backend, self.status.phase)

    def quick_interval(self) -> float:
        return self.watch.interval(self.status.phase, self.view.cfg)

    def changed(self) -> None:
        """Its status or observation changed outside a tick: build its document again."""
        self._doc = None

    def document(self, config_path: str, config_hash: str, problems: tuple[str, ...]) -> statusdoc.DeploymentDoc:
        """Its part of the status file; built again only after a change (the daemon asks after every
        deployment's tick: the log scan and the history in it are not free)."""
        key = (config_path, config_hash, problems, self.repairs.problem)
        if self._doc is not None and key == self._doc_key:
            return self._doc
        self._doc_key, read = key, self.last_seen.progress if self.last_seen is not None else None
        wall = self.wall()  # both clocks read now: a verdict's wall time does not move with the tick's length
        self._doc = statusdoc.document(self.status, _with_slow_facts(self.last_obs, self.last_full), self.view,
                                       config_path, config_hash, wall, round(wall - self.clock(), 3),
                                       tuple(p for p in (self.repairs.problem, *problems) if p), read)
        return self._doc

    def reconfigure(self, view: DeploymentView, backend: Backend, why: str) -> None:
        """A reload changed what it runs: the new view and backend, then re-armed (a changed spec replaces
        the deployment through the planner, like any other difference it observes)."""
        self.backend.close()
        self.view, self.backend = view, backend
        self.budget.reopen(view.cfg)
        self.rearm(why)

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budget and the pinned images when the operator asks for a reset)."""
        st = self.status
        self.start.restart()
        st.images, st.admitted = {}, None  # an image fixed under its name, a reload wanting more memory: read again
        if why == "reset":
            self.repairs.clear()
            forget_kept(self)
            self.log.info("reconcile.reset", budget_cleared=True, phase=st.phase.value)
        st.failures, st.backoff_until, st.next_repair_at = 0, 0.0, 0.0
        self.changed()
        if st.phase in (Phase.FAILED, Phase.BACKOFF, Phase.WAITING):
            st.advance(Phase.DETECTING, Reason(detail=f"re-armed by {why}"), self.clock(), self.wall())
            self.log.info("reconcile.rearmed", by=why)
        self.due_at = 0.0


def forget_kept(r: Reconciler) -> None:
    """What a reset forgets beside the repair budget: the pinned images and the performance bests."""
    unpin(r, "reset")
    perf.forget(r.view.state_dir, r.log)


def _corroborated(decision: Decision) -> bool:
    """A stall's corroborating probe just ran: its verdict is acted on at once, not a sweep later (a wedge's repair
    starts within heartbeat_stall + the probe)."""
    return decision.why.kind == Kind.HEARTBEAT_STALLED and any(isinstance(a, Verify) for a in decision.actions)


def unpin(r: Reconciler, why: str) -> None:
    """Start what the tags name from now on (the operator moves past pinned images: one pruned, say)."""
    if r.status.pinned:
        r.log.info("image.unpinned", by=why, ids=r.status.pinned)
        r.status.pinned = {}
        r.backend.pin({})


def _phase_line(st: Status, view: DeploymentView, now: float) -> str:
    """Its phase in a line (systemd's STATUS=, the log)."""
    if st.phase == Phase.SERVING:
        n = len(view.members)
        return f"SERVING {view.dep.serve.name} on {n} node{'' if n == 1 else 's'}"
    if st.phase == Phase.BACKOFF:
        return f"BACKOFF retry {st.failures} in {max(0, st.backoff_until - now):.0f}s: {st.reason}"
    if st.phase == Phase.LOADING:
        return f"LOADING {st.progress}" + (f" ({st.reason})" if st.reason else "")
    return f"{st.phase.value} {st.reason}".strip()


def wants_full(last_full: Observation | None, phase: Phase, look_closer: bool, seen: Seen | None, now: float,
               view: DeploymentView) -> bool:
    """Whether a tick observes fully: the first, in the phases that act on the slow facts, when the plan asked,
    at least every full_observe_interval, and while something could not be seen: a steady sweep does not look at
    a node's engine or the serve's state again (it keeps a listing, it trusts /health), and must not be taken
    for having seen them (the unknown's run, and so DEGRADED after the patience, would break on every one)."""
    return (last_full is None or phase in _FULL_PHASES or look_closer or bool(seen is not None and seen.unknown)
            or now - last_full.at >= view.cfg.supervisor.full_observe_interval)


def _interval(st: Status, view: DeploymentView, clock: Callable[[], float]) -> float:
    """The seconds until the next tick when nothing calls for one at once: the phase's own pace."""
    cfg = view.cfg
    if st.phase in (Phase.SERVING, Phase.FAILED, Phase.WAITING):
        return cfg.supervisor.interval
    if st.phase == Phase.BACKOFF:
        until = max(st.backoff_until, st.next_repair_at)
        return max(0.05, min(until - clock(), cfg.supervisor.interval))
    if st.phase == Phase.DEGRADED:
        return min(backoff_delay(st.failures + 1, cfg.supervisor.backoff_base, 30, 1.0), 30)
    if st.phase == Phase.LOADING:
        return min(view.dep.readiness.poll_interval, cfg.supervisor.interval)
    return cfg.supervisor.transition_interval


def _would(decision: Decision, paused_from: Phase) -> str:
    """What a paused deployment would do, as the PAUSED reason shows it."""
    would = ", ".join(type(a).__name__ for a in decision.actions)
    return (f"would {would}" if would else f"would go {decision.phase.value}"
            if decision.phase != paused_from else f"sees {decision.phase.value}") + (
        f" ({decision.reason})" if decision.reason else "")


def _take_report(st: Status, result: ImageReport | ModelReport) -> None:
    """An image or model check's report, kept in the status (a model check put off to the Ray join joins its
    image's report)."""
    if isinstance(result, ImageReport):
        st.images[result.node] = dataclasses.replace(result, start=st.starts)
    elif (kept := st.images.get(result.node)) is not None:
        st.images[result.node] = dataclasses.replace(kept, model=result)


def _admitted(st: Status, obs: Observation, decision: Decision, failure: Reason | None) -> None:
    """The full reading on which this start's containers started (plan.serving.admitted_fresh): kept for its
    launch, and for that launch only (a relaunch reads the memory again)."""
    if any(isinstance(a, StartServe) for a in decision.actions):
        st.admitted = None
    elif obs.full and not failure and any(isinstance(a, StartContainer) for a in decision.actions):
        st.admitted = (st.starts, obs.at)


def _at_once(actions: tuple[Action, ...], i: int) -> bool:
    """Whether the action at ``i`` runs at once with the like ones after it: removals and checks (one per
    node); container starts after the first (the head's alone first: its failure is a plain retry, not a
    deployment half started; a Ray worker then waits for its head by itself)."""
    a = actions[i]
    return isinstance(a, RemoveContainers | CheckImage | CheckModel) or (
        isinstance(a, StartContainer) and i > 0 and isinstance(actions[i - 1], StartContainer))


def _run(backend: Backend, actions: tuple[Action, ...], watchdog: Callable[[], None],
         log: Log) -> list[tuple[Action, Result]]:
    """Run actions in order; consecutive like ones run at once where _at_once says. Stops at a failure."""
    def run_one(action: Action) -> Result:
        try:
            return backend.run(action)
        except ActionFailed as e:
            return e

    done: list[tuple[Action, Result]] = []
    i = 0
    while i < len(actions):
        j = i + 1
        while (_at_once(actions, i) and j < len(actions) and type(actions[j]) is type(actions[i])):
            j += 1
        batch = actions[i:j]
        watchdog()  # still the main loop: a long tick is not a hung one
        for a in batch:
            log.info("action.started", **describe(a))
        if len(batch) == 1:
            results = [run_one(batch[0])]
        else:
            with cf.ThreadPoolExecutor(max_workers=len(batch)) as pool:
                results = list(pool.map(run_one, batch))
        done += list(zip(batch, results, strict=True))
        if any(isinstance(r, ActionFailed) for r in results):
            break
        i = j
    return done


def _with_slow_facts(obs: Observation | None, last_full: Observation | None) -> Observation | None:
    """A quick observation with the slow facts (GPU, memory, units) kept from the last full one."""
    if obs is None or last_full is None or obs.full:
        return obs
    full = last_full.nodes
    nodes = {k: dataclasses.replace(full[k], containers=v.containers, error=v.error) if k in full else v
             for k, v in obs.nodes.items()}
    return dataclasses.replace(obs, nodes=nodes)
