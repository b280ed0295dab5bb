"""The way back from a change that failed once switched to: the last spec that served, per deployment; and
the images a serving deployment's repairs start, by ID.

A change is proven before the switch (loop.proof), but a proof cannot see everything: a model that loads and
then kills the engine on its first request, a start that misses its deadline. So when a reload replaces a
serving deployment, the spec it ran is kept, and the new one is on probation until it reaches SERVING. If it
fails first -- FAILED, or a failed attempt at its start or verification -- the deployment is put back on
the spec it ran and the image IDs it ran (its compile cache is still warm), `RolledBack: <the new spec's failure>` is shown until the
next reload, alerted and logged; the operator's file is left as it is, and a later reload tries it again.
``[changes] rollback = false`` turns it off (the failed spec then stays, as any other failure).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..alerts import Alerter
from ..backend import Backend
from ..deployment import DeploymentView
from ..identity import node_container_name
from ..model import Kind, Phase, Reason
from .reconciler import Reconciler


def pin_what_serves(r: Reconciler) -> None:
    """Serving: the image ID each member's container runs is what its repairs start from now on (Status.pinned),
    not whatever its tag names by then: a tag re-pulled underneath is picked up by a reload, never by a repair."""
    obs, dep = r.last_obs, r.view.dep
    if obs is None:
        return
    ids = {n.name: c.image_id for n in r.view.members if n.name in obs.nodes
           for c in obs.nodes[n.name].containers if c.name == node_container_name(dep, n) and c.image_id}
    if ids and ids != r.status.pinned:
        r.status.pinned = ids
        r.backend.pin(ids)
        r.log.info("image.pinned", image=dep.ray.image, ids=ids)


class Rollbacks:
    def __init__(self, log: Any) -> None:
        self.log = log
        # deployment -> the view it ran before the switch, the image IDs it ran (Status.pinned), and when its
        # phase then began (SERVING counts as the change made good only once entered after the switch)
        self.probation: dict[str, tuple[DeploymentView, dict[str, str], float]] = {}
        self.notes: list[Reason] = []  # the rollbacks since the last reload applied: shown with the reload

    def switched(self, name: str, before: Reconciler, after: DeploymentView) -> None:
        """A reload is about to replace what ``before`` runs with ``after``: keep the view it runs if it has
        served (the way back) -- serving now, or pinned by serving and in a repair at the switch (a proof can
        outlast the serve it began beside) -- unless the new config turns rollbacks off."""
        self.probation.pop(name, None)
        served = before.status.phase in (Phase.SERVING, Phase.DEGRADED) or bool(before.status.pinned)
        if after.cfg.changes.rollback and served:
            self.probation[name] = (before.view, dict(before.status.pinned), before.status.since_wall)
            self.log.info("change.switched", deployment=name, way_back="the spec that served")

    def due(self, name: str, r: Reconciler) -> tuple[DeploymentView, dict[str, str], Reason] | None:
        """After a tick of ``r``: the view to go back to, the images it ran and why, when the spec on probation
        failed first."""
        held = self.probation.get(name)
        if held is None:
            return None
        back, pinned, switched_in = held
        st = r.status
        if st.phase == Phase.SERVING and st.since_wall != switched_in:
            self.probation.pop(name)  # the change made it: this spec is the way back from now on
            self.log.info("change.proven_by_serving", deployment=name)
            return None
        if st.phase not in (Phase.FAILED, Phase.BACKOFF) and st.failures == 0:
            return None
        self.probation.pop(name)
        why = Reason(Kind.ROLLED_BACK, f"{name}: {st.reason or st.phase.value}"[:600])
        self.notes.append(why)
        self.log.error("change.rolled_back", deployment=name, reason=str(why))
        return back, pinned, why

    def roll_back_if_due(self, name: str, r: Reconciler, backend_factory: Callable[[DeploymentView], Backend],
                         alerter: Alerter) -> None:
        """After a tick of ``r``: back to the spec that served, when the one switched to failed first."""
        back = self.due(name, r)
        if back is None:
            return
        view, pinned, why = back
        backend = backend_factory(view)
        backend.pin(pinned)  # the way back is the very images that served, not what their tags name now
        r.status.pinned = pinned
        r.reconfigure(view, backend, "rollback")
        r.recorder.note("rollback", str(why), r.wall())
        alerter.emit(name, "rolled_back", phase=r.status.phase.value, reason=str(why), reason_kind=why.kind)
