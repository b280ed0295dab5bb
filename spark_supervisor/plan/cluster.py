"""Rule steps 1-5: the nodes seen, hygiene, the deployment's containers, their placement, Ray. Pure."""

from __future__ import annotations

from ..config import Node
from ..config.identity import is_orphan, is_stale, node_container_name, owned, spec_hash
from ..judge import fabric, logscan
from ..judge.admission import admit, gpu_blockers, gpu_unknown, port_holders
from ..model import (
    Action,
    Container,
    Decision,
    Kind,
    NodeObservation,
    Phase,
    Reason,
    RemoveContainers,
    StartContainer,
    StopUnits,
)
from .facts import DEPLOYED, Facts, hold, ray_view
from .gates import below_gate, image_gate, model_gate
from .stale import stale_units


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
    deployed = any(owned(o, f.dep) for o in obs.nodes.values()) or st.phase in DEPLOYED
    if not deployed:
        return Decision(Phase.BACKOFF, Reason(Kind.NODE_UNREACHABLE, why), failure=True)
    view = ray_view(obs.ray, f.members) if obs.ray is not None and obs.ray.reachable else None
    gone = [o.name for o in down if view is not None and view.state[o.name] in ("dead", "unlisted")]
    if gone:  # Ray, which can still be asked, confirms the loss: wait for the node to come back
        return Decision(Phase.DEGRADED, Reason(Kind.NODE_LOST, f"{', '.join(gone)} unreachable and not alive in Ray "
                        f"({why}); waiting for it to return"))
    return Decision(hold(st), Reason(Kind.OBSERVATION_UNKNOWN, f"{why}"))


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
    return Decision(Phase.CLEANING, Reason(Kind.STALE_FOUND, "; ".join(found)), tuple(actions)) if actions else None


def rebooted(f: Facts) -> Decision | None:
    """2b. A member whose boot ID is not the one recorded for the serve that runs (reconcile.tracking.Below.boots)
    rebooted under it: positive evidence, even when its containers came back by themselves (a rank restarted
    alone wedges the pair, or joins a group that no longer exists). The whole deployment is restarted."""
    st = f.st
    if st.phase not in (Phase.SERVING, Phase.DEGRADED) or not st.boots:
        return None
    who = fabric.rebooted(f.view, st.boots, st.hosts)
    if not who:
        return None
    return f.repair("gang", Reason(Kind.PEER_REBOOTED, f"{', '.join(who)}: its ranks would not rejoin the others' "
                    "communicators; restarting the whole deployment"), f.teardown("peer rebooted"))


def containers(f: Facts) -> Decision | None:
    """3. The deployment's containers (Ray nodes, or the homes of the mp serve): all present, running and
    of the current spec, or none at all."""
    dep, st = f.dep, f.st
    rh = f.view.ray_hash
    problems: list[str] = []
    between: list[str] = []
    for node in f.members:
        cs = owned(f.obs.nodes[node.name], dep)
        ok = [c for c in cs if c.name == node_container_name(dep, node) and c.running
              and spec_hash(c) == rh]
        if ok and len(cs) == 1:
            continue
        if not cs:
            problems.append(f"{node.name}: no {f.kind} container")
        elif any(spec_hash(c) != rh for c in cs):
            problems.append(f"{node.name}: spec changed")
        elif any(c.lost for c in cs) or len(cs) > 1:
            problems.append(f"{node.name}: {f.kind} container {cs[0].state}{_why_ended(cs[0])}")
            bind = next((b for c in cs if c.lost and (b := logscan.port_in_use(c.log_tail)) is not None), None)
            if bind is not None and not f.obs.full:  # who holds it is in a full observation: the next tick's
                return Decision(hold(st), Reason(Kind.PORT_IN_USE, f"{node.name}: {f.kind} container exited: "
                                f"port {bind.port or '?'} in use (looking who holds it)"), look_closer=True)
            if bind is not None:  # the same again on every restart: say who holds it, restart nothing
                return Decision(Phase.FAILED, Reason(Kind.PORT_IN_USE, f"{node.name}: {f.kind} container exited: "
                                f"{_holder(f.obs.nodes[node.name], node, bind.port)}: {logscan.PORT_HINT} ({bind.line})"),
                                f.teardown("port in use"), fatal=True)
        else:  # paused, restarting, removing: neither running nor gone
            between.append(f"{node.name}: {f.kind} container {cs[0].state}")
    if f.any_owned and problems:
        if all("spec changed" in p for p in problems):
            return Decision(Phase.CLEANING, Reason(Kind.SPEC_CHANGED, "replacing the deployment"), f.teardown("replace"))
        return f.repair("gang", Reason(Kind.PARTIAL_DEPLOYMENT, "; ".join(problems)), f.teardown("gang restart"))
    if between:
        return Decision(hold(st), Reason(Kind.CONTAINER_IN_TRANSITION, "; ".join(between)))
    if not f.any_owned and st.phase in DEPLOYED:  # all we ran vanished (a power cut, `docker rm -f` everywhere)
        return f.repair("gang", Reason(Kind.DEPLOYMENT_LOST, f"no {f.kind} container on any node"), ())
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
    obs, st, cfg = f.obs, f.st, f.cfg
    if not obs.full:
        return Decision(Phase.DETECTING, Reason())
    if st.waiting_for:  # deployments.after: theirs first (the daemon says which do not answer yet)
        return Decision(Phase.WAITING, Reason(Kind.WAITING_FOR, st.waiting_for))
    here = st.phase if st.phase in (Phase.DETECTING, Phase.CLEANING) else Phase.DETECTING
    checked = image_gate(st, f.view) or model_gate(f, here) or below_gate(f, here)
    if checked is not None:
        return checked
    head_report = st.images.get(f.members[0].name)
    dashboard = head_report is None or head_report.dashboard
    busy, ports_unseen = port_holders(obs, f.view, dashboard)
    if busy:  # before any container starts and any budget is spent: what would only exit, named
        return Decision(Phase.FAILED, Reason(Kind.PORT_IN_USE, "; ".join(busy) + f": {logscan.PORT_HINT}"), fatal=True)
    unseen = ports_unseen + gpu_unknown(obs, f.view)
    if unseen:  # nothing starts on a guess; DEGRADED once it lasts
        late = st.phase == Phase.DEGRADED or (st.phase == Phase.CLEANING
                                              and st.in_phase(f.now) > cfg.healing.unknown_patience)
        return Decision(Phase.DEGRADED if late else Phase.CLEANING,
                        Reason(Kind.OBSERVATION_UNKNOWN, ("GPU memory: " if not ports_unseen else "") + "; ".join(unseen)))
    held = gpu_blockers(obs, f.view)
    if held:
        if st.phase == Phase.CLEANING and st.in_phase(f.now) > cfg.stale.memory_free_timeout:
            return Decision(Phase.FAILED, Reason(Kind.GPU_MEMORY_HELD, f"still held after {cfg.stale.memory_free_timeout:.0f}s: "
                            + "; ".join(held) + " (not ours: stop it, then `spark-supervisor reset`)"), fatal=True)
        return Decision(Phase.CLEANING, Reason(Kind.WAITING_FOR_GPU_MEMORY, "; ".join(held)))
    admitted = admit(obs, st, f.view, Phase.CLEANING)
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
            return f.repair("gang", Reason(Kind.RAY_JOIN_TIMEOUT, f"Ray not reachable after {dep.ray.join_timeout:.0f}s ({why})"),
                            f.teardown("join timeout"))
        if st.phase == Phase.STARTING_RAY:
            return joining(f, Reason(detail=f"0/{len(members)} nodes (dashboard not answering yet)"))
        return Decision(hold(st), Reason(Kind.OBSERVATION_UNKNOWN, f"ray {r.via if r else 'dashboard'}: "
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
            return f.repair("gang", Reason(Kind.RAY_NODE_LOST, f"{', '.join(dead or short)} ({status})"),
                            f.teardown("ray node lost"))
        unknown = [n for n in missing if view.state[n] == "unknown"]
        if unknown:
            return Decision(hold(st), Reason(Kind.OBSERVATION_UNKNOWN, f"ray nodes: {', '.join(unknown)} not placed in "
                            f"Ray's answer ({'; '.join(view.gaps) or status})"))
        return Decision(hold(st), Reason(Kind.RAY_NODE_NOT_LISTED, f"{', '.join(missing or short)} not in Ray's node list "
                        f"({status})"))
    if st.phase == Phase.STARTING_RAY and st.in_phase(f.now) > dep.ray.join_timeout:
        unknown = [n for n in missing if view.state[n] == "unknown"]
        if unknown:  # the join may well be complete: Ray's answer cannot say, and a deadline is no evidence
            return Decision(Phase.DEGRADED, Reason(Kind.OBSERVATION_UNKNOWN, f"ray nodes: {', '.join(unknown)} not placed "
                            f"in Ray's answer after {dep.ray.join_timeout:.0f}s ({'; '.join(view.gaps)})"))
        unlisted = [n for n in missing if view.state[n] == "unlisted"]
        if view.strays and unlisted:  # ours never came on its fabric IP, and others did: a config problem
            return Decision(Phase.FAILED, Reason(Kind.RAY_NODE_WRONG_IP, f"{', '.join(unlisted)} never registered on its "
                            f"fabric IP while {', '.join(view.strays)} registered ({status}): set fabric_ip/VLLM_HOST_IP "
                            "per node"), f.teardown("wrong ip"), fatal=True)
        return f.repair("gang", Reason(Kind.RAY_JOIN_TIMEOUT, f"{status} after {dep.ray.join_timeout:.0f}s "
                        f"(waiting for {', '.join(missing or short)})"), f.teardown("join timeout"))
    return joining(f, Reason(detail=status))


def joining(f: Facts, why: Reason) -> Decision:
    """While Ray joins (it takes seconds): the model check put off by the image gate, made meanwhile."""
    return model_gate(f, Phase.STARTING_RAY, started=True) or Decision(Phase.STARTING_RAY, why)
