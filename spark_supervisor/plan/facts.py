"""What every rule step reads (``Facts``), and the readings of it several steps share: Ray's answer read for
the deployment's members, the phase to hold while something is unseen (the containers it owns: identity).
Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from ..config import Config, Deployment, Node
from ..config.identity import owned
from ..config.view import DeploymentView
from ..judge import logscan
from ..model import (
    Action,
    Decision,
    Observation,
    Phase,
    RayObservation,
    Reason,
    RemoveContainers,
    Status,
)
from . import outcome

# Phases in which a deployment was known to run: losing it there is a fault to repair.
DEPLOYED = {Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING, Phase.SERVING, Phase.DEGRADED}


def hold(st: Status) -> Phase:
    """The phase to stay in while something could not be seen."""
    return Phase.DEGRADED if st.phase in (Phase.BACKOFF, Phase.FAILED, Phase.STOPPING) else st.phase


@dataclass(frozen=True)
class RayView:
    """Ray's answer read for one deployment's members. ``state``: member -> "alive", "dead" (listed DEAD
    and not alive), "unlisted" or "unknown" (the answer cannot tell: a row without an address or a state
    that may be it, a truncated table). Only "dead" and "unlisted" say anything about a loss."""

    state: dict[str, str]
    gpus: dict[str, float | None]  # alive members: the GPUs Ray gives it (None: no figure)
    strays: tuple[str, ...]  # addresses alive in Ray that are no member's: someone else's, never ours to act on
    gaps: tuple[str, ...]  # what the answer left out that matters here (unknowns)


def ray_view(r: RayObservation, members: list[Node]) -> RayView:
    ours = {n.fabric_ip for n in members}
    anyone = [x for x in r.nodes if not x.ip and x.alive is not False]
    gaps = [f"{len(anyone)} node{'s' if len(anyone) > 1 else ''} without an address"] if anyone else []
    if r.incomplete:
        gaps.append(r.incomplete)
    hidden = bool(anyone or r.incomplete)
    state: dict[str, str] = {}
    gpus: dict[str, float | None] = {}
    for n in members:
        rows = [x for x in r.nodes if x.ip == n.fabric_ip]
        alive = [x for x in rows if x.alive is True]
        if alive:
            state[n.name] = "alive"
            figures = [x.gpus for x in alive if x.gpus is not None]
            gpus[n.name] = max(figures) if figures else None
            if not figures:
                gaps.append(f"{n.name}: no GPU figure")
        elif hidden or any(x.alive is None for x in rows):
            state[n.name] = "unknown"
            if not hidden:
                gaps.append(f"{n.name}: no state")
        else:
            state[n.name] = "dead" if rows else "unlisted"
    strays = tuple(sorted({x.ip for x in r.alive if x.ip and x.ip not in ours}))
    return RayView(state, gpus, strays, tuple(gaps))


@dataclass(frozen=True)
class Facts:
    """What every rule step reads: this tick's observation, the status, the deployment's view, the time."""

    obs: Observation
    st: Status
    view: DeploymentView
    now: float
    read: logscan.LoadProgress | None = None  # the serve's log as the tick read it (plan.seen), if it did

    @property
    def cfg(self) -> Config:
        """The settings the deployment runs on."""
        return self.view.cfg

    @property
    def dep(self) -> Deployment:
        return self.view.dep

    @cached_property
    def members(self) -> list[Node]:
        return list(self.view.members)

    @cached_property
    def any_owned(self) -> bool:
        return any(owned(self.obs.nodes[n.name], self.dep) for n in self.members)

    @cached_property
    def kind(self) -> str:
        """What the deployment's containers are, in reasons."""
        return "Ray" if self.dep.uses_ray else "serve"

    @cached_property
    def progress(self) -> logscan.LoadProgress:
        if self.read is not None:
            return self.read
        return logscan.scan(self.obs.serve.log_tail if self.obs.serve is not None else "")

    def repair(self, kind: str, reason: Reason, actions: tuple[Action, ...]) -> Decision:
        return outcome.repair(kind, reason, actions, self.st, self.cfg, self.now)

    def teardown(self, why: str) -> tuple[Action, ...]:
        """Remove every owned container, workers first (a head removed first makes workers spin)."""
        actions: list[Action] = []
        for node in reversed(self.members):
            names = tuple(c.name for c in owned(self.obs.nodes[node.name], self.dep))
            if names:
                actions.append(RemoveContainers(node.name, names, why))
        return tuple(actions)


Rule = Callable[[Facts], "Decision | None"]
