"""Below vLLM: what the members' hosts say of the fabric, which transport NCCL chose, who rebooted, who lost
the GPU (docs/wire-formats.md §8). Pure: the members' host facts (Status.hosts) and the ranks' transports in,
reasons out. The planner holds a start on them, and shows them while serving (DEGRADED, never a repair);
only a boot ID that changed under a serving deployment is positive evidence enough for a repair."""

from __future__ import annotations

from typing import NamedTuple

from ..config import Node
from ..config.view import DeploymentView
from ..model import BelowJudgement, HostFacts, Kind, Link, RdmaPort, Reason, Status, Transport

GPU_LOST_HINT = ("the containers lost their GPU devices, as after a host `systemctl daemon-reload` without NVIDIA's "
                 "CDI refresh (enable nvidia-cdi-refresh, or use CDI device names): a restart of the containers "
                 "gives them back")
_HINTS = {
    Kind.FABRIC_LINK_DOWN: "check the cable and `ip link` / `ibv_devinfo` on the node",
    Kind.FABRIC_MTU_MISMATCH: "give every member's fabric interface the same MTU (9000 on a Spark's fabric); a "
                              "mismatch hangs NCCL (IBV_WC_RETRY_EXC_ERR)",
    Kind.GID_INDEX_MOVED: "set NCCL_IB_GID_INDEX to the index named (deployments.ray.env or the node's env) and "
                          "reload, or unset it to let NCCL search",
    Kind.FABRIC_DEGRADED: "reseat or replace the cable: models run, but prompt processing over it is slower",
}


def _env(view: DeploymentView, node: Node) -> dict[str, str]:
    """What NCCL on the node sees, as the containers and the serve are given it (commands)."""
    dep = view.dep
    head = dep.ray.head_env if node.name == view.serve_node.name else {}
    return {**dep.ray.env, **head, **node.env, **dep.serve.env}


def fabric_link(node: Node, host: HostFacts) -> Link | None:
    """The node's fabric interface: the one configured, else the one its fabric IPv4's GID belongs to."""
    name = node.fabric_interface or next((g.netdev for p in host.rdma for g in p.gids
                                          if g.ipv4 == node.fabric_ip and g.netdev), "")
    return host.link(name) if name else None


def _ports(node: Node, host: HostFacts) -> tuple[RdmaPort, ...]:
    return host.ports_on(node.fabric_interface, node.fabric_ip)


def problems(view: DeploymentView, hosts: dict[str, HostFacts]) -> list[Reason]:
    """What is wrong with the fabric between the members, worst first; a member not read says nothing."""
    members = list(view.members)
    if not view.dep.fabric.check or len(members) < 2:
        return []
    found: list[Reason] = []
    mtus: list[str] = []
    seen_mtus: set[int] = set()
    floor = view.dep.fabric.min_rate_gbps
    for node in members:
        host = hosts.get(node.name)
        if host is None:
            continue
        link = fabric_link(node, host)
        if link is not None and link.down:
            found.append(Reason(Kind.FABRIC_LINK_DOWN, f"{node.name} {link.name} is {link.operstate}"))
        if link is not None and link.mtu is not None:
            mtus.append(f"{node.name} {link.name} {link.mtu}")
            seen_mtus.add(link.mtu)
        ports = _ports(node, host)
        if (floor and not ports and link is not None and link.speed_mbps is not None  # the port's rate says it
                and link.speed_mbps < floor * 1000):
            found.append(Reason(Kind.FABRIC_DEGRADED, f"{node.name} {link.name} at {link.speed_mbps / 1000:g} Gb/s, "
                                f"below the floor of {floor:g} Gb/s"))
        want = _env(view, node).get("NCCL_IB_GID_INDEX", "").strip()
        for p in ports:
            if p.state and not p.active:
                found.append(Reason(Kind.FABRIC_LINK_DOWN, f"{node.name} {p.device} port {p.port} is {p.state}"))
            if floor and p.rate_gbps is not None and p.rate_gbps < floor:
                found.append(Reason(Kind.FABRIC_DEGRADED, f"{node.name} {p.device} port {p.port} at {p.rate_gbps:g} "
                                    f"Gb/s, below the floor of {floor:g} Gb/s"))
            if want.isdigit():
                at = p.roce_v2_index(node.fabric_ip)
                if at is None and any(g.ipv4 == node.fabric_ip for g in p.gids):
                    found.append(Reason(Kind.GID_INDEX_MOVED, f"{node.name} {p.device}: {node.fabric_ip} has no RoCE v2 "
                                        f"GID, NCCL_IB_GID_INDEX={want}"))
                elif at is not None and at != int(want):
                    found.append(Reason(Kind.GID_INDEX_MOVED, f"{node.name} {p.device}: {node.fabric_ip} is at index {at}, "
                                        f"NCCL_IB_GID_INDEX={want}"))
    if len(seen_mtus) > 1:
        found.append(Reason(Kind.FABRIC_MTU_MISMATCH, ", ".join(mtus)))
    order = list(_HINTS)
    return sorted(found, key=lambda r: order.index(Kind(r.kind)))


def summary(found: list[Reason]) -> Reason:
    """One reason for a decision: the worst kind, all of its findings and its hint, then the others."""
    first = Kind(found[0].kind)
    same = [r.detail for r in found if r.kind == first]
    rest = [str(r) for r in found if r.kind != first]
    return Reason(first, "; ".join(same) + f": {_HINTS[first]}" + (f" (also {'; '.join(rest)})" if rest else ""))


def fallback(view: DeploymentView, transports: tuple[Transport, ...], hosts: dict[str, HostFacts]) -> Reason | None:
    """A rank on sockets between nodes where its node's fabric is RDMA (an RDMA port on it, ACTIVE): NCCL fell
    back from RoCE to TCP, and serves, slowly. None: none, or nothing known of the fabric."""
    members = list(view.members)
    if not view.dep.fabric.check or len(members) < 2:
        return None
    found: list[str] = []
    for t in transports:
        node = member(view, t)
        host = hosts.get(node.name) if node is not None else None
        if not t.socket or node is None or host is None or not any(p.active for p in _ports(node, host)):
            continue
        rank = f"rank {t.rank}" if t.rank is not None else "a rank"
        on = f" on {t.interface}" if t.interface else ""
        found.append(f"{node.name} {rank} uses NET/Socket{on} ({t.line})")
    if not found:
        return None
    return Reason(Kind.FABRIC_FALLBACK, "; ".join(found) + ": NCCL found no usable RDMA device: check the GID index "
                  "(NCCL_IB_GID_INDEX), the MTU on both ends, NCCL_IB_HCA and NCCL_IB_DISABLE")


def member(view: DeploymentView, t: Transport) -> Node | None:
    """The member a rank runs on: by its address, else by the hostname NCCL printed (a rank that bootstrapped
    on another interface than the fabric's)."""
    return (next((n for n in view.members if n.fabric_ip == t.ip), None)
            or next((n for n in view.members if n.name == t.host), None))


def rebooted(view: DeploymentView, boots: dict[str, str], hosts: dict[str, HostFacts]) -> list[str]:
    """Members whose boot ID is not the one recorded when the deployment reached SERVING (both known)."""
    out = []
    for node in view.members:
        then, host = boots.get(node.name, ""), hosts.get(node.name)
        if then and host is not None and host.boot_id and host.boot_id != then:
            out.append(f"{node.name} (boot ID {then[:8]}… → {host.boot_id[:8]}…)")
    return out


def gpu_lost(view: DeploymentView, lost: dict[str, str]) -> Reason | None:
    said = [f"{n.name}: {lost[n.name]}" for n in view.members if lost.get(n.name)]
    return Reason(Kind.GPU_ACCESS_LOST, "; ".join(said) + f": {GPU_LOST_HINT}") if said else None


def _held(lost: Reason | None, found: list[Reason]) -> Reason | None:
    """What holds a start: GPU access lost, then the fabric's own problems (``found``) summed up."""
    return lost or (summary(found) if found else None)


def judged(view: DeploymentView, st: Status) -> BelowJudgement:
    """The judgement of the status's facts below vLLM: the one kept on it (reconcile.tracking.Below) while those facts
    are the same (or equal) and the view the same object, else judged afresh. The planner and the metrics read
    it every tick: judged once per change, not once per reader and tick."""
    facts = (tuple(st.hosts.items()), st.transports, tuple(st.gpu_lost.items()))
    kept = st.below
    if kept is not None and kept.view is view and kept.facts == facts:
        return kept
    found = problems(view, st.hosts)
    return BelowJudgement(view, facts, _held(gpu_lost(view, st.gpu_lost), found), tuple(found),
                          fallback(view, st.transports, st.hosts))


def machine_id_twins(facts: dict[str, HostFacts]) -> list[str]:
    """Warnings for nodes that share one /etc/machine-id (Sparks flashed from one image): tools that tell
    machines apart by it (journald, DHCP client IDs, some clusters) confuse them."""
    by_id: dict[str, list[str]] = {}
    for name, h in facts.items():
        if h.machine_id:
            by_id.setdefault(h.machine_id, []).append(name)
    return [f"{', '.join(names)} share /etc/machine-id {mid[:8]}…: give each its own (systemd-machine-id-setup after "
            "removing it) so journald, DHCP and clustering tools can tell them apart"
            for mid, names in sorted(by_id.items()) if len(names) > 1]


class Findings(NamedTuple):
    """What the members' hosts say below vLLM, for an operator's command (`check --preflight`, `diagnose`)."""

    warnings: list[str]  # nodes that share one machine-id: serving works, other tools confuse them
    problems: list[str]  # each one found: the GPUs lost, then the fabric's own problems, worst first
    held: str  # the one reason the daemon would hold a start on: a lost GPU, else the fabric's ("": none)


def findings(view: DeploymentView, hosts: dict[str, HostFacts], lost: dict[str, str]) -> Findings:
    """The members' host facts (and what nvidia-smi said where it lost the GPU) judged as the daemon judges
    them, with the machine-id twins among them: one judgement for every command that shows it."""
    found, gone = problems(view, hosts), gpu_lost(view, lost)
    held = _held(gone, found)
    return Findings(machine_id_twins(hosts), [str(r) for r in [*([gone] if gone else []), *found]],
                    str(held) if held is not None else "")
