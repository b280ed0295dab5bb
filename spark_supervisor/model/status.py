"""The status the daemon reports and keeps beyond an observation: the phase clock, the probe trackers,
the last verdict."""

from __future__ import annotations

from dataclasses import dataclass, field

from .host import HostFacts, Transport
from .observation import EngineStats
from .phase import Phase
from .reason import Reason
from .reports import ImageReport


@dataclass(frozen=True)
class Tracker:
    """Consecutive equal probe results, as kubelet's prober counts them. "unknown" (the probe could not
    run) neither counts as a failure nor breaks a run of failures."""

    failures: int = 0
    successes: int = 0
    last: str = "unknown"  # success | failure | unknown
    last_at: float = 0.0
    detail: str = ""

    def record(self, result: str, now: float, detail: str = "") -> Tracker:
        if result == "success":
            return Tracker(0, self.successes + 1, result, now, detail)
        if result == "failure":
            return Tracker(self.failures + 1, 0, result, now, detail)
        return Tracker(self.failures, self.successes, result, now, detail)


@dataclass(frozen=True)
class Verdict:
    passed: bool
    why: str
    serve: str = ""  # ServeObservation.identity it was judged on
    latency_s: float = 0.0
    finish_reason: str = ""
    field: str = ""  # which field carried the text: content, reasoning, reasoning_content
    ran: bool = True  # False: the request could not be sent (refused, unreachable): "unknown", not "failed"
    timed_out: bool = False  # no answer within the probe's timeout
    busy: bool = False  # it timed out while the engine's counters moved: waited behind others' work (ran False)


@dataclass(frozen=True)
class Heartbeat:
    """The engine's heartbeat while it serves (its /metrics, read each tick): when its work last moved, what
    it holds, and since when requests have run or waited with nothing moving for the stall time (0: they have
    not)."""

    serve: str = ""  # the serve instance it is of
    work: tuple[float, ...] | None = None  # the last reading's counters (None: no reading to compare with)
    moved_at: float = 0.0  # when they last moved, or the engine was last idle, or a reading was missing
    running: float = 0.0
    waiting: float = 0.0
    stalled_at: float = 0.0
    error: str = ""  # why the last reading is missing ("" and work None: not read)

    def beat(self, e: EngineStats | None, serve: str, now: float, stall_s: float) -> Heartbeat:
        """The next reading. Two readings are needed to call it frozen; an idle engine (nothing running or
        waiting) and a missing reading restart the count: unknown is not frozen."""
        if e is None or e.error or stall_s <= 0:
            return Heartbeat(serve, None, now, error=e.error if e is not None else "")
        holds = e.running > 0 or e.waiting > 0  # work held: waiting with nothing running is a stuck scheduler
        moved = self.work is None or serve != self.serve or e.work != self.work or not holds
        moved_at = now if moved else self.moved_at
        stalled = holds and now - moved_at >= stall_s
        return Heartbeat(serve, e.work, moved_at, e.running, e.waiting, (self.stalled_at or now) if stalled else 0.0)

    def frozen(self, now: float) -> str:
        """What a stall looks like, for a reason."""
        n = int(self.running)
        return (f"{n} request{'' if n == 1 else 's'} running, {int(self.waiting)} waiting, and no token generated "
                f"for {now - self.moved_at:.0f}s")


@dataclass(frozen=True)
class PerfVerdict:
    """The performance verdict of the serve that runs (perf.judge): its last measurement against the best
    for its key (image IDs, model, serve spec, nodes) or the operator's baseline."""

    serve: str
    at: float  # when it was measured (the status's clock)
    ttft_s: float = 0.0
    decode_tps: float = 0.0
    aggregate_tps: float = 0.0
    best_tps: float = 0.0  # the best decode speed for the key, this one included
    reference: str = ""  # what it was held to: "best" or "baseline" ("": nothing yet, the first for its key)
    regression: str = ""  # a ThroughputRegression's detail ("": none)
    error: str = ""  # not measured: why


@dataclass(frozen=True)
class KvCache:
    """The KV cache a serve came up with, against the best seen for its spec (reconcile.tracking)."""

    serve: str  # ServeObservation.identity it was read from: each serve is judged once
    tokens: int
    best: int  # for this spec, this one included
    warning: str = ""  # a regression from the best, in words ("": none)


@dataclass(frozen=True)
class LoadLimits:
    """The limits one load runs under (reconcile.loadtimes, set as it enters LOADING): its deadline and its stall
    limit, each learned from the good loads of its key or the configured cold budget, and why."""

    deadline: float  # seconds in LOADING before LoadTimeout
    stall: float  # seconds without load progress before LoadStalled
    deadline_why: str  # "learned: p95 412s x 2.0 of 7 good loads" or "configured cold budget"
    stall_why: str
    cold: str = ""  # "cold start expected: image changed since the last load" ("": none said)
    learned: bool = False  # both limits learned from history (else the configured values)


@dataclass(frozen=True)
class BelowJudgement:
    """What fabric.py judged below vLLM of the status's facts (fabric.judged), kept on the status until those facts
    or the deployment's view change: the planner and the metrics read it every tick, judged once."""

    view: object = field(repr=False, compare=False)  # the DeploymentView judged on, by identity (a reload: another)
    facts: tuple[object, ...]  # what it was judged from: the hosts, the transports and the lost GPUs, as items
    held: Reason | None  # what holds a start: a lost GPU, else the fabric's problems summed up (fabric.summary)
    problems: tuple[Reason, ...]  # the fabric's own, worst first (fabric.problems)
    fallback: Reason | None  # a rank of Status.transports on sockets where the fabric is RDMA (fabric.fallback)


@dataclass(frozen=True)
class Transition:
    phase: Phase
    reason: str
    at: float  # monotonic
    wall: float
    kind: str = ""  # the reason's kind


@dataclass
class Status:
    """What the daemon knows beyond the observation: the phase clock, failures, the last verdict.

    ``advance`` is the only place the phase changes.
    """

    phase: Phase = Phase.DETECTING
    why: Reason = Reason()
    since: float = 0.0
    since_wall: float = 0.0
    history: list[Transition] = field(default_factory=list)
    failures: int = 0  # consecutive, reset on SERVING
    backoff_until: float = 0.0
    verdict: Verdict | None = None
    progress: str = ""
    load_fraction: float = 0.0
    eta_s: float | None = None
    load_progress_at: float = 0.0  # when the load last moved (a shard, a milestone): stalls count from here
    load_limits: LoadLimits | None = None  # the load's deadline and stall limit (None: the configured values)
    preflight: tuple[str, ...] = ()  # problems found at the last full observation
    health: Tracker = field(default_factory=Tracker)
    deep: Tracker = field(default_factory=Tracker)
    heartbeat: Heartbeat = field(default_factory=Heartbeat)
    perf: PerfVerdict | None = None  # the performance verdict of the serve that runs (None: not measured yet)
    repairs_in_window: int = 0  # from the persisted repair log
    next_repair_at: float = 0.0  # jittered exponential spacing between repairs
    unknown_since: dict[str, float] = field(default_factory=dict)  # what could not be seen -> since when
    unknown_counts: dict[str, int] = field(default_factory=dict)  # ticks each could not be seen (lifetime)
    unknown_run_since: float = 0.0  # start of the unbroken run of ticks with something unseen (0: none)
    page_cache_dropped: frozenset[str] = frozenset()  # nodes dropped since the bring-up began (reset at SERVING)
    kv_cache: KvCache | None = None  # the last serve's (None: none read yet)
    images: dict[str, ImageReport] = field(default_factory=dict)  # node -> its image check (this run)
    # node -> the image ID its container ran when the deployment last reached SERVING: repairs start that
    # very image, not whatever its tag names by then (a reload's new spec starts from the tag again)
    pinned: dict[str, str] = field(default_factory=dict)
    starts: int = 0  # times the deployment's containers were started (each start checks its images first)
    # (start, when) of the full observation whose memory reading let that start's containers start: the
    # launch of the same start trusts it while fresh rather than reading every member again
    admitted: tuple[int, float] | None = None
    waiting_for: str = ""  # the deployments it starts after that do not answer yet (set by the daemon)
    # Below vLLM (fabric.py): each member's host facts at the last full observation that read them (a node
    # whose reading failed is left out: unknown), what nvidia-smi said where it lost the GPU, the boot IDs
    # the serve that runs was started on, and the NCCL transport of each rank of the serve that runs.
    hosts: dict[str, HostFacts] = field(default_factory=dict)
    gpu_lost: dict[str, str] = field(default_factory=dict)
    boots: dict[str, str] = field(default_factory=dict)
    boots_of: str = ""  # the serve instance they were recorded for
    transports: tuple[Transport, ...] = ()
    transports_of: str = ""  # the serve instance they are of
    below: BelowJudgement | None = None  # fabric.py's judgement of these (reconcile.tracking.Below keeps it)
    # What differs from the last good record, said on entering FAILED or DEGRADED (reconcile.recording): shown with
    # the reason and sent with the alert ("": nothing to say, or not in either phase)
    changed: str = ""

    @property
    def reason(self) -> str:
        return str(self.why)

    def advance(self, phase: Phase, why: Reason, now: float, wall: float) -> bool:
        """Set the phase; return True when it (or its reason) changed."""
        if phase == self.phase and why == self.why and self.history:
            return False
        if phase != self.phase or not self.history:
            self.since, self.since_wall = now, wall
        self.phase, self.why = phase, why
        self.history.append(Transition(phase, str(why), now, wall, why.kind))
        del self.history[:-50]
        return True

    def in_phase(self, now: float) -> float:
        return now - self.since
