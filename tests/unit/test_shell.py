"""The SSH shell at its edge (issue 21): the argument list a node's command becomes (never a shell string),
and what comes back from real processes: output, exit code and stderr as they are, a command hanging past
its timeout ended and reported, a worker whose sshd refuses reported as unreachable (real ssh against a
bound port on 127.0.0.1 that does not listen: refused at once, whatever the machine's load)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_supervisor.adapters import AdapterError, TransientError, Unreachable
from spark_supervisor.adapters.shell import NodeShell, Result, control_dir, run_local, ssh_config_file
from spark_testbed.testbed import until

# What a command's arguments may hold that a shell would read (split, expand, run): each must arrive as it is.
TRICKY = ["a b", "$(echo expanded)", "`echo expanded`", "it's", '"quoted"', "; echo injected", "*", "$HOME", ""]


def gone(pattern: list[str], deadline: float = 20.0) -> bool:
    """No process of this exact argv is left, waited for up to ``deadline`` seconds."""
    want = "\0".join(pattern).encode() + b"\0"

    def none_left() -> bool:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == want:
                    return False
            except OSError:
                pass
        return True
    try:
        until(none_left, deadline, f"no process {pattern}", every=0.05)
    except TimeoutError:
        return False
    return True


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """$HOME in the test's directory, without an ssh config until a test writes one."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(h))
    return h


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[str]:
    path = control_dir(str(tmp_path / "state"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def refusing() -> Iterator[int]:
    """A port on 127.0.0.1 bound (so no one else takes it) and not listening: a connect there is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def worker(home: Path, port: int, ctl: str = "") -> NodeShell:
    """A worker reached as `edge-worker`, which the ssh config in $HOME names 127.0.0.1:port."""
    (home / ".ssh" / "config").write_text(f"Host edge-worker\n  HostName 127.0.0.1\n  Port {port}\n")
    return NodeShell("spark-2", "edge-worker", timeout=30, connect_timeout=2, control_dir=ctl)


# --------------------------------------------------------------------------------------------- argv
def test_a_local_node_runs_the_argv_itself_and_no_shell_reads_it() -> None:
    sh = NodeShell("spark-1", "", timeout=30, connect_timeout=5)
    argv = ["printf", r"%s\n", *TRICKY]
    assert sh.argv(argv) == argv
    assert sh.run(argv) == Result(0, "".join(f"{a}\n" for a in TRICKY), "")


@pytest.mark.usefixtures('home')
def test_a_workers_argv_is_ssh_with_its_options_the_target_and_the_command_quoted_once(ctl: str) -> None:
    sh = NodeShell("spark-2", "root@spark-2", timeout=30, connect_timeout=3, control_dir=ctl)
    argv = sh.argv(["printf", r"%s\n", *TRICKY])
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert argv[0] == "ssh" and "-F" not in argv  # no ssh config in $HOME: none passed
    target = argv.index("root@spark-2")
    assert argv[target + 1] == "--" and len(argv) == target + 3  # the target, then one remote command
    opts = argv[1:target]
    assert opts[0::2] == ["-o"] * (len(opts) // 2)
    options = dict(o.split("=", 1) for o in opts[1::2])
    assert options == {"BatchMode": "yes", "ConnectTimeout": "3", "ServerAliveInterval": "5",
                       "ServerAliveCountMax": "2", "ControlMaster": "auto", "ControlPath": f"{ctl}/ssh-%C",
                       "ControlPersist": "120"}
    assert shlex.split(argv[-1]) == ["printf", r"%s\n", *TRICKY]  # the remote shell reads it back exactly


@pytest.mark.usefixtures('home')
def test_without_a_control_dir_no_connection_is_shared_and_a_short_timeout_is_a_second() -> None:
    argv = NodeShell("spark-2", "root@spark-2", timeout=30, connect_timeout=0.2).argv(["true"])
    assert not any(a.startswith("Control") for a in argv)
    assert "ConnectTimeout=1" in argv  # ssh takes whole seconds; 0 would mean its default


def test_the_ssh_config_in_home_is_passed_explicitly(home: Path) -> None:
    assert ssh_config_file() == ""
    (home / ".ssh" / "config").write_text("Host *\n  ServerAliveInterval 9\n")
    assert ssh_config_file() == str(home / ".ssh" / "config")
    argv = NodeShell("spark-2", "root@spark-2", timeout=30, connect_timeout=3).argv(["true"])
    assert argv[:3] == ["ssh", "-F", str(home / ".ssh" / "config")]


def test_the_control_dir_is_short_private_and_one_per_state_dir(tmp_path: Path, ctl: str) -> None:
    assert ctl.startswith("/tmp/") and control_dir(str(tmp_path / "state")) == ctl
    st = os.stat(ctl)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert len(f"{ctl}/ssh-{'0' * 40}") < 108  # ssh's %C is 40 hex digits; a unix socket path fits 107 bytes
    other = control_dir(str(tmp_path / "another-state"))
    try:
        assert other and other != ctl
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_control_dir_others_could_enter_is_not_used(tmp_path: Path, ctl: str) -> None:
    os.chmod(ctl, 0o755)
    assert control_dir(str(tmp_path / "state")) == ""  # connection sharing off rather than a socket exposed


# ------------------------------------------------------------------------------------ real processes
def test_exit_code_output_and_stderr_come_back_as_they_are() -> None:
    r = run_local(["sh", "-c", "printf 'out\\n'; printf 'err: no such unit\\n' >&2; exit 3"], timeout=30)
    assert r == Result(3, "out\n", "err: no such unit\n")  # a failure is a result, not an error


def test_a_missing_command_is_an_adapter_error_that_says_which() -> None:
    with pytest.raises(AdapterError) as e:
        run_local(["spark-no-such-command-xyz", "--help"], timeout=30)
    assert e.value.reason == "CommandNotFound" and "spark-no-such-command-xyz is not installed" in str(e.value)
    assert not isinstance(e.value, TransientError)  # not there now is not there on retry


def test_a_command_hanging_past_its_timeout_is_ended_and_reported() -> None:
    argv = ["sleep", f"600.{os.getpid()}"]  # a process of its own, told apart by its argument
    t0 = time.monotonic()
    with pytest.raises(TransientError) as e:
        run_local(argv, timeout=0.5)
    assert time.monotonic() - t0 < 60  # it did not wait for the command (a generous bound on a busy machine)
    assert e.value.reason == "CommandTimeout" and str(e.value).startswith("CommandTimeout: sleep did not finish")
    assert gone(argv)  # ended, not left behind


def test_a_nodes_shell_ends_a_hanging_command_at_the_calls_timeout_rather_than_its_own() -> None:
    argv = ["sleep", f"601.{os.getpid()}"]
    sh = NodeShell("spark-1", "", timeout=600, connect_timeout=5)
    with pytest.raises(TransientError, match="CommandTimeout"):
        sh.run(argv, timeout=0.5)
    assert gone(argv)


# ------------------------------------------------------------------- a worker, through a stand-in ssh
@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first on PATH that does what sshd does with the command (hands it to a shell), and records
    the arguments it was given; "refused" as the target answers as ssh does when it cannot connect."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh-args"
    (bin_dir / "ssh").write_text(f"""#!/bin/sh
printf '%s\\n' "$@" > {shlex.quote(str(log))}
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
    [ "$1" = refused ] && {{ echo "ssh: connect to host refused port 22: Connection refused" >&2; exit 255; }}
    shift
done
shift
exec sh -c "$1"
""")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


@pytest.mark.usefixtures('home')
def test_a_workers_command_reaches_its_shell_argument_for_argument(fake_ssh: Path) -> None:
    sh = NodeShell("spark-2", "root@spark-2", timeout=30, connect_timeout=3)
    assert sh.run(["printf", r"%s\n", *TRICKY]) == Result(0, "".join(f"{a}\n" for a in TRICKY), "")
    assert "root@spark-2" in fake_ssh.read_text().splitlines()


@pytest.mark.usefixtures('home', 'fake_ssh')
def test_a_workers_failing_command_comes_back_as_it_is() -> None:
    sh = NodeShell("spark-2", "root@spark-2", timeout=30, connect_timeout=3)
    r = sh.run(["sh", "-c", "echo partial; echo 'Unit vllm.service not loaded.' >&2; exit 5"])
    assert r == Result(5, "partial\n", "Unit vllm.service not loaded.\n")


@pytest.mark.usefixtures('home', 'fake_ssh')
def test_ssh_failing_to_connect_is_unreachable_with_its_own_words() -> None:
    sh = NodeShell("spark-2", "refused", timeout=30, connect_timeout=3)
    with pytest.raises(Unreachable) as e:
        sh.run(["true"])
    assert e.value.reason == "SshUnreachable"
    assert str(e.value) == "SshUnreachable: ssh refused: ssh: connect to host refused port 22: Connection refused"


# ----------------------------------------------------------------------- a worker, through real ssh
def test_check_on_a_worker_whose_sshd_refuses_is_unreachable(home: Path, refusing: int, ctl: str) -> None:
    sh = worker(home, refusing, ctl)
    with pytest.raises(Unreachable) as e:
        sh.check()
    assert e.value.reason == "SshUnreachable"
    assert f"ssh edge-worker: ssh: connect to host 127.0.0.1 port {refusing}: Connection refused" in str(e.value)
    with pytest.raises(Unreachable, match="Connection refused"):
        sh.run(["systemctl", "is-active", "docker"])  # any command: not a result with rc 255


def test_reachable_connects_where_ssh_would_and_says_where_it_was_refused(home: Path, refusing: int) -> None:
    sh = worker(home, refusing)
    with pytest.raises(Unreachable) as e:
        sh.reachable()
    assert e.value.reason == "SshUnreachable"
    assert str(e.value).startswith(f"SshUnreachable: edge-worker (127.0.0.1:{refusing}): ")
    assert "refused" in str(e.value).lower()


def test_reachable_passes_on_a_listening_port_and_keeps_the_address_it_resolved(home: Path, refusing: int) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        sh = worker(home, listening.getsockname()[1])
        sh.reachable()
        worker(home, refusing)  # the config now says elsewhere: the address already resolved stands
        sh.reachable()  # (were it resolved again, the connect would be refused)


def test_the_head_is_always_reachable_and_its_check_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # any command run would fail
    sh = NodeShell("spark-1", "", timeout=30, connect_timeout=5)
    sh.check()
    sh.reachable()


def test_what_a_hanging_command_started_is_ended_with_it() -> None:
    """A shell's children die with it: a command's whole session is killed at its timeout."""
    child = ["sleep", f"602.{os.getpid()}"]
    with pytest.raises(TransientError, match="CommandTimeout"):
        run_local(["sh", "-c", f"{' '.join(child)} & wait"], timeout=0.5)
    assert gone(child)
