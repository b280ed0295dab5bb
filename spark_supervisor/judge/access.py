"""Whether the unit's user can reach a node and run there what needs root: pure judgements of the access
probes' answers (world.access runs them). Only positive evidence is a problem: a probe that could not run
is an unknown, shown as such, never a verdict."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ..model import Kind, Reason


@dataclass(frozen=True)
class Finding:
    """One check of one node: a problem (``reason``, the fix in ``hint``), an unknown (``unknown``: why it
    could not be judged) or neither (it passed)."""

    node: str
    check: str  # "ssh host key", "docker ssh:// host key", "privilege"
    reason: Reason | None = None
    hint: str = ""
    unknown: str = ""

    @property
    def ok(self) -> bool:
        return self.reason is None and not self.unknown

    def __str__(self) -> str:
        if self.reason is not None:
            return f"{self.node}: {self.check}: {self.reason}" + (f" (hint: {self.hint})" if self.hint else "")
        return f"{self.node}: {self.check}: " + (f"unknown: {self.unknown}" if self.unknown else "OK")


def _keyscan(host: str, port: int, known_hosts: str) -> str:
    p = f"-p {port} " if port != 22 else ""
    return (f"as the unit's user (root), after checking the host's fingerprint: `ssh-keyscan -H {p}{host} >> "
            f"{known_hosts}`, or set nodes.known_hosts to a file that has it")


def host_key_ssh(node: str, host: str, port: int, known_hosts: str, rc: int, err: str) -> Finding:
    """`ssh -o BatchMode=yes -o StrictHostKeyChecking=yes <target> true`'s answer. 255 with ssh's own host
    key refusal: a problem; any other 255 (refused, no route, a bad login): unknown here (the node is
    unreachable, which the observation says); anything else: ssh got past the host key."""
    check = "ssh host key"
    if rc != 255:
        return Finding(node, check)
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
        return Finding(node, check, Reason(Kind.HOST_KEY_CHANGED, f"the key {host}:{port} offers is not the one "
                                           f"recorded in {known_hosts}"),
                       f"if the host was reinstalled: `ssh-keygen -R '[{host}]:{port}' -f {known_hosts}`, then "
                       + _keyscan(host, port, known_hosts))
    if "Host key verification failed" in err or "host key is known" in err:
        return Finding(node, check, Reason(Kind.HOST_KEY_UNKNOWN, f"{host}:{port} is not in {known_hosts} (ssh: "
                                           f"{_last(err)})"), _keyscan(host, port, known_hosts))
    return Finding(node, check, unknown=f"ssh failed: {_last(err) or 'exit 255'}")


def host_key_docker(node: str, host: str, port: int, known_hosts: str, kind: str, detail: str) -> Finding:
    """The ssh:// engine's connect: ``kind`` is the adapter error's ("" when it answered)."""
    check = "docker ssh:// host key"
    if not kind:
        return Finding(node, check)
    if kind == Kind.HOST_KEY_UNKNOWN:
        return Finding(node, check, Reason(Kind.HOST_KEY_UNKNOWN, f"{host}:{port} is not in {known_hosts} "
                                           f"(docker-py's SSH client refuses unknown hosts: {detail[-160:]})"),
                       _keyscan(host, port, known_hosts))
    if kind == Kind.HOST_KEY_CHANGED:
        return Finding(node, check, Reason(Kind.HOST_KEY_CHANGED, detail[-200:]),
                       f"if the host was reinstalled: `ssh-keygen -R '[{host}]:{port}' -f {known_hosts}`, then "
                       + _keyscan(host, port, known_hosts))
    return Finding(node, check, unknown=f"{kind}: {detail[-200:]}")


def _last(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][-200:] if lines else ""


def sudo_probe(become: list[str], argv: list[str]) -> list[str] | None:
    """How to ask ``become`` whether it would run ``argv`` without running it: `sudo -n -l <argv>` answers
    (exit 0, the command's path) or refuses (exit 1). None for any other prefix (doas, run0, pkexec: none
    answers without running the command)."""
    if not become or become[0].rsplit("/", 1)[-1] != "sudo":
        return None
    return [*become, *([] if "-n" in become else ["-n"]), "-l", *argv]


@dataclass(frozen=True)
class Answer:
    """What one probe command answered: its exit code and stderr; None when it could not be run at all."""

    rc: int
    err: str = ""


def privilege(node: str, user: str, uid: int | None, become: list[str], needed: list[list[str]],
              answers: list[Answer | None], rule: str) -> Finding:
    """Whether the node's user can run each of ``needed`` (the commands that need root there, without the
    prefix; specs.privilege.root_commands): ``uid`` is the user's (None: unread); ``answers`` the prefix's
    (sudo_probe) answer to each, in order ([] when there is no prefix or it cannot be asked); ``rule``
    the sudoers lines that would allow them."""
    check = "privilege"
    if not needed:
        return Finding(node, check)
    if uid is None:
        return Finding(node, check, unknown="the user's uid could not be read")
    if not become:
        if uid == 0:
            return Finding(node, check)
        return Finding(node, check, Reason(Kind.NO_PRIVILEGE, f"{user} (uid {uid}) is not root and nodes.become is "
                                           f"not set: `{shlex.join(needed[0])}` would fail"
                                           + (f" (and {len(needed) - 1} more)" if len(needed) > 1 else "")),
                       f"set become = [\"sudo\", \"-n\"] for {node} and allow exactly these commands on it "
                       f"(/etc/sudoers.d/spark-supervisor, `visudo -cf` it):\n{rule}")
    if not answers:
        return Finding(node, check, unknown=f"{become[0]} cannot be asked without running the commands: "
                                            "check them by hand (docs/privileges.md)")
    for argv, answer in zip(needed, answers, strict=True):
        if answer is None:
            return Finding(node, check, unknown=f"`{shlex.join([*become, *argv])}` could not be asked")
        if answer.rc == 0:
            continue
        if answer.rc not in (1, 127):
            return Finding(node, check, unknown=f"`{shlex.join([*become, '-l', *argv])}`: exit {answer.rc}: "
                                                f"{_last(answer.err)}")
        why = f"{become[0]} is not installed" if answer.rc == 127 else (_last(answer.err) or "not allowed")
        return Finding(node, check, Reason(Kind.NO_PRIVILEGE, f"{user} may not run `{shlex.join([*become, *argv])}` "
                                           f"({why})"),
                       f"allow exactly these commands to {user} on {node} (/etc/sudoers.d/spark-supervisor, "
                       f"`visudo -cf` it):\n{rule}")
    return Finding(node, check)


# What a command that needs root says when the node's user may not run it: polkit's answer to systemctl, sudo's
# own refusals, the kernel's to a write under /proc/sys. Seen in an action's stderr, it is NoPrivilege (the same
# on every retry), not a transient failure.
_DENIED = re.compile(r"Access denied|Interactive authentication required|a password is required|"
                     r"is not allowed to execute|a terminal is required|not in the sudoers file|"
                     r"Permission denied|permission denied on key|Operation not permitted")


def denied(err: str) -> bool:
    return bool(_DENIED.search(err[-2000:]))


PRIVILEGE_HINT = ("the node's user may not run it: set nodes.become = [\"sudo\", \"-n\"] and the sudoers rule "
                  "`spark-supervisor check --preflight` prints (docs/privileges.md), then `spark-supervisor reset`")

