"""Whether a deployment's spec can start on every member, short of starting it: the proof a change must pass
before it replaces what serves (loop.proof). Its image is there (pulled if the config allows it) and passes
the image check (the backend's commands present, the same versions on every node), and its model is there as
the image sees it: a short-lived container per node, in parallel, while the old spec keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from .act import ActionFailed, Actor
from .adapters import AdapterError
from .model import CheckImage, ImageReport, Kind, Reason
from .observe import World
from .preflight import image_problem

REFUSED = Kind.CHANGE_REFUSED


def prove(world: World, actor: Actor) -> Reason | None:
    """None when the spec of ``world``'s deployment can start as far as anything short of starting it can
    tell; else why not, as a ChangeRefused reason naming the node and what is wrong there."""
    view = world.view
    dep, members = view.dep, view.members
    with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="prove") as pool:
        futures = {n.name: pool.submit(actor.run, CheckImage(n.name)) for n in members}
        reports: dict[str, ImageReport] = {}
        for node, f in futures.items():
            try:
                got = f.result()
            except ActionFailed as e:
                where = "" if node in e.why.detail else f" on {node}"
                return Reason(REFUSED, f"{e.why.kind}{where}: {e.why.detail}")
            except AdapterError as e:
                return Reason(REFUSED, f"{node} could not be checked: {e}")
            if isinstance(got, ImageReport):
                reports[node] = got
    problem = image_problem(view.cfg, dep, reports)
    return Reason(REFUSED, f"{problem[0]}: {problem[1]}") if problem else None
