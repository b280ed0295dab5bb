"""The status document's shape (built by statusdoc.document, written and read by statefile, shown by
`status`): types only, so the writer, the file layer and every reader share them without importing each
other. The inner objects are JSON objects of the model's dataclasses (dataclasses.asdict) and stay loose."""

# No `from __future__ import annotations`: TypedDict reads NotRequired from evaluated annotations only.
from typing import Any, NotRequired, TypedDict


class HistoryDoc(TypedDict):
    phase: str
    reason: str
    kind: str
    at: str


class DeploymentDoc(TypedDict):
    schema: int
    phase: str
    reason: str
    reason_kind: str
    since: str
    history: list[HistoryDoc]
    failures: int
    backoff_until: str
    verdict: dict[str, Any] | None
    liveness: dict[str, dict[str, Any]]
    repairs: dict[str, Any]
    unknown: dict[str, dict[str, Any]]
    unknown_ticks_total: dict[str, int]
    kv_cache: dict[str, Any] | None
    state_problems: list[str]
    progress: str
    load_fraction: float
    eta_s: int | None
    deployment: dict[str, Any]
    config: dict[str, str]
    daemon: dict[str, Any]
    nodes: dict[str, dict[str, Any]]
    ray: dict[str, Any] | None
    serve: dict[str, Any] | None
    bringup: dict[str, float]
    load: NotRequired[dict[str, Any]]


class StatusDoc(DeploymentDoc):
    summary: str
    deployments: list[DeploymentDoc]
    pause: dict[str, Any] | None
    reload: dict[str, Any] | None
