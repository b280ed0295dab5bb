"""The decision table: the rule steps in order (``RULES``), and ``plan``, which runs them and adds what
could not be seen and who joined Ray uninvited to the decision. Pure."""

from __future__ import annotations

import dataclasses

from ..config.view import DeploymentView
from ..model import Decision, Kind, Observation, Phase, Reason, Status
from .cluster import containers, hygiene, nodes_seen, placement, ray, rebooted
from .facts import Facts, Rule, ray_view
from .seen import Seen, unknown_in
from .serving import liveness, ranks, readiness, serve
from .unknown import with_unknowns

# The reconcile, in order: the first step that decides wins (KubeRay's reconcile functions, as one pass).
RULES: tuple[Rule, ...] = (nodes_seen, hygiene, rebooted, containers, placement, ray, serve, ranks, readiness, liveness)


def plan(obs: Observation, st: Status, view: DeploymentView, now: float, seen: Seen | None = None) -> Decision:
    """One tick's decision. FAILED, and a BACKOFF not yet over, hold; else the first rule step that decides,
    with what could not be seen and Ray's strays shown in it. ``seen``: what the tick derived from ``obs``
    (plan.seen.derive), read here otherwise."""
    if st.phase == Phase.FAILED:  # until a config change (SIGHUP) or `spark-supervisor reset`
        return Decision(Phase.FAILED, st.why)
    if st.phase == Phase.BACKOFF and now < st.backoff_until:
        return Decision(Phase.BACKOFF, st.why)
    seen_unknown = unknown_in(seen, obs, view, st.phase) if seen is not None else None
    return _with_strays(with_unknowns(_plan(obs, st, view, now, seen), obs, st, view, now, seen_unknown), obs, view)


def _plan(obs: Observation, st: Status, view: DeploymentView, now: float, seen: Seen | None) -> Decision:
    facts = Facts(obs, st, view, now, seen.progress if seen is not None else None)
    for rule in RULES:
        d = rule(facts)
        if d is not None:
            return d
    raise AssertionError("liveness always decides")


def _with_strays(d: Decision, obs: Observation, view: DeploymentView) -> Decision:
    """A node alive in the head's Ray that is none of the deployment's: a warning in a reason that has
    nothing else to say, never a teardown (it may be another cluster's, and nothing of ours is wrong)."""
    r, dep = obs.ray, view.dep
    if d.why.kind or d.phase == Phase.STARTING_RAY or not dep.uses_ray or r is None or not r.reachable:
        return d
    strays = ray_view(r, list(view.members)).strays
    if not strays:
        return d
    note = f"{', '.join(strays)} joined the head's Ray but {'is' if len(strays) == 1 else 'are'} no node of " \
           f"{dep.name} (ignored)"
    return dataclasses.replace(d, why=Reason(Kind.RAY_STRAY_NODE, f"{note}; {d.why.detail}" if d.why.detail else note))
