"""Whether a deployment's spec can start on every member, short of starting it: the proof a change must pass
before it replaces what serves (change.proof). Its image is there (pulled if the config allows it) and passes
the image check (the backend's commands present, the same versions on every node), rank 0's serve
arguments pass the image's own vLLM argument parser (one more container on the serve node), and its model is
there as the image sees it (a short-lived container per node, in parallel) -- or, with [deployments.model]
prefetch, is fetched there now (the prefetch checks the disk has room first) -- all while the old spec keeps
serving. The prefetch comes last: it may take hours, and a typo in an argument should not wait for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..adapters import AdapterError
from ..judge import modelcheck
from ..judge.preflight import image_problem
from ..model import Action, CheckImage, ImageReport, Kind, PrefetchModel, Reason
from ..specs import commands
from .act import ActionFailed, Actor
from .observe import World

REFUSED = Kind.CHANGE_REFUSED
PREFETCH_POLL_S = 2.0  # how often a prefetch's progress is read while the proof waits for it
PREFETCH_SLACK_S = 120.0  # past the prefetch's own deadline (its container ends itself then): a backstop
_PACE = threading.Event()  # never set: its wait paces the reading of a prefetch's progress


def _run(actor: Actor, action: Action, node: str) -> ImageReport | Reason:
    """One check on one node: its report, or why the change is refused."""
    try:
        got = actor.run(action)
    except ActionFailed as e:
        where = "" if node in e.why.detail else f" on {node}"
        return Reason(REFUSED, f"{e.why.kind}{where}: {e.why.detail}")
    except AdapterError as e:
        return Reason(REFUSED, f"{node} could not be checked: {e}")
    if not isinstance(got, ImageReport):
        return Reason(REFUSED, f"{node} could not be checked: {type(action).__name__} gave no report")
    return got


def _each(nodes: list[str], check: Callable[[str], ImageReport | Reason]
          ) -> dict[str, ImageReport] | Reason:
    """``check`` on every node at once: the reports by node, or the first node's refusal (in ``nodes``' order)."""
    with ThreadPoolExecutor(max_workers=max(1, len(nodes)), thread_name_prefix="prove") as pool:
        got = dict(zip(nodes, pool.map(check, nodes), strict=True))
    refused = next((r for r in got.values() if isinstance(r, Reason)), None)
    return refused or {n: r for n, r in got.items() if isinstance(r, ImageReport)}


def prove(world: World, actor: Actor) -> Reason | None:
    """None when the spec of ``world``'s deployment can start as far as anything short of starting it can
    tell; else why not, as a ChangeRefused reason naming the node and what is wrong there."""
    view = world.view
    reports = _each([n.name for n in view.members], lambda node: _run(actor, CheckImage(node), node))
    if isinstance(reports, Reason):
        return reports
    problem = image_problem(view.cfg, view.dep, reports)
    if problem:
        return Reason(REFUSED, f"{problem[0]}: {problem[1]}")
    return _arguments(world, actor, reports.get(view.serve_nodes[0].name)) or fill(world, actor, reports)


def fill(world: World, actor: Actor, reports: dict[str, ImageReport],
         wait: Callable[[float], object] = _PACE.wait) -> Reason | None:
    """With [deployments.model] prefetch (image_problem leaves the model to it then), the members that lack
    the model are filled now, in parallel, while the old spec serves; the switch starts only on a model that
    is there on every member. A prefetch that fails, or finds too little room, refuses the change with the
    node and its outcome; ``wait`` paces the reading of its progress."""
    view = world.view
    dep = view.dep
    if not (dep.model.check and dep.model.prefetch):
        return None
    todo = [n for n, r in reports.items() if r.model is not None and r.model.missing]
    if not todo:
        return None
    if actor.dry:  # said, not done
        for n in todo:
            m = reports[n].model
            size = f"{m.bytes_total / 2**30:.1f} GiB" if m is not None and m.bytes_total else "size unknown"
            actor.would.append(f"fetch {dep.serve.model} on {n} ({size})")
        return None

    def prefetched(node: str) -> ImageReport | Reason:
        started = _run(actor, PrefetchModel(node), node)
        deadline = time.monotonic() + dep.model.prefetch_timeout + PREFETCH_SLACK_S
        got = started
        while isinstance(got, ImageReport) and got.model is not None and got.model.prefetch == "running":
            if time.monotonic() > deadline:
                return Reason(REFUSED, f"{Kind.MODEL_MISSING} on {node}: its prefetch did not end in "
                              f"{dep.model.prefetch_timeout:g} s")
            wait(PREFETCH_POLL_S)
            got = _run(actor, CheckImage(node), node)  # its progress; once it ended, the node checked again
            if isinstance(got, ImageReport) and got.model is not None:
                actor.log.info("change.prefetching", node=node, summary=got.model.summary())
        return got

    filled = _each(todo, prefetched)
    if isinstance(filled, Reason):
        return filled
    models = {n: r.model for n, r in {**reports, **filled}.items() if r.model is not None}
    problem = modelcheck.problem(view.cfg, dep, models)
    return Reason(REFUSED, f"{problem[0]}: {problem[1]}") if problem else None


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
