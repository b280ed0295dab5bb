"""What one deployment's reconciler keeps track of between its ticks, beside its phase: the serve's
liveness and what could not be seen, the load's progress (and the KV cache it came up with), the start's
progress (systemd's start timeout), the repair budget, and what the cheap check between ticks compares.

Each tracker holds only its own memory; the status, config and metrics it works on are handed in by the
reconciler on every call (a reload replaces them under it)."""

from __future__ import annotations

from collections.abc import Callable

from ..adapters.retry import backoff_delay
from ..base.log import Log
from ..config import Config
from ..config.view import DeploymentView
from ..judge import fabric, logscan
from ..model import (
    Decision,
    EndpointState,
    EngineStats,
    Kind,
    KvCache,
    Observation,
    Phase,
    ProbeResult,
    Status,
    Tracker,
)
from ..plan import Seen
from ..report.metrics import DeploymentMetrics, NoMetrics
from ..state import names, statefile
from ..world.backend import Backend, Fingerprint, ray_alive

MetricsHandle = DeploymentMetrics | NoMetrics  # one deployment's handle, or metrics off


class Liveness:
    """Liveness of the serve that is SERVING (its /health), and what could not be seen."""

    def __init__(self, log: Log):
        self.log = log
        self._tracked_serve = ""

    def track(self, st: Status, obs: Observation, seen: Seen, metrics: MetricsHandle, now: float,
              stall_s: float = 0.0) -> None:
        """Liveness of the serve that is SERVING; a new serve instance starts its trackers afresh.
        ``stall_s``: healing.heartbeat_stall (0: the engine's heartbeat is not followed)."""
        identity = obs.serve.identity if obs.serve is not None and obs.serve.present else ""
        if identity != self._tracked_serve:
            self._tracked_serve = identity
            st.health, st.deep = Tracker(), Tracker(last_at=now)
        self._track_unknown(st, seen, metrics, now)
        watched = st.phase == Phase.SERVING or (st.phase == Phase.DEGRADED and st.verdict is not None
                                                 and st.verdict.passed and st.verdict.serve == identity)
        self._heartbeat(st, obs.engine if watched else None, identity, now, stall_s)
        if watched and obs.serve is not None and (obs.serve.running or obs.serve.error):
            result = seen.health
            detail = obs.endpoint.detail or obs.endpoint.state if obs.endpoint else ""
            if obs.endpoint is not None and obs.endpoint.state == EndpointState.UP:
                detail = f"HTTP {obs.endpoint.health}"
            st.health = st.health.record(result, now, detail)
            metrics.probed("health", result)
            if result == ProbeResult.FAILURE:
                self.log.warning("probe.health_failed", failures=st.health.failures, detail=detail)

    def _heartbeat(self, st: Status, engine: EngineStats | None, identity: str, now: float, stall_s: float) -> None:
        was, st.heartbeat = st.heartbeat, st.heartbeat.beat(engine, identity, now, stall_s)
        hb = st.heartbeat
        if hb.stalled_at and not was.stalled_at:
            self.log.warning("engine.heartbeat_stalled", running=hb.running, waiting=hb.waiting,
                             still_s=round(now - hb.moved_at, 1), why=hb.frozen(now))
        elif was.stalled_at and not hb.stalled_at:
            self.log.info("engine.heartbeat_resumed", stalled_s=round(now - was.stalled_at, 1))

    def _track_unknown(self, st: Status, seen: Seen, metrics: MetricsHandle, now: float) -> None:
        """What could not be seen: since when (for the planner's patience), and how often (shown)."""
        seen_not = seen.unknown
        if not seen_not:
            st.unknown_run_since = 0.0
        elif not st.unknown_run_since:
            st.unknown_run_since = now
        for what, error in seen_not.items():
            if what not in st.unknown_since:
                st.unknown_since[what] = now
                self.log.warning("observe.unknown", what=what, error=error)
            st.unknown_counts[what] = st.unknown_counts.get(what, 0) + 1
            metrics.unknown(what)
        for what in [w for w in st.unknown_since if w not in seen_not]:
            self.log.info("observe.known_again", what=what, unknown_s=round(now - st.unknown_since.pop(what), 1))


class LoadProgress:
    """How far the serve's load is (read from its log), when it last moved, and the KV cache it came up with."""

    def __init__(self, log: Log):
        self.log = log
        self._milestone = ""
        self._load_key: tuple[object, ...] | None = None

    def update(self, st: Status, obs: Observation, seen: Seen, cfg: Config, metrics: MetricsHandle, now: float) -> None:
        if obs.serve is None or not obs.serve.present:
            st.progress, st.load_fraction, st.eta_s, self._milestone = "", 0.0, None, ""
            self._load_key = None
            return
        p = seen.progress
        st.progress, st.load_fraction, st.eta_s = p.summary(), p.fraction, p.eta_s
        if p.ready:
            self._kv_cache(st, obs, cfg, metrics, p.kv_cache_tokens)
        key = (obs.serve.identity, p.milestone, p.shards_done, p.graphs_percent, p.pg_wait_s)
        if key != self._load_key:
            self._load_key, st.load_progress_at = key, now
        if p.milestone != self._milestone:
            self._milestone = p.milestone
            self.log.info("load.progress", milestone=p.milestone, progress=st.progress, version=p.version)

    def _kv_cache(self, st: Status, obs: Observation, cfg: Config, metrics: MetricsHandle, tokens: int) -> None:
        """The KV cache a serve came up with, against the best seen for its spec (persisted): page cache
        and compiler memory during a cold load shrink it silently (vLLM counts them as non-torch memory)."""
        serve = obs.serve
        assert serve is not None
        if not tokens or (st.kv_cache is not None and st.kv_cache.serve == serve.identity):
            return
        best_all = statefile.read_json(cfg.supervisor.state_dir, names.KV_CACHE)
        raw = best_all.get(serve.spec_hash, 0)
        best = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0  # anything else: none
        share = cfg.memory.kv_cache_regression
        regressed = best > 0 and tokens < best * (1 - share)
        warning = ""
        if regressed:
            warning = (
                f"{Kind.KV_CACHE_REGRESSION}: {tokens:,} tokens, {1 - tokens / best:.0%} below the best {best:,} for this "
                "spec: page cache or compiler memory during the load counted as used; drop the page cache and "
                "restart the serve at a quiet moment")
            self.log.warning("memory.kv_cache_regression", tokens=tokens, best=best, spec=serve.spec_hash)
        st.kv_cache = KvCache(serve.identity, tokens, max(best, tokens), warning)
        if tokens > best:
            try:
                statefile.write_json(cfg.supervisor.state_dir, names.KV_CACHE, {**best_all, serve.spec_hash: tokens})
            except OSError as e:
                self.log.error("state.write_failed", file=names.KV_CACHE, error=str(e))
        metrics.kv_cache(tokens, max(best, tokens), regressed)


class Below:
    """What lies below vLLM, kept between full observations (fabric.py judges it): each member's host facts
    and whether nvidia-smi lost its GPU, the boot IDs when the deployment reached SERVING, and the NCCL
    transport of each rank of the serve that runs (latched: its INFO lines scroll out of the log's tail)."""

    def __init__(self, log: Log):
        self.log = log

    def update(self, st: Status, obs: Observation, view: DeploymentView) -> None:
        """The tick's facts, and fabric.py's judgement of them kept on the status (Status.below): judged again
        only when they or the view (a reload) changed, not on every tick by the planner and the metrics."""
        if obs.full:
            self._hosts(st, obs, view)
        self._transports(st, obs)
        self.boots(st, obs)
        st.below = fabric.judged(view, st)

    def boots(self, st: Status, obs: Observation) -> None:
        """The members' boot IDs a serve runs on: recorded once per serve instance, the first tick it is seen
        SERVING or DEGRADED (a new serve after a repair is recorded afresh, even one that never is SERVING:
        else a reboot already repaired would be repaired again); one first read later is added."""
        s = obs.serve
        if st.phase not in (Phase.SERVING, Phase.DEGRADED) or s is None or not s.present or s.error:
            return
        known = {n: h.boot_id for n, h in st.hosts.items() if h.boot_id}
        if st.boots_of != s.identity:
            st.boots, st.boots_of = known, s.identity
            self.log.info("host.boot_ids", boot_ids=st.boots)
        else:
            st.boots.update({n: b for n, b in known.items() if n not in st.boots})

    def _hosts(self, st: Status, obs: Observation, view: DeploymentView) -> None:
        for node in view.members:
            o = obs.nodes.get(node.name)
            if o is None or o.error or o.host is None:  # not read: unknown, not the last reading
                st.hosts.pop(node.name, None)
            else:
                was = st.hosts.get(node.name)
                if was is not None and was.boot_id and o.host.boot_id and was.boot_id != o.host.boot_id:
                    self.log.warning("host.rebooted", node=node.name, boot_id=o.host.boot_id, was=was.boot_id)
                st.hosts[node.name] = o.host
            if o is not None and o.gpu_lost:
                if st.gpu_lost.get(node.name) != o.gpu_lost:
                    self.log.error("gpu.access_lost", node=node.name, said=o.gpu_lost)
                st.gpu_lost[node.name] = o.gpu_lost
            elif st.gpu_lost.pop(node.name, "") and o is not None and o.gpu is not None:  # not read: unknown
                self.log.info("gpu.access_regained", node=node.name)

    def _transports(self, st: Status, obs: Observation) -> None:
        s = obs.serve
        if s is None or not s.present:
            st.transports, st.transports_of = (), ""
            return
        if st.transports_of != s.identity:
            st.transports, st.transports_of = (), s.identity
        texts = [s.log_tail, *(x.log_tail for x in obs.followers.values() if x is not None and not x.error)]
        found = {(t.ip, t.rank): t for text in texts if "NCCL INFO" in text for t in logscan.transports(text)}
        if not found:
            return
        known = {(t.ip, t.rank): t for t in st.transports}
        if any(known.get(k) != t for k, t in found.items()):
            merged = {**known, **found}
            ranked = {ip for ip, rank in merged if rank is not None}
            merged = {k: t for k, t in merged.items() if k[1] is not None or k[0] not in ranked}
            st.transports = tuple(sorted(merged.values(), key=lambda t: (t.rank is None, t.rank or 0, t.ip)))
            for t in found.values():
                if known.get((t.ip, t.rank)) != t:
                    self.log.info("nccl.transport", rank=t.rank, ip=t.ip, network=t.net, detail=t.detail)


class StartProgress:
    """When the start last made progress (systemd's start timeout), and when the current bring-up began."""

    # Phases a start climbs through; reaching a further one (or the load moving) is progress.
    _RANK = {Phase.DETECTING: 0, Phase.CLEANING: 1, Phase.STARTING_RAY: 2, Phase.STARTING_VLLM: 3,
             Phase.LOADING: 4, Phase.VERIFYING: 5, Phase.SERVING: 6}

    def __init__(self, clock: Callable[[], float]):
        self.last_progress = clock()  # when its start last made progress (systemd's start timeout)
        self._best_rank = -1
        self._fetched = 0  # model bytes prefetched so far (progress of the start)
        self.bringup_at = clock()  # the start of the current bring-up (daemon start, a repair): time to ready

    def restart(self) -> None:
        """A bring-up begins again (resumed, re-armed, repaired): any phase it reaches is progress again."""
        self._best_rank = 0

    def note(self, st: Status, progress_before: str, now: float) -> None:
        """After a tick: the start moved (see ``_progressed``) at ``now``, or not."""
        if self._progressed(st, progress_before):
            self.last_progress = now

    def _progressed(self, st: Status, progress_before: str) -> bool:
        """Progress extends systemd's start timeout: a phase further than any reached since the bring-up
        began, or the load moving. Going round in circles (waiting, backing off, retrying) is not."""
        rank = self._RANK.get(st.phase, -1)
        if rank > self._best_rank:
            self._best_rank = rank
            return True
        # A model prefetch filling a node (modelcheck) moves too: a first download may take an hour.
        fetched = sum(r.model.bytes_done for r in st.images.values() if r.model is not None and r.model.prefetch)
        moved, self._fetched = fetched > 0 and fetched != self._fetched, fetched
        if moved:
            return True
        return bool(st.progress) and st.progress != progress_before


class RepairBudget:
    """The repairs made (kept in the state directory, so that the budget survives restarts), how many fall
    in the healing window, and when the next one may start."""

    def __init__(self, cfg: Config, *, log: Log, wall: Callable[[], float], rng: Callable[[], float]):
        self.log, self.wall, self.rng = log, wall, rng
        self.repairs = self._repair_log(cfg)

    def _repair_log(self, cfg: Config) -> statefile.RepairLog:
        log = statefile.RepairLog(cfg.supervisor.state_dir, self.wall())
        if log.problem:
            self.log.warning("state.repairs_unusable", problem=log.problem)
        return log

    def reopen(self, cfg: Config) -> None:
        """A reload changed what the deployment runs: its repair log read again."""
        self.repairs = self._repair_log(cfg)

    def used(self, cfg: Config) -> int:
        """The repairs in the healing window."""
        return len(self.repairs.recent(self.wall(), cfg.healing.repair_window))

    def spend(self, st: Status, decision: Decision, cfg: Config, metrics: MetricsHandle, now: float) -> int:
        """A repair starts: recorded, and the next one put off by its backoff; returns the budget used."""
        h = cfg.healing
        self.repairs.add(self.wall(), decision.repair, decision.reason)
        metrics.repaired(decision.repair, decision.why.kind)
        n = self.used(cfg)
        st.repairs_in_window = n
        delay = backoff_delay(n, cfg.supervisor.backoff_base, cfg.supervisor.backoff_max, self.rng())
        st.next_repair_at = now + delay
        self.log.warning("repair.started", kind=decision.repair, reason=decision.reason, reason_kind=decision.why.kind,
                         budget_used=n, budget=h.repair_budget, next_repair_not_before_s=round(delay, 1))
        return n


class QuickWatch:
    """The cheap check between ticks: what the last tick saw of Ray's nodes and /health, against a fresh look."""

    # While bringing the deployment up, the cheap check wakes the loop the moment Ray forms or the API
    # starts listening, instead of a poll interval later.
    _BRINGUP_QUICK_S = 0.2

    def __init__(self, log: Log):
        self.log = log
        self.fingerprint: Fingerprint = (None, "unknown")

    def saw(self, obs: Observation, seen: Seen) -> None:
        """What a tick saw: the quick checks until the next one compare with it."""
        self.fingerprint = ray_alive(obs.ray), seen.health

    def changed(self, backend: Backend, phase: Phase) -> bool:
        """True when Ray's nodes or /health changed since the last tick."""
        try:
            seen = backend.quick()
        except Exception as e:  # a bug or an odd answer between ticks must not end the daemon
            self.log.warning("watch.failed", error=f"{type(e).__name__}: {e}"[:200])
            return False
        ray_then, health_then = self.fingerprint
        # The tick may not have looked at /health (no serve yet): then only Ray counts.
        if seen[0] != ray_then or (health_then != "unknown" and seen[1] != health_then):
            if phase == Phase.SERVING:
                self.log.info("watch.changed", ray_alive=sorted(seen[0]) if seen[0] else None, health=seen[1])
            return True
        return False

    def interval(self, phase: Phase, cfg: Config) -> float:
        """How often the cheap check runs in this phase (0: not at all)."""
        if phase == Phase.SERVING:
            return cfg.healing.quick_check_interval
        if phase in (Phase.STARTING_RAY, Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING):
            return min(self._BRINGUP_QUICK_S, cfg.healing.quick_check_interval)
        return 0.0
