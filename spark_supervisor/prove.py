"""Whether a deployment's spec can start on every member, short of starting it: the proof a change must pass
before it replaces what serves (loop.proof). Its image is there (pulled if the config allows it) and passes
the image check (the backend's commands present, the same versions on every node), its model is there as
the image sees it (a short-lived container per node, in parallel), and rank 0's serve arguments pass the
image's own vLLM argument parser (one more on the serve node) -- all while the old spec keeps serving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from . import commands
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
    if problem:
        return Reason(REFUSED, f"{problem[0]}: {problem[1]}")
    return _arguments(world, actor, reports.get(view.serve_nodes[0].name))


def _arguments(world: World, actor: Actor, image: ImageReport | None) -> Reason | None:
    """Rank 0's serve arguments through the image's own vLLM parser (commands.SERVE_ARGS_PY) on the serve
    node: refused there, refused here. A parser that could not be found or run proves nothing either way
    (an image without that vLLM layout, a stand-in): logged, not a refusal."""
    view = world.view
    dep, node = view.dep, view.serve_nodes[0]
    spec = commands.serve_args_probe(view.cfg, dep, node)
    try:
        code, out = world.nodes[node.name].docker.run_once(spec)
    except AdapterError as e:
        actor.log.warning("change.arguments_unchecked", node=node.name, why=str(e))
        return None
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("serve_args=")), "")
    verdict, _, detail = line.removeprefix("serve_args=").partition(" ")
    if code != 0 or verdict != "ok":
        if verdict == "refused":
            vllm = f"vLLM {image.vllm_version}" if image is not None and image.vllm_version else "vLLM"
            return Reason(REFUSED, f"{Kind.BAD_ARGUMENTS}: {dep.ray.image}'s {vllm} refuses the serve's "
                          f"arguments on {node.name}: {detail}")
        actor.log.warning("change.arguments_unchecked", node=node.name, exit=code,
                          why=(detail or out.strip()[-200:]) or "no answer")
        return None
    actor.log.info("change.arguments_checked", node=node.name, image=dep.ray.image)
    return None
