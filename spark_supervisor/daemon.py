"""The reconcile loop: observe -> plan -> act, signals, reload, shutdown, notify, status file.

Signal handlers only record the signal and wake the loop; the loop dispatches them between ticks.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import fcntl
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from . import config as config_mod
from . import logscan, probes, statefile
from .act import ActionFailed
from .config import Config
from .model import (
    Reason,
    Action,
    CheckImage,
    Decision,
    ImageReport,
    DropPageCache,
    StartContainer,
    Observation,
    Phase,
    RemoveContainers,
    Status,
    Tracker,
    Verdict,
    Verify,
    describe,
)
from .metrics import Metrics, NoMetrics
from .notify import Notifier
from .control import ControlServer
from .backend import Backend, Fingerprint, RealBackend, fingerprint
from .plan import plan, unknowns
from .preflight import preflight
from .retry import backoff_delay

# Phases during which a full observation (units, nvidia-smi, meminfo) is needed every tick.
_FULL_PHASES = {Phase.DETECTING, Phase.CLEANING, Phase.BACKOFF, Phase.FAILED, Phase.DEGRADED, Phase.STARTING_VLLM}


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
            lambda c: RealBackend(c, log, heartbeat=lambda: self.notifier.watchdog(self.clock())))
        self.clock, self.wall, self.rng = clock, wall, rng
        self.status = Status()
        self.backend = self._backend_factory(cfg)
        self.last_obs: Observation | None = None
        self.last_full: Observation | None = None
        self._last_doc = ""
        self._signals: collections.deque[int | str] = collections.deque()  # signals and control requests
        self.control: ControlServer | None = None
        self._wake = threading.Event()
        self._milestone = ""
        self._load_key: tuple[object, ...] | None = None
        self._last_progress = clock()
        self._best_rank = -1
        self._look_closer = False
        self._stall_logged = False
        self._last_status = ""
        self._tracked_serve = ""
        self._eager = 0  # consecutive ticks run at once after acting
        self._fingerprint: Fingerprint = (None, "unknown")
        self.repairs = self._repair_log(cfg)
        self._state_write_error = ""
        self._bringup_at = clock()  # the start of the current bring-up (daemon start, a repair): time to ready
        self.metrics = self._metrics(cfg)
        self.reload_error = ""  # kept in STATUS= until a reload succeeds
        self.stopped = False

    def _repair_log(self, cfg: Config) -> statefile.RepairLog:
        log = statefile.RepairLog(cfg.supervisor.state_dir, self.wall())
        if log.problem:
            self.log.warning("state.repairs_unusable", problem=log.problem)
        return log

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
        return self._reconcile(obs, now)

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
            self._last_progress = now
        self._extend_start(now)
        self._fingerprint = fingerprint(obs.ray, obs.endpoint)
        self.metrics.update(st, obs, self.clock())
        self._write_status(now)
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
        if st.phase in (Phase.SERVING, Phase.FAILED):
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
            self.notifier.watchdog(self.clock())  # still the main loop: a long tick is not a hung one
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
        return bool(st.progress) and st.progress != before[2]

    def _start_repair(self, decision: Decision, now: float) -> None:
        st, h = self.status, self.cfg.healing
        self._best_rank = 0
        st.page_cache_dropped = frozenset()
        self.repairs.add(self.wall(), decision.repair, decision.reason)
        self.metrics.repaired(decision.repair, decision.why.kind)
        self._bringup_at = now
        n = len(self.repairs.recent(self.wall(), h.repair_window))
        st.repairs_in_window = n
        delay = backoff_delay(n, self.cfg.supervisor.backoff_base, self.cfg.supervisor.backoff_max, self.rng())
        st.next_repair_at = now + delay
        self.log.warning("repair.started", kind=decision.repair, reason=decision.reason, reason_kind=decision.why.kind,
                         budget_used=n, budget=h.repair_budget, next_repair_not_before_s=round(delay, 1))

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
                    self.metrics.ready_after(now - self._bringup_at)
            else:
                self.log.info("phase.progress", phase=phase.value, reason=str(why), reason_kind=why.kind)
        line = self.status_line()
        if line != self._last_status:
            self._last_status = line
            self.notifier.status(line)
        if not st.ready_sent and (phase == Phase.SERVING or self.cfg.supervisor.ready_when == "started"):
            st.ready_sent = True
            self.notifier.ready(self.status_line())
            self.log.info("daemon.ready", phase=phase.value)

    # How long each EXTEND_TIMEOUT_USEC buys: more than the longest tick, so the next one arrives in time.
    EXTEND_S = 180.0

    def _extend_start(self, now: float) -> None:
        """While not yet READY, keep systemd's start timeout alive as long as the start makes progress."""
        st, sup = self.status, self.cfg.supervisor
        if st.ready_sent:
            return
        if now - self._last_progress <= sup.start_stall_timeout:
            self.notifier.extend_timeout(self.EXTEND_S)
        elif not self._stall_logged:
            self._stall_logged = True
            self.log.error("start.stalled", phase=st.phase.value, reason=st.reason,
                           no_progress_s=round(now - self._last_progress))

    def status_line(self) -> str:
        line = self._phase_line()
        return f"{line} (reload failed: {self.reload_error})" if self.reload_error else line

    def _phase_line(self) -> str:
        st, dep = self.status, self.cfg.deployment
        if st.phase == Phase.SERVING:
            return f"SERVING {dep.serve.name} on {len(self.cfg.members(dep))} nodes"
        if st.phase == Phase.BACKOFF:
            wait = max(0, st.backoff_until - self.clock())
            return f"BACKOFF retry {st.failures} in {wait:.0f}s: {st.reason}"
        if st.phase == Phase.LOADING:
            return f"LOADING {st.progress}" + (f" ({st.reason})" if st.reason else "")
        return f"{st.phase.value} {st.reason}".strip()

    def _write_status(self, now: float) -> None:
        obs = self.last_obs
        if obs is not None and self.last_full is not None and not obs.full:
            # Keep the slow facts (GPU, memory, units) from the last full observation.
            full = self.last_full.nodes
            nodes = {k: dataclasses.replace(full[k], containers=v.containers, error=v.error) if k in full else v
                     for k, v in obs.nodes.items()}
            obs = dataclasses.replace(obs, nodes=nodes)
        problems = tuple(p for p in (self.repairs.problem, self._state_write_error) if p)
        doc = statefile.document(self.status, obs, self.cfg, self.config_path, self.config_hash,
                                 self.wall(), self.wall() - now, problems)
        key = json.dumps({k: v for k, v in doc.items() if k != "daemon"}, sort_keys=True)
        if key != self._last_doc:
            self._last_doc = key
            try:
                statefile.write(self.cfg.supervisor.state_dir, doc)
                self._state_write_error = ""
            except OSError as e:
                if not self._state_write_error:
                    self.log.error("status.write_failed", error=str(e), state_dir=self.cfg.supervisor.state_dir)
                self._state_write_error = f"cannot write the status file: {e.strerror or e}"
                self._last_doc = ""  # try again next tick
                self.metrics.state_write_failed("status")

    # --------------------------------------------------------------------------- signals and loop
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM and signal.SIGTERM in self._signals:
            raise SystemExit(1)  # a second SIGTERM: leave at once
        self._signals.append(signum)
        self._wake.set()

    def _on_request(self, command: str) -> str:
        """From the control socket's thread: record and wake, like a signal; the loop acts on it."""
        if command == "ping":
            return f"spark-supervisor {os.getpid()}: {self.status.phase.value}"
        self._signals.append(command)
        self._wake.set()
        return f"spark-supervisor (pid {os.getpid()}) will re-arm and forget its repair budget"

    def reload(self) -> None:
        self.notifier.reloading()
        try:
            new = config_mod.load(self.config_path)
        except config_mod.ConfigError as e:
            self.log.error("config.invalid", path=self.config_path, problems=e.problems, kept="previous config")
            self.reload_error = e.problems[0]
            self._reload_done()
            return
        except Exception as e:  # whatever the file holds, a reload must never take the supervisor down
            self.log.exception("config.unreadable", path=self.config_path, kept="previous config")
            self.reload_error = f"{self.config_path}: {type(e).__name__}: {e}"[:300]
            self._reload_done()
            return
        if new.supervisor.state_dir != self.cfg.supervisor.state_dir:
            # The lock and the control socket live there: moving it would let a second daemon in.
            self.reload_error = (f"{self.config_path}: supervisor.state_dir cannot change on reload "
                                 f"(restart the service to move it to {new.supervisor.state_dir})")
            self.log.error("config.invalid", path=self.config_path, problems=[self.reload_error],
                           kept="previous config")
            self._reload_done()
            return
        self.reload_error = ""
        changed = new != self.cfg
        self.log.info("config.reloaded", path=self.config_path, changed=changed,
                      ray_hash=config_mod.ray_hash(new, new.deployment),
                      serve_hash=config_mod.serve_hash(new, new.deployment))
        if changed:
            try:
                backend = self._backend_factory(new)
            except Exception as e:
                self.log.exception("config.unusable", path=self.config_path, kept="previous config")
                self.reload_error = f"{self.config_path}: cannot set up: {type(e).__name__}: {e}"[:300]
                self._reload_done()
                return
            old_metrics = self.cfg.metrics
            self.backend.close()
            self.cfg, self.config_hash = new, config_mod.file_hash(self.config_path)
            self.backend = backend
            self.repairs = self._repair_log(new)
            if new.metrics != old_metrics:
                self.metrics.close()
                self.metrics = self._metrics(new)
            self.rearm("config change")
            self._last_doc = ""
        self._reload_done()

    def _reload_done(self) -> None:
        # READY=1 ends the reload; before the first READY it would also end the start, so not then.
        self._last_status = self.status_line()
        if self.status.ready_sent:
            self.notifier.ready(self._last_status)
        else:
            self.notifier.status(self._last_status)

    def shutdown(self) -> None:
        self.notifier.stopping(f"STOPPING on_stop={self.cfg.supervisor.on_stop}")
        self.log.info("daemon.stopping", on_stop=self.cfg.supervisor.on_stop)
        if self.cfg.supervisor.on_stop == "teardown":
            try:
                self.backend.teardown()
            except ActionFailed as e:
                self.log.error("teardown.incomplete", reason=e.reason)
        self.status.advance(Phase.STOPPING, Reason(detail=f"on_stop={self.cfg.supervisor.on_stop}"), self.clock(),
                            self.wall())
        self._last_doc = ""
        self._write_status(self.clock())
        self.backend.close()
        self.metrics.close()
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
                      deployment=self.cfg.deployment.name, nodes=[n.name for n in self.cfg.nodes],
                      state_dir=self.cfg.supervisor.state_dir)
        while True:
            while self._signals:
                sig = self._signals.popleft()
                if sig == signal.SIGHUP:
                    self.reload()
                elif sig in (signal.SIGUSR1, "reset"):
                    self.rearm("reset")
                else:
                    self.shutdown()
                    return 0
            hang = os.environ.get("SPARK_SUPERVISOR_TEST_HANG_FILE")
            if hang and os.path.exists(hang):  # test-only fault switch: a hung main loop
                self.log.warning("test.hanging", file=hang)
                threading.Event().wait()
            try:
                wait = self.tick()
            except Exception as e:  # a bug must not kill the supervisor: report it, back off, go on
                self.log.exception("reconcile.crashed", error=f"{type(e).__name__}: {e}")
                self.status.failures += 1
                wait = backoff_delay(self.status.failures, self.cfg.supervisor.backoff_base,
                                     self.cfg.supervisor.backoff_max, self.rng())
            self._wait(wait)

    def _wait(self, seconds: float) -> None:
        """Sleep until the next tick, a signal, or (while serving) a change seen by the quick check."""
        deadline = self.clock() + seconds
        while True:
            self.notifier.watchdog(self.clock())
            left = deadline - self.clock()
            if left <= 0:
                break
            step = left
            if self.notifier.watchdog_interval:
                step = min(step, self.notifier.watchdog_interval)
            quick = self._quick_interval()
            if quick:
                step = min(step, quick)
            if self._wake.wait(step):
                break
            if quick and self.clock() < deadline:
                try:
                    seen = self.backend.quick()
                except Exception as e:  # a bug or an odd answer between ticks must not end the daemon
                    self.log.warning("watch.failed", error=f"{type(e).__name__}: {e}"[:200])
                    seen = self._fingerprint
                ray_then, health_then = self._fingerprint
                # The tick may not have looked at /health (no serve yet): then only Ray counts.
                if seen[0] != ray_then or (health_then != "unknown" and seen[1] != health_then):
                    if self.status.phase == Phase.SERVING:
                        self.log.info("watch.changed", ray_alive=sorted(seen[0]) if seen[0] else None,
                                      health=seen[1])
                    break
        self._wake.clear()

    # While bringing the deployment up, the cheap check wakes the loop the moment Ray forms or the API
    # starts listening, instead of a poll interval later.
    _BRINGUP_QUICK_S = 0.2

    def _quick_interval(self) -> float:
        phase = self.status.phase
        if phase == Phase.SERVING:
            return self.cfg.healing.quick_check_interval
        if phase in (Phase.STARTING_RAY, Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING):
            return min(self._BRINGUP_QUICK_S, self.cfg.healing.quick_check_interval)
        return 0.0

    def rearm(self, why: str) -> None:
        """Leave FAILED (and forget the repair budget when the operator asks for a reset)."""
        st = self.status
        self._best_rank = 0
        st.images = {}  # the image may have been fixed under the same name: check it again
        if why == "reset":
            self.repairs.clear()
            self.log.info("reconcile.reset", budget_cleared=True, phase=st.phase.value)
        st.failures, st.backoff_until, st.next_repair_at = 0, 0.0, 0.0
        if st.phase in (Phase.FAILED, Phase.BACKOFF):
            st.advance(Phase.DETECTING, Reason(detail=f"re-armed by {why}"), self.clock(), self.wall())
            self.log.info("reconcile.rearmed", by=why)


class AlreadyRunning(Exception):
    pass


def lock_state_dir(state_dir: str) -> int:
    """Hold an exclusive lock for the process lifetime: two supervisors would fight over one cluster."""
    os.makedirs(state_dir, exist_ok=True)
    fd = os.open(os.path.join(state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise AlreadyRunning(f"another spark-supervisor (pid {other}) holds {state_dir}/lock") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
