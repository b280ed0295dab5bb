"""Unknown is not absent: what a tick could not see (``unknowns``), and how it shows in a decision taken
without it (``with_unknowns``): the reason says so, and DEGRADED once it lasts past the patience. Pure."""

from __future__ import annotations

from ..config.identity import owned
from ..config.view import DeploymentView
from ..model import Decision, Kind, Observation, Phase, Reason, Status
from .facts import ray_view


def unknowns(obs: Observation, view: DeploymentView, phase: Phase | None = None) -> dict[str, str]:
    """What this tick could not see that matters to the deployment: what -> the error. Never evidence.
    (A dashboard that does not answer yet while Ray is starting is the join in progress, not an unknown.)"""
    dep = view.dep
    members = {n.name for n in view.members}
    out = {f"node {o.name}": o.error for o in obs.nodes.values() if o.error and o.name in members}
    head = obs.nodes.get(view.serve_node.name)
    head_up = head is not None and any(c.running for c in owned(head, dep))
    if (dep.uses_ray and head_up and phase != Phase.STARTING_RAY
            and (obs.ray is None or not obs.ray.reachable)):
        out[f"ray {obs.ray.via if obs.ray else 'dashboard'}"] = (obs.ray.error if obs.ray else "") or "no answer"
    if dep.uses_ray and obs.ray is not None and obs.ray.reachable:
        gaps = ray_view(obs.ray, list(view.members)).gaps
        if gaps:
            out["ray nodes"] = "; ".join(gaps)[:300]
    if obs.serve is not None and obs.serve.error:
        out["serve state"] = obs.serve.error
    for node, f in obs.followers.items():
        if f is not None and f.error:
            out[f"serve state {node}"] = f.error
    return out


def with_unknowns(d: Decision, obs: Observation, st: Status, view: DeploymentView, now: float,
                  seen_unknown: dict[str, str] | None = None) -> Decision:
    """Show what could not be seen in a decision that was taken without it; DEGRADED once something has
    stayed unseen past the patience (counted from the start of an unbroken run of unknowns, whichever
    part could not be seen from one tick to the next). Repairs, failures, cleaning and Ray's own join
    stand on their own evidence and deadlines and are left as they are. ``seen_unknown``: what the tick
    already read for this phase (plan.seen), else read here."""
    patience = view.cfg.healing.unknown_patience
    seen_not = unknowns(obs, view, st.phase) if seen_unknown is None else seen_unknown
    if (not seen_not or d.repair or d.fatal or d.failure or d.why.kind == Kind.NODE_LOST
            or d.phase in (Phase.BACKOFF, Phase.STARTING_RAY)):
        return d
    if d.why.kind == Kind.OBSERVATION_UNKNOWN:
        why = d.why
    elif d.phase == Phase.CLEANING:
        return d
    else:
        why = Reason(Kind.OBSERVATION_UNKNOWN, "; ".join(f"{k}: {v}" for k, v in seen_not.items()))
    since = st.unknown_run_since or now
    if now - since > patience:
        return Decision(Phase.DEGRADED, Reason(why.kind, f"{why.detail} (longer than {patience:.0f}s)"),
                        d.actions)
    return Decision(d.phase, why, d.actions)
