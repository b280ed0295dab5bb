"""The operator's own relaunch (`spark-supervisor restart [DEPLOYMENT] [--serve-only]`): the runbook's first
request, "relaunch the models". Carried out by the loop between ticks, logged with who asked (the control
socket's SO_PEERCRED), shown as such, and never charged to the repair budget: it is a start, not a repair.
--serve-only stops the serve of every rank (its containers stay) and the planner launches it again; without
it the deployment's containers go too and it starts as on a boot."""

from __future__ import annotations

from ..model import Kind, Phase, Reason, StopServe
from ..world.act import ActionFailed
from .reconciler import Reconciler


def restart(r: Reconciler, *, serve_only: bool, by: str) -> str:
    """Stop what ``r`` runs (its serve, or everything of it) and set it to start again; the answer."""
    name = r.view.dep.name
    what = "serve-only restart" if serve_only else "restart"
    r.log.warning("operator.restart", serve_only=serve_only, by=by)
    try:
        if serve_only:
            r.backend.run(StopServe(f"{what} asked by {by}"))
        else:
            r.backend.teardown()
    except ActionFailed as e:  # answered as refused: what was stopped is started again by the planner
        raise ValueError(f"{name}: {e.reason}") from None
    r.rearm(what)
    r.status.advance(Phase.STARTING_VLLM if serve_only else Phase.DETECTING,
                     Reason(Kind.RESTARTING, f"{what} asked by {by}"), r.clock(), r.wall())
    r.changed()
    return f"{name}: {'serve stopped' if serve_only else 'torn down'}; starting again ({what} asked by {by})"
