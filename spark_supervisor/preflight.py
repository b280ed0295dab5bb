"""Fabric checks before spending 15 minutes on a load. Pure: config + what `ip -o addr` showed per node."""

from __future__ import annotations

import ipaddress

from .commands import node_env
from .config import Config
from .model import Observation

_IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME")


def parse_ip_addr(text: str) -> dict[str, tuple[str, ...]]:
    """`ip -o addr show`: "2: enp1s0f1np1    inet 192.168.200.12/24 brd ... scope global ..." per line."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
            out.setdefault(parts[1].split("@")[0], []).append(parts[3])
    return {k: tuple(v) for k, v in out.items()}


def _on(ip: str, cidrs: tuple[str, ...]) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr == ipaddress.ip_interface(c).ip or addr in ipaddress.ip_interface(c).network for c in cidrs)


def preflight(cfg: Config, obs: Observation) -> list[str]:
    dep = cfg.deployment
    members = cfg.members(dep)
    problems: list[str] = []
    for node in members:
        env = {**dep.ray.env, **node_env(node), **node.env}
        if env.get("VLLM_HOST_IP") != node.fabric_ip:
            problems.append(f"{node.name}: VLLM_HOST_IP={env.get('VLLM_HOST_IP')} is not its fabric IP {node.fabric_ip}")
        o = obs.nodes.get(node.name)
        ifaces = o.interfaces if o is not None else None
        if ifaces is None:
            continue  # not readable there: a probe error, not a verdict
        if node.fabric_interface:
            if node.fabric_interface not in ifaces:
                problems.append(f"{node.name}: fabric interface {node.fabric_interface} does not exist "
                                f"(has {', '.join(sorted(ifaces))})")
            elif not _on(node.fabric_ip, ifaces[node.fabric_interface]):
                problems.append(f"{node.name}: fabric IP {node.fabric_ip} is not on {node.fabric_interface} "
                                f"({', '.join(ifaces[node.fabric_interface])})")
        elif not any(_on(node.fabric_ip, c) for c in ifaces.values()):
            problems.append(f"{node.name}: fabric IP {node.fabric_ip} is on no interface")
        for var in _IFNAME_VARS:
            for name in filter(None, (env.get(var) or "").split(",")):
                if name.startswith("^"):
                    continue  # an exclusion list
                name = name.lstrip("=")
                if not any(i == name or i.startswith(name) for i in ifaces):
                    problems.append(f"{node.name}: {var}={name} matches no interface")
    per_node = max((n.gpus for n in members), default=0)
    world = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
    if world > per_node and dep.serve.placement_strategy != "SPREAD":
        problems.append(f"TP x PP = {world} spans nodes with {per_node} GPU each: set placement_strategy = \"SPREAD\"")
    return problems
