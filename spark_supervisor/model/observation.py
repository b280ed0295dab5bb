"""What one tick observed: each node (containers, units, GPU, memory, listeners), Ray, the serve and
its endpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from .host import HostFacts


@dataclass(frozen=True)
class Answer:
    """A serve's HTTP answer to a sanity request, as received: judge.completion reads it."""

    status_code: int
    body: bytes
    latency_s: float


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
    image_id: str = ""  # the image it runs, by ID (sha256:...): what a tag pointed to when it was created

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
    cuda: str = ""  # the CUDA version the driver supports (nvidia-smi's cuda_version; "": not said)


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
    host: HostFacts | None = None  # its fabric and identity facts (a full observation); None: not read
    gpu_lost: str = ""  # nvidia-smi's own words when it lost the GPU (NVML "Unknown Error"): GpuAccessLost


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


class EndpointState(StrEnum):
    """What the serve's API answered. A str: written, logged and compared as its value."""

    UP = "up"  # /health answered (any HTTP status)
    REFUSED = "refused"  # no connection could be made: nothing listens (vLLM listens only once loaded)
    ERROR = "error"  # connected, but no usable answer (a timeout, a reset, a bad /v1/models)
    UNKNOWN = "unknown"  # not asked: the serve's state could not be read


class ProbeResult(StrEnum):
    """A liveness probe's result (/health, the deep probe): the tracker's and the metrics' label."""

    SUCCESS = "success"
    FAILURE = "failure"
    UNKNOWN = "unknown"
    BUSY = "busy"  # it timed out while the engine's own counters moved: no answer yet, no failure (unknown)


@dataclass(frozen=True)
class EndpointObservation:
    state: EndpointState
    detail: str = ""
    health: int | None = None
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineStats:
    """The engine's own heartbeat, read from the serve's /metrics (vLLM's Prometheus page, summed over its
    engines): requests running and waiting, and the counters that move while it works. ``error``: the page
    could not be read (unknown: no figure here is evidence then)."""

    running: float = 0.0  # vllm:num_requests_running
    waiting: float = 0.0  # vllm:num_requests_waiting
    generated: float = 0.0  # vllm:generation_tokens_total
    prompted: float = 0.0  # vllm:prompt_tokens_total (a prefill's tokens, counted when it ends)
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc (grows as a long prefill's chunks take blocks)
    error: str = ""

    @property
    def work(self) -> tuple[float, float, float]:
        """What moves while the engine works: any change is a beat."""
        return self.generated, self.prompted, self.kv_usage


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
    engine: EngineStats | None = None  # rank 0's /metrics while it answers (None: not read)
