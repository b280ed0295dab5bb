"""What a tick derives from its observation, once (``derive``), for the planner, the trackers, the quick
watch and the status document: the serve's log read, what could not be seen, the /health result. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from ..config.view import DeploymentView
from ..judge import logscan
from ..judge.completion import health_result
from ..model import Observation, Phase, ProbeResult
from .unknown import unknowns


@dataclass(frozen=True)
class Seen:
    progress: logscan.LoadProgress  # the serve's log, read (empty when there is no serve)
    unknown: dict[str, str]  # what could not be seen, as it matters in ``phase`` (plan.unknowns)
    phase: Phase  # the phase ``unknown`` was read for: a plan in another phase reads its own
    health: ProbeResult  # the endpoint's /health, judged (completion.health_result)


def derive(obs: Observation, phase: Phase, view: DeploymentView) -> Seen:
    return Seen(logscan.scan(obs.serve.log_tail if obs.serve is not None else ""), unknowns(obs, view, phase),
                phase, health_result(obs.endpoint))


def unknown_in(seen: Seen | None, obs: Observation, view: DeploymentView, phase: Phase) -> dict[str, str]:
    """What could not be seen, for ``phase``: the tick's reading when it was for that phase."""
    return seen.unknown if seen is not None and seen.phase == phase else unknowns(obs, view, phase)
