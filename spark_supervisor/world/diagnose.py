"""The runbook's triage as a command: per node, walk down the layers with short timeouts and report the
deepest layer that answers and the first that does not, with a hint."""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass

from ..adapters import AdapterError
from ..adapters.shell import run_local
from ..adapters.sysfs import host_facts_of
from ..base import redaction
from ..config import identity
from ..judge import fabric
from ..judge.completion import health_result
from ..model import HostFacts, ProbeResult
from ..specs import commands
from .observe import NodeAdapters, World

HINTS = {
    "serve API": "the serve is down or loading: `spark-supervisor status`, then `spark-supervisor logscan` on its log",
    "container": "our Ray container is not running on this node: the supervisor re-forms the gang; if it keeps "
                 "failing, `docker logs {container}`",
    "Docker engine": "Docker does not answer: `systemctl status docker` on {node}",
    "SSH": "the host does not answer SSH: network, power, or sshd on {node}",
    "out-of-band": "the out-of-band check failed too: the machine itself is down",
}


@dataclass(frozen=True)
class Layer:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class NodeDiagnosis:
    node: str
    layers: tuple[Layer, ...]

    @property
    def deepest_ok(self) -> str:
        return next((lay.name for lay in self.layers if lay.ok), "none")

    @property
    def first_failing(self) -> Layer | None:
        failing = None
        for lay in self.layers:  # top-down: the failing layer just above the first that answers
            if lay.ok:
                break
            failing = lay
        return failing


def _layers(world: World, a: NodeAdapters, timeout: float) -> list[Layer]:
    dep = world.view.dep
    container = identity.node_container_name(dep, a.node)
    secrets = world.view.secrets

    def shown(e: Exception) -> str:
        return redaction.text(str(e), secrets)
    out: list[Layer] = []
    if a.node.role == "head":
        ep = world.api.observe_health()
        out.append(Layer("serve API", health_result(ep) == ProbeResult.SUCCESS,
                         f"{redaction.url(world.view.endpoint)}/health: {ep.state} {ep.health or ''}".strip()))
        if out[-1].ok:
            return out
    try:
        c = identity.named(a.docker.containers(), container)
        state = c.state if c is not None else "absent"
        out.append(Layer("container", state == "running", f"{container}: {state}"))
        out.append(Layer("Docker engine", True, f"{redaction.url(a.node.docker)}: version {a.docker.version()}"))
    except AdapterError as e:
        out.append(Layer("container", False, "unknown (the engine does not answer)"))
        out.append(Layer("Docker engine", False, shown(e)))
    if a.node.remote:
        try:
            a.shell.check()
            out.append(Layer("SSH", True, f"ssh {a.node.ssh}: answers"))
        except AdapterError as e:
            out.append(Layer("SSH", False, shown(e)))
    if a.node.oob:
        try:
            r = run_local(a.node.oob, timeout)
            out.append(Layer("out-of-band", r.rc == 0,
                             f"{' '.join(commands.shown_argv(world.cfg, dep, list(a.node.oob)))}: exit {r.rc}"))
        except AdapterError as e:
            out.append(Layer("out-of-band", False, shown(e)))
    # Report top-down, but the verdict reads bottom-up: stop at the first layer that answers.
    return out


def diagnose(world: World) -> list[NodeDiagnosis]:
    timeout = world.cfg.supervisor.ssh_connect_timeout
    with cf.ThreadPoolExecutor(max_workers=len(world.nodes)) as pool:
        futures = {name: pool.submit(_layers, world, a, timeout) for name, a in world.nodes.items()}
        return [NodeDiagnosis(name, tuple(f.result(timeout=timeout * 6))) for name, f in futures.items()]


def _host_facts(a: NodeAdapters) -> HostFacts | str:
    try:
        return host_facts_of(a.shell.run(commands.host_facts(a.node)))
    except AdapterError as e:
        return str(e)


def below(world: World) -> list[str]:
    """Below vLLM, as the members' hosts say now (fabric.findings): nodes that share one machine-id, the fabric's
    problems, and the nodes whose facts could not be read (unknown: said, not judged)."""
    timeout = world.cfg.supervisor.io_timeout
    with cf.ThreadPoolExecutor(max_workers=len(world.nodes)) as pool:
        futures = {name: pool.submit(_host_facts, a) for name, a in world.nodes.items()}
        got = {}
        for name, f in futures.items():
            try:
                got[name] = f.result(timeout=timeout * 2)
            except cf.TimeoutError:
                got[name] = "no answer"
    facts = {n: h for n, h in got.items() if isinstance(h, HostFacts)}
    found = fabric.findings(world.view, facts, {})  # nvidia-smi is not run here: no GPU said lost
    out = [f"warning: {w}" for w in found.warnings]
    out += [f"fabric: {p}" for p in found.problems]
    out += [f"fabric: {n}: unknown ({h})" for n, h in got.items() if isinstance(h, str)]
    return out


def render(diags: list[NodeDiagnosis], world: World, notes: list[str] | None = None) -> str:
    lines = []
    dep = world.view.dep
    for d in diags:
        failing = d.first_failing
        node = world.nodes[d.node].node
        head = f"{d.node} ({node.role}, {node.fabric_ip}): "
        if failing is None:
            lines.append(head + f"OK ({d.layers[0].name} answers)")
        else:
            hint = HINTS[failing.name].format(node=d.node, container=identity.node_container_name(dep, node))
            lines.append(head + f"deepest answering: {d.deepest_ok}; first failing: {failing.name}")
            lines.append(f"  hint: {hint}")
        for lay in d.layers:
            lines.append(f"  {'ok ' if lay.ok else 'BAD'} {lay.name:<14} {lay.detail}")
    lines += notes or []
    return "\n".join(lines)
