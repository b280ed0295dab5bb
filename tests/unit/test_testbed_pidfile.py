"""The testbed's daemons (each node's dockerd and sshd) are known by their pidfiles. A pidfile that outlived
its daemon (a machine restored from a snapshot, a SIGKILL) names a PID the system hands to any process
later; the testbed must then see "not running" and start the daemon, not skip it (CI at 1b2cb5a: spark-3's
sshd was never started, its stale PID being some other live process, and the stack test timed out)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from spark_testbed import testbed


def test_a_pidfile_naming_another_live_process_is_not_the_daemon(tmp_path: Path) -> None:
    pidfile = tmp_path / "sshd.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # alive, but pytest, not an sshd started with this directory
    assert testbed._alive(pidfile) == 0


def test_the_daemon_started_with_its_directory_is_alive_until_it_exits(tmp_path: Path) -> None:
    pidfile = tmp_path / "sshd.pid"
    # Its command line names its own directory, as `sshd -f <dir>/sshd_config` and `dockerd --pidfile <dir>/…` do.
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", f"{tmp_path}/sshd_config"],
                            stdin=subprocess.PIPE)
    try:
        pidfile.write_text(f"{proc.pid}\n")
        assert testbed._alive(pidfile) == proc.pid
        sibling = tmp_path.parent / (tmp_path.name + "-other") / "sshd.pid"  # a prefix of the path is not it
        sibling.parent.mkdir()
        sibling.write_text(f"{proc.pid}\n")
        assert testbed._alive(sibling) == 0
    finally:
        proc.communicate(timeout=30)
    assert testbed._alive(pidfile) == 0
    assert testbed._alive(tmp_path / "missing.pid") == 0
    (tmp_path / "junk.pid").write_text("not a pid")
    assert testbed._alive(tmp_path / "junk.pid") == 0
