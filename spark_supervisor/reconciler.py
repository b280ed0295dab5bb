"""One deployment's reconcile loop: observe -> plan -> act on its own nodes, with its own phase, probes,
trackers, repair budget, history and load progress. The daemon runs one per configured deployment, each
on its view of the config (``Config.view``), and shares what is process-wide (signals, systemd, metrics,
the status file) between them."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable
from typing import Any

from . import logscan, probes, statefile
from .act import ActionFailed
from .backend import Backend, Fingerprint, fingerprint
from .config import Config
from .metrics import DeploymentMetrics, NoMetrics
from .model import (
    Action,
    CheckImage,
    Decision,
    DropPageCache,
    ImageReport,
    Observation,
    Pause,
    Phase,
    Reason,
    RemoveContainers,
    StartContainer,
    Status,
    Tracker,
    Verdict,
    Verify,
    describe,
)
from .plan import plan, unknowns
from .preflight import preflight
from .retry import backoff_delay

# Phases during which a full observation (units, nvidia-smi, meminfo) is needed every tick.
_FULL_PHASES = {Phase.DETECTING, Phase.CLEANING, Phase.BACKOFF, Phase.FAILED, Phase.DEGRADED, Phase.STARTING_VLLM}


class Reconciler:
    def __init__(self, cfg: Config, backend: Backend, *, log: Any, metrics: DeploymentMetrics | NoMetrics,
                 watchdog: Callable[[], None], clock: Callable[[], float], wall: Callable[[], float],
                 rng: Callable[[], float], alert: Callable[..., object] | None = None):
        self.cfg, self.backend, self.log, self.metrics = cfg, backend, log, metrics
        self.alert = alert or (lambda deployment, event, **fields: None)
        self.paused: Pause | None = None  # set by the daemon: observe and report, act on nothing
        self._paused_from = Phase.DETECTING  # the phase it was in when paused: what the plan is judged from
        self._trouble = False  # an alert about it went out (failed, degraded, repair): recovery is news
        self.watchdog, self.clock, self.wall, self.rng = watchdog, clock, wall, rng
        self.name = cfg.deployment.name
        self.status = Status()
        self.last_obs: Observation | None = None
        self.last_full: Observation | None = None
        self.due_at = 0.0  # when its next tick is due (the daemon's clock)
        self.last_progress = clock()  # when its start last made progress (systemd's start timeout)
        self._milestone = ""
        self._load_key: tuple[object, ...] | None = None
        self._best_rank = -1
        self._fetched = 0  # model bytes prefetched so far (progress of the start)
        self._look_closer = False
        self._tracked_serve = ""
        self._eager = 0  # consecutive ticks run at once after acting
        self.fingerprint: Fingerprint = (None, "unknown")
        self.repairs = self._repair_log(cfg)
        self.bringup_at = clock()  # the start of the current bring-up (daemon start, a repair): time to ready
        self._doc: dict[str, Any] | None = None  # its part of the status file, kept until something changes
        self._doc_key: tuple[object, ...] = ()

    def _repair_log(self, cfg: Config) -> statefile.RepairLog:
        log = statefile.RepairLog(cfg.supervisor.state_dir, self.wall())
        if log.problem:
            self.log.warning("state.repairs_unusable", problem=log.problem)
        return log

    # ------------------------------------------------------------------------------------ one tick
    def _want_full(self, now: float) -> bool:
        return (self.last_full is None or self.status.phase in _FULL_PHASES or self._look_closer
                or now - self.last_full.at >= self.cfg.supervisor.full_observe_interval)

    def tick(self) -> float:
        """One reconcile pass; returns the seconds until the next one."""
        st, cfg, now = self.status, self.cfg, self.clock()
        obs = self.backend.observe(self._want_full(now))
        self.last_obs = obs
        if obs.full:
            self.last_full = obs
            st.preflight = tuple(preflight(cfg, obs))
        self._track(obs, now)
        if self.paused is not None:
            return self._paused_tick(obs, now)
        return self._reconcile(obs, now)

    def _paused_tick(self, obs: Observation, now: float) -> float:
        """Paused: plan as usual, to report what would be done, but do none of it and count no repair."""
        st = self.status
        assert self.paused is not None
        if st.phase != Phase.PAUSED:
            self._paused_from = st.phase
        self._progress(obs, now)
        decision = plan(obs, dataclasses.replace(st, phase=self._paused_from), self.cfg, now)
        would = ", ".join(type(a).__name__ for a in decision.actions)
        sees = (f"would {would}" if would else f"would go {decision.phase.value}"
                if decision.phase != self._paused_from else f"sees {decision.phase.value}") + (
            f" ({decision.reason})" if decision.reason else "")
        if st.advance(Phase.PAUSED, Reason("Paused", f"{self.paused.text()}; {sees}"), now, self.wall()):
            self.log.info("phase.paused", phase=Phase.PAUSED.value, sees=sees, by=self.paused.by,
                          reason=self.paused.reason)
        self.fingerprint = fingerprint(obs.ray, obs.endpoint)
        self.metrics.update(st, obs, self.clock(), self.cfg)
        self.changed()
        return self.cfg.supervisor.interval

    def resume(self, why: str) -> None:
        """Leave PAUSED: detect afresh (a serve left running is adopted, not restarted)."""
        self.paused = None
        st = self.status
        if st.phase == Phase.PAUSED:
            self._best_rank = 0
            st.failures, st.backoff_until, st.next_repair_at = 0, 0.0, 0.0
            st.advance(Phase.DETECTING, Reason(detail=f"resumed: {why}"), self.clock(), self.wall())
            self.log.info("reconcile.resumed", by=why)
        self.changed()
        self.due_at = 0.0

    def _reconcile(self, obs: Observation, now: float, *, again: bool = True) -> float:
        """Plan and act on one observation; returns the seconds until the next tick."""
        st, cfg = self.status, self.cfg
        st.repairs_in_window = len(self.repairs.recent(self.wall(), cfg.healing.repair_window))
        before = (st.phase, st.reason, st.progress)
        self._progress(obs, now)  # before the plan: a load that moved this tick is not judged stalled
        decision = plan(obs, st, cfg, now)
        self._look_closer = decision.look_closer
        if decision.repair:
            self._start_repair(decision, now)
        failure = decision.why if decision.failure else None
        fatal = False
        for action, result in self._run(decision.actions):
            if isinstance(result, ActionFailed):
                self.log.warning("action.failed", action=type(action).__name__, reason=result.reason)
                failure, fatal = result.why, result.deterministic
                break
            if isinstance(result, ImageReport):
                st.images[result.node] = dataclasses.replace(result, start=st.starts)
                continue
            verdict = result
            if isinstance(action, DropPageCache):
                st.page_cache_dropped = st.page_cache_dropped | {action.node}
                self.metrics.page_cache_dropped(action.node)
            if isinstance(action, StartContainer):  # a new stage of the start: it may drop once more
                st.page_cache_dropped = frozenset()
                st.starts += action.node == self.cfg.members(self.cfg.deployment)[0].name  # the next checks again
            if isinstance(action, Verify) and verdict is not None:
                # Readiness and the periodic deep probe feed one tracker: a serve that never answers
                # its first completion is as wedged as one that stops answering later.
                st.deep = st.deep.record(probes.deep_result(verdict), self.clock(), verdict.why)
                self.metrics.probed("deep" if action.deep else "sanity", st.deep.last, verdict)
                if not action.deep:
                    st.verdict = verdict
                    if not verdict.passed:
                        failure = Reason("SanityFailed", verdict.why)
        self._advance(decision, failure, fatal, now)
        if self._progressed(before):
            self.last_progress = now
        self.fingerprint = fingerprint(obs.ray, obs.endpoint)
        self.metrics.update(st, obs, self.clock(), self.cfg)
        self.changed()
        if (again and decision.actions and not failure and st.phase != Phase.FAILED
                and all(isinstance(a, CheckImage) for a in decision.actions)):
            # Only looked at the images: decide on at once with the same (fresh) observation.
            return self._reconcile(obs, self.clock(), again=False)
        if (decision.actions or decision.look_closer) and not failure and st.phase not in (Phase.SERVING,
                                                                                             Phase.FAILED):
            self._eager += 1
            if self._eager <= 3:  # bounded: something that comes back as fast as it is removed must not spin us
                return 0.0  # something was done: look again at once rather than idle for an interval
        else:
            self._eager = 0
        if st.phase in (Phase.SERVING, Phase.FAILED, Phase.WAITING):
            return cfg.supervisor.interval
        if st.phase == Phase.BACKOFF:
            until = max(st.backoff_until, st.next_repair_at)
            return max(0.05, min(until - self.clock(), cfg.supervisor.interval))
        if st.phase == Phase.DEGRADED:
            return min(backoff_delay(st.failures + 1, cfg.supervisor.backoff_base, 30, 1.0), 30)
        if st.phase == Phase.LOADING:
            return min(cfg.deployment.readiness.poll_interval, cfg.supervisor.interval)
        return cfg.supervisor.transition_interval

    def _run(self, actions: tuple[Action, ...]) -> list[tuple[Action, Verdict | ImageReport | ActionFailed | None]]:
        """Run actions in order; consecutive removals or image checks (one per node) run at once. Stops at a
        failure."""
        done: list[tuple[Action, Verdict | ImageReport | ActionFailed | None]] = []
        i = 0
        while i < len(actions):
            j = i + 1
            while (isinstance(actions[i], RemoveContainers | CheckImage) and j < len(actions)
                   and type(actions[j]) is type(actions[i])):
                j += 1
            batch = actions[i:j]
            self.watchdog()  # still the main loop: a long tick is not a hung one
            for a in batch:
                self.log.info("action.started", **describe(a))
            if len(batch) == 1:
                results = [self._run_one(batch[0])]
            else:
                with cf.ThreadPoolExecutor(max_workers=len(batch)) as pool:
                    results = list(pool.map(self._run_one, batch))
            done += list(zip(batch, results, strict=True))
            if any(isinstance(r, ActionFailed) for r in results):
                break
            i = j
        return done

    def _run_one(self, action: Action) -> Verdict | ImageReport | ActionFailed | None:
        try:
            return self.backend.run(action)
        except ActionFailed as e:
            return e

    def _track(self, obs: Observation, now: float) -> None:
        """Liveness of the serve that is SERVING; a new serve instance starts its trackers afresh."""
        st = self.status
        identity = obs.serve.identity if obs.serve is not None and obs.serve.present else ""
        if identity != self._tracked_serve:
            self._tracked_serve = identity
            st.health, st.deep = Tracker(), Tracker(last_at=now)
        self._track_unknown(obs, now)
        watched = st.phase == Phase.SERVING or (st.phase == Phase.DEGRADED and st.verdict is not None
                                                 and st.verdict.passed and st.verdict.serve == identity)
        if watched and obs.serve is not None and (obs.serve.running or obs.serve.error):
            result = probes.health_result(obs.endpoint)
            detail = obs.endpoint.detail or obs.endpoint.state if obs.endpoint else ""
            if obs.endpoint is not None and obs.endpoint.state == "up":
                detail = f"HTTP {obs.endpoint.health}"
            st.health = st.health.record(result, now, detail)
            self.metrics.probed("health", result)
            if result == "failure":
                self.log.warning("probe.health_failed", failures=st.health.failures, detail=detail)

    def _track_unknown(self, obs: Observation, now: float) -> None:
        """What could not be seen: since when (for the planner's patience), and how often (shown)."""
        st = self.status
        seen_not = unknowns(obs, self.cfg, st.phase)
        if not seen_not:
            st.unknown_run_since = 0.0
        elif not st.unknown_run_since:
            st.unknown_run_since = now
        for what, error in seen_not.items():
            if what not in st.unknown_since:
                st.unknown_since[what] = now
                self.log.warning("observe.unknown", what=what, error=error)
            st.unknown_counts[what] = st.unknown_counts.get(what, 0) + 1
            self.metrics.unknown(what)
        for what in [w for w in st.unknown_since if w not in seen_not]:
            self.log.info("observe.known_again", what=what, unknown_s=round(now - st.unknown_since.pop(what), 1))

    # Phases a start climbs through; reaching a further one (or the load moving) is progress.
    _RANK = {Phase.DETECTING: 0, Phase.CLEANING: 1, Phase.STARTING_RAY: 2, Phase.STARTING_VLLM: 3,
             Phase.LOADING: 4, Phase.VERIFYING: 5, Phase.SERVING: 6}

    def _progressed(self, before: tuple[Phase, str, str]) -> bool:
        """Progress extends systemd's start timeout: a phase further than any reached since the bring-up
        began, or the load moving. Going round in circles (waiting, backing off, retrying) is not."""
        st = self.status
        rank = self._RANK.get(st.phase, -1)
        if rank > self._best_rank:
            self._best_rank = rank
            return True
        # A model prefetch filling a node (modelcheck) moves too: a first download may take an hour.
        fetched = sum(r.model.bytes_done for r in st.images.values() if r.model is not None and r.model.prefetch)
        moved, self._fetched = fetched > 0 and fetched != self._fetched, fetched
        if moved:
            return True
        return bool(st.progress) and st.progress != before[2]

    def _start_repair(self, decision: Decision, now: float) -> None:
        st, h = self.status, self.cfg.healing
        self._best_rank = 0
        st.page_cache_dropped = frozenset()
        self.repairs.add(self.wall(), decision.repair, decision.reason)
        self.metrics.repaired(decision.repair, decision.why.kind)
        self.bringup_at = now
        n = len(self.repairs.recent(self.wall(), h.repair_window))
        st.repairs_in_window = n
        delay = backoff_delay(n, self.cfg.supervisor.backoff_base, self.cfg.supervisor.backoff_max, self.rng())
        st.next_repair_at = now + delay
        self.log.warning("repair.started", kind=decision.repair, reason=decision.reason, reason_kind=decision.why.kind,
                         budget_used=n, budget=h.repair_budget, next_repair_not_before_s=round(delay, 1))
        self._trouble = True
        self.alert(self.name, "repair", phase=st.phase.value, reason=decision.reason, reason_kind=decision.why.kind,
                   repair=decision.repair, budget_used=n, budget=h.repair_budget)

    def _kv_cache(self, obs: Observation, tokens: int) -> None:
        """The KV cache a serve came up with, against the best seen for its spec (persisted): page cache
        and compiler memory during a cold load shrink it silently (vLLM counts them as non-torch memory)."""
        st, serve = self.status, obs.serve
        assert serve is not None
        if not tokens or st.kv_cache.get("serve") == serve.identity:
            return
        best_all = statefile.read_json(self.cfg.supervisor.state_dir, "kv.json")
        raw = best_all.get(serve.spec_hash, 0)
        best = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0  # anything else: none
        share = self.cfg.memory.kv_cache_regression
        regressed = best > 0 and tokens < best * (1 - share)
        st.kv_cache = {"serve": serve.identity, "tokens": tokens, "best": max(best, tokens), "warning": ""}
        if regressed:
            st.kv_cache["warning"] = (
                f"KvCacheRegression: {tokens:,} tokens, {1 - tokens / best:.0%} below the best {best:,} for this "
                "spec: page cache or compiler memory during the load counted as used; drop the page cache and "
                "restart the serve at a quiet moment")
            self.log.warning("memory.kv_cache_regression", tokens=tokens, best=best, spec=serve.spec_hash)
        if tokens > best:
            try:
                statefile.write_json(self.cfg.supervisor.state_dir, "kv.json", {**best_all, serve.spec_hash: tokens})
            except OSError as e:
                self.log.error("state.write_failed", file="kv.json", error=str(e))
        self.metrics.kv_cache(tokens, max(best, tokens), regressed)

    def _progress(self, obs: Observation, now: float) -> None:
        st = self.status
        if obs.serve is None or not obs.serve.present:
            st.progress, st.load_fraction, st.eta_s, self._milestone = "", 0.0, None, ""
            self._load_key = None
            return
        p = logscan.scan(obs.serve.log_tail)
        st.progress, st.load_fraction, st.eta_s = p.summary(), p.fraction, p.eta_s
        if p.ready:
            self._kv_cache(obs, p.kv_cache_tokens)
        key = (obs.serve.identity, p.milestone, p.shards_done, p.graphs_percent, p.pg_wait_s)
        if key != self._load_key:
            self._load_key, st.load_progress_at = key, now
        if p.milestone != self._milestone:
            self._milestone = p.milestone
            self.log.info("load.progress", milestone=p.milestone, progress=st.progress, version=p.version)

    def _advance(self, decision: Decision, failure: Reason | None, fatal: bool, now: float) -> None:
        st, sup = self.status, self.cfg.supervisor
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
                    self.metrics.ready_after(now - self.bringup_at)
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
                   previous_phase=before.value)

    def phase_line(self) -> str:
        st, dep = self.status, self.cfg.deployment
        if st.phase == Phase.SERVING:
            n = len(self.cfg.members(dep))
            return f"SERVING {dep.serve.name} on {n} node{'' if n == 1 else 's'}"
        if st.phase == Phase.BACKOFF:
            wait = max(0, st.backoff_until - self.clock())
            return f"BACKOFF retry {st.failures} in {wait:.0f}s: {st.reason}"
        if st.phase == Phase.LOADING:
            return f"LOADING {st.progress}" + (f" ({st.reason})" if st.reason else "")
        return f"{st.phase.value} {st.reason}".strip()

    def quick(self) -> bool:
        """The cheap check between ticks: True when Ray's nodes or /health changed since the last tick."""
        try:
            seen = self.backend.quick()
        except Exception as e:  # a bug or an odd answer between ticks must not end the daemon
            self.log.warning("watch.failed", error=f"{type(e).__name__}: {e}"[:200])
            return False
        ray_then, health_then = self.fingerprint
        # The tick may not have looked at /health (no serve yet): then only Ray counts.
        if seen[0] != ray_then or (health_then != "unknown" and seen[1] != health_then):
            if self.status.phase == Phase.SERVING:
                self.log.info("watch.changed", ray_alive=sorted(seen[0]) if seen[0] else None, health=seen[1])
            return True
        return False

    # While bringing the deployment up, the cheap check wakes the loop the moment Ray forms or the API
    # starts listening, instead of a poll interval later.
    _BRINGUP_QUICK_S = 0.2

    def quick_interval(self) -> float:
        phase = self.status.phase
        if phase == Phase.SERVING:
            return self.cfg.healing.quick_check_interval
        if phase in (Phase.STARTING_RAY, Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING):
            return min(self._BRINGUP_QUICK_S, self.cfg.healing.quick_check_interval)
        return 0.0

    def changed(self) -> None:
        """Its status or observation changed outside a tick: build its document again."""
        self._doc = None

    def document(self, config_path: str, config_hash: str, problems: tuple[str, ...], now: float) -> dict[str, Any]:
        """Its part of the status file; built again only after a change (the daemon asks after every
        deployment's tick: the log scan and the history in it are not free)."""
        key = (config_path, config_hash, problems, self.repairs.problem)
        if self._doc is not None and key == self._doc_key:
            return self._doc
        obs = self.last_obs
        if obs is not None and self.last_full is not None and not obs.full:
            # Keep the slow facts (GPU, memory, units) from the last full observation.
            full = self.last_full.nodes
            nodes = {k: dataclasses.replace(full[k], containers=v.containers, error=v.error) if k in full else v
                     for k, v in obs.nodes.items()}
            obs = dataclasses.replace(obs, nodes=nodes)
        self._doc_key = key
        self._doc = statefile.document(self.status, obs, self.cfg, config_path, config_hash, self.wall(),
                                       self.wall() - now, tuple(p for p in (self.repairs.problem, *problems) if p))
        return self._doc

    def reconfigure(self, cfg: Config, backend: Backend, why: str) -> None:
        """A reload changed what it runs: the new view and backend, then re-armed (a changed spec replaces
        the deployment through the planner, like any other difference it observes)."""
        self.backend.close()
        self.cfg, self.backend = cfg, backend
        self.repairs = self._repair_log(cfg)
        self.rearm(why)

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budget when the operator asks for a reset)."""
        st = self.status
        self._best_rank = 0
        st.images = {}  # the image may have been fixed under the same name: check it again
        if why == "reset":
            self.repairs.clear()
            self.log.info("reconcile.reset", budget_cleared=True, phase=st.phase.value)
        st.failures, st.backoff_until, st.next_repair_at = 0, 0.0, 0.0
        self.changed()
        if st.phase in (Phase.FAILED, Phase.BACKOFF, Phase.WAITING):
            st.advance(Phase.DETECTING, Reason(detail=f"re-armed by {why}"), self.clock(), self.wall())
            self.log.info("reconcile.rearmed", by=why)
        self.due_at = 0.0
