"""Data only: phases, what was observed, what to do, and the status the daemon reports."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar


class Phase(StrEnum):
    DETECTING = "DETECTING"
    WAITING = "WAITING"  # for the deployments it starts after (deployments.after)
    CLEANING = "CLEANING"
    STARTING_RAY = "STARTING_RAY"
    STARTING_VLLM = "STARTING_VLLM"
    LOADING = "LOADING"
    VERIFYING = "VERIFYING"
    SERVING = "SERVING"
    DEGRADED = "DEGRADED"
    BACKOFF = "BACKOFF"
    FAILED = "FAILED"
    STOPPING = "STOPPING"
    PAUSED = "PAUSED"  # maintenance: observing and reporting, acting on nothing (`spark-supervisor pause`)


@dataclass(frozen=True)
class Pause:
    """Maintenance mode: observe and report, act on nothing and spend no repair budget, until resumed or
    until ``until`` (wall clock; None: until resumed).

    Every pause is checked where it is made (the CLI, a control request, the file on disk): a time that is
    not a finite number, a deadline that is not after ``at`` or further than ``MAX_S`` away, or a text
    that is not a short string is a ValueError, never a pause that breaks whatever shows it."""

    by: str
    reason: str
    at: float
    until: float | None = None

    MAX_S: ClassVar[float] = 30 * 86400.0  # longer is a typo, or a deployment left unsupervised for good
    TEXT_MAX: ClassVar[int] = 300
    _LATEST: ClassVar[float] = 1e11  # year 5138: what time.gmtime and every display can still show

    def __post_init__(self) -> None:
        for name in ("by", "reason"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > self.TEXT_MAX:
                raise ValueError(f"pause {name}: a text of at most {self.TEXT_MAX} characters, not {self._short(value)}")
        if not self._finite(self.at) or not 0 <= self.at <= self._LATEST:
            raise ValueError(f"pause at: a time (seconds since the epoch), not {self._short(self.at)}")
        if self.until is not None:
            if not self._finite(self.until):
                raise ValueError(f"pause until: a time (seconds since the epoch), not {self._short(self.until)}")
            if self.until <= self.at:
                raise ValueError("pause until: already past: give a time in the future")
            if self.until - self.at > self.MAX_S:
                raise ValueError(f"pause until: at most {self.MAX_S / 86400:g} days ahead "
                                 f"(resume, then pause again, to stay paused longer)")

    @staticmethod
    def _finite(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    @staticmethod
    def _short(x: object) -> str:
        return repr(x)[:40]

    def text(self) -> str:
        def hm(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))
        return (f"by {self.by} at {hm(self.at)} " + (f"until {hm(self.until)}" if self.until else "until resumed")
                + (f": {self.reason}" if self.reason else ""))

    def expired(self, wall: float) -> bool:
        return self.until is not None and wall >= self.until

    def to_json(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "at": self.at, "until": self.until}

    @classmethod
    def from_json(cls, d: Any) -> Pause | None:
        """From the state file; None for anything malformed (a pause is only kept if it is readable)."""
        try:
            return cls(by=d["by"], reason=d.get("reason", ""), at=d["at"], until=d.get("until"))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


# ---------------------------------------------------------------------------------------- observations
@dataclass(frozen=True)
class Container:
    id: str
    name: str
    image: str
    state: str  # docker's State.Status: created, running, exited, ...
    labels: dict[str, str] = field(default_factory=dict)
    # An exited container of the deployment's: why, as its engine tells (None / "": not read)
    exit_code: int | None = None
    log_tail: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def lost(self) -> bool:
        """Positive evidence that it no longer runs: its engine says it exited, died or never started.
        paused, restarting and removing are in between: not evidence of anything yet."""
        return self.state in ("exited", "dead", "created")


@dataclass(frozen=True)
class Listener:
    """A TCP socket listening on a node (ss -ltnp, or /proc/net/tcp without the process)."""

    address: str  # "0.0.0.0", "::" or "*": every address
    port: int
    process: str = ""  # "": the node could not tell
    pid: int | None = None

    @property
    def everywhere(self) -> bool:
        return self.address in ("0.0.0.0", "::", "*", "")


@dataclass(frozen=True)
class Unit:
    name: str
    active: str  # ActiveState: active, inactive, failed, activating, ...
    enabled: str  # UnitFileState: enabled, disabled, masked, ...
    loaded: str = "loaded"  # LoadState: loaded, not-found, masked


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int


@dataclass(frozen=True)
class Gpu:
    name: str = ""
    driver: str = ""
    total_mib: int | None = None  # None: N/A (GB10 unified memory)
    used_mib: int | None = None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Memory:
    total_mib: int
    available_mib: int
    free_mib: int | None = None  # MemFree: what vLLM's start-up check reads on unified memory (GB10)
    cached_mib: int | None = None  # page cache: counted as used by that check, yet reclaimable


@dataclass(frozen=True)
class NodeObservation:
    name: str
    error: str = ""  # reason the node could not be observed (unreachable SSH, Docker engine down)
    containers: tuple[Container, ...] = ()
    docker_version: str = ""
    units: tuple[Unit, ...] | None = None  # None: not looked at this tick
    gpu: Gpu | None = None
    memory: Memory | None = None
    interfaces: dict[str, tuple[str, ...]] | None = None  # name -> addresses with prefix (ip -o addr)
    probe_errors: tuple[str, ...] = ()  # non-fatal: a probe (units, nvidia-smi) could not run
    # Host PIDs in the running containers of the configured deployments (any of them): GPU processes that are
    # ours, not foreign. Read only when the GPU lists a process that is not allowed; None: not read.
    owned_pids: frozenset[int] | None = None
    # TCP listeners on the node (a full observation); None: could not be read (unknown: neither free nor busy)
    listening: tuple[Listener, ...] | None = ()


@dataclass(frozen=True)
class RayNode:
    """One row of Ray's node table. A field Ray left out or garbled is unknown, never a verdict."""

    node_id: str
    ip: str  # "": not reported or not an address (the row may be any node)
    alive: bool | None  # True ALIVE, False DEAD, None: no state or one that is neither
    gpus: float | None  # None: no usable GPU figure (unknown, not zero)
    is_head: bool = False


@dataclass(frozen=True)
class RayObservation:
    reachable: bool
    error: str = ""
    version: str = ""
    nodes: tuple[RayNode, ...] = ()
    via: str = "dashboard"  # "dashboard" (its REST API) or "gcs" (asked in the head container: no dashboard)
    incomplete: str = ""  # why the table may lack rows (truncated, rows that were not readable): "" for whole

    @property
    def alive(self) -> tuple[RayNode, ...]:
        return tuple(n for n in self.nodes if n.alive is True)

    @property
    def gpus(self) -> float:
        return sum(n.gpus or 0.0 for n in self.alive)


@dataclass(frozen=True)
class ServeObservation:
    """The serve process inside the Ray head container, as its wrapper recorded it.

    ``error`` set: this tick could not look (the exec failed or timed out); the other fields are then the
    last state that was seen, carried forward, and must not be read as evidence of anything."""

    present: bool
    pid: int = 0
    container_id: str = ""
    running: bool = False
    exit_code: int | None = None
    spec_hash: str = ""
    started_at: str = ""
    log_tail: str = ""
    error: str = ""

    @property
    def identity(self) -> str:
        """One serve instance: pids repeat across containers, so include the container and start."""
        return f"{self.container_id}:{self.pid}:{self.started_at}"


@dataclass(frozen=True)
class EndpointObservation:
    state: str  # "refused" | "up" | "error" | "unknown"
    detail: str = ""
    health: int | None = None
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelReport:
    """The model on one node as the deployment's image sees it (modelcheck): made with every image check,
    so once per start. ``missing`` empty: complete. ``unchecked``: it could not be looked at (not evidence)."""

    node: str
    model: str
    key: str  # modelcheck.key: a new image, mounts, env or model means a new check
    path: str = ""  # the directory it resolved to (a snapshot in the hub cache, or the local path)
    source: str = ""  # "local" or "hub"
    cache: str = ""  # the hub cache it looked in
    missing: tuple[str, ...] = ()  # files missing or implausible, each "name (why)"
    files: int = 0  # weight files found
    bytes: int = 0
    unchecked: str = ""
    prefetch: str = ""  # "running" while a prefetch fills the node
    prefetched: bool = False  # a prefetch ran for this start (it is not started twice)
    detail: str = ""  # the prefetch's outcome
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0

    @property
    def found(self) -> bool:
        """It resolved to a directory (a snapshot, or the local path) whose files were looked at."""
        return bool(self.path) and (self.source == "local" or "/snapshots/" in self.path)

    def summary(self) -> str:
        if self.prefetch == "running":
            total = f" of {_size(self.bytes_total)}" if self.bytes_total else ""
            files = f"{self.files_done}/{self.files_total} files, " if self.files_total else ""
            return f"prefetching into {self.path or '?'}: {files}{_size(self.bytes_done)}{total}"
        if self.unchecked:
            return f"not checked: {self.unchecked}"
        if self.missing:
            more = f" and {len(self.missing) - 3} more" if len(self.missing) > 3 else ""
            return f"MISSING{f' in {self.path}' if self.found else ''}: {', '.join(self.missing[:3])}{more}"
        return f"{self.path}: {self.files} weight file{'' if self.files == 1 else 's'}, {_size(self.bytes)}"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class ImageReport:
    """What a node's copy of the deployment's image holds (commands.IMAGE_PROBE). Versions: "" when the
    command is there but its version could not be read; paths "" when the command is not there."""

    node: str
    image: str
    key: str  # the ray_hash it was checked for: a new image, mounts or env means a new check
    start: int = 0  # Status.starts when it was made: every start checks again (cheap: kept by image ID)
    ray_path: str = ""
    ray_version: str = ""
    ray_python: str = ""
    dashboard: bool = False
    dashboard_detail: str = ""
    vllm_path: str = ""
    vllm_version: str = ""
    vllm_python: str = ""
    model: ModelReport | None = None  # the model as the image sees it on this node (None: not checked)

    def summary(self, uses_ray: bool = True) -> str:
        ray = (f"ray {self.ray_version or '?'} ({'with' if self.dashboard else 'without'} dashboard, "
               f"Python {self.ray_python or '?'})" if self.ray_path else "no ray")
        vllm = f"vllm {self.vllm_version or '?'}" if self.vllm_path else "no vllm"
        if self.vllm_path and self.vllm_python:
            vllm += f" (Python {self.vllm_python})"
        return f"{ray}, {vllm}" if uses_ray else vllm


@dataclass(frozen=True)
class Observation:
    at: float
    full: bool
    nodes: dict[str, NodeObservation]
    ray: RayObservation | None = None
    serve: ServeObservation | None = None
    endpoint: EndpointObservation | None = None
    # mp across nodes: the headless ranks' serves, node -> as ``serve`` (None: no running container there)
    followers: dict[str, ServeObservation | None] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------- actions
@dataclass(frozen=True)
class StopUnits:
    node: str
    units: tuple[str, ...]
    disable: bool = False
    mask: bool = False


@dataclass(frozen=True)
class RemoveContainers:
    node: str
    containers: tuple[str, ...]  # names
    why: str = "stale"


@dataclass(frozen=True)
class StartContainer:
    node: str
    dashboard: bool = True  # the image's Ray has its dashboard (the image check): the head starts one


@dataclass(frozen=True)
class DropPageCache:
    """sync and drop the node's page cache: on unified memory it stands between MemFree and vLLM."""

    node: str
    why: str = ""


@dataclass(frozen=True)
class CheckImage:
    """Run the image check (commands.IMAGE_PROBE) on a node before the deployment's first start there."""

    node: str


@dataclass(frozen=True)
class PrefetchModel:
    """Fill a node that lacks the model ([deployments.model] prefetch), in a detached container of the image."""

    node: str


@dataclass(frozen=True)
class StopServe:
    why: str


@dataclass(frozen=True)
class StartServe:
    pass


@dataclass(frozen=True)
class Verify:
    """A real completion: readiness (VERIFYING) or, with deep=True, the periodic liveness probe."""

    serve: str = ""
    deep: bool = False


Action = (StopUnits | RemoveContainers | CheckImage | StartContainer | DropPageCache | StopServe | StartServe
          | Verify | PrefetchModel)


def describe(action: Action) -> dict[str, Any]:
    return {"action": type(action).__name__, **dataclasses.asdict(action)}


@dataclass(frozen=True)
class Reason:
    """Why: a kind (a CamelCase tag that metrics, alerts, chaos and tests match on; "" for a plain note of
    progress) and its details, rendered to text only at the edge (status, logs, STATUS=)."""

    kind: str = ""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.kind and self.detail else self.kind or self.detail


@dataclass(frozen=True)
class Decision:
    phase: Phase
    why: Reason = Reason()
    actions: tuple[Action, ...] = ()
    failure: bool = False  # the reason is an error: back off before the next attempt
    repair: str = ""  # "serve" or "gang": the actions repair a fault and count against the budget
    fatal: bool = False  # deterministic, or the budget is spent: FAILED until a config change or reset
    look_closer: bool = False  # decide on the next tick, from a full observation (memory, GPU, units)

    @property
    def reason(self) -> str:
        return str(self.why)


# ----------------------------------------------------------------------------------------------- status
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
    preflight: tuple[str, ...] = ()  # problems found at the last full observation
    health: Tracker = field(default_factory=Tracker)
    deep: Tracker = field(default_factory=Tracker)
    repairs_in_window: int = 0  # from the persisted repair log
    next_repair_at: float = 0.0  # jittered exponential spacing between repairs
    unknown_since: dict[str, float] = field(default_factory=dict)  # what could not be seen -> since when
    unknown_counts: dict[str, int] = field(default_factory=dict)  # ticks each could not be seen (lifetime)
    unknown_run_since: float = 0.0  # start of the unbroken run of ticks with something unseen (0: none)
    page_cache_dropped: frozenset[str] = frozenset()  # nodes dropped since the bring-up began (reset at SERVING)
    kv_cache: dict[str, Any] = field(default_factory=dict)  # tokens, best for this spec, warning
    images: dict[str, ImageReport] = field(default_factory=dict)  # node -> its image check (this run)
    starts: int = 0  # times the deployment's containers were started (each start checks its images first)
    waiting_for: str = ""  # the deployments it starts after that do not answer yet (set by the daemon)

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
