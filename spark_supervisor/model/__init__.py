"""Data only: phases, what was observed, what to do, and the status the daemon reports.

The package, by kind: ``phase`` (Phase, Pause), ``observation`` (what a tick saw), ``reports`` (the
image check's findings), ``reason`` (Reason), ``action`` (the actions and the Decision), ``status``
(Status and its trackers). Everything is importable from ``spark_supervisor.model`` as before."""

from .action import (
    Action,
    CheckImage,
    Decision,
    DropPageCache,
    PrefetchModel,
    RemoveContainers,
    StartContainer,
    StartServe,
    StopServe,
    StopUnits,
    Verify,
    describe,
)
from .observation import (
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
from .reports import ImageReport, ModelReport
from .status import Heartbeat, KvCache, Status, Tracker, Transition, Verdict

__all__ = [
    "Action", "CheckImage", "Container", "Decision", "DropPageCache", "EndpointObservation", "EndpointState",
    "EngineStats", "Gpu", "GpuProcess", "Heartbeat", "ImageReport", "Kind", "KvCache", "Listener", "Memory",
    "ModelReport", "NodeObservation", "Observation", "Pause", "Phase", "PrefetchModel", "ProbeResult", "RayNode",
    "RayObservation", "Reason", "RemoveContainers", "ServeObservation", "StartContainer", "StartServe", "Status",
    "StopServe", "StopUnits", "Tracker", "Transition", "Unit", "Verdict", "Verify", "describe",
]
