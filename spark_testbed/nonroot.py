"""A normal user on the testbed's workers, as Spark owners reach their nodes (docs/privileges.md): `sparkop`,
in the docker group (the testbed engines' sockets are root:docker 0660), logging in to the worker's real sshd
with the testbed's client key, and allowed by a real sudoers rule only what the daemon runs there as root.

The nodes have no systemd and share this machine's kernel, so `systemctl` and `sysctl` are stood in per node
(spark_testbed/unitstandin.py) under <dir>/nonroot/<node>/bin: sparkop's sessions find them first (the sshd's
`Match User` PATH), sudo finds them through the rule's own secure_path, and the head's are put first on the
daemon's PATH by the test. Made by ensure() and removed whole by remove() (`spark-testbed down` too): the only
things this testbed puts under /etc are this user and /etc/sudoers.d/spark-testbed-nonroot, while a test runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from . import testbed

USER = testbed.NONROOT_USER
SUDOERS = Path("/etc/sudoers.d/spark-testbed-nonroot")
ROOT = testbed.DIR / "nonroot"
HOME = ROOT / "home"
STANDIN = Path(__file__).resolve().parent / "unitstandin.py"
PYTHON = "/usr/bin/python3"  # the system's: sparkop cannot read the dev venv's interpreter under /root


def node_dir(node: str) -> Path:
    return ROOT / node


def bin_dir(node: str) -> Path:
    return node_dir(node) / "bin"


def paths(node: str) -> dict[str, str]:
    """Where the node's stand-ins are, for specs.privilege.sudoers_rule."""
    return {p: str(bin_dir(node) / p) for p in ("systemctl", "sysctl")}


def available() -> str:
    """"" when a non-root user can be made here; else why not."""
    missing = [p for p in ("sudo", "visudo", "useradd", PYTHON) if not shutil.which(p)]
    return f"not installed: {', '.join(missing)}" if missing else ""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def _standins(node: str) -> None:
    d = node_dir(node)
    for sub in ("bin", "units"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    gpu = testbed.DIR / node / "gpu.json"
    for prog, extra in (("systemctl", ""), ("sysctl", f" '{gpu}'")):
        f = d / "bin" / prog
        f.write_text(f"#!/bin/sh\nexec {PYTHON} '{STANDIN}' {prog} '{d}'{extra} \"$@\"\n")
        f.chmod(0o755)
    (d / "calls.log").touch()


def _login_path(node: str) -> str:
    r = _run("ssh", "-F", str(testbed.DIR / "home" / ".ssh" / "config"), f"{USER}@{node}", "--", "echo $PATH")
    return r.stdout.strip() if r.returncode == 0 else ""


def ensure(node: str = "spark-2") -> None:
    """The user, the stand-ins of every node and the worker's sshd reloaded with the user's PATH (no sudoers
    rule yet: allow() writes it). Idempotent."""
    if _run("id", USER).returncode != 0:
        HOME.mkdir(parents=True, exist_ok=True)
        r = _run("useradd", "--system", "--home-dir", str(HOME), "--shell", "/bin/sh", "--groups", "docker", USER)
        if r.returncode != 0:
            raise RuntimeError(f"useradd {USER}: {r.stderr.strip()}")
        _run("usermod", "-p", "*", USER)  # no password, but not locked: sshd refuses a locked account's key
        shutil.chown(HOME, USER)
    for n in testbed.running_nodes():
        _standins(n)
    for p in (ROOT, *(node_dir(n) for n in testbed.running_nodes())):
        p.chmod(0o755)
    testbed.start_sshd(node)  # rewrites its config (with the Match block for USER); a running sshd is kept
    pid = testbed._alive(testbed._ssh_dir(node) / "sshd.pid")
    if pid:
        os.kill(pid, signal.SIGHUP)  # sshd re-executes itself with the new config; open sessions stay
    testbed.until(lambda: str(bin_dir(node)) in _login_path(node), 30, f"{USER}'s PATH on {node}")


def allow(rule: str, node: str = "spark-2") -> None:
    """The sudoers rule in place, checked by visudo first, with sudo's PATH for USER led by the node's stand-ins."""
    text = f'Defaults:{USER} secure_path="{bin_dir(node)}:/usr/sbin:/usr/bin:/sbin:/bin"\n{rule}'
    tmp = SUDOERS.with_name(".spark-testbed-nonroot.tmp")
    tmp.write_text(text)
    tmp.chmod(0o440)
    r = _run("visudo", "-cf", str(tmp))
    if r.returncode != 0:
        tmp.unlink()
        raise RuntimeError(f"visudo refused the rule: {r.stdout.strip()} {r.stderr.strip()}\n{text}")
    os.replace(tmp, SUDOERS)


def disallow() -> None:
    SUDOERS.unlink(missing_ok=True)


def plant_unit(node: str, unit: str, active: str = "active", file_state: str = "enabled") -> None:
    (node_dir(node) / "units" / unit).write_text(f"{active} {file_state}\n")


def unit(node: str, unit: str) -> tuple[str, str]:
    active, file_state = (node_dir(node) / "units" / unit).read_text().split()
    return active, file_state


def calls(node: str) -> list[str]:
    return (node_dir(node) / "calls.log").read_text().splitlines()


def remove() -> None:
    """Everything ensure() and allow() made; the worker's sshd keeps the Match block (it names no one then)."""
    disallow()
    if _run("id", USER).returncode == 0:
        # userdel refuses while a session of the user lingers (its last ssh closing): waited for, not killed.
        testbed.until(lambda: _run("userdel", USER).returncode == 0, 30, f"userdel {USER}")
    shutil.rmtree(ROOT, ignore_errors=True)
