"""The status document's shape (built by statusdoc.document, written and read by statefile, shown by
`status`): types only, so the writer, the file layer and every reader share them without importing each
other. Every object in it is typed, down to the leaves: a key the writer and a reader name differently is a
type error (mypy checks `doc["key"]`; tests/unit/test_statusdoc.py checks the readers' `doc.get("key")`,
which mypy lets through).

A type named after a model dataclass (VerdictDoc for Verdict, ...) is that dataclass as dataclasses.asdict
writes it: the same keys (tests/unit/test_statusdoc.py holds them equal), its tuples written as JSON
lists (Sequence here: a list once read back, a tuple in the writer's hands). NotRequired marks a key the
writer leaves out at times, never one that only an older daemon did not write: a reader that shows any
document still reads those with .get."""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations only.
from collections.abc import Sequence
from typing import NotRequired, TypeAlias, TypedDict

# Any JSON value: for what no TypedDict here spells out (an alert's extra fields).
JSON: TypeAlias = dict[str, "JSON"] | list["JSON"] | str | int | float | bool | None


class HistoryDoc(TypedDict):
    phase: str
    reason: str
    kind: str
    at: str


class VerdictDoc(TypedDict):  # model.Verdict
    passed: bool
    why: str
    serve: str
    latency_s: float
    finish_reason: str
    field: str
    ran: bool
    timed_out: bool
    busy: bool


class TrackerDoc(TypedDict):  # model.Tracker
    failures: int
    successes: int
    last: str
    last_at: float
    detail: str


class EngineDoc(TypedDict):  # model.Heartbeat, as the status shows it
    read: bool  # False: /metrics not read (not serving, heartbeat off) or unreadable (error)
    running: float
    waiting: float
    still_s: float  # how long nothing has moved while requests ran (0: idle or moving)
    stalled_s: float  # how long it has been stalled (0: not stalled)
    error: str


class PerfDoc(TypedDict):  # model.PerfVerdict, as the status shows it
    measured: str  # when (ISO)
    ttft_s: float
    decode_tps: float
    aggregate_tps: float  # 0: not measured (one stream)
    best_tps: float  # for the serve's key, this measurement included
    reference: str  # what it was held to: "best", "baseline" or "" (the first for its key)
    regression: str  # a ThroughputRegression's detail ("": none)
    error: str  # not measured: why


class LivenessDoc(TypedDict):
    health: TrackerDoc
    deep: TrackerDoc
    engine: NotRequired[EngineDoc]  # older daemons did not write it


class RepairsDoc(TypedDict):
    in_window: int
    budget: int
    window_s: float


class UnknownDoc(TypedDict):
    since_s: float
    ticks: int


class KvCacheDoc(TypedDict):  # model.KvCache but its "serve" (which serve it was read from: the daemon's own)
    tokens: int
    best: int
    warning: str


class LoadLimitsDoc(TypedDict):  # model.LoadLimits: the limits the last load ran (or runs) under
    deadline: float  # seconds LOADING before LoadTimeout
    stall: float  # seconds without load progress before LoadStalled
    deadline_why: str  # "learned: p95 412s x 2.0 of 7 good loads" or "configured cold budget"
    stall_why: str
    cold: str  # "cold start expected: image changed since the last load" ("": nothing to say)
    learned: bool


class BackendDoc(TypedDict):
    name: str  # vLLM's executor backend: "ray" or "mp"
    nodes: int
    evidence: str


class GoalDoc(TypedDict):
    """A deployment's "deployment": what it is to run and where, as configured (nothing observed)."""

    name: str
    model: str
    served_model_name: str
    tensor_parallel_size: int
    endpoint: str
    nodes: list[str]
    required: bool
    after: list[str]
    backend: BackendDoc
    ray_hash: str
    serve_hash: str


class ConfigDoc(TypedDict):
    path: str
    hash: str


class DaemonDoc(TypedDict):
    pid: int
    updated: str


class ModelDoc(TypedDict):  # model.ModelReport, and its summary
    node: str
    model: str
    key: str
    path: str
    source: str
    cache: str
    missing: Sequence[str]
    files: int
    bytes: int
    unchecked: str
    prefetch: str
    prefetched: bool
    detail: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    revision: str
    config_sha256: str
    sizes: Sequence[Sequence[str | int]]  # [file, bytes]: each weight file (what copy-model and ModelCopyDiffers compare)
    blobs: Sequence[Sequence[str]]  # [file, blob name]: the hub cache's blob each links to (an LFS file's sha256)
    disk_gb_s: float | None  # the disk's sequential read rate there, GB/s (null: not measured)
    summary: str


class ImageDoc(TypedDict):  # model.ImageReport, and its summary
    node: str
    image: str
    key: str
    start: int
    ray_path: str
    ray_version: str
    ray_python: str
    dashboard: bool
    dashboard_detail: str
    vllm_path: str
    vllm_version: str
    vllm_python: str
    model: NotRequired[None]  # null when the model was not checked; a check is the node's "model", not here
    model_later: bool  # the model check put off to the Ray join (complete at its last check), not made yet
    torch_version: str
    transformers_version: str
    nccl_version: str
    image_id: str
    repo_digests: Sequence[str]
    summary: str


class GpuProcessDoc(TypedDict):  # model.GpuProcess
    pid: int
    name: str
    used_mib: int


class GpuDoc(TypedDict):  # model.Gpu
    name: str
    driver: str
    total_mib: int | None
    used_mib: int | None
    processes: Sequence[GpuProcessDoc]
    cuda: str


class MemoryDoc(TypedDict):  # model.Memory
    total_mib: int
    available_mib: int
    free_mib: int | None
    cached_mib: int | None


class ContainerDoc(TypedDict):
    name: str
    state: str
    image: str


class LinkDoc(TypedDict):  # model.Link
    name: str
    operstate: str
    mtu: int | None
    speed_mbps: int | None


class RdmaPortDoc(TypedDict):  # model.RdmaPort, its GID table summed up
    device: str
    port: int
    state: str
    rate_gbps: float | None
    firmware: str
    gid_index: int | None  # the index holding the node's fabric IPv4 as a RoCE v2 GID (None: none)


class HostDoc(TypedDict):  # model.HostFacts, for the node's fabric
    boot_id: str
    boot_id_at_serving: str  # "" none recorded
    machine_id: str
    link: LinkDoc | None  # its fabric interface (None: not known)
    rdma: list[RdmaPortDoc]  # the RDMA ports of its fabric


class TransportDoc(TypedDict):  # model.Transport: one NCCL rank's network
    rank: int | None
    node: str  # the member on its address ("" none)
    net: str
    detail: str


class NodeDoc(TypedDict):
    fabric_ip: str
    role: str
    pinned_image: str | None
    image: NotRequired[ImageDoc]  # once its image was checked
    model: NotRequired[ModelDoc]  # once the image check looked at the model
    # The rest once the node was observed:
    error: NotRequired[str]
    docker_version: NotRequired[str]
    probe_errors: NotRequired[list[str]]
    containers: NotRequired[list[ContainerDoc]]
    gpu: NotRequired[GpuDoc | None]
    memory: NotRequired[MemoryDoc | None]
    gpu_lost: NotRequired[str]  # nvidia-smi's words when it lost the GPU ("" not lost)
    host: NotRequired[HostDoc | None]  # a member's, from the last full observation that read it (None: unknown)


class RayNodeDoc(TypedDict):  # model.RayNode
    node_id: str
    ip: str
    alive: bool | None
    gpus: float | None
    is_head: bool


class RayDoc(TypedDict):
    reachable: bool
    error: str
    via: str
    nodes_alive: int
    gpus: float
    nodes: list[RayNodeDoc]


class EndpointDoc(TypedDict):  # model.EndpointObservation
    state: str  # an EndpointState's value
    detail: str
    health: int | None
    models: Sequence[str]


class RankDoc(TypedDict):
    pid: int
    running: bool
    exit_code: int | None
    started_at: str
    error: str


class ServeDoc(TypedDict):
    pid: int
    running: bool
    exit_code: int | None
    started_at: str
    spec_hash: str
    endpoint: EndpointDoc | None
    ranks: NotRequired[dict[str, RankDoc | None]]  # mp across nodes: node -> its headless rank (None: no container)


class StepDoc(TypedDict):  # logscan.Step
    milestone: str
    at: str
    seconds: float | None


class LoadDoc(TypedDict):
    version: str
    milestone: str
    kv_cache_tokens: int
    timeline: list[StepDoc]


class PauseDoc(TypedDict):  # model.Pause
    by: str
    reason: str
    at: float
    until: float | None


class ReloadDoc(TypedDict):
    error: str | None
    at: str
    staged: str | None
    proving: str | None
    refused: list[str]
    rolled_back: list[str]


class DeploymentDoc(TypedDict):
    schema: int
    phase: str
    reason: str
    reason_kind: str
    changed: NotRequired[str]  # FAILED or DEGRADED: what differs from the last good record ("": nothing said)
    since: str
    history: list[HistoryDoc]
    failures: int
    backoff_until: str
    verdict: VerdictDoc | None
    liveness: LivenessDoc
    repairs: RepairsDoc
    unknown: dict[str, UnknownDoc]  # what could not be seen -> for how long
    unknown_ticks_total: dict[str, int]
    kv_cache: KvCacheDoc | None
    performance: NotRequired[PerfDoc | None]  # older daemons did not write it
    load_limits: NotRequired[LoadLimitsDoc | None]  # None: no load seen yet (older daemons did not write it)
    transports: NotRequired[list[TransportDoc]]  # the NCCL network of each rank of the serve that runs
    state_problems: list[str]
    progress: str
    load_fraction: float
    eta_s: int | None
    deployment: GoalDoc
    config: ConfigDoc
    daemon: DaemonDoc
    nodes: dict[str, NodeDoc]  # every node of the config, in its order
    ray: RayDoc | None
    serve: ServeDoc | None
    bringup: dict[str, float]  # phase -> seconds
    load: NotRequired[LoadDoc]  # once the serve has a log


class StatusDoc(DeploymentDoc):
    summary: str
    deployments: list[DeploymentDoc]
    pause: PauseDoc | None
    reload: ReloadDoc | None
