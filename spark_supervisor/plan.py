"""The decision table: (observation, status, config, now) -> phase, reason and actions. Pure.

A pass runs the rule steps in ``RULES`` in order (nodes seen, hygiene, containers, placement, Ray, serve,
ranks, readiness, liveness); each is a function of the tick's ``Facts`` that a test can call alone, and
the first that returns a decision decides.

The phase follows from what is observed, never from memory of what was done: stale things present
-> CLEANING; no healthy Ray cluster -> STARTING_RAY; no serve -> STARTING_VLLM; serve not answering
-> LOADING; answering but not yet judged -> VERIFYING; judged sane -> SERVING. Deadlines count from
the moment the current phase was entered (``Status.since``).

Unknown is not absent. An observation that failed (a node that did not answer, Ray's dashboard timing
out, the serve-state exec failing) is never read as "gone": it holds the current phase, is shown in the
reason as ``ObservationUnknown``, and after ``healing.unknown_patience`` turns the phase DEGRADED. Only
positive evidence removes, restarts or launches anything: a container its engine lists as exited or
absent, a Ray node that Ray's (reachable) dashboard does not list alive, a serve whose recorded pid is
not running, a probe failing past its threshold.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from . import logscan, modelcheck
from .commands import PREFETCH_ROLE, node_container_name, serve_nodes
from .admission import admit, free_memory_failure, gpu_blockers, gpu_unknown, port_holders
from .preflight import image_problem
from .config import HASH_LABEL, LABEL_PREFIX, OWNER_LABEL, ROLE_LABEL, Config, Deployment, Node, ray_hash, serve_hash
from .model import (
    Reason,
    Action,
    CheckImage,
    Container,
    Decision,
    NodeObservation,
    Observation,
    Phase,
    RayObservation,
    PrefetchModel,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    StopUnits,
    Verify,
)

_ACTIVE = {"active", "activating", "reloading", "deactivating"}
# Phases in which a deployment was known to run: losing it there is a fault to repair.
_DEPLOYED = {Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING, Phase.SERVING, Phase.DEGRADED}


def is_stale(c: Container, cfg: Config) -> bool:
    """A container the stale rules name. One carrying any label of ours (a deployment's, a helper's, this
    daemon's or another supervisor's, a concurrent `check --preflight`'s) is never stale, whatever its name
    or image: only the owner rules (``is_orphan``, teardown) may remove it, by its deployment's name."""
    if any(k.startswith(LABEL_PREFIX) for k in c.labels):
        return False
    st = cfg.stale
    if c.name in st.containers or any(fnmatch.fnmatch(c.image, p) for p in st.image_patterns):
        return True
    for want in st.container_labels:
        key, _, value = want.partition("=")
        if key in c.labels and (not value or c.labels[key] == value):
            return True
    return False


def is_orphan(c: Container, cfg: Config, dep: Deployment, member: bool) -> bool:
    """The one owner rule: a container labelled as ours belongs to the deployment its label names. It is an
    orphan only when that deployment is not configured, or is this one on a node it no longer uses; another
    configured deployment's container is never ours to remove, whatever its state."""
    owner = c.labels.get(OWNER_LABEL)
    if owner is None:
        return False
    return owner not in cfg.owners or (owner == dep.name and not member)


def stale_units(o: NodeObservation, cfg: Config) -> tuple[str, ...]:
    """Configured stale units that run, or would come back at boot when disabling is asked for."""
    st, found = cfg.stale, {u.name.removesuffix(".service"): u for u in o.units or ()}
    out = []
    for name in st.units:
        u = found.get(name.removesuffix(".service"))
        if u is None or u.loaded == "not-found":
            continue
        if (u.active in _ACTIVE or (st.mask and u.enabled != "masked")
                or (st.disable and u.enabled in ("enabled", "enabled-runtime"))):
            out.append(name)
    return tuple(out)


def unknowns(obs: Observation, cfg: Config, phase: Phase | None = None) -> dict[str, str]:
    """What this tick could not see that matters to the deployment: what -> the error. Never evidence.
    (A dashboard that does not answer yet while Ray is starting is the join in progress, not an unknown.)"""
    dep = cfg.deployment
    members = {n.name for n in cfg.members(dep)}
    out = {f"node {o.name}": o.error for o in obs.nodes.values() if o.error and o.name in members}
    head = obs.nodes.get(cfg.serve_node(dep).name)
    head_up = head is not None and any(c.running for c in _owned(head, dep))
    if (dep.uses_ray and head_up and phase != Phase.STARTING_RAY
            and (obs.ray is None or not obs.ray.reachable)):
        out[f"ray {obs.ray.via if obs.ray else 'dashboard'}"] = (obs.ray.error if obs.ray else "") or "no answer"
    if dep.uses_ray and obs.ray is not None and obs.ray.reachable:
        gaps = ray_view(obs.ray, cfg.members(dep)).gaps
        if gaps:
            out["ray nodes"] = "; ".join(gaps)[:300]
    if obs.serve is not None and obs.serve.error:
        out["serve state"] = obs.serve.error
    for node, f in obs.followers.items():
        if f is not None and f.error:
            out[f"serve state {node}"] = f.error
    return out


def _images(st: Status, cfg: Config, dep: Deployment) -> Decision | None:
    """Before the deployment's containers start: its image checked on every node, for this start (an image
    re-pulled under the same name is a new image; the check of one already seen, by its ID, is kept and
    costs an inspect). What a start would otherwise find out at STARTING_RAY, or 15 minutes into a load.
    None: checked and fit."""
    key = ray_hash(cfg, dep)
    members = cfg.members(dep)
    todo = [n.name for n in members if (r := st.images.get(n.name)) is None or r.key != key or r.start != st.starts]
    if todo:  # part of getting ready to start: no phase of its own (CLEANING stays CLEANING)
        phase = st.phase if st.phase in (Phase.DETECTING, Phase.CLEANING) else Phase.DETECTING
        return Decision(phase, Reason("CheckingImage", f"{dep.ray.image} on {', '.join(todo)}"),
                        tuple(CheckImage(n) for n in todo))
    problem = image_problem(cfg, dep, st.images)
    if problem is not None:
        return Decision(Phase.FAILED, Reason(*problem), fatal=True)
    return None


def _owned(o: NodeObservation, dep: Deployment) -> list[Container]:
    return [c for c in o.containers if c.labels.get(OWNER_LABEL) == dep.name and c.labels.get(ROLE_LABEL) != PREFETCH_ROLE]


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


def _model(f: Facts, phase: Phase) -> Decision | None:
    """Before a start (and before a launch of another model): the model on every member, as the image sees
    it (the image check makes the model check too). Missing: fetched there when asked ([deployments.model]
    prefetch, once per start, its progress watched), else FAILED ModelMissing: the same again on any retry.
    A report not made (the check off, could not run) is no evidence: the start goes on."""
    dep, st = f.dep, f.st
    if not dep.model.check:
        return None
    key = modelcheck.key(f.cfg, dep)
    reports = {n.name: r.model for n in f.members if (r := st.images.get(n.name)) is not None and r.model is not None}
    stale = [n for n, m in reports.items() if m.key != key]
    if stale:
        return Decision(phase, Reason("CheckingModel", f"{dep.serve.model} on {', '.join(stale)}"),
                        tuple(CheckImage(n) for n in stale))
    source = dep.model.prefetch_from or "the hub"
    running = [n for n, m in reports.items() if m.prefetch == "running"]
    if running:
        return Decision(phase, Reason("PrefetchingModel", f"{dep.serve.model} on {', '.join(running)} from {source}"),
                        tuple(CheckImage(n) for n in running))
    todo = [n for n, m in reports.items() if m.missing and not m.prefetched]
    if dep.model.prefetch and todo:
        return Decision(phase, Reason("PrefetchingModel", f"{dep.serve.model} on {', '.join(todo)} from {source}"),
                        tuple(PrefetchModel(n) for n in todo))
    problem = modelcheck.problem(f.cfg, dep, reports)
    return Decision(Phase.FAILED, Reason(*problem), fatal=True) if problem else None


def _teardown(cfg: Config, obs: Observation, dep: Deployment, why: str) -> tuple[Action, ...]:
    """Remove every owned container, workers first (a head removed first makes workers spin)."""
    actions: list[Action] = []
    for node in reversed(cfg.members(dep)):
        names = tuple(c.name for c in _owned(obs.nodes[node.name], dep))
        if names:
            actions.append(RemoveContainers(node.name, names, why))
    return tuple(actions)


def plan(obs: Observation, st: Status, cfg: Config, now: float) -> Decision:
    if st.phase == Phase.FAILED:  # until a config change (SIGHUP) or `spark-supervisor reset`
        return Decision(Phase.FAILED, st.why)
    if st.phase == Phase.BACKOFF and now < st.backoff_until:
        return Decision(Phase.BACKOFF, st.why)
    return _with_strays(_with_unknowns(_plan(obs, st, cfg, now), obs, st, cfg, now), obs, cfg)


def _with_strays(d: Decision, obs: Observation, cfg: Config) -> Decision:
    """A node alive in the head's Ray that is none of the deployment's: a warning in a reason that has
    nothing else to say, never a teardown (it may be another cluster's, and nothing of ours is wrong)."""
    r, dep = obs.ray, cfg.deployment
    if d.why.kind or d.phase == Phase.STARTING_RAY or not dep.uses_ray or r is None or not r.reachable:
        return d
    strays = ray_view(r, cfg.members(dep)).strays
    if not strays:
        return d
    note = f"{', '.join(strays)} joined the head's Ray but {'is' if len(strays) == 1 else 'are'} no node of " \
           f"{dep.name} (ignored)"
    return dataclasses.replace(d, why=Reason("RayStrayNode", f"{note}; {d.why.detail}" if d.why.detail else note))


def _hold(st: Status) -> Phase:
    """The phase to stay in while something could not be seen."""
    return Phase.DEGRADED if st.phase in (Phase.BACKOFF, Phase.FAILED, Phase.STOPPING) else st.phase


def _with_unknowns(d: Decision, obs: Observation, st: Status, cfg: Config, now: float) -> Decision:
    """Show what could not be seen in a decision that was taken without it; DEGRADED once something has
    stayed unseen past the patience (counted from the start of an unbroken run of unknowns, whichever
    part could not be seen from one tick to the next). Repairs, failures, cleaning and Ray's own join
    stand on their own evidence and deadlines and are left as they are."""
    seen_not = unknowns(obs, cfg, st.phase)
    if (not seen_not or d.repair or d.fatal or d.failure or d.why.kind == "NodeLost"
            or d.phase in (Phase.BACKOFF, Phase.STARTING_RAY)):
        return d
    if d.why.kind == "ObservationUnknown":
        why = d.why
    elif d.phase == Phase.CLEANING:
        return d
    else:
        why = Reason("ObservationUnknown", "; ".join(f"{k}: {v}" for k, v in seen_not.items()))
    since = st.unknown_run_since or now
    if now - since > cfg.healing.unknown_patience:
        return Decision(Phase.DEGRADED, Reason(why.kind, f"{why.detail} (longer than {cfg.healing.unknown_patience:.0f}s)"),
                        d.actions)
    return Decision(d.phase, why, d.actions)


@dataclass(frozen=True)
class Facts:
    """What every rule step reads: this tick's observation, the status, the config, the time."""

    obs: Observation
    st: Status
    cfg: Config
    now: float

    @cached_property
    def dep(self) -> Deployment:
        return self.cfg.deployment

    @cached_property
    def members(self) -> list[Node]:
        return self.cfg.members(self.dep)

    @cached_property
    def any_owned(self) -> bool:
        return any(_owned(self.obs.nodes[n.name], self.dep) for n in self.members)

    @cached_property
    def kind(self) -> str:
        """What the deployment's containers are, in reasons."""
        return "Ray" if self.dep.uses_ray else "serve"

    @cached_property
    def progress(self) -> logscan.LoadProgress:
        return logscan.scan(self.obs.serve.log_tail if self.obs.serve is not None else "")

    def repair(self, kind: str, reason: Reason, actions: tuple[Action, ...]) -> Decision:
        return _repair(kind, reason, actions, self.st, self.cfg, self.now)

    def teardown(self, why: str) -> tuple[Action, ...]:
        return _teardown(self.cfg, self.obs, self.dep, why)


Rule = Callable[[Facts], "Decision | None"]


def nodes_seen(f: Facts) -> Decision | None:
    """1. Nodes that did not answer are unknown, not empty. Nothing is decided about a gang one of whose
    members cannot be seen, and nothing is ever torn down for it: if the node is really gone, a repair
    could not complete anyway, and if it is only unreachable the model is still serving."""
    obs, st = f.obs, f.st
    names = {n.name for n in f.members}
    down = [o for o in obs.nodes.values() if o.error and o.name in names]
    if not down:
        return None
    why = "; ".join(f"{o.name}: {o.error}" for o in down)
    deployed = any(_owned(o, f.dep) for o in obs.nodes.values()) or st.phase in _DEPLOYED
    if not deployed:
        return Decision(Phase.BACKOFF, Reason("NodeUnreachable", why), failure=True)
    view = ray_view(obs.ray, f.members) if obs.ray is not None and obs.ray.reachable else None
    gone = [o.name for o in down if view is not None and view.state[o.name] in ("dead", "unlisted")]
    if gone:  # Ray, which can still be asked, confirms the loss: wait for the node to come back
        return Decision(Phase.DEGRADED, Reason("NodeLost", f"{', '.join(gone)} unreachable and not alive in Ray "
                        f"({why}); waiting for it to return"))
    return Decision(_hold(st), Reason("ObservationUnknown", f"{why}"))


def hygiene(f: Facts) -> Decision | None:
    """2. Stale units and containers on any node that answered, and orphans: containers labelled for a
    deployment no longer configured, or for this one on a node it no longer has (``is_orphan``)."""
    cfg, dep = f.cfg, f.dep
    actions: list[Action] = []
    found: list[str] = []
    for node in cfg.nodes:
        o = f.obs.nodes[node.name]
        if o.error:
            continue
        units = stale_units(o, cfg)
        if units:
            actions.append(StopUnits(node.name, units, cfg.stale.disable, cfg.stale.mask))
            found.append(f"{node.name}: units {', '.join(units)}")
        names = tuple(c.name for c in o.containers if is_stale(c, cfg))
        if names:
            actions.append(RemoveContainers(node.name, names, "stale"))
            found.append(f"{node.name}: containers {', '.join(names)}")
        orphans = tuple(c.name for c in o.containers if is_orphan(c, cfg, dep, node in f.members))
        if orphans:
            actions.append(RemoveContainers(node.name, orphans, "orphan"))
            found.append(f"{node.name}: orphans {', '.join(orphans)}")
    return Decision(Phase.CLEANING, Reason("StaleFound", "; ".join(found)), tuple(actions)) if actions else None


def containers(f: Facts) -> Decision | None:
    """3. The deployment's containers (Ray nodes, or the homes of the mp serve): all present, running and
    of the current spec, or none at all."""
    dep, st = f.dep, f.st
    rh = ray_hash(f.cfg, dep)
    problems: list[str] = []
    between: list[str] = []
    for node in f.members:
        cs = _owned(f.obs.nodes[node.name], dep)
        ok = [c for c in cs if c.name == node_container_name(dep, node) and c.running
              and c.labels.get(HASH_LABEL) == rh]
        if ok and len(cs) == 1:
            continue
        if not cs:
            problems.append(f"{node.name}: no {f.kind} container")
        elif any(c.labels.get(HASH_LABEL) != rh for c in cs):
            problems.append(f"{node.name}: spec changed")
        elif any(c.lost for c in cs) or len(cs) > 1:
            problems.append(f"{node.name}: {f.kind} container {cs[0].state}{_why_ended(cs[0])}")
            bind = next((b for c in cs if c.lost and (b := logscan.port_in_use(c.log_tail)) is not None), None)
            if bind is not None and not f.obs.full:  # who holds it is in a full observation: the next tick's
                return Decision(_hold(st), Reason("PortInUse", f"{node.name}: {f.kind} container exited: "
                                f"port {bind.port or '?'} in use (looking who holds it)"), look_closer=True)
            if bind is not None:  # the same again on every restart: say who holds it, restart nothing
                return Decision(Phase.FAILED, Reason("PortInUse", f"{node.name}: {f.kind} container exited: "
                                f"{_holder(f.obs.nodes[node.name], node, bind.port)}: {logscan.PORT_HINT} ({bind.line})"),
                                f.teardown("port in use"), fatal=True)
        else:  # paused, restarting, removing: neither running nor gone
            between.append(f"{node.name}: {f.kind} container {cs[0].state}")
    if f.any_owned and problems:
        if all("spec changed" in p for p in problems):
            return Decision(Phase.CLEANING, Reason("SpecChanged", "replacing the deployment"), f.teardown("replace"))
        return f.repair("gang", Reason("PartialDeployment", "; ".join(problems)), f.teardown("gang restart"))
    if between:
        return Decision(_hold(st), Reason("ContainerInTransition", "; ".join(between)))
    if not f.any_owned and st.phase in _DEPLOYED:  # all we ran vanished (a power cut, `docker rm -f` everywhere)
        return f.repair("gang", Reason("DeploymentLost", f"no {f.kind} container on any node"), ())
    return None


def _why_ended(c: Container) -> str:
    last = logscan.lines(c.log_tail)[-1:] if c.log_tail else []
    parts = ([f"exit code {c.exit_code}"] if c.exit_code is not None else []) + [ln.strip()[-200:] for ln in last]
    return f" ({': '.join(parts)})" if parts else ""


def _holder(o: NodeObservation, node: Node, port: int | None) -> str:
    if port is None:
        return "a port it needs is in use"
    who = sorted({ln.process + (f" (pid {ln.pid})" if ln.pid is not None else "") for ln in o.listening or ()
                  if ln.port == port and ln.process and (ln.everywhere or ln.address == node.fabric_ip)})
    return f"{port} held by {', '.join(who)}" if who else f"{port} in use"


def placement(f: Facts) -> Decision | None:
    """4. Nothing of the deployment runs: start its containers once the images are checked and the GPU
    memory of every member is seen free (never on a guess)."""
    if f.any_owned:
        return None
    obs, st, cfg, dep = f.obs, f.st, f.cfg, f.dep
    if not obs.full:
        return Decision(Phase.DETECTING, Reason())
    if st.waiting_for:  # deployments.after: theirs first (the daemon says which do not answer yet)
        return Decision(Phase.WAITING, Reason("WaitingFor", st.waiting_for))
    checked = _images(st, cfg, dep) or _model(f, st.phase if st.phase in (Phase.DETECTING, Phase.CLEANING)
                                              else Phase.DETECTING)
    if checked is not None:
        return checked
    head_report = st.images.get(f.members[0].name)
    dashboard = head_report is None or head_report.dashboard
    busy, ports_unseen = port_holders(obs, cfg, dep, dashboard)
    if busy:  # before any container starts and any budget is spent: what would only exit, named
        return Decision(Phase.FAILED, Reason("PortInUse", "; ".join(busy) + f": {logscan.PORT_HINT}"), fatal=True)
    unseen = ports_unseen + gpu_unknown(obs, cfg, dep)
    if unseen:  # nothing starts on a guess; DEGRADED once it lasts
        late = st.phase == Phase.DEGRADED or (st.phase == Phase.CLEANING
                                              and st.in_phase(f.now) > cfg.healing.unknown_patience)
        return Decision(Phase.DEGRADED if late else Phase.CLEANING,
                        Reason("ObservationUnknown", ("GPU memory: " if not ports_unseen else "") + "; ".join(unseen)))
    held = gpu_blockers(obs, cfg, dep)
    if held:
        if st.phase == Phase.CLEANING and st.in_phase(f.now) > cfg.stale.memory_free_timeout:
            return Decision(Phase.FAILED, Reason("GpuMemoryHeld", f"still held after {cfg.stale.memory_free_timeout:.0f}s: "
                            + "; ".join(held) + " (not ours: stop it, then `spark-supervisor reset`)"), fatal=True)
        return Decision(Phase.CLEANING, Reason("WaitingForGpuMemory", "; ".join(held)))
    admitted = admit(obs, st, cfg, Phase.CLEANING)
    if admitted is not None:
        return admitted
    return Decision(Phase.STARTING_RAY, Reason(detail=f"0/{len(f.members)} nodes"),
                    tuple(StartContainer(n.name, dashboard) for n in f.members))


def ray(f: Facts) -> Decision | None:
    """5. Ray: every configured node ALIVE on its fabric IP, with the GPUs it was given. A Ray that does
    not answer says nothing about the nodes: with a serve to watch, go on without Ray's view."""
    obs, st, dep, members = f.obs, f.st, f.dep, f.members
    if not dep.uses_ray:
        return None  # mp: no Ray step
    r, s = obs.ray, obs.serve
    if r is None or not r.reachable:
        if s is not None and s.present:
            return None
        if st.phase == Phase.STARTING_RAY and st.in_phase(f.now) > dep.ray.join_timeout:
            why = (r.error if r else "") or "no answer"
            return f.repair("gang", Reason("RayJoinTimeout", f"Ray not reachable after {dep.ray.join_timeout:.0f}s ({why})"),
                            f.teardown("join timeout"))
        if st.phase == Phase.STARTING_RAY:
            return Decision(Phase.STARTING_RAY, Reason(detail=f"0/{len(members)} nodes (dashboard not answering yet)"))
        return Decision(_hold(st), Reason("ObservationUnknown", f"ray {r.via if r else 'dashboard'}: "
                        f"{(r.error if r else '') or 'no answer'}"))
    view = ray_view(r, members)
    want_gpus = float(sum(n.gpus for n in members))
    up = [n for n in members if view.state[n.name] == "alive"]
    short = [n.name for n in up if (g := view.gpus[n.name]) is not None and g < n.gpus]
    gpus = sum(g for n in up if (g := view.gpus[n.name]) is not None)
    serve_seen = s is not None and s.present and (s.running or bool(s.error))
    if len(up) == len(members) and not short:
        return None  # GPU figures Ray left out are unknowns (``unknowns``), not a shortage
    missing = [n.name for n in members if view.state[n.name] != "alive"]
    status = f"{len(up)}/{len(members)} nodes, {gpus:.1f}/{want_gpus:.1f} GPUs"
    if view.strays:
        status += f"; {', '.join(view.strays)} registered too, not a fabric IP"
    if serve_seen or st.phase in (Phase.SERVING, Phase.VERIFYING, Phase.LOADING):
        # Evidence is Ray marking the node DEAD (and no row that could be it alive or unknown), or an alive
        # node short of GPUs by Ray's own figure; a node merely not listed, or one the answer cannot place,
        # is held, not torn down for.
        dead = [n for n in missing if view.state[n] == "dead"]
        if dead or (short and not missing):
            return f.repair("gang", Reason("RayNodeLost", f"{', '.join(dead or short)} ({status})"),
                            f.teardown("ray node lost"))
        unknown = [n for n in missing if view.state[n] == "unknown"]
        if unknown:
            return Decision(_hold(st), Reason("ObservationUnknown", f"ray nodes: {', '.join(unknown)} not placed in "
                            f"Ray's answer ({'; '.join(view.gaps) or status})"))
        return Decision(_hold(st), Reason("RayNodeNotListed", f"{', '.join(missing or short)} not in Ray's node list "
                        f"({status})"))
    if st.phase == Phase.STARTING_RAY and st.in_phase(f.now) > dep.ray.join_timeout:
        unknown = [n for n in missing if view.state[n] == "unknown"]
        if unknown:  # the join may well be complete: Ray's answer cannot say, and a deadline is no evidence
            return Decision(Phase.DEGRADED, Reason("ObservationUnknown", f"ray nodes: {', '.join(unknown)} not placed "
                            f"in Ray's answer after {dep.ray.join_timeout:.0f}s ({'; '.join(view.gaps)})"))
        unlisted = [n for n in missing if view.state[n] == "unlisted"]
        if view.strays and unlisted:  # ours never came on its fabric IP, and others did: a config problem
            return Decision(Phase.FAILED, Reason("RayNodeWrongIp", f"{', '.join(unlisted)} never registered on its "
                            f"fabric IP while {', '.join(view.strays)} registered ({status}): set fabric_ip/VLLM_HOST_IP "
                            "per node"), f.teardown("wrong ip"), fatal=True)
        return f.repair("gang", Reason("RayJoinTimeout", f"{status} after {dep.ray.join_timeout:.0f}s "
                        f"(waiting for {', '.join(missing or short)})"), f.teardown("join timeout"))
    return Decision(Phase.STARTING_RAY, Reason(detail=status))


def serve(f: Facts) -> Decision | None:
    """6. The serve, in the head's container (and, mp across nodes, a rank in every member's). A serve
    state that could not be read is the last one seen: nothing is launched or stopped on it; the
    endpoint's own evidence still counts."""
    obs, st, cfg, dep, s = f.obs, f.st, f.cfg, f.dep, f.obs.serve
    if s is not None and s.error and not s.present:
        return Decision(_hold(st), Reason("ObservationUnknown", f"serve state: {s.error}"))
    if s is None or not s.present:
        strays = [n for n, x in obs.followers.items() if x is not None and x.present and (x.running or x.error)]
        if strays:  # ranks left from an earlier serve would wait for a head that is not theirs
            return Decision(Phase.STARTING_VLLM, Reason("RanksWithoutHead", f"stopping the serve on {', '.join(strays)} "
                            "before the launch"), (StopServe("ranks without their head"),))
        if st.preflight:  # a fabric mistake: found now instead of after a 15-minute load
            return Decision(Phase.FAILED, Reason("PreflightFailed", "; ".join(st.preflight)), fatal=True)
        if not obs.full:  # admission reads every member's memory first, on the next tick, at once
            return Decision(Phase.STARTING_VLLM, Reason(detail="reading memory before the launch"), look_closer=True)
        held = gpu_blockers(obs, cfg, dep)
        if held:
            if st.phase == Phase.STARTING_VLLM and st.in_phase(f.now) > cfg.stale.memory_free_timeout:
                return Decision(Phase.FAILED, Reason("GpuMemoryHeld", f"still held after {cfg.stale.memory_free_timeout:.0f}s: "
                                + "; ".join(held)), fatal=True)
            return Decision(Phase.STARTING_VLLM, Reason("WaitingForGpuMemory", "; ".join(held)))
        admitted = admit(obs, st, cfg, Phase.STARTING_VLLM) or _model(f, Phase.STARTING_VLLM)
        if admitted is not None:
            return admitted
        return Decision(Phase.STARTING_VLLM, Reason(detail=f"launching {dep.serve.name}"), (StartServe(),))
    if s.error:
        return None
    if s.spec_hash != serve_hash(cfg, dep):
        return Decision(Phase.STARTING_VLLM, Reason("ServeSpecChanged", "relaunching"), (StopServe("spec changed"),))
    if s.running:
        return None
    fail = f.progress.failure
    if fail is not None and fail.reason == "FreeMemoryBelowUtilization":
        return free_memory_failure(obs, st, cfg, fail.line)
    if fail is not None and fail.deterministic:  # the same again on retry: stop and say why
        return Decision(Phase.FAILED, Reason("ServeFailed", f"{fail.reason}: {fail.hint} ({fail.line})"),
                        (StopServe("failed"),), fatal=True)
    why = Reason("ServeFailed", f"{fail.reason} ({fail.line})") if fail else Reason("ServeExited", f"exit code {s.exit_code}")
    return f.repair("serve", why, (StopServe("exited"),))


def ranks(f: Facts) -> Decision | None:
    """7. mp across nodes: the headless ranks beside a running head."""
    return _ranks(f.obs, f.st, f.cfg, f.now, serve_hash(f.cfg, f.dep))


def _verified(f: Facts) -> bool:
    v, s = f.st.verdict, f.obs.serve
    return v is not None and s is not None and v.passed and v.serve == s.identity


def readiness(f: Facts) -> Decision | None:
    """8. Loading until the model is listed, then one real completion judged before SERVING. Once judged
    sane, liveness decides: one /health that failed or could not be read is no reason to leave SERVING."""
    obs, st, dep, s = f.obs, f.st, f.dep, f.obs.serve
    assert s is not None
    if _verified(f) and st.phase in (Phase.SERVING, Phase.DEGRADED):
        return None
    ep, name = obs.endpoint, dep.serve.name
    if ep is None or ep.state != "up" or name not in ep.models:
        if s.error:  # the log tail is the last one seen: no stall or deadline is judged on it
            return Decision(_hold(st), Reason("ObservationUnknown", f"serve state: {s.error}"))
        if (st.phase == Phase.LOADING and st.load_progress_at
                and f.now - st.load_progress_at > dep.readiness.stall_timeout):
            return f.repair("serve", Reason("LoadStalled", f"no progress for {dep.readiness.stall_timeout:.0f}s at "
                            f"{f.progress.summary()}"), (StopServe("load stalled"),))
        if st.phase == Phase.LOADING and st.in_phase(f.now) > dep.readiness.deadline:
            return f.repair("serve", Reason("LoadTimeout", f"not ready after {dep.readiness.deadline:.0f}s "
                            f"({f.progress.summary()})"), (StopServe("load timeout"),))
        why = Reason()  # progress is reported apart from the reason, so history keeps only real changes
        if ep is not None and ep.state == "error":
            why = Reason("EndpointError", ep.detail)
        elif ep is not None and ep.state == "up":
            why = Reason(detail=f"API up, {name} not listed yet")
        return Decision(Phase.LOADING, why)
    if _verified(f):
        return None
    if st.deep.failures >= f.cfg.healing.deep_failure_threshold:
        return f.repair("serve", Reason("ServeWedged", f"{st.deep.failures} sanity completions failed ({st.deep.detail})"),
                        (StopServe("wedged"),))
    return Decision(Phase.VERIFYING, Reason(detail="sanity completion"), (Verify(s.identity),))


def liveness(f: Facts) -> Decision:
    """9. Serving: liveness with thresholds. Trackers restart with each serve instance (the hold)."""
    return _serving(f.obs, f.st, f.cfg, f.now)


# The reconcile, in order: the first step that decides wins (KubeRay's reconcile functions, as one pass).
RULES: tuple[Rule, ...] = (nodes_seen, hygiene, containers, placement, ray, serve, ranks, readiness, liveness)


def _plan(obs: Observation, st: Status, cfg: Config, now: float) -> Decision:
    facts = Facts(obs, st, cfg, now)
    for rule in RULES:
        d = rule(facts)
        if d is not None:
            return d
    raise AssertionError("liveness always decides")


def _ranks(obs: Observation, st: Status, cfg: Config, now: float, sh: str) -> Decision | None:
    """mp across nodes: every headless rank runs the same spec beside a running head. One that exited or
    vanished ends the whole serve (vLLM cannot go on without a rank): a serve repair of every rank. A rank
    that could not be looked at is unknown (shown by ``unknowns``), never a reason to stop anything."""
    dep = cfg.deployment
    members = [n.name for n in serve_nodes(cfg, dep)]
    for node, f in obs.followers.items():
        rank = members.index(node) if node in members else -1
        if f is None or f.error:
            continue
        if not f.present:
            return _repair("serve", Reason("ServeRankMissing", f"no serve on {node} (rank {rank})"),
                           (StopServe("rank missing"),), st, cfg, now)
        if f.spec_hash != sh:
            return Decision(Phase.STARTING_VLLM, Reason("ServeSpecChanged", f"rank {rank} on {node}: relaunching"),
                            (StopServe("spec changed"),))
        if not f.running:
            fail = logscan.scan(f.log_tail).failure
            if fail is not None and fail.deterministic:
                return Decision(Phase.FAILED, Reason("ServeFailed", f"{fail.reason} on {node} (rank {rank}): {fail.hint} "
                                f"({fail.line})"), (StopServe("failed"),), fatal=True)
            why = f"{fail.reason} ({fail.line})" if fail else f"exit code {f.exit_code}"
            return _repair("serve", Reason("ServeRankExited", f"{node} (rank {rank}): {why}"), (StopServe("rank exited"),),
                           st, cfg, now)
    return None


def _serving(obs: Observation, st: Status, cfg: Config, now: float) -> Decision:
    """6. Serving: liveness with thresholds. Trackers restart with each serve instance (the hold)."""
    h, dep, s = cfg.healing, cfg.deployment, obs.serve
    assert s is not None
    if st.health.failures >= h.health_failure_threshold:
        return _repair("serve", Reason("ServeUnhealthy", f"/health failed {st.health.failures} times ({st.health.detail})"),
                       (StopServe("unhealthy"),), st, cfg, now)
    if st.deep.failures >= h.deep_failure_threshold:
        return _repair("serve", Reason("ServeWedged", f"{st.deep.failures} deep probes failed ({st.deep.detail})"),
                       (StopServe("wedged"),), st, cfg, now)
    n = len(cfg.members(dep))
    serving = f"{dep.serve.name} on {n} node{'' if n == 1 else 's'}"
    if now - max(st.deep.last_at, st.since) >= h.deep_probe_interval:
        return Decision(Phase.SERVING, Reason(detail=serving), (Verify(s.identity, deep=True),))
    return Decision(Phase.SERVING, Reason(detail=serving))


_REPAIR_PHASE = {"serve": Phase.STARTING_VLLM, "gang": Phase.CLEANING}


def _repair(kind: str, reason: Reason, actions: tuple[Action, ...], st: Status, cfg: Config, now: float) -> Decision:
    """A fault's repair, within the budget and spaced by jittered exponential backoff."""
    h = cfg.healing
    if st.repairs_in_window >= h.repair_budget:
        return Decision(Phase.FAILED, Reason("RestartBudgetExhausted", f"{st.repairs_in_window} repairs in "
                        f"{h.repair_window / 3600:g}h; last fault: {reason}"), fatal=True)
    if now < st.next_repair_at:
        return Decision(Phase.BACKOFF, Reason("RepairDelayed", str(reason)))
    return Decision(_REPAIR_PHASE[kind], reason, actions, repair=kind)
