"""What to do: the actions the planner asks for, and the decision that carries them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .phase import Phase
from .reason import Reason


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
class ContainerSpec:
    """A container to create, as specs builds it and the docker adapter creates it."""

    name: str
    image: str
    command: list[str]
    environment: dict[str, str]
    labels: dict[str, str]
    options: dict[str, Any] = field(default_factory=dict)  # docker-py create() keyword arguments


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
    """Run the image check (commands.IMAGE_PROBE) on a node before the deployment's first start there, and
    the model check with it. ``model_later``: the model check may wait for the Ray join (CheckModel), off the
    start's path; the actor puts it off where the node's last check of the same key found it complete."""

    node: str
    model_later: bool = False


@dataclass(frozen=True)
class CheckModel:
    """The model check alone (modelprobe.PROBE_PY) on a node whose image is checked: the one put off to the
    Ray join by CheckImage(model_later=True)."""

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
    timeout: float = 0.0  # 0: the configured one (readiness.request_timeout, healing.deep_probe_timeout)


@dataclass(frozen=True)
class Measure:
    """The performance verdict's measurement (perf): once after each start, and again on a schedule while idle."""

    serve: str = ""


Action = (StopUnits | RemoveContainers | CheckImage | CheckModel | StartContainer | DropPageCache | StopServe | StartServe
          | Verify | PrefetchModel | Measure)


def describe(action: Action) -> dict[str, Any]:
    return {"action": type(action).__name__, **dataclasses.asdict(action)}


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
