"""Memory admission before a launch, pure: what vLLM's own start-up check will see on each node (GPU
processes we do not own, MemFree against --gpu-memory-utilization on unified memory, the page cache in
the way), and what to do about it."""

from __future__ import annotations

from ..config import Deployment
from ..config.view import DeploymentView
from ..model import (
    Decision,
    DropPageCache,
    Kind,
    NodeObservation,
    Observation,
    Phase,
    Reason,
    Status,
    StopServe,
)


def _need_mib(o: NodeObservation, dep: Deployment) -> int | None:
    """What --gpu-memory-utilization will ask for on a unified-memory node (GB10: nvidia-smi says N/A)."""
    if o.memory is None or o.gpu is None or o.gpu.total_mib is not None:
        return None
    return int(dep.serve.gpu_memory_utilization * o.memory.total_mib)


def _mem(o: NodeObservation) -> str:
    m = o.memory
    assert m is not None
    return (f"MemFree {m.free_mib} MiB, Cached {m.cached_mib} MiB, MemAvailable {m.available_mib} MiB"
            if m.free_mib is not None else f"MemAvailable {m.available_mib} MiB")


def gpu_blockers(obs: Observation, view: DeploymentView) -> list[str]:
    """What still holds GPU memory on the deployment's nodes: processes no configured deployment owns, and
    memory that even dropping the page cache would not give back (MemAvailable below what vLLM will ask for)."""
    held: list[str] = []
    st, dep = view.cfg.stale, view.dep
    for node in view.members:
        o = obs.nodes[node.name]
        if o.gpu is not None:
            residual = 0
            for p in o.gpu.processes:
                if st.allows(p.name):
                    residual += p.used_mib
                elif o.owned_pids is not None and p.pid in o.owned_pids:
                    continue  # another deployment's serve on a shared node: its share is in the config's sum
                else:
                    held.append(f"{node.name}: pid {p.pid} ({p.name or '?'}) {p.used_mib} MiB")
            if residual > st.residual_mib:
                held.append(f"{node.name}: allowed processes hold {residual} MiB > {st.residual_mib} MiB")
        need = _need_mib(o, dep)
        if need is not None and o.memory is not None and o.memory.available_mib < need:
            held.append(f"{node.name}: MemAvailable {o.memory.available_mib} MiB < {need} MiB "
                        f"({dep.serve.gpu_memory_utilization} x MemTotal)")
    return held


def share_fits(new: DeploymentView, old: DeploymentView, full: Observation | None) -> Reason | None:
    """A change's --gpu-memory-utilization against what will be free on each of its serve nodes once the serve
    that runs stops: MemAvailable now (what the node uses beside that serve, other deployments' serves included)
    plus that serve's own share. Unified memory only (GB10: nvidia-smi has no total); a node not read is unknown,
    never a refusal. A ChangeRefused reason, or None."""
    if full is None:
        return None
    running = {n.name for n in old.serve_nodes}
    for node in new.serve_nodes:
        o = full.nodes.get(node.name)
        need = None if o is None or o.error else _need_mib(o, new.dep)
        if o is None or need is None or o.memory is None:
            continue
        share = old.dep.serve.gpu_memory_utilization if node.name in running else 0.0
        freed = int(share * o.memory.total_mib)
        after = o.memory.available_mib + freed
        if need > after:
            return Reason(Kind.CHANGE_REFUSED, f"{Kind.FREE_MEMORY_BELOW_UTILIZATION} on {node.name}: "
                          f"gpu_memory_utilization {new.dep.serve.gpu_memory_utilization} asks for {need} MiB of "
                          f"{o.memory.total_mib} MiB, but about {after} MiB will be free once the running serve stops "
                          f"(MemAvailable {o.memory.available_mib} MiB + its share {freed} MiB): lower it")
    return None


def page_cache_in_the_way(obs: Observation, view: DeploymentView) -> dict[str, str]:
    """Nodes where vLLM's own check would fail on MemFree although MemAvailable is enough: the page cache
    (a previous load's weight shards) is what stands in the way. node -> the figures."""
    out = {}
    for node in view.members:
        o = obs.nodes[node.name]
        need = _need_mib(o, view.dep)
        m = o.memory
        if need is not None and m is not None and m.free_mib is not None and m.free_mib < need <= m.available_mib:
            out[node.name] = f"{node.name}: {_mem(o)}; vLLM will ask for {need} MiB"
    return out


def admit(obs: Observation, st: Status, view: DeploymentView, phase: Phase) -> Decision | None:
    """Before a launch: drop the page cache where it is in the way (once), or say why it cannot start."""
    cfg = view.cfg
    cache = page_cache_in_the_way(obs, view)
    if not cache:
        return None
    figures = "; ".join(cache.values())
    if cfg.memory.page_cache == "never":
        return Decision(Phase.FAILED, Reason(Kind.FREE_MEMORY_BELOW_UTILIZATION, f"{figures}: the page cache holds the rest and "
                        "[memory] page_cache = \"never\" (drop it by hand: sync; echo 3 > /proc/sys/vm/drop_caches, "
                        "or set page_cache = \"drop\", or lower gpu_memory_utilization)"), fatal=True)
    again = sorted(set(cache) & st.page_cache_dropped)
    if again:
        return Decision(Phase.FAILED, Reason(Kind.FREE_MEMORY_BELOW_UTILIZATION, f"{figures} even after dropping the page cache "
                        "(something keeps refilling it or holds memory: lower gpu_memory_utilization)"), fatal=True)
    return Decision(phase, Reason(Kind.PAGE_CACHE_IN_THE_WAY, f"{figures}: dropping it"),
                    tuple(DropPageCache(n, "page cache in the way") for n in cache))


def gpu_unknown(obs: Observation, view: DeploymentView) -> list[str]:
    """Members whose GPU memory could not be read this tick: nothing may start there on a guess."""
    out = []
    for node in view.members:
        o = obs.nodes[node.name]
        errors = [e for e in o.probe_errors if e.startswith(("nvidia-smi", "meminfo"))]
        if errors or o.gpu is None:  # no process list, or no memory figures: not a reading to start on
            out.append(f"{node.name}: " + ("; ".join(errors) or "GPU not read"))
    return out


def free_memory_failure(obs: Observation, st: Status, view: DeploymentView, line: str) -> Decision:
    """vLLM refused to start on free memory. Right after a drop, or with MemAvailable short too, the same
    would happen again: FAILED with the numbers. Otherwise the page cache is the likely cause: drop it and
    let the launch be retried once (no repair budget: nothing was broken)."""
    cfg = view.cfg
    if not obs.full:
        return Decision(st.phase, Reason(Kind.FREE_MEMORY_BELOW_UTILIZATION, "reading memory before deciding"), look_closer=True)
    nodes = [obs.nodes[n.name] for n in view.members]
    figures = "; ".join(f"{o.name}: {_mem(o)}" for o in nodes if o.memory is not None) or "memory not read"
    short = gpu_blockers(obs, view)
    if st.page_cache_dropped or short or cfg.memory.page_cache == "never":
        why = ("after dropping the page cache" if st.page_cache_dropped else
               "with MemAvailable short too" if short else "and [memory] page_cache = \"never\"")
        return Decision(Phase.FAILED, Reason(Kind.SERVE_FAILED, f"FreeMemoryBelowUtilization {why}: {figures} ({line}); "
                        "free the memory or lower gpu_memory_utilization"), (StopServe("failed"),), fatal=True)
    return Decision(Phase.STARTING_VLLM, Reason(Kind.FREE_MEMORY_BELOW_UTILIZATION, f"{figures}: dropping the page cache, "
                    "then one more launch"), (StopServe("free memory"), *(
                        DropPageCache(n.name, "vLLM refused on free memory") for n in view.members)))


def ports_needed(view: DeploymentView, dashboard: bool = True) -> dict[str, dict[int, str]]:
    """node -> port -> what binds it there once the deployment starts, as the config says."""
    dep, head = view.dep, view.serve_node
    out: dict[str, dict[int, str]] = {n.name: {} for n in view.members}
    if dep.uses_ray:
        ray = dep.ray
        out[head.name][ray.port] = "Ray's GCS"
        if dashboard:
            out[head.name][ray.dashboard_port] = "Ray's dashboard"
        out[head.name].setdefault(ray.client_port, "Ray's client server")
    rank0 = view.serve_nodes[0]
    out[rank0.name].setdefault(dep.serve.port, f"the serve ({dep.serve.name})")
    if view.multi_node_mp:
        out[rank0.name].setdefault(dep.serve.master_port, "the serve's rank 0 (master_port)")
    return out


def port_holders(obs: Observation, view: DeploymentView, dashboard: bool = True) -> tuple[list[str], list[str]]:
    """Before the deployment's containers start: (ports held by something that is not a configured
    deployment's container on a member's fabric IP or every address, unknown: nodes whose listeners could
    not be read, or whose holder may be ours but cannot be told)."""
    held: list[str] = []
    unseen: list[str] = []
    for node in view.members:
        o, want = obs.nodes[node.name], ports_needed(view, dashboard)[node.name]
        if o.listening is None:
            unseen.append(f"{node.name}: listening ports not read")
            continue
        for ln in o.listening:
            if ln.port not in want or not (ln.everywhere or ln.address in (node.fabric_ip, f"::ffff:{node.fabric_ip}")):
                continue
            if ln.pid is not None and o.owned_pids is not None and ln.pid in o.owned_pids:
                continue  # another configured deployment's (its own config problem, not a stranger)
            who = f"{ln.process} (pid {ln.pid})" if ln.process and ln.pid is not None else ln.process or "a process the node does not name"
            held.append(f"{node.name}: {ln.port} ({want[ln.port]}) held by {who} on {ln.address or '*'}")
    return sorted(set(held)), unseen
