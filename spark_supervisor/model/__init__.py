"""Data only: phases, what was observed, what to do, and the status the daemon reports.

The package, by kind: ``phase`` (Phase, Pause), ``observation`` (what a tick saw), ``reports`` (the
image check's findings), ``reason`` (Reason), ``action`` (the actions and the Decision), ``status``
(Status and its trackers). Everything is importable from ``spark_supervisor.model`` as before."""

from .action import (
    Action,
    CheckImage,
    CheckModel,
    ContainerSpec,
    Decision,
    DropPageCache,
    Measure,
    PrefetchModel,
    RemoveContainers,
    StartContainer,
    StartServe,
    StopServe,
    StopUnits,
    Verify,
    describe,
)
from .host import Gid, HostFacts, Link, RdmaPort, Transport
from .observation import (
    Answer,
    Container,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Gpu,
    GpuProcess,
    Listener,
    Memory,
    NodeObservation,
    Observation,
    ProbeResult,
    RayNode,
    RayObservation,
    ServeObservation,
    Unit,
)
from .phase import Pause, Phase
from .reason import Kind, Reason
from .reports import ImageReport, ModelReport, Throughput
from .status import (
    BelowJudgement,
    Heartbeat,
    KvCache,
    LoadLimits,
    PerfVerdict,
    Status,
    Tracker,
    Transition,
    Verdict,
)

# What an action found: a completion's verdict, a node's image check, a throughput measurement (or nothing).
Outcome = Verdict | ImageReport | ModelReport | Throughput | None

__all__ = [
    "Action", "Answer", "BelowJudgement", "CheckImage", "CheckModel", "ContainerSpec", "Gid", "HostFacts", "Link", "RdmaPort", "Transport", "Container", "Decision", "DropPageCache", "EndpointObservation", "EndpointState",
    "EngineStats", "Gpu", "GpuProcess", "Heartbeat", "ImageReport", "Kind", "KvCache", "Listener", "LoadLimits", "Measure", "Memory",
    "ModelReport", "NodeObservation", "Observation", "Outcome", "Pause", "PerfVerdict", "Phase", "PrefetchModel", "ProbeResult", "RayNode",
    "RayObservation", "Reason", "RemoveContainers", "ServeObservation", "StartContainer", "StartServe", "Status",
    "StopServe", "StopUnits", "Throughput", "Tracker", "Transition", "Unit", "Verdict", "Verify", "describe",
]
