"""Can the unit's user reach each node and run there what needs root? The access probes of the qualification
before a load (`check --preflight`; the daemon may call ``check_access`` before a start): each worker's host
key tried on both SSH paths (ssh(1) strict, and the Docker engine's ssh://), and the privilege prefix asked,
without running them, about exactly the commands that need root on the node. Judged in judge.access."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from ..adapters import AdapterError
from ..adapters.docker import DockerEngine
from ..adapters.shell import NodeShell, SshKeys, run_local, ssh_g, ssh_options
from ..config import Config, Node
from ..judge import access
from ..judge.access import Answer, Finding
from ..specs import privilege

__all__ = ["Finding", "check_access", "problems"]


def _known_hosts(node: Node) -> str:
    """The file a host key is looked up in, as the message names it: the node's, else the running user's."""
    return node.known_hosts or os.path.join(os.path.expanduser("~"), ".ssh", "known_hosts")


def _ssh_endpoint(target: str, timeout: float) -> tuple[str, int, str]:
    """Host, port and user as ssh(1) resolves ``target`` through the ssh config (``ssh -G``)."""
    conf = ssh_options(ssh_g(target, timeout))
    return conf.get("hostname", target), int(conf.get("port", "22") or 22), conf.get("user", "")


def _ssh_host_key(node: Node, timeout: float, connect_timeout: float) -> Finding:
    host, port, _ = _ssh_endpoint(node.ssh, timeout)
    # No shared connection: a master another process opened would skip the host key check.
    shell = NodeShell(node.name, node.ssh, timeout=timeout, connect_timeout=connect_timeout,
                      keys=SshKeys.of(node), strict=True)
    r = run_local(shell.argv(["true"]), timeout)
    return access.host_key_ssh(node.name, host, port, _known_hosts(node), r.rc, r.err)


def _docker_host_key(node: Node, timeout: float) -> Finding:
    url = urlsplit(node.docker)
    engine = DockerEngine(node.name, node.docker, timeout=timeout, keys=SshKeys.of(node))
    try:
        engine.version()
        kind, detail = "", ""
    except AdapterError as e:
        kind, detail = e.reason, str(e.args[0])
    finally:
        engine.close()
    # Named as the ssh config resolves it, as docker-py's SSH client does (its HostName and Port).
    host, port, _ = _ssh_endpoint(url.hostname or "", timeout)
    return access.host_key_docker(node.name, host, url.port or port, _known_hosts(node), kind, detail)


def _ask(shell: NodeShell, argv: list[str]) -> Answer | None:
    try:
        r = shell.run(argv)
    except AdapterError:
        return None
    return Answer(r.rc, r.err)


def _privilege(cfg: Config, node: Node, shell: NodeShell) -> Finding:
    needed = privilege.root_commands(cfg, node)
    if not needed:
        return access.privilege(node.name, "", None, list(node.become), [], [], "")
    if not node.ssh and os.geteuid() != 0 and not node.become:
        # The head's commands are run by the daemon itself, as root under its unit: this user is not it.
        return Finding(node.name, "privilege", unknown=f"checked as uid {os.geteuid()}, not as the daemon's user "
                                                       "(the unit runs it as root): run the preflight as root")
    uid_out = _ask_out(shell, ["id", "-u"])
    uid = int(uid_out) if uid_out.isdigit() else None
    user = _ask_out(shell, ["id", "-un"]) or "<user>"
    probes = [access.sudo_probe(list(node.become), argv) for argv in needed]
    answers = [_ask(shell, p) for p in probes if p is not None]
    paths = {p: found for p in privilege.PATHS if (found := _ask_out(shell, ["sh", "-c", 'command -v "$1"', "sh", p]))
             and found.startswith("/")}
    return access.privilege(node.name, user, uid, list(node.become), needed, answers,
                            privilege.sudoers_rule(user, needed, paths))


def _ask_out(shell: NodeShell, argv: list[str]) -> str:
    try:
        r = shell.run(argv)
    except AdapterError:
        return ""
    return r.out.strip() if r.rc == 0 else ""


def _node(cfg: Config, node: Node, timeout: float, connect_timeout: float) -> list[Finding]:
    found = []
    if node.ssh:
        found.append(_ssh_host_key(node, timeout, connect_timeout))
    if node.docker.startswith("ssh://"):
        found.append(_docker_host_key(node, timeout))
    if node.ssh and not found[0].ok:  # the node's own commands cannot be asked over a path that fails
        found.append(Finding(node.name, "privilege", unknown="not asked: ssh does not get through"))
        return found
    shell = NodeShell(node.name, node.ssh, timeout=timeout, connect_timeout=connect_timeout, keys=SshKeys.of(node))
    found.append(_privilege(cfg, node, shell))
    return found


def check_access(cfg: Config, nodes: Sequence[Node], *, timeout: float, connect_timeout: float) -> list[Finding]:
    """Every access check of every node in ``nodes``, the nodes in parallel, each answer in order of the
    nodes: a finding's ``reason`` is a problem (positive evidence), its ``unknown`` a check that could not
    be judged. Reads only; runs nothing that changes a node (sudo -l lists, it does not run)."""
    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="access") as pool:
        done = list(pool.map(lambda n: _node(cfg, n, timeout, connect_timeout), nodes))
    return [f for per_node in done for f in per_node]


def problems(found: list[Finding]) -> list[Finding]:
    """The findings that are problems (a reason), in order."""
    return [f for f in found if f.reason is not None]


def shown(f: Finding) -> str:
    """A finding on one line (its hint's sudoers lines after it, indented)."""
    head, _, rest = str(f).partition("\n")
    return head + "".join(f"\n    {line}" for line in rest.splitlines()) if rest else head
