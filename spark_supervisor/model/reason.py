"""Why a phase is what it is: the kinds of reason, and a reason (a kind and its details)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Every kind of reason the daemon gives (a CamelCase tag that metrics, alerts, chaos and tests match on),
    each knowing whether it is deterministic: the same again on a retry, so FAILED with it at once rather
    than retried. A str: written, logged, labelled and rendered as its value (``Kind: detail``)."""

    deterministic: bool

    def __new__(cls, value: str, deterministic: bool = False) -> Kind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.deterministic = deterministic
        return member

    # The serve's log (logscan.FAILURES reads each from its lines).
    FREE_MEMORY_BELOW_UTILIZATION = "FreeMemoryBelowUtilization", True
    NO_MEMORY_FOR_KV_CACHE = "NoMemoryForKvCache", True
    OUT_OF_MEMORY = "OutOfMemory", True
    BAD_ARGUMENTS = "BadArguments", True
    MODEL_NOT_FOUND = "ModelNotFound", True
    HUB_UNREACHABLE = "HubUnreachable"
    UNSUPPORTED_CONFIGURATION = "UnsupportedConfiguration", True
    CACHE_DIR_NOT_OURS = "CacheDirNotOurs", True
    CACHE_DIR_GONE = "CacheDirGone"  # removed under the running container: new containers mount it afresh
    COMMAND_NOT_FOUND = "CommandNotFound", True
    MISSING_RAY_BACKEND = "MissingRayBackend", True
    RAY_NOT_SUPPORTED = "RayNotSupported", True  # this vLLM build's platform has no Ray device key
    PLACEMENT_GROUP_TIMEOUT = "PlacementGroupTimeout", True
    NO_NODE_CAN_FULFILL = "NoNodeCanFulfill", True
    NCCL_ERROR = "NcclError"
    ENGINE_READY_TIMEOUT = "EngineReadyTimeout"
    RAY_OOM_KILL = "RayOomKill"
    MASTER_PORT_IN_USE = "MasterPortInUse"
    PORT_IN_USE = "PortInUse", True
    RANKS_NEVER_JOINED = "RanksNeverJoined"
    ENGINE_DIED = "EngineDied"
    ENGINE_START_FAILED = "EngineStartFailed"
    GPU_ACCESS_LOST = "GpuAccessLost"  # NVML "Unknown Error" (a host systemd reload without the CDI refresh)

    # An action that failed (act.ActionFailed).
    IMAGE_MISSING = "ImageMissing", True  # not on the node and pulls are off
    PINNED_IMAGE_GONE = "PinnedImageGone", True  # the image that served, by ID, pruned: never pulled (no name)
    DISK_TOO_FULL = "DiskTooFull", True  # a pull would not fit (ray.pull_min_free_gib)
    PAGE_CACHE_DROP_FAILED = "PageCacheDropFailed", True  # not allowed, or the image cannot do it
    IMAGE_CHECK_FAILED = "ImageCheckFailed"  # deterministic when the image cannot run sh (act.py says so)
    MODEL_CHECK_FAILED = "ModelCheckFailed"
    SYSTEMCTL_FAILED = "SystemctlFailed"
    TEARDOWN_INCOMPLETE = "TeardownIncomplete"

    # Below vLLM: the fabric and the hosts (fabric.py; docs/wire-formats.md §8).
    FABRIC_FALLBACK = "FabricFallback"  # NCCL on sockets where the fabric is RDMA: DEGRADED, never a repair
    FABRIC_LINK_DOWN = "FabricLinkDown"
    FABRIC_MTU_MISMATCH = "FabricMtuMismatch"
    FABRIC_DEGRADED = "FabricDegraded"  # a rate below [deployments.fabric] min_rate_gbps
    GID_INDEX_MOVED = "GidIndexMoved"
    PEER_REBOOTED = "PeerRebooted"  # a member's boot ID changed under the deployment: a gang repair

    # Access to the nodes, qualified before a load (world.access; docs/privileges.md).
    HOST_KEY_UNKNOWN = "HostKeyUnknown", True  # the node's host key is not in the known_hosts read (ssh or ssh://)
    HOST_KEY_CHANGED = "HostKeyChanged", True  # the node's host key is not the one recorded there
    NO_PRIVILEGE = "NoPrivilege", True  # the node's user cannot run a command that needs root (become)

    # What the planner and the loop decide.
    CHANGE_REFUSED = "ChangeRefused"  # a reload's new spec failed its proof: the old one serves on
    ROLLED_BACK = "RolledBack"  # a reload's new spec failed once switched to: the last that served again
    CHECKING_IMAGE = "CheckingImage"
    CHECKING_MODEL = "CheckingModel"
    CONTAINER_IN_TRANSITION = "ContainerInTransition"
    DEPLOYMENT_LOST = "DeploymentLost"
    ENDPOINT_ERROR = "EndpointError"
    GPU_MEMORY_HELD = "GpuMemoryHeld"
    IMAGE_LACKS_RAY = "ImageLacksRay"
    IMAGE_LACKS_VLLM = "ImageLacksVllm"
    IMAGE_VERSION_MISMATCH = "ImageVersionMismatch"
    KV_CACHE_REGRESSION = "KvCacheRegression"
    LOAD_STALLED = "LoadStalled"
    LOAD_TIMEOUT = "LoadTimeout"
    MODEL_MISSING = "ModelMissing"
    MODEL_COPY_DIFFERS = "ModelCopyDiffers", True  # a member's model files are not the head's (judge.modelcheck)
    NODE_LOST = "NodeLost"
    NODE_UNREACHABLE = "NodeUnreachable"
    OBSERVATION_UNKNOWN = "ObservationUnknown"
    PAGE_CACHE_IN_THE_WAY = "PageCacheInTheWay"
    PARTIAL_DEPLOYMENT = "PartialDeployment"
    PAUSED = "Paused"
    PREFETCHING_MODEL = "PrefetchingModel"
    PREFLIGHT_FAILED = "PreflightFailed"
    # Day-one qualification (judge.qualify): each names one PreflightFailed problem.
    NCCL_HCA_UNMATCHED = "NcclHcaUnmatched"
    PER_NODE_ENV_OVERWRITTEN = "PerNodeEnvOverwritten"
    OOM_KILLER_ACTIVE = "OomKillerActive"
    STACK_DOES_NOT_FIT = "StackDoesNotFit"
    RANKS_WITHOUT_HEAD = "RanksWithoutHead"
    # What Ray's answer was not (a RayObservation's error, "Kind: detail"; an unknown, never a reason alone).
    RAY_HEAD_NOT_RUNNING = "RayHeadNotRunning"  # no head container to ask
    RAY_GCS_UNREACHABLE = "RayGcsUnreachable"
    RAY_DASHBOARD_UNREACHABLE = "RayDashboardUnreachable"
    RAY_DASHBOARD_UNREADABLE = "RayDashboardUnreadable"
    RAY_STATE_UNREADABLE = "RayStateUnreadable"
    RAY_JOIN_TIMEOUT = "RayJoinTimeout"
    RAY_NODE_LOST = "RayNodeLost"
    RAY_NODE_NOT_LISTED = "RayNodeNotListed"
    RAY_NODE_WRONG_IP = "RayNodeWrongIp"
    RAY_STRAY_NODE = "RayStrayNode"
    REPAIR_DELAYED = "RepairDelayed"
    HEARTBEAT_STALLED = "HeartbeatStalled"  # requests run, nothing moves: corroborated by a deep probe before a repair
    THROUGHPUT_REGRESSION = "ThroughputRegression"  # DEGRADED, never a repair by itself
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"
    RESTARTING = "Restarting"  # the operator asked (`spark-supervisor restart`): a start, not a repair
    SANITY_FAILED = "SanityFailed"
    SERVE_EXITED = "ServeExited"
    SERVE_FAILED = "ServeFailed"
    SERVE_RANK_EXITED = "ServeRankExited"
    SERVE_RANK_MISSING = "ServeRankMissing"
    SERVE_SPEC_CHANGED = "ServeSpecChanged"
    SERVE_UNHEALTHY = "ServeUnhealthy"
    SERVE_WEDGED = "ServeWedged"
    SPEC_CHANGED = "SpecChanged"
    STALE_FOUND = "StaleFound"
    WAITING_FOR = "WaitingFor"
    WAITING_FOR_GPU_MEMORY = "WaitingForGpuMemory"


def deterministic(kind: str) -> bool:
    """Whether a kind is deterministic; a kind this version does not name (an adapter's error kind, a kind
    read back from another version's status) is not."""
    try:
        return Kind(kind).deterministic
    except ValueError:
        return False


@dataclass(frozen=True)
class Reason:
    """Why: a kind (a ``Kind``; "" for a plain note of progress) and its details, rendered to text only at
    the edge (status, logs, STATUS=). Typed ``str``: a Kind is one, and a status read back may name a kind
    this version does not know."""

    kind: str = ""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.kind and self.detail else self.kind or self.detail
