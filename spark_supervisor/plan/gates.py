"""What must hold before a start: the image checked on every member, and the model there (fetched first
when asked). Pure."""

from __future__ import annotations

from ..config.view import DeploymentView
from ..judge import fabric, modelcheck
from ..judge.preflight import image_problem
from ..model import CheckImage, CheckModel, Decision, Kind, Phase, PrefetchModel, Reason, Status
from ..specs import modelprobe
from .facts import Facts


def image_gate(st: Status, view: DeploymentView) -> Decision | None:
    """Before the deployment's containers start: its image checked on every node, for this start (an image
    re-pulled under the same name is a new image; the check of one already seen, by its ID, is kept and
    costs an inspect). What a start would otherwise find out at STARTING_RAY, or 15 minutes into a load.
    None: checked and fit."""
    key, members, dep = view.image_key, view.members, view.dep
    todo = [n.name for n in members if (r := st.images.get(n.name)) is None or r.key != key or r.start != st.starts]
    if todo:  # part of getting ready to start: no phase of its own (CLEANING stays CLEANING)
        phase = st.phase if st.phase in (Phase.DETECTING, Phase.CLEANING) else Phase.DETECTING
        return Decision(phase, Reason(Kind.CHECKING_IMAGE, f"{dep.ray.image} on {', '.join(todo)}"),
                        tuple(CheckImage(n, model_later=True) for n in todo))
    problem = image_problem(view.cfg, dep, st.images)
    if problem is not None:
        return Decision(Phase.FAILED, Reason(*problem), fatal=True)
    return None


def model_gate(f: Facts, phase: Phase, *, started: bool = False) -> Decision | None:
    """Before a start (and before a launch of another model): the model on every member, as the image sees
    it (the image check makes the model check too). Missing: fetched there when asked ([deployments.model]
    prefetch, once per start, its progress watched), else FAILED ModelMissing: the same again on any retry.
    A report not made (the check off, could not run) is no evidence: the start goes on.
    A node whose model was complete at its last check of the same key is checked once the containers have
    started (``started``: while Ray joins, and before the launch), off the start's path (or before it, when
    another node lacks the model: the failure names every node); found incomplete there, the containers go
    and the start checks it again before it starts, as above."""
    dep, st = f.dep, f.st
    if not dep.model.check:
        return None
    key = modelprobe.key(f.cfg, dep)
    images = {n.name: r for n in f.members if (r := st.images.get(n.name)) is not None}
    reports = {n: r.model for n, r in images.items() if r.model is not None}
    stale = [n for n, m in reports.items() if m.key != key]
    if stale:
        return Decision(phase, Reason(Kind.CHECKING_MODEL, f"{dep.serve.model} on {', '.join(stale)}"),
                        tuple(CheckImage(n) for n in stale))
    if started and (unknown := [n.name for n in f.members if n.name not in images]):
        # a start whose checks were forgotten (a reset, a reload, a daemon restarted mid-start): made now
        return Decision(phase, Reason(Kind.CHECKING_MODEL, f"{dep.serve.model} on {', '.join(unknown)}"),
                        tuple(CheckImage(n) for n in unknown))
    later = [n for n, r in images.items() if r.model_later and r.model is None]
    if later and (started or any(m.missing for m in reports.values())):  # a start that fails names every node
        return Decision(phase, Reason(Kind.CHECKING_MODEL, f"{dep.serve.model} on {', '.join(later)}"),
                        tuple(CheckModel(n) for n in later))
    gone = [n for n, m in reports.items() if images[n].model_later and m.missing]
    if gone and started:
        return Decision(Phase.CLEANING, Reason(Kind.MODEL_MISSING, f"{dep.serve.model} on {', '.join(gone)}, complete "
                        "at its last check: checked again before a new start"), f.teardown("model missing"))
    source = dep.model.prefetch_from or "the hub"
    running = [n for n, m in reports.items() if m.prefetch == "running"]
    if running:
        return Decision(phase, Reason(Kind.PREFETCHING_MODEL, f"{dep.serve.model} on {', '.join(running)} from {source}"),
                        tuple(CheckImage(n) for n in running))
    todo = [n for n, m in reports.items() if m.missing and not m.prefetched]
    if dep.model.prefetch and todo:
        return Decision(phase, Reason(Kind.PREFETCHING_MODEL, f"{dep.serve.model} on {', '.join(todo)} from {source}"),
                        tuple(PrefetchModel(n) for n in todo))
    problem = modelcheck.problem(f.cfg, dep, reports)
    return Decision(Phase.FAILED, Reason(*problem), fatal=True) if problem else None


def below_gate(f: Facts, phase: Phase) -> Decision | None:
    """Before a start: what lies below vLLM, as the members' hosts last said (fabric.judged): a GPU nvidia-smi
    lost, a fabric link down, MTUs unequal, NCCL_IB_GID_INDEX no longer holding the fabric IPv4, a rate below
    the floor. The start waits in ``phase`` with the reason (a 15-minute load on a broken fabric would only
    hang or crawl) and goes on once a full observation reads them fixed. A member not read says nothing."""
    why = fabric.judged(f.view, f.st).held
    return Decision(phase, why) if why is not None else None
