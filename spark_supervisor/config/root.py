"""The whole config (the file's root table): its tables, the cross-checks between them (with the helpers of
checks.py), and the per-deployment view the reconcile machinery runs on."""

from __future__ import annotations

import os

from pydantic import PrivateAttr, model_validator

from .checks import _after_cycle, _host_dirs, _local_programs, _ports_and_endpoints, _same_machine
from .fields import _raise, _Strict
from .schema import Alerts, Deployment, Healing, Memory, Metrics, Node, Retry, Stale, Supervisor


def deployment_dir(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "deployments", name)


class Config(_Strict):
    supervisor: Supervisor = Supervisor()
    healing: Healing = Healing()
    retry: Retry = Retry()
    memory: Memory = Memory()
    metrics: Metrics = Metrics()
    alerts: Alerts = Alerts()
    nodes: list[Node]
    stale: Stale = Stale()
    deployments: list[Deployment]
    _owners: frozenset[str] = PrivateAttr(default=frozenset())
    # What `check` reports but accepts: "<file>: <key>: <why>" lines, set by parse().
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        problems: list[tuple[str, str]] = []
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if name in names[:i]:
                problems.append((f"nodes[{i}].name", f"duplicate node {name!r}"))
        ips = [n.fabric_ip for n in self.nodes]
        for i, ip in enumerate(ips):
            if ip in ips[:i]:
                problems.append((f"nodes[{i}].fabric_ip", f"duplicate fabric IP {ip}"))
        heads = [i for i, n in enumerate(self.nodes) if n.role == "head"]
        if not heads:
            problems.append(("nodes", "no node has role = \"head\""))
        for i in heads[1:]:
            problems.append((f"nodes[{i}].role", "more than one head node"))
        for i, n in enumerate(self.nodes):
            if n.role == "worker" and not n.ssh:
                problems.append((f"nodes[{i}].ssh", "a worker needs an SSH target, e.g. \"root@spark-2\""))
            if n.role == "worker" and n.docker == "local":
                problems.append((f"nodes[{i}].docker", "a worker's engine is remote, e.g. \"ssh://root@spark-2\""))
        deps = [dep.name for dep in self.deployments]
        if not self.deployments:
            problems.append(("deployments", "no deployment: add a [[deployments]] table"))
        for d, dep in enumerate(self.deployments):
            if dep.name in deps[:d]:
                problems.append((f"deployments[{d}].name", f"duplicate deployment {dep.name!r}: each needs its own name "
                                 "(it names its containers and owns them)"))
            for j, a in enumerate(dep.after):
                if a not in deps or a == dep.name:
                    problems.append((f"deployments[{d}].after[{j}]", f"{a!r} is not another deployment "
                                     f"(deployments: {', '.join(deps)})"))
        cycle = _after_cycle(self.deployments)
        if cycle:
            problems.append(("deployments", f"the start order goes round in a circle: {' -> '.join(cycle)}"))
        own_containers: dict[str, str] = {}
        listening: dict[tuple[str, int], str] = {}  # (host node, port) -> the key that takes it
        shares: dict[str, list[tuple[str, float]]] = {}
        for d, dep in enumerate(self.deployments):
            for j, nn in enumerate(dep.nodes):
                if nn not in names:
                    problems.append((f"deployments[{d}].nodes[{j}]", f"unknown node {nn!r}"))
                elif nn in dep.nodes[:j]:
                    problems.append((f"deployments[{d}].nodes[{j}]", f"{nn!r} is listed twice: list each node once"))
            members = self.members(dep)
            gpus = sum(n.gpus for n in members)
            want = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
            if not members:
                pass  # unknown nodes: said above
            elif gpus == 0:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 "its nodes have no GPUs: set nodes[].gpus"))
            elif want > gpus:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 f"TP x PP = {want} is larger than the {gpus} GPUs configured on its nodes: make "
                                 f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or add GPUs "
                                 "(nodes[].gpus, deployments.nodes)"))
            elif want < gpus:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 f"TP x PP = {want} is smaller than the {gpus} GPUs configured on its nodes "
                                 f"({gpus - want} would sit idle or fail placement): make "
                                 f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or list fewer "
                                 "GPUs (nodes[].gpus, deployments.nodes)"))
            if not members:
                continue
            # Everything below listens on its node's host network: one port each, across deployments too.
            host = members[0].name
            ports = ([(f"deployments[{d}].ray.port", dep.ray.port),
                      (f"deployments[{d}].ray.dashboard_port", dep.ray.dashboard_port)] if dep.uses_ray else [])
            ports.append((f"deployments[{d}].serve.port", dep.serve.port))
            if not dep.uses_ray and len(members) > 1:
                ports.append((f"deployments[{d}].serve.master_port", dep.serve.master_port))
            for key, port in ports:
                other = listening.setdefault((host, port), key)
                if other != key:
                    problems.append((key, f"port {port} is also {other} on {host}: they share the node's host "
                                          "network; give each its own port"))
            for n in members:
                own_containers[f"{dep.name}-ray-{n.name}"] = n.name
                own_containers[f"{dep.name}-vllm-{n.name}"] = n.name
                shares.setdefault(n.name, []).append((dep.name, dep.serve.gpu_memory_utilization))
        if self.metrics.listen and heads:  # the daemon's own, on the head
            clash = listening.get((self.nodes[heads[0]].name, self.metrics.port))
            if clash:
                problems.append(("metrics.listen", f"port {self.metrics.port} is also {clash} on "
                                 f"{self.nodes[heads[0]].name}: give the metrics their own port"))
        limit = 1 - self.memory.share_margin
        for node, taken in shares.items():
            total = sum(u for _, u in taken)
            if len(taken) > 1 and total > limit + 1e-9:
                d = next(i for i, dep in enumerate(self.deployments) if dep.name == taken[-1][0])
                problems.append((f"deployments[{d}].serve.gpu_memory_utilization",
                                 f"the deployments on {node} ask for {total:.2f} of its GPU memory "
                                 f"({', '.join(f'{n} {u:g}' for n, u in taken)}), more than {limit:.2f} "
                                 f"(1 - memory.share_margin): vLLM would refuse the last to start; lower them"))
        for i, c in enumerate(self.stale.containers):
            if c in own_containers:
                problems.append((f"stale.containers[{i}]", f"{c!r} is the supervisor's own Ray container on "
                                                           f"{own_containers[c]}: remove it from the list"))
        problems += _same_machine(self.nodes)
        problems += _host_dirs(self)
        problems += _ports_and_endpoints(self)
        problems += _local_programs(self)
        _raise(problems)
        return self

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    def view(self, dep: Deployment) -> Config:
        """One deployment's own config: its nodes only, its own state directory under ours (repair log, bests,
        status), and the names of every configured deployment (``owners``: their containers are nobody's
        orphans). The reconcile machinery runs on a view, one per deployment."""
        sup = self.supervisor.model_copy(update={"state_dir": deployment_dir(self.supervisor.state_dir, dep.name)})
        v = self.model_copy(update={"deployments": [dep], "nodes": self.members(dep), "supervisor": sup})
        v._owners = frozenset(d.name for d in self.deployments)
        return v

    @property
    def owners(self) -> frozenset[str]:
        """Every configured deployment's name: a container labelled with one of them is owned."""
        return self._owners or frozenset(d.name for d in self.deployments)

    @property
    def deployment(self) -> Deployment:
        return self.deployments[0]

    def members(self, dep: Deployment) -> list[Node]:
        """The deployment's nodes, head first (Ray needs the head up before workers join)."""
        nodes = [n for n in self.nodes if not dep.nodes or n.name in dep.nodes]
        return sorted(nodes, key=lambda n: n.role != "head")

    def serve_node(self, dep: Deployment) -> Node:
        """Where the serve process runs: the head of its nodes."""
        return self.members(dep)[0]

    def endpoint(self, dep: Deployment) -> str:
        return dep.readiness.endpoint or f"http://{self.serve_node(dep).fabric_ip}:{dep.serve.port}"


