"""`spark-supervisor logs` reads only regular files in the node's log directory (issue 19, item 11): the
container writes there, so a link it plants (to a host file, or `current` pointing outside), a FIFO (which
would hang a reader) or a linked directory is not read, not followed, and says so. Real files, the real
CLI in a subprocess (a hang is a timeout, not a stuck suite), and the scripts that run over SSH run here
under sh on the same directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_supervisor.base import files
from spark_supervisor.world import servelogs
from spark_supervisor.world.servelogs import FOLLOW, LIST, READ, log_name
from spark_testbed.testbed import until
from tests.helpers import data

SECRET = "root:x:0:0:the-host-secret"
OLD = log_name("2026-12-03T08:00:00Z", "spark-1", "aaa")
LINKED = log_name("2026-12-03T09:00:00Z", "spark-1", "bbb")  # newer than the real one: a link to the secret
PIPE = log_name("2026-12-03T10:00:00Z", "spark-1", "ccc")  # newest: a FIFO


def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A config and its head's log directory: one real log, the rest planted."""
    secret = tmp_path / "passwd"
    secret.write_text(SECRET + "\n")
    d = data()
    d["deployments"][0]["serve"]["log_host_dir"] = str(tmp_path / "serve-logs")
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps(d))
    logs = tmp_path / "serve-logs" / "qwen" / "spark-1"
    logs.mkdir(parents=True)
    (logs / OLD).write_text("the real log\n")
    (logs / f"{OLD}.1").symlink_to(secret)  # its "older part"
    (logs / LINKED).symlink_to(secret)
    os.mkfifo(logs / PIPE)
    (logs / servelogs.CURRENT).symlink_to(secret)
    return config, logs


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_supervisor", "logs", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_only_the_regular_log_is_read_locally(tmp_path: Path) -> None:
    config, logs = planted(tmp_path)
    out = cli("--config", str(config))
    assert out.returncode == 0, out.stderr
    assert out.stdout == "the real log\n" and SECRET not in out.stdout
    assert f"{logs}/{OLD} (launch 2026-12-03T08:00:00Z" in out.stderr
    assert cli("--previous", "--config", str(config)).returncode == 1  # the planted ones are no launches


def test_a_file_swapped_for_a_link_after_listing_is_refused(tmp_path: Path) -> None:
    config, logs = planted(tmp_path)
    cfg = _cfg(config)
    names = servelogs._list(servelogs._shell(cfg, cfg.nodes[0]), str(logs), "spark-1")
    assert sorted(names) == [OLD]
    (logs / OLD).unlink()
    (logs / OLD).symlink_to(tmp_path / "passwd")
    with pytest.raises(files.Refused, match="is a symbolic link"):
        fd = servelogs._open_dir(str(logs))
        try:
            list(servelogs._lines(fd, OLD))
        finally:
            os.close(fd)


def _cfg(config: Path) -> Any:
    from spark_supervisor import config as config_mod
    return config_mod.load(config)


def test_a_linked_node_directory_is_not_read(tmp_path: Path) -> None:
    config, logs = planted(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / OLD).write_text(SECRET + "\n")
    os.rename(logs, tmp_path / "moved")
    logs.symlink_to(elsewhere)
    out = cli("--config", str(config))
    assert out.returncode == 1 and SECRET not in out.stdout
    assert f"{logs} is a symbolic link: not read" in out.stderr
    r = _sh(LIST, str(logs))
    assert r.returncode == 4 and "is a symbolic link" in r.stderr and OLD not in r.stdout


def _sh(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script, "spark-logs", *args], capture_output=True, text=True, timeout=30,
                          check=False, stdin=subprocess.DEVNULL)


def test_the_remote_scripts_list_and_read_only_regular_files(tmp_path: Path) -> None:
    _, logs = planted(tmp_path)
    r = _sh(LIST, str(logs))
    assert r.returncode == 0 and r.stdout.split() == [OLD], r
    r = _sh(READ, str(logs), "+1", f"{OLD}.1", OLD)
    assert r.stdout == "the real log\n" and f"{OLD}.1: not a regular file: not read" in r.stderr
    r = _sh(READ, str(logs), "5", PIPE, LINKED, "../../../passwd")  # a FIFO does not hang it
    assert r.stdout == "" and SECRET not in r.stdout and r.stderr.count("not a regular file") == 3, r
    assert _sh(LIST, str(tmp_path / "none")).returncode == 3


def test_follow_follows_only_a_regular_file_beside_current(tmp_path: Path) -> None:
    _, logs = planted(tmp_path)
    current = logs / servelogs.CURRENT
    p = subprocess.Popen(["sh", "-c", FOLLOW, "spark-logs", str(logs), "2"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    out: list[bytes] = []
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: out.extend(p.stdout or ()), daemon=True)
    reader.start()
    err_reader = threading.Thread(target=lambda: err.extend(p.stderr or ()), daemon=True)
    err_reader.start()
    try:
        def point(target: str) -> None:
            tmp = logs / "current.tmp"
            tmp.symlink_to(target)
            os.replace(tmp, current)

        for target in ("../../../passwd", LINKED, PIPE):  # outside, a link, a FIFO: never followed
            point(target)
            until(lambda: f"{target}: not a regular file: not followed\n".encode() in err, 30,  # noqa: B023
                  f"{target} refused")
        new = log_name("2026-12-03T11:00:00Z", "spark-1", "ddd")
        (logs / new).write_text("one\ntwo\nthree\n")
        point(new)
        until(lambda: out == [b"two\n", b"three\n"], 30, "the last lines of the real launch")
        with open(logs / new, "a") as f:
            f.write("four\n")
        until(lambda: out[-1:] == [b"four\n"], 30, "a line appended")
        newer = log_name("2026-12-03T12:00:00Z", "spark-1", "eee")
        (logs / newer).write_text("a\nb\nc\n")
        point(newer)
        until(lambda: out[-3:] == [b"a\n", b"b\n", b"c\n"], 30, "a new launch, whole")
        assert p.stdin is not None
        p.stdin.close()  # the local side goes away: it ends, with its tail
        assert p.wait(timeout=30) == 0
        reader.join(timeout=30)
        assert not reader.is_alive(), "a tail left holding its output"
    finally:  # the whole group: a tail left behind would hold the pipe the reader reads
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        reader.join(timeout=30)
        err_reader.join(timeout=30)
        for pipe in (p.stdin, p.stdout, p.stderr):
            if pipe:
                with contextlib.suppress(BrokenPipeError):
                    pipe.close()
    assert not any(SECRET.encode() in line for line in out)


def test_logs_follow_runs_the_checked_script_locally_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, logs = planted(tmp_path)
    seen: list[tuple[list[str], bool]] = []
    def stream(argv: list[str], _key: str, *, timeout: float | None, hold_stdin: bool) -> int:  # noqa: ARG001  (given as timeout=)
        seen.append((argv, hold_stdin))
        return 0
    monkeypatch.setattr(servelogs, "_stream", stream)
    cfg = _cfg(config)
    assert servelogs.show(cfg, cfg.deployments[0], cfg.nodes[0], previous=False, follow=True, lines=3) == 0
    assert seen == [(["sh", "-c", FOLLOW, "spark-logs", str(logs), "3"], True)]
