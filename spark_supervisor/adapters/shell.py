"""Run an argument list on a node: locally on the head, over SSH on workers. Always with a timeout."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import AdapterError, TransientError, Unreachable

if TYPE_CHECKING:
    from ..config import Node


@dataclass(frozen=True)
class SshKeys:
    """Which host keys a node's SSH trusts and which key it logs in with ([[nodes]] known_hosts and
    identity_file), for both ways a node is reached over SSH: ssh(1) (``ssh_argv``) and the Docker engine's
    ssh:// (adapters.dockerssh). "": the running user's own (ssh: its config and ~/.ssh/known_hosts;
    docker-py: $HOME/.ssh/known_hosts)."""

    known_hosts: str = ""
    identity_file: str = ""

    @classmethod
    def of(cls, node: Node) -> SshKeys:
        return cls(node.known_hosts, node.identity_file)

    def options(self) -> list[str]:
        """ssh(1)'s options for them (none for the defaults)."""
        opts = ["-o", f"UserKnownHostsFile={self.known_hosts}"] if self.known_hosts else []
        # IdentitiesOnly: the key given, not whatever an agent offers first (sshd's MaxAuthTries counts them).
        return opts + (["-i", self.identity_file, "-o", "IdentitiesOnly=yes"] if self.identity_file else [])


NO_KEYS = SshKeys()


def ssh_argv(target: str, argv: list[str], *, connect_timeout: float, control_dir: str = "",
             config_file: str = "", keys: SshKeys = NO_KEYS, strict: bool = False) -> list[str]:
    """ssh runs the remote command through the remote shell, so quote each argument exactly once.
    strict: an unknown host key fails whatever the user's ssh config says (StrictHostKeyChecking=yes), as
    docker-py's ssh:// always does; the access check (world.access) asks so."""
    opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(connect_timeout))}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2"]
    opts += ["-o", "StrictHostKeyChecking=yes"] if strict else []
    opts += keys.options()
    if config_file:
        opts = ["-F", config_file, *opts]
    if control_dir:
        opts += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control_dir}/ssh-%C",
                 "-o", "ControlPersist=120"]
    return ["ssh", *opts, target, "--", shlex.join(argv)]


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


def ssh_config_file() -> str:
    """ssh(1) reads the passwd home, not $HOME; pass $HOME's config explicitly so that ssh and
    docker-py's paramiko transport (which does read $HOME) agree on hosts, keys and known_hosts."""
    path = os.path.join(os.path.expanduser("~"), ".ssh", "config")
    return path if os.path.exists(path) else ""


def control_dir(state_dir: str) -> str:
    """A short private directory for ssh ControlMaster sockets (unix socket paths max out at 108 bytes)."""
    path = f"/tmp/spark-supervisor-ssh-{hashlib.sha256(state_dir.encode()).hexdigest()[:10]}"
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            return ""  # not ours: go without connection sharing
    except OSError:
        return ""
    return path


def decoded(raw: bytes) -> str:
    """A program's output as text, whatever its bytes: anyone on a host names a process (prctl
    PR_SET_NAME) or a file, and `ss`, nvidia-smi or a log print the name raw. A byte that is not UTF-8 is
    kept visible as ``\\xNN`` (escaped for display), never an error."""
    return raw.decode("utf-8", errors="backslashreplace")


def printable(text: str) -> str:
    """A name from outside, safe to show on one line: control characters (a newline in a process name, an
    escape sequence) written as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def ssh_g(target: str, timeout: float) -> str:
    """ssh(1)'s own reading of ``target`` through its config (`ssh -G`): one "option value" per line."""
    return run_local(["ssh", *(["-F", ssh_config_file()] if ssh_config_file() else []), "-G", target], timeout).out


def ssh_options(text: str) -> dict[str, str]:
    """`ssh -G`'s lines as option -> value (options in lower case, as it prints them)."""
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def run_local(argv: list[str], timeout: float) -> Result:
    """``argv`` in a session of its own: past its timeout the whole session is killed, so nothing it
    started (a shell's children, say a hung `ss`) is left behind on the host, one per tick. A program that
    cannot be started (missing, not executable, busy, not a program) is an AdapterError with the reason."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    except FileNotFoundError:
        raise AdapterError("CommandNotFound", f"{argv[0]} is not installed") from None
    except OSError as e:  # EACCES, ENOEXEC, ETXTBSY, E2BIG, ENOMEM...
        raise AdapterError("CommandNotStarted", f"{argv[0]}: {e.strerror or type(e).__name__}") from None
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.communicate(timeout=5)  # reaped; its pipes close with the session (one a stray holds: not waited on)
        p.kill()
        p.wait()
        raise TransientError("CommandTimeout", f"{argv[0]} did not finish within {timeout:g}s") from None
    return Result(p.returncode, decoded(out), decoded(err))


class NodeShell:
    def __init__(self, node_name: str, ssh_target: str, *, timeout: float, connect_timeout: float,
                 control_dir: str = "", keys: SshKeys = NO_KEYS, strict: bool = False):
        self.node, self.target = node_name, ssh_target
        self.timeout, self.connect_timeout, self.control_dir = timeout, connect_timeout, control_dir
        self.keys, self.strict = keys, strict
        self._addr: tuple[str, int] | None = None

    def argv(self, argv: list[str]) -> list[str]:
        if not self.target:
            return argv
        return ssh_argv(self.target, argv, connect_timeout=self.connect_timeout, control_dir=self.control_dir,
                        config_file=ssh_config_file(), keys=self.keys, strict=self.strict)

    def run(self, argv: list[str], timeout: float | None = None) -> Result:
        r = run_local(self.argv(argv), timeout or self.timeout)
        if self.target and r.rc == 255:
            raise Unreachable("SshUnreachable", f"ssh {self.target}: {r.err.strip()[-200:] or 'failed'}")
        return r

    def check(self) -> None:
        """Raise SshUnreachable unless the node answers over SSH (a no-op on the head)."""
        if self.target:
            self.run(["true"], timeout=self.connect_timeout + 5)

    def reachable(self) -> None:
        """A cheap pre-check before docker-py's SSH transport (which has no connect timeout of its own):
        a TCP connect to the node's sshd, address and port as ssh(1) resolves them (cached)."""
        if not self.target:
            return
        if self._addr is None:
            conf = ssh_options(ssh_g(self.target, self.timeout))
            self._addr = (conf.get("hostname", self.target), int(conf.get("port", "22")))
        try:
            socket.create_connection(self._addr, timeout=self.connect_timeout).close()
        except OSError as e:
            raise Unreachable("SshUnreachable", f"{self.target} ({self._addr[0]}:{self._addr[1]}): {e}") from None
