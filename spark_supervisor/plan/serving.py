"""Rule steps 6-9: the serve, its ranks, readiness and liveness. Pure."""

from __future__ import annotations

from ..config import Config
from ..judge import fabric, logscan
from ..judge.admission import admit, free_memory_failure, gpu_blockers
from ..model import (
    Action,
    Decision,
    EndpointState,
    Kind,
    Measure,
    Phase,
    ProbeResult,
    Reason,
    StartServe,
    Status,
    StopServe,
    Verify,
)
from .facts import Facts, hold
from .gates import below_gate, model_gate


def serve(f: Facts) -> Decision | None:
    """6. The serve, in the head's container (and, mp across nodes, a rank in every member's). A serve
    state that could not be read is the last one seen: nothing is launched or stopped on it; the
    endpoint's own evidence still counts."""
    obs, st, cfg, dep, s = f.obs, f.st, f.cfg, f.dep, f.obs.serve
    if s is not None and s.error and not s.present:
        return Decision(hold(st), Reason(Kind.OBSERVATION_UNKNOWN, f"serve state: {s.error}"))
    if s is None or not s.present:
        strays = [n for n, x in obs.followers.items() if x is not None and x.present and (x.running or x.error)]
        if strays:  # ranks left from an earlier serve would wait for a head that is not theirs
            return Decision(Phase.STARTING_VLLM, Reason(Kind.RANKS_WITHOUT_HEAD, f"stopping the serve on {', '.join(strays)} "
                            "before the launch"), (StopServe("ranks without their head"),))
        if st.preflight:  # a fabric mistake: found now instead of after a 15-minute load
            return Decision(Phase.FAILED, Reason(Kind.PREFLIGHT_FAILED, "; ".join(st.preflight)), fatal=True)
        if not obs.full and not admitted_fresh(st, f.now, cfg):  # admission reads every member's memory first,
            # on the next tick, at once
            return Decision(Phase.STARTING_VLLM, Reason(detail="reading memory before the launch"), look_closer=True)
        held = gpu_blockers(obs, f.view)
        if held:
            if st.phase == Phase.STARTING_VLLM and st.in_phase(f.now) > cfg.stale.memory_free_timeout:
                return Decision(Phase.FAILED, Reason(Kind.GPU_MEMORY_HELD, f"still held after {cfg.stale.memory_free_timeout:.0f}s: "
                                + "; ".join(held)), fatal=True)
            return Decision(Phase.STARTING_VLLM, Reason(Kind.WAITING_FOR_GPU_MEMORY, "; ".join(held)))
        admitted = (admit(obs, st, f.view, Phase.STARTING_VLLM) or model_gate(f, Phase.STARTING_VLLM, started=True)
                    or below_gate(f, Phase.STARTING_VLLM))
        if admitted is not None:
            return admitted
        return Decision(Phase.STARTING_VLLM, Reason(detail=f"launching {dep.serve.name}"), (StartServe(),))
    if s.error:
        return None
    if s.spec_hash != f.view.serve_hash:
        return Decision(Phase.STARTING_VLLM, Reason(Kind.SERVE_SPEC_CHANGED, "relaunching"), (StopServe("spec changed"),))
    if s.running:
        return None
    fail = f.progress.failure
    if fail is not None and fail.reason == Kind.FREE_MEMORY_BELOW_UTILIZATION:
        return free_memory_failure(obs, st, f.view, fail.line)
    if fail is not None and fail.deterministic:  # the same again on retry: stop and say why
        return Decision(Phase.FAILED, Reason(Kind.SERVE_FAILED, f"{fail.reason}: {fail.hint} ({fail.line})"),
                        (StopServe("failed"),), fatal=True)
    why = _failed(fail) if fail else Reason(Kind.SERVE_EXITED, f"exit code {s.exit_code}")
    return _repair(f, why, "exited")


ADMITTED_FRESH_S = 60.0  # the longest a start's admitting reading is trusted for its launch (Ray joins in seconds)


def admitted_fresh(st: Status, now: float, cfg: Config) -> bool:
    """This start's containers started on a full reading of every member's memory, taken at most
    full_observe_interval (and ADMITTED_FRESH_S) ago: the launch goes on from it (what held the GPUs was seen
    gone, and Ray's join takes little) instead of a tick spent reading them all again. A serve-only start, a
    relaunch, and a start re-armed since (a reset, a reload) read them first; a launch that vLLM refuses on
    free memory is judged by its cause (free_memory_failure), as any."""
    window = min(cfg.supervisor.full_observe_interval, ADMITTED_FRESH_S)
    return st.admitted is not None and st.admitted[0] == st.starts and now - st.admitted[1] <= window


# What a new serve in the same container cannot fix: its devices, or a mount whose directory was removed.
_CONTAINER_LOST: dict[str, str] = {Kind.GPU_ACCESS_LOST: "gpu access lost", Kind.CACHE_DIR_GONE: "compile cache removed"}


def _repair(f: Facts, why: Reason, stop: str) -> Decision:
    """A serve repair; but a lost GPU or a removed cache comes back only with new containers: a gang repair."""
    if why.kind in _CONTAINER_LOST:
        return f.repair("gang", why, f.teardown(_CONTAINER_LOST[why.kind]))
    return f.repair("serve", why, (StopServe(stop),))


def _failed(fail: logscan.Failure, on: str = "") -> Reason:
    """A serve's (or a rank's) failure that a retry may fix: a lost GPU is its own reason with its hint."""
    if fail.reason in _CONTAINER_LOST:  # the wrapper's own line names its kind already
        return Reason(fail.reason, f"{on}{fail.line.removeprefix(f'spark-serve: {fail.reason}: ')}: {fail.hint}")
    return Reason(Kind.SERVE_RANK_EXITED if on else Kind.SERVE_FAILED, f"{on}{fail.reason} ({fail.line})")


def ranks(f: Facts) -> Decision | None:
    """7. mp across nodes: every headless rank runs the same spec beside a running head. One that exited or
    vanished ends the whole serve (vLLM cannot go on without a rank): a serve repair of every rank. A rank
    that could not be looked at is unknown (shown by ``unknowns``), never a reason to stop anything."""
    sh = f.view.serve_hash
    members = [n.name for n in f.view.serve_nodes]
    for node, x in f.obs.followers.items():
        rank = members.index(node) if node in members else -1
        if x is None or x.error:
            continue
        if not x.present:
            return f.repair("serve", Reason(Kind.SERVE_RANK_MISSING, f"no serve on {node} (rank {rank})"),
                            (StopServe("rank missing"),))
        if x.spec_hash != sh:
            return Decision(Phase.STARTING_VLLM, Reason(Kind.SERVE_SPEC_CHANGED, f"rank {rank} on {node}: relaunching"),
                            (StopServe("spec changed"),))
        if not x.running:
            fail = logscan.scan(x.log_tail).failure
            if fail is not None and fail.deterministic:
                return Decision(Phase.FAILED, Reason(Kind.SERVE_FAILED, f"{fail.reason} on {node} (rank {rank}): {fail.hint} "
                                f"({fail.line})"), (StopServe("failed"),), fatal=True)
            why = (_failed(fail, f"{node} (rank {rank}): ") if fail
                   else Reason(Kind.SERVE_RANK_EXITED, f"{node} (rank {rank}): exit code {x.exit_code}"))
            return _repair(f, why, "rank exited")
    return None


def _verified(f: Facts) -> bool:
    v, s = f.st.verdict, f.obs.serve
    return v is not None and s is not None and v.passed and v.serve == s.identity


COLD_CEILING = 3  # cold budgets a load that keeps moving may take (serving.readiness)


def readiness(f: Facts) -> Decision | None:
    """8. Loading until the model is listed, then one real completion judged before SERVING. Once judged
    sane, liveness decides: one /health that failed or could not be read is no reason to leave SERVING."""
    obs, st, dep, s = f.obs, f.st, f.dep, f.obs.serve
    assert s is not None
    if _verified(f) and st.phase in (Phase.SERVING, Phase.DEGRADED):
        return None
    ep, name = obs.endpoint, dep.serve.name
    if ep is None or ep.state != EndpointState.UP or name not in ep.models:
        if s.error:  # the log tail is the last one seen: no stall or deadline is judged on it
            return Decision(hold(st), Reason(Kind.OBSERVATION_UNKNOWN, f"serve state: {s.error}"))
        # The load's own limits (reconcile.loadtimes: learned from its key's good loads, or the cold budget) and why.
        lim = st.load_limits
        stall, stall_why = (lim.stall, f" ({lim.stall_why})") if lim else (dep.readiness.stall_timeout, "")
        deadline, deadline_why = (lim.deadline, f"{lim.deadline_why}; ") if lim else (dep.readiness.deadline, "")
        if st.phase == Phase.LOADING and st.load_progress_at and f.now - st.load_progress_at > stall:
            return f.repair("serve", Reason(Kind.LOAD_STALLED, f"no progress for {stall:.0f}s{stall_why} at "
                            f"{f.progress.summary()}"), (StopServe("load stalled"),))
        why = Reason()  # progress is reported apart from the reason, so history keeps only real changes
        loading = st.in_phase(f.now) if st.phase == Phase.LOADING else 0.0
        if loading > deadline:
            # The cold budget cannot know a first load's compile and CUDA-graph steps (20-36 min on GB10): past it
            # a load that has moved since it was first seen is left to the stall limit above, which catches a hang,
            # up to COLD_CEILING budgets (a load that moves for hours is a loop, not a load). A learned deadline is
            # evidence of this key's own loads: a load far slower than those is stopped even while it moves.
            moved = st.load_progress_at > st.since
            if (lim is not None and lim.learned) or not moved:
                return f.repair("serve", Reason(Kind.LOAD_TIMEOUT, f"not ready after {deadline:.0f}s "
                                f"({deadline_why}{f.progress.summary()})"), (StopServe("load timeout"),))
            if loading > COLD_CEILING * deadline:
                return f.repair("serve", Reason(Kind.LOAD_TIMEOUT, f"not ready after {COLD_CEILING * deadline:.0f}s, "
                                f"{COLD_CEILING} x the cold budget, though still moving ({f.progress.summary()})"),
                                (StopServe("load timeout"),))
            why = Reason(detail=f"past the cold budget of {deadline:.0f}s, still moving: left to the stall limit")
        if ep is not None and ep.state == EndpointState.ERROR:
            why = Reason(Kind.ENDPOINT_ERROR, ep.detail)
        elif ep is not None and ep.state == EndpointState.UP:
            why = Reason(detail=f"API up, {name} not listed yet")
        return Decision(Phase.LOADING, why)
    if _verified(f):
        return None
    if st.deep.failures >= f.cfg.healing.deep_failure_threshold:
        return f.repair("serve", Reason(Kind.SERVE_WEDGED, f"{st.deep.failures} sanity completions failed ({st.deep.detail})"),
                        (StopServe("wedged"),))
    v = st.verdict
    busy = f" when a slot frees ({v.why})" if v is not None and v.busy and v.serve == s.identity else ""
    return Decision(Phase.VERIFYING, Reason(detail=f"sanity completion{busy}"), (Verify(s.identity),))


def liveness(f: Facts) -> Decision:
    """9. Serving: liveness with thresholds. Trackers restart with each serve instance (the hold)."""
    h, dep, st, s = f.cfg.healing, f.dep, f.st, f.obs.serve
    assert s is not None
    if st.health.failures >= h.health_failure_threshold:
        return f.repair("serve", Reason(Kind.SERVE_UNHEALTHY, f"/health failed {st.health.failures} times ({st.health.detail})"),
                        (StopServe("unhealthy"),))
    stalled = _heartbeat(f)
    if stalled is not None and stalled.repair:  # the fuller reason: the heartbeat, then the probe
        return stalled
    if st.deep.failures >= h.deep_failure_threshold:
        return f.repair("serve", Reason(Kind.SERVE_WEDGED, f"{st.deep.failures} deep probes failed ({st.deep.detail})"),
                        (StopServe("wedged"),))
    if stalled is not None:
        return stalled
    n = len(f.members)
    serving = f"{dep.serve.name} on {n} node{'' if n == 1 else 's'}"
    if st.deep.last == ProbeResult.BUSY:  # shown, never counted against it
        serving += f"; {st.deep.detail}"
    actions: tuple[Action, ...] = ()
    if f.now - max(st.deep.last_at, st.since) >= h.deep_probe_interval:
        actions += (Verify(s.identity, deep=True),)
    if measure_due(f):
        actions += (Measure(s.identity),)
    judged = fabric.judged(f.view, st)  # the transports only of this serve: another's say nothing of it
    below = judged.held or (judged.fallback if st.transports_of == s.identity else None)
    if below is not None:  # the cause below vLLM, shown before its effect (a slower decode): never a repair
        return Decision(Phase.DEGRADED, below, actions)
    v = st.perf
    if v is not None and v.serve == s.identity and v.regression:  # slow, not broken: shown, never repaired
        return Decision(Phase.DEGRADED, Reason(Kind.THROUGHPUT_REGRESSION, v.regression), actions)
    return Decision(Phase.SERVING, Reason(detail=serving), actions)


def measure_due(f: Facts) -> bool:
    """Whether to take the performance verdict's measurement now: once for each serve that reaches SERVING,
    then every [deployments.performance] interval -- only while the engine is idle by its own /metrics
    (nothing running or waiting), so that it never competes with users. With the heartbeat off
    (healing.heartbeat_stall = 0) or its page unreadable, the one after a start still runs, whatever the load."""
    st, dep, s = f.st, f.dep, f.obs.serve
    p, hb = dep.performance, st.heartbeat
    if not p.check or dep.readiness.probe != "chat" or s is None:
        return False
    idle = hb.work is not None and hb.running == 0 and hb.waiting == 0
    if st.perf is None or st.perf.serve != s.identity:
        return idle or not f.cfg.healing.heartbeat_stall or bool(hb.error)
    return bool(p.interval) and f.now - st.perf.at >= p.interval and idle


STALL_PROBE_S = 3.0


def _corroboration(f: Facts) -> float:
    """The timeout of the deep probe that corroborates a stall. Nothing has moved for the stall time with work
    held, so it need not wait its full timeout: an engine that answers now is not wedged, and one whose counters
    move while the probe waits is busy (completion.beside_heartbeat) -- only a probe unanswered with the counters
    still frozen confirms the wedge."""
    return min(f.cfg.healing.deep_probe_timeout, STALL_PROBE_S)


def _heartbeat(f: Facts) -> Decision | None:
    """The engine's heartbeat stalled (requests run, no token, prefill or KV block moved for
    healing.heartbeat_stall): a liveness failure, corroborated before any repair by a deep probe made at once.
    It failing too is a wedge; it answering is a long prefill or a slow batch, shown and left alone."""
    st, s = f.st, f.obs.serve
    hb = st.heartbeat
    if not hb.stalled_at or s is None:
        return None
    frozen = hb.frozen(f.now)
    # A deep probe that ended once nothing had moved for the stall time was asked of the stalled engine: one
    # made at once, or a scheduled one the wedge caught in flight (it held the tick until its timeout).
    if st.deep.last_at < hb.moved_at + f.cfg.healing.heartbeat_stall:
        return Decision(Phase.SERVING, Reason(Kind.HEARTBEAT_STALLED, f"{frozen}: a deep probe now, to tell a wedge "
                        "from a long prefill"), (Verify(s.identity, deep=True, timeout=_corroboration(f)),))
    if st.deep.last == ProbeResult.FAILURE:
        return f.repair("serve", Reason(Kind.SERVE_WEDGED, f"the engine's heartbeat stopped ({frozen}) and the deep "
                        f"probe failed ({st.deep.detail})"), (StopServe("wedged"),))
    said = "answered" if st.deep.last == ProbeResult.SUCCESS else "could not run"
    again = f.now - st.deep.last_at >= f.cfg.healing.deep_probe_interval  # a long stall is probed on its schedule
    return Decision(Phase.SERVING, Reason(Kind.HEARTBEAT_STALLED, f"{frozen}; the deep probe {said} ({st.deep.detail}): "
                    "not a wedge on this evidence"), (Verify(s.identity, deep=True, timeout=_corroboration(f)),) if again else ())
