"""The decision table: (observation, status, config, now) -> phase, reason and actions. Pure.

The phase follows from what is observed, never from memory of what was done: stale things present
-> CLEANING; no healthy Ray cluster -> STARTING_RAY; no serve -> STARTING_VLLM; serve not answering
-> LOADING; answering but not yet judged -> VERIFYING; judged sane -> SERVING. Deadlines count from
the moment the current phase was entered (``Status.since``).
"""

from __future__ import annotations

import fnmatch
import os

from . import logscan
from .commands import ray_container_name
from .config import HASH_LABEL, OWNER_LABEL, Config, Deployment, ray_hash, serve_hash
from .model import (
    Action,
    Container,
    Decision,
    NodeObservation,
    Observation,
    Phase,
    RemoveContainers,
    StartRay,
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
    if OWNER_LABEL in c.labels:
        return False
    st = cfg.stale
    if c.name in st.containers or any(fnmatch.fnmatch(c.image, p) for p in st.image_patterns):
        return True
    for want in st.container_labels:
        key, _, value = want.partition("=")
        if key in c.labels and (not value or c.labels[key] == value):
            return True
    return False


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


def gpu_blockers(obs: Observation, cfg: Config, dep: Deployment) -> list[str]:
    """What still holds GPU memory on the deployment's nodes before Ray may start."""
    held: list[str] = []
    st = cfg.stale
    for node in cfg.members(dep):
        o = obs.nodes[node.name]
        if o.gpu is not None:
            residual = 0
            for p in o.gpu.processes:
                base = os.path.basename(p.name)
                if any(base == a or base.startswith(a) for a in st.allowed_gpu_processes):
                    residual += p.used_mib
                else:
                    held.append(f"{node.name}: pid {p.pid} ({p.name or '?'}) {p.used_mib} MiB")
            if residual > st.residual_mib:
                held.append(f"{node.name}: allowed processes hold {residual} MiB > {st.residual_mib} MiB")
        if o.memory is not None and (o.gpu is None or o.gpu.total_mib is None):
            # Unified memory (GB10): vLLM refuses to start unless this much is free.
            need = int(dep.serve.gpu_memory_utilization * o.memory.total_mib)
            if o.memory.available_mib < need:
                held.append(f"{node.name}: MemAvailable {o.memory.available_mib} MiB < {need} MiB "
                            f"({dep.serve.gpu_memory_utilization} x MemTotal)")
    return held


def _owned(o: NodeObservation, dep: Deployment) -> list[Container]:
    return [c for c in o.containers if c.labels.get(OWNER_LABEL) == dep.name]


def _teardown(cfg: Config, obs: Observation, dep: Deployment, why: str) -> tuple[Action, ...]:
    """Remove every owned container, workers first (a head removed first makes workers spin)."""
    actions: list[Action] = []
    for node in reversed(cfg.members(dep)):
        names = tuple(c.name for c in _owned(obs.nodes[node.name], dep))
        if names:
            actions.append(RemoveContainers(node.name, names, why))
    return tuple(actions)


def plan(obs: Observation, st: Status, cfg: Config, now: float) -> Decision:
    dep = cfg.deployment
    members = cfg.members(dep)
    if st.phase == Phase.FAILED:  # until a config change (SIGHUP) or `spark-supervisor reset`
        return Decision(Phase.FAILED, st.reason)
    if st.phase == Phase.BACKOFF and now < st.backoff_until:
        return Decision(Phase.BACKOFF, st.reason)

    # 1. Every node must answer before anything is decided about the gang. A deployment that still
    # runs on the reachable nodes is left alone for a while: the peer may only be rebooting.
    down = [o for o in obs.nodes.values() if o.error]
    if down:
        why = "; ".join(f"{o.name}: {o.error}" for o in down)
        if any(_owned(o, dep) for o in obs.nodes.values()):
            if st.phase == Phase.DEGRADED and st.in_phase(now) > cfg.healing.node_patience:
                gone = ", ".join(o.name for o in down)
                return _repair("gang", f"NodeLost: {gone} unreachable for {cfg.healing.node_patience:.0f}s ({why})",
                               _teardown(cfg, obs, dep, "node lost"), st, cfg, now)
            return Decision(Phase.DEGRADED, f"waiting for {', '.join(o.name for o in down)}: {why}")
        return Decision(Phase.BACKOFF, "NodeUnreachable: " + why, failure=True)

    # 2. Stale units and containers on any node, and containers we own under another deployment name.
    actions: list[Action] = []
    found: list[str] = []
    for node in cfg.nodes:
        o = obs.nodes[node.name]
        units = stale_units(o, cfg)
        if units:
            actions.append(StopUnits(node.name, units, cfg.stale.disable, cfg.stale.mask))
            found.append(f"{node.name}: units {', '.join(units)}")
        names = tuple(c.name for c in o.containers if is_stale(c, cfg))
        if names:
            actions.append(RemoveContainers(node.name, names, "stale"))
            found.append(f"{node.name}: containers {', '.join(names)}")
        orphans = tuple(c.name for c in o.containers
                        if OWNER_LABEL in c.labels and (c.labels[OWNER_LABEL] != dep.name or node not in members))
        if orphans:
            actions.append(RemoveContainers(node.name, orphans, "orphan"))
            found.append(f"{node.name}: orphans {', '.join(orphans)}")
    if actions:
        return Decision(Phase.CLEANING, "StaleFound: " + "; ".join(found), tuple(actions))

    # 3. Our Ray containers: all present, running and of the current spec, or none at all.
    rh = ray_hash(cfg, dep)
    problems: list[str] = []
    any_owned = False
    for node in members:
        cs = _owned(obs.nodes[node.name], dep)
        any_owned |= bool(cs)
        ok = [c for c in cs if c.name == ray_container_name(dep, node) and c.running
              and c.labels.get(HASH_LABEL) == rh]
        if ok and len(cs) == 1:
            continue
        if not cs:
            problems.append(f"{node.name}: no Ray container")
        elif any(c.labels.get(HASH_LABEL) != rh for c in cs):
            problems.append(f"{node.name}: spec changed")
        else:
            problems.append(f"{node.name}: Ray container {cs[0].state}")
    if any_owned and problems:
        if all("spec changed" in p for p in problems):
            return Decision(Phase.CLEANING, "SpecChanged: replacing the deployment", _teardown(cfg, obs, dep, "replace"))
        return _repair("gang", "PartialDeployment: " + "; ".join(problems), _teardown(cfg, obs, dep, "gang restart"),
                       st, cfg, now)

    if not any_owned:
        if st.phase in _DEPLOYED:  # everything we ran vanished (a power cut, `docker rm -f` on both nodes)
            return _repair("gang", "DeploymentLost: no Ray container on any node", (), st, cfg, now)
        if not obs.full:
            return Decision(Phase.DETECTING, "")
        held = gpu_blockers(obs, cfg, dep)
        if held:
            if st.phase == Phase.CLEANING and st.in_phase(now) > cfg.stale.memory_free_timeout:
                return Decision(Phase.CLEANING, "GpuMemoryHeld: " + "; ".join(held), failure=True)
            return Decision(Phase.CLEANING, "WaitingForGpuMemory: " + "; ".join(held))
        return Decision(Phase.STARTING_RAY, f"0/{len(members)} nodes",
                        tuple(StartRay(n.name) for n in members))

    # 4. Ray: every configured node ALIVE on its fabric IP, with the GPUs it was given.
    ray = obs.ray
    want_ips = {n.fabric_ip for n in members}
    want_gpus = float(sum(n.gpus for n in members))
    alive_ips = {n.ip for n in ray.alive} if ray and ray.reachable else set()
    serve_seen = obs.serve is not None and obs.serve.present and obs.serve.running
    wrong = sorted(alive_ips - want_ips)
    if wrong:
        return Decision(Phase.FAILED, f"RayNodeWrongIp: a node registered with {', '.join(wrong)}, expected the "
                        f"fabric IPs {', '.join(sorted(want_ips))}: set fabric_ip/VLLM_HOST_IP per node",
                        _teardown(cfg, obs, dep, "wrong ip"), fatal=True)
    gpus = ray.gpus if ray and ray.reachable else 0.0
    if not (want_ips <= alive_ips and gpus >= want_gpus):
        lost = sorted(n.name for n in members if n.fabric_ip not in alive_ips)
        status = f"{len(alive_ips)}/{len(members)} nodes, {gpus:.1f}/{want_gpus:.1f} GPUs"
        if serve_seen or st.phase in (Phase.SERVING, Phase.VERIFYING, Phase.LOADING):
            return _repair("gang", f"RayNodeLost: {', '.join(lost) or 'GPUs'} ({status})",
                           _teardown(cfg, obs, dep, "ray node lost"), st, cfg, now)
        if st.phase == Phase.STARTING_RAY and st.in_phase(now) > dep.ray.join_timeout:
            why = ray.error if ray and not ray.reachable else f"waiting for {', '.join(lost)}"
            return _repair("gang", f"RayJoinTimeout: {status} after {dep.ray.join_timeout:.0f}s ({why})",
                           _teardown(cfg, obs, dep, "join timeout"), st, cfg, now)
        return Decision(Phase.STARTING_RAY, status)

    # 5. The serve, inside the head's Ray container.
    s = obs.serve
    sh = serve_hash(cfg, dep)
    if s is None or not s.present:
        if st.preflight:  # a fabric mistake: found now instead of after a 15-minute load
            return Decision(Phase.FAILED, "PreflightFailed: " + "; ".join(st.preflight), fatal=True)
        return Decision(Phase.STARTING_VLLM, f"launching {dep.serve.name}", (StartServe(),))
    if s.spec_hash != sh:
        return Decision(Phase.STARTING_VLLM, "ServeSpecChanged: relaunching",
                        (StopServe("spec changed"), StartServe()))
    progress = logscan.scan(s.log_tail)
    if not s.running:
        fail = progress.failure
        if fail is not None and fail.deterministic:  # the same again on retry: stop and say why
            return Decision(Phase.FAILED, f"ServeFailed: {fail.reason}: {fail.hint} ({fail.line})",
                            (StopServe("failed"),), fatal=True)
        reason = f"ServeFailed: {fail.reason} ({fail.line})" if fail else f"ServeExited: exit code {s.exit_code}"
        return _repair("serve", reason, (StopServe("exited"), StartServe()), st, cfg, now)

    ep = obs.endpoint
    name = dep.serve.name
    if ep is None or ep.state != "up" or name not in ep.models:
        if (st.phase == Phase.LOADING and st.load_progress_at
                and now - st.load_progress_at > dep.readiness.stall_timeout):
            return _repair("serve", f"LoadStalled: no progress for {dep.readiness.stall_timeout:.0f}s at "
                           f"{progress.summary()}", (StopServe("load stalled"), StartServe()), st, cfg, now)
        if st.phase == Phase.LOADING and st.in_phase(now) > dep.readiness.deadline:
            return _repair("serve", f"LoadTimeout: not ready after {dep.readiness.deadline:.0f}s "
                           f"({progress.summary()})", (StopServe("load timeout"), StartServe()), st, cfg, now)
        detail = ""  # progress is reported apart from the reason, so history keeps only real changes
        if ep is not None and ep.state == "error":
            detail = f"EndpointError: {ep.detail}"
        elif ep is not None and ep.state == "up":
            detail = f"API up, {name} not listed yet"
        return Decision(Phase.LOADING, detail)
    h = cfg.healing
    v = st.verdict
    if v is None or not v.passed or v.serve != s.identity:
        if st.deep.failures >= h.deep_failure_threshold:
            return _repair("serve", f"ServeWedged: {st.deep.failures} sanity completions failed ({st.deep.detail})",
                           (StopServe("wedged"), StartServe()), st, cfg, now)
        return Decision(Phase.VERIFYING, "sanity completion", (Verify(s.identity),))

    # 6. Serving: liveness with thresholds. Trackers restart with each serve instance (the hold).
    if st.health.failures >= h.health_failure_threshold:
        return _repair("serve", f"ServeUnhealthy: /health failed {st.health.failures} times ({st.health.detail})",
                       (StopServe("unhealthy"), StartServe()), st, cfg, now)
    if st.deep.failures >= h.deep_failure_threshold:
        return _repair("serve", f"ServeWedged: {st.deep.failures} deep probes failed ({st.deep.detail})",
                       (StopServe("wedged"), StartServe()), st, cfg, now)
    serving = f"{name} on {len(members)} nodes"
    if now - max(st.deep.last_at, st.since) >= h.deep_probe_interval:
        return Decision(Phase.SERVING, serving, (Verify(s.identity, deep=True),))
    return Decision(Phase.SERVING, serving)


_REPAIR_PHASE = {"serve": Phase.STARTING_VLLM, "gang": Phase.CLEANING}


def _repair(kind: str, reason: str, actions: tuple[Action, ...], st: Status, cfg: Config, now: float) -> Decision:
    """A fault's repair, within the budget and spaced by jittered exponential backoff."""
    h = cfg.healing
    if st.repairs_in_window >= h.repair_budget:
        return Decision(Phase.FAILED, f"RestartBudgetExhausted: {st.repairs_in_window} repairs in "
                        f"{h.repair_window / 3600:g}h; last fault: {reason}", fatal=True)
    if now < st.next_repair_at:
        return Decision(Phase.BACKOFF, f"RepairDelayed: {reason}")
    return Decision(_REPAIR_PHASE[kind], reason, actions, repair=kind)
