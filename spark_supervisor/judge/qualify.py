"""Day-one qualification, pure: what on the members' hosts, or in the config as they will see it, would break or
slow the serve only after its 15-minute load. Each problem is named by its first word (a reason kind) and carries
its fix. A fact that was not read is no verdict. Called by judge.preflight, so `check --preflight` and the daemon
before each launch say the same."""

from __future__ import annotations

from ..config import Node
from ..config.identity import is_stale, owned_by_any
from ..config.view import DeploymentView
from ..model import Kind, Observation
from ..model.host import HostFacts
from ..specs import commands

# vLLM's Ray executor copies the driver's (the head's) variables with these prefixes to every worker rank
# (vllm/ray/ray_env.py, since vLLM PR #34383): a worker's own value for them is overwritten.
CARRIED_PREFIXES = ("NCCL_", "UCX_")
# Processes that kill the largest process when memory runs low: on unified memory that is one rank's engine, and
# the other rank then waits in a collective until NCCL's timeout (a wedged pair, not a clean exit). systemd-oomd
# is not among them: it acts only on cgroups with ManagedOOM*=kill, which Ubuntu sets on user slices, not on
# Docker's scopes.
OOM_KILLERS = ("earlyoom",)


def launched_env(view: DeploymentView, node: Node) -> dict[str, str]:
    """What a process launched on ``node`` runs with: its container's environment (on the head with head_env),
    and where a serve runs there, the serve's own (serve.env last), as the command builders make them."""
    env = dict(commands.node_container(view.cfg, view.dep, node).environment)
    if any(n.name == node.name for n in view.serve_nodes):
        env.update(commands.serve_env(view.cfg, view.dep, view.serve_hash, node))
    return env


def rank_env(view: DeploymentView, node: Node) -> dict[str, str]:
    """What the rank on ``node`` runs with: under Ray, a worker's rank gets the driver's (the head's) NCCL_*/UCX_*."""
    env = launched_env(view, node)
    head = view.members[0]
    if view.dep.uses_ray and node.name != head.name:
        env.update({k: v for k, v in launched_env(view, head).items() if k.startswith(CARRIED_PREFIXES)})
    return env


def hca_entries(value: str) -> list[str]:
    """NCCL_IB_HCA's device names to prefix-match ("=" makes them exact, ":port" is cut); none for an exclusion
    list ("^..."), which cannot leave a node with no device by naming one that does not exist."""
    value = value.strip()
    if not value or value.startswith("^"):
        return []
    exact = value.startswith("=")
    names = [e.strip().split(":")[0] for e in value.lstrip("=").split(",")]
    return [("=" if exact else "") + n for n in names if n]


def hca_problems(view: DeploymentView, obs: Observation) -> list[str]:
    """NCCL_IB_HCA is a prefix filter on RDMA device names: an entry that matches no device of a member is a typo
    or a copy from another machine (vLLM's InfiniBand docs say "mlx5"; a Spark's devices are rocep1s0f1,
    roceP2p1s0f1, ...). With none matching, NCCL falls back to sockets: the model serves at half speed."""
    problems: list[str] = []
    for node in view.members:
        env = rank_env(view, node)
        if env.get("NCCL_IB_DISABLE", "0").strip() == "1":
            continue
        facts = _facts(obs, node.name)
        if facts is None:
            continue
        devices = sorted({p.device for p in facts.rdma})
        for entry in hca_entries(env.get("NCCL_IB_HCA", "")):
            name = entry.lstrip("=")
            if not any(d == name if entry.startswith("=") else d.startswith(name) for d in devices):
                problems.append(f"{Kind.NCCL_HCA_UNMATCHED}: {node.name}: NCCL_IB_HCA entry {name!r} matches no RDMA "
                                f"device (has {', '.join(devices) or 'none'}); NCCL would fall back to sockets: unset "
                                "NCCL_IB_HCA (NCCL picks the RoCE devices itself) or name devices the node has")
    return problems


def carry_over_problems(view: DeploymentView) -> list[str]:
    """Per-node NCCL_*/UCX_* values under the Ray backend: vLLM gives every worker rank the head's values, so a
    member whose own value differs (another cabled port, another GID index) would run with the head's. Refused
    before the start (the non-carry-over file vLLM reads could keep them, but its effect on a real Ray executor
    cannot be proven here: vLLM's CPU build has no Ray executor)."""
    if not view.dep.uses_ray or len(view.members) < 2:
        return []
    head, *workers = view.members
    head_env = launched_env(view, head)
    problems: list[str] = []
    for node in workers:
        env = launched_env(view, node)
        # A key only the head sets is carried (what it is for); one only the worker sets is left alone.
        keys = sorted(k for k in set(env) & set(head_env) if k.startswith(CARRIED_PREFIXES) and env[k] != head_env[k])
        if keys:
            said = ", ".join(f"{k}={env[k]} (head: {head_env[k]})" for k in keys)
            problems.append(f"{Kind.PER_NODE_ENV_OVERWRITTEN}: {node.name}: {said}: vLLM's Ray executor gives every "
                            "rank the head's NCCL_*/UCX_* values; cable and name the same port on every node, or use "
                            "distributed_executor_backend = \"mp\" (each rank keeps its own environment)")
    return problems


def oom_killer_problems(view: DeploymentView, obs: Observation) -> list[str]:
    problems: list[str] = []
    for node in view.members:
        facts = _facts(obs, node.name)
        for name in facts.oom_killers if facts is not None else ():
            if name in OOM_KILLERS:
                problems.append(f"{Kind.OOM_KILLER_ACTIVE}: {node.name}: {name} runs and may kill one rank's engine "
                                "under memory pressure, leaving the other rank waiting in a collective: "
                                f"`systemctl disable --now {name}` on {node.name} (or make it avoid python3, ray and "
                                "vllm), then `spark-supervisor reset`")
    return problems


def stack_memory_problems(view: DeploymentView, obs: Observation) -> list[str]:
    """An auxiliary deployment whose share, with those of the deployments beside it on a unified-memory node, does
    not fit in what the node has free besides (MemAvailable less memory.share_margin, measured while nothing of
    ours, or of the old stack, runs there): vLLM would refuse it once the others are up. A required deployment is
    never refused for an auxiliary's sake; a node that runs something of ours or the old stack's, or was not read,
    is no verdict. `check --preflight` only: the daemon measures on a clean slate too rarely to keep a verdict, and
    admission names the same shortfall at the auxiliary's own start (GpuMemoryHeld)."""
    cfg, dep = view.cfg, view.dep
    if dep.required:
        return []
    problems: list[str] = []
    for node in view.members:  # every member holds a rank, and the rank its share of the node's memory
        beside = [d for d in cfg.deployments if any(n.name == node.name for n in cfg.members(d))]
        o = obs.nodes.get(node.name)
        if len(beside) < 2 or o is None or o.error or o.memory is None or o.gpu is None or o.gpu.total_mib is not None:
            continue
        if any(c.running and (owned_by_any(c, cfg) or is_stale(c, cfg)) for c in o.containers):
            continue
        m = o.memory
        asked = sum(d.serve.gpu_memory_utilization for d in beside)
        room = m.available_mib - int(cfg.memory.share_margin * m.total_mib)
        if asked * m.total_mib > room:
            shares = " + ".join(f"{d.name} {d.serve.gpu_memory_utilization:g}" for d in beside)
            problems.append(f"{Kind.STACK_DOES_NOT_FIT}: {node.name}: {shares} = {asked:g} of MemTotal "
                            f"{m.total_mib} MiB asks {int(asked * m.total_mib)} MiB, but the node has {m.available_mib} "
                            f"MiB available beside what it runs now (less the share margin: {room} MiB): lower "
                            f"{dep.name}'s gpu_memory_utilization or place it on another node")
    return problems


def _facts(obs: Observation, node: str) -> HostFacts | None:
    """The node's host facts when they were read (its links seen: the script ran against sysfs)."""
    o = obs.nodes.get(node)
    facts = o.host if o is not None else None
    return facts if facts is not None and facts.links else None


def qualification(view: DeploymentView, obs: Observation) -> list[str]:
    return [*hca_problems(view, obs), *carry_over_problems(view), *oom_killer_problems(view, obs)]
