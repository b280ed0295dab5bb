"""What a request, a saved file or a half-written config can do to the running daemon (issue 19, items 1, 3,
4, 9 and the runtime LOW items): nothing that ends it, stops it, or tears a deployment down. Fake backend
and clock; the control socket, the state directory and its files are real."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_supervisor.base import files
from spark_supervisor.loop.daemon import StateDirUnfit, lock_state_dir
from spark_supervisor.model import Pause, Phase
from spark_supervisor.state import control, statefile
from spark_supervisor.state.maintenance import parse_duration
from spark_supervisor.state.maintenance import pause as cli_pause
from tests.fakes import make
from tests.helpers import obs, sole, view_of

BAD_UNTIL = [float("nan"), float("inf"), "tomorrow", [1], {"t": 1}, True, 1e30, 1.0]  # 1.0: long past


# ------------------------------------------------------------------------------------ 1: the pause
@pytest.mark.parametrize("until", BAD_UNTIL)
def test_a_pause_that_cannot_be_shown_is_refused_where_it_is_made(until: Any) -> None:
    with pytest.raises(ValueError, match="pause until"):
        Pause(by="ops", reason="", at=1.7e9, until=until)
    assert Pause.from_json({"by": "ops", "at": 1.7e9, "until": until}) is None


@pytest.mark.parametrize("text", ["99999999999999999999", "1e400", "nan", "inf", "9999999 days", "31 days"])
def test_a_duration_past_any_sane_pause_is_refused_with_its_reason(text: str) -> None:
    with pytest.raises(ValueError, match="cannot read|longer than the longest pause"):
        parse_duration(text)


def run_request(daemon: Any, command: str, **args: Any) -> tuple[list[str], list[Exception]]:
    """A control request answered by the loop, as the control thread and the loop meet in the daemon."""
    replies: list[str] = []
    errors: list[Exception] = []

    def ask() -> None:
        try:
            replies.append(daemon._on_request(command, args))
        except Exception as e:
            errors.append(e)
    t = threading.Thread(target=ask)
    t.start()
    while not daemon._signals and t.is_alive():
        t.join(0.01)
    assert daemon.dispatch() is False  # the loop goes on
    t.join(30)
    return replies, errors


@pytest.mark.parametrize("until", BAD_UNTIL)
def test_a_bad_pause_request_is_answered_as_refused_and_the_daemon_goes_on(tmp_path: Path, until: Any) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()
    replies, errors = run_request(daemon, "pause", until=until, by="ops", reason="x")
    assert not replies and len(errors) == 1 and isinstance(errors[0], ValueError), (replies, errors)
    assert "nothing was changed" in str(errors[0])
    assert daemon.pause is None and not (tmp_path / "state" / statefile.PAUSE).exists()
    daemon.tick()
    assert sole(daemon).status.phase != Phase.PAUSED


def test_over_the_socket_a_refused_pause_is_heard_as_refused_not_as_no_daemon(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()
    state = str(tmp_path / "state")
    server = control.ControlServer(state, daemon._on_request)
    got: list[BaseException] = []

    def ask() -> None:
        try:
            control.request(state, "pause", timeout=30, until="tomorrow", by="o")
        except BaseException as e:
            got.append(e)
    try:
        t = threading.Thread(target=ask)
        t.start()
        while not daemon._signals and t.is_alive():
            t.join(0.01)
        daemon.dispatch()
        t.join(30)
    finally:
        server.close()
    # refused at the socket, by the argument's type, before the loop is asked (issue 42's LOW item)
    assert len(got) == 1 and isinstance(got[0], control.Refused) and "'until' must be" in str(got[0]), got


@pytest.mark.parametrize("saved", ['{"by": "ops", "at": 1.7e9, "until": NaN}', '{"by": "ops", "at": Infinity}',
                                   '{"by": "ops", "at": 1.7e9, "until": 1e300}', '[1, 2]', '{"by": 5, "at": 1}',
                                   'not json'])
def test_a_saved_pause_that_is_not_valid_is_set_aside_and_the_daemon_starts(tmp_path: Path, saved: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / statefile.PAUSE).write_text(saved)
    daemon, be, clock, notes, _ = make(tmp_path)
    assert daemon.pause is None
    assert not (state / statefile.PAUSE).exists() and len(list(state.glob("pause.json.bad-*"))) == 1
    be.next = obs(daemon.cfg)
    daemon.tick()
    doc = json.loads((state / "status.json").read_text())
    assert any("pause.json was not a valid pause" in p for p in doc["state_problems"]), doc["state_problems"]


def test_the_cli_refuses_a_pause_the_daemon_would_refuse_and_saves_nothing(tmp_path: Path) -> None:
    done, message = cli_pause(str(tmp_path), "x", 1e30)
    assert not done and message.startswith("cannot pause: pause until") and not list(tmp_path.iterdir())


def test_a_pause_ends_on_the_daemons_clock_not_the_wall_clock(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    be.next = obs(daemon.cfg)
    now = daemon.wall()
    daemon.set_pause(Pause(by="ops", reason="", at=now, until=now + 600))
    daemon.wall = lambda: 1.7e9 + clock.t + 86400  # the wall clock stepped a day ahead
    daemon.tick()
    assert daemon.pause is not None and sole(daemon).status.phase == Phase.PAUSED
    clock.t += 600
    daemon.tick()
    assert daemon.pause is None


# --------------------------------------------------------------------------- 4: a file caught mid-write
def two_deployments() -> dict[str, Any]:
    from tests.unit.test_stack import EMBED, stack
    return stack({**EMBED, "after": []})


def test_a_config_cut_before_a_deployment_removes_nothing_until_it_reads_the_same_again(tmp_path: Path) -> None:
    from tests.unit.test_stack import make as make_stack
    d = two_deployments()
    daemon, be, clock, notes, path = make_stack(tmp_path, d)
    whole = path.read_text()
    cut = whole[:whole.rindex("[[deployments]]")]  # valid TOML: only the first deployment
    torn: list[str] = []
    def teardown() -> list[str]:
        torn.append("embed")
        return []
    be["embed"].teardown = teardown  # type: ignore[method-assign]  # a fake's method replaced for one test
    path.write_text(cut)
    daemon.reload()
    assert list(daemon.reconcilers) == ["qwen", "embed"] and not torn
    assert "reload staged: removes 'embed'" in daemon.status_line()
    path.write_text(whole)  # the writer finished
    clock.t += daemon.SETTLE_S
    be["qwen"].next, be["embed"].next = obs(daemon.reconcilers["qwen"].view.cfg), obs(daemon.reconcilers["embed"].view.cfg)
    daemon.tick()
    assert list(daemon.reconcilers) == ["qwen", "embed"] and not torn and daemon.reloader.staged is None
    # Cut again, and left so: the same file SETTLE_S later is what the operator meant.
    path.write_text(cut)
    daemon.reload()
    clock.t += daemon.SETTLE_S
    daemon.tick()
    assert list(daemon.reconcilers) == ["qwen"] and torn == ["embed"]


def test_a_writer_stalled_past_the_settle_time_at_a_deployment_boundary_removes_nothing(tmp_path: Path) -> None:
    """Issue 42 (LOW): the writer stalls longer than SETTLE_S with the file cut before [[deployments]] (the same
    bytes twice): while it holds the file open for writing, nothing is removed; once it closes it, the whole
    file is read."""
    from tests.unit.test_stack import make as make_stack
    d = two_deployments()
    daemon, be, clock, notes, path = make_stack(tmp_path, d)
    whole = path.read_text()
    cut = whole[:whole.rindex("[[deployments]]")]
    writer = open(path, "w")  # a real process (this one) holding it open for writing, as `cat >` would
    try:
        writer.write(cut)
        writer.flush()
        daemon.reload()
        for _ in range(3):  # stalled well past the settle time
            clock.t += daemon.SETTLE_S
            daemon.tick()
        assert list(daemon.reconcilers) == ["qwen", "embed"] and daemon.reloader.staged is not None
        assert "reload staged: removes 'embed'" in daemon.status_line()
        writer.write(whole[len(cut):])
    finally:
        writer.close()
    clock.t += daemon.SETTLE_S
    be["qwen"].next, be["embed"].next = obs(daemon.reconcilers["qwen"].view.cfg), obs(daemon.reconcilers["embed"].view.cfg)
    daemon.tick()
    assert list(daemon.reconcilers) == ["qwen", "embed"] and daemon.reloader.staged is None


def test_the_writers_of_a_file_are_found_by_their_open_mode(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text("x")
    with open(f) as reading:
        assert files.writers(f) == [] and reading.readable()
    with open(f, "a") as appending:
        assert files.writers(f) == [os.getpid()] and appending.writable()
    assert files.writers(tmp_path / "none") == []


def test_a_failed_reload_is_in_the_status_file_until_one_succeeds(tmp_path: Path) -> None:
    daemon, be, clock, notes, path = make(tmp_path)
    be.next = obs(daemon.cfg)
    daemon.tick()
    good = path.read_text()
    path.write_text("[supervisor\n")
    daemon.reload()
    daemon.tick()
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["reload"]["error"] and str(path) in doc["reload"]["error"], doc["reload"]
    path.write_text(good)
    daemon.reload()
    daemon.tick()
    assert json.loads((tmp_path / "state" / "status.json").read_text())["reload"] is None


# ---------------------------------------------------------------------------- 9: the state directory
def test_a_state_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    with pytest.raises(StateDirUnfit, match="writable by its group or by others"):
        lock_state_dir(str(state))


def test_a_linked_state_dir_or_lock_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    (state / "lock").symlink_to(victim)
    with pytest.raises(StateDirUnfit, match="lock"):
        lock_state_dir(str(state))
    assert victim.read_text() == "precious\n"
    (tmp_path / "elsewhere").mkdir(mode=0o755)
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StateDirUnfit, match="symbolic link"):
        lock_state_dir(str(tmp_path / "linked"))


def test_special_state_files_are_refused_not_waited_on(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.mkfifo(state / "status.json")
    (state / statefile.PAUSE).symlink_to("/dev/zero")
    assert any("status.json: is a FIFO" in p or "status.json: is a named pipe" in p or "status.json" in p
               for p in statefile.check_state_dir(str(state)))
    with pytest.raises(files.Refused):
        statefile.read(str(state))  # returns at once: a FIFO is not opened for a blocking read
    with pytest.raises(files.Refused):
        statefile.read_state(state / statefile.PAUSE)
    with pytest.raises(StateDirUnfit):
        lock_state_dir(str(state))


def test_a_state_dir_is_made_the_daemons_own_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        fd = lock_state_dir(str(tmp_path / "a" / "state"))
    finally:
        os.umask(old)
    os.close(fd)
    assert (os.stat(tmp_path / "a" / "state").st_mode & 0o777) == 0o755
    statefile.atomic_write(tmp_path / "a" / "state" / "x.json", "{}")
    assert statefile.check_state_dir(str(tmp_path / "a" / "state")) == []


# ------------------------------------------------------------------------- LOW: the control socket
def test_a_client_that_dribbles_bytes_blocks_no_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    server = control.ControlServer(str(state), lambda command, _: f"pong {command}")
    slow = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for s in slow:
            s.connect(str(state / control.SOCKET))
            s.sendall(b"pi")  # and never the rest of the line
        assert control.request(str(state), "ping", timeout=5) == "pong ping"
        big = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        big.settimeout(10)
        big.connect(str(state / control.SOCKET))
        big.sendall(b"x" * (control.ControlServer.MAX_LINE + 10))
        answer = json.loads(big.makefile().readline())
        assert answer["ok"] is False and "at most" in answer["message"]
        big.close()
    finally:
        for s in slow:
            s.close()
        server.close()


# ------------------------------------------------------------------------------------- LOW: the CLI
def write_config(tmp_path: Path, state: Path) -> Path:
    from tests.helpers import data
    d = data()
    d["supervisor"]["state_dir"] = str(state)
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    return path


def test_check_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    import subprocess
    import sys
    config = write_config(tmp_path, tmp_path / "state")
    r, w = os.pipe()
    os.close(r)  # the reader (`head -1`) is gone before check writes
    try:
        out = subprocess.run([sys.executable, "-m", "spark_supervisor", "check", "--config", str(config)],
                             stdout=w, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(w)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_run_on_a_state_dir_others_can_write_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o777)
    config = write_config(tmp_path, state)
    out = subprocess.run([sys.executable, "-m", "spark_supervisor", "run", "--config", str(config)],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 78 and "Traceback" not in out.stderr, out.stderr
    assert "supervisor.state_dir" in out.stderr and "writable by its group or by others" in out.stderr
    assert not (state / "lock").exists()


def test_a_key_a_reload_brings_is_redacted_and_its_warnings_logged(tmp_path: Path) -> None:
    import structlog

    from spark_supervisor.report import journal
    from tests.helpers import data
    daemon, be, clock, notes, path = make(tmp_path)
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    d["deployments"][0]["serve"]["env"] = {"HF_TOKEN": "hf_reloadedsecretvalue1234"}  # a literal: warned about
    path.write_text(tomli_w.dumps(d))
    be.next = obs(daemon.cfg)
    with structlog.testing.capture_logs() as seen:
        daemon.reload()  # the serve's env changed: staged, then applied when read the same again
        clock.t += daemon.SETTLE_S
        daemon.tick()
    assert any(e["event"] == "config.warning" and "HF_TOKEN" in e["problem"] for e in seen), seen
    assert "hf_reloadedsecretvalue1234" not in json.dumps(journal.redact(None, "", {"line": "x hf_reloadedsecretvalue1234"}))


def test_logscan_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    import subprocess
    import sys
    os.mkfifo(tmp_path / "log")
    out = subprocess.run([sys.executable, "-m", "spark_supervisor", "logscan", str(tmp_path / "log")],
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "is a FIFO" in out.stderr, out.stderr


class _Engine:
    """A Docker engine that holds the image and whose image probe prints what a real vLLM image prints."""

    def __init__(self, probe_output: str) -> None:
        self.probes = 0
        self.out = probe_output

    def has_image(self, _image: str) -> bool:
        return True

    def image_id(self, _image: str) -> str:
        return "sha256:" + "a" * 64

    def image_ref(self, image: str) -> tuple[str, tuple[str, ...]]:
        return self.image_id(image), ()

    def run_once(self, _spec: Any) -> tuple[int, str]:
        self.probes += 1
        return 0, self.out


@pytest.mark.parametrize("kept", [{"report": {"node": "spark-1", "image": "x", "key": "K", "ray_version": 5,
                                               "ray_path": ["/x"]}},
                                  {"report": ["x"]}, {"report": {"nope": 1}}, {"report": None}, "text"])
def test_a_damaged_image_record_is_checked_again_not_a_crash(tmp_path: Path, kept: Any) -> None:
    from types import SimpleNamespace

    import structlog

    from spark_supervisor.config import image_check_key
    from spark_supervisor.model import ImageReport
    from spark_supervisor.world.act import Actor
    from tests.helpers import cfg, data
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    c = cfg(d)
    node = c.nodes[0]
    engine = _Engine("")  # what the probe prints matters not here: that it ran does
    world = SimpleNamespace(cfg=c, view=view_of(c), nodes={node.name: SimpleNamespace(node=node, docker=engine)})
    if isinstance(kept, dict):
        kept = {"image_id": engine.image_id(""), "key": image_check_key(c, c.deployment), **kept}
    statefile.write_json(str(tmp_path / "state"), statefile.NODES, {node.name: kept})
    r = Actor(world, structlog.get_logger())._check_image(world.nodes[node.name])  # type: ignore[arg-type]
    assert isinstance(r, ImageReport) and engine.probes == 1  # checked again, from the image itself


def test_a_sound_image_record_is_still_used(tmp_path: Path) -> None:
    import dataclasses
    from types import SimpleNamespace

    import structlog

    from spark_supervisor.config import image_check_key
    from spark_supervisor.model import ImageReport
    from spark_supervisor.world.act import Actor
    from tests.helpers import cfg, data
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    c = cfg(d)
    node = c.nodes[0]
    engine = _Engine("")
    key = image_check_key(c, c.deployment)
    report = ImageReport(node.name, c.deployment.ray.image, key, ray_path="/usr/bin/ray", ray_version="2.49.0",
                         vllm_path="/usr/bin/vllm", vllm_version="0.11.0", dashboard=True)
    statefile.write_json(str(tmp_path / "state"), statefile.NODES, {node.name: {
        "image_id": engine.image_id(""), "key": key, "report": dataclasses.asdict(report)}})
    world = SimpleNamespace(cfg=c, view=view_of(c), nodes={node.name: SimpleNamespace(node=node, docker=engine)})
    got = Actor(world, structlog.get_logger())._check_image(world.nodes[node.name])  # type: ignore[arg-type]
    assert got == dataclasses.replace(report, image_id=engine.image_id(""))  # the ID as inspected now
    assert engine.probes == 0


def test_a_control_requests_arguments_are_of_their_types_or_refused(tmp_path: Path) -> None:
    """Issue 42 (LOW): "serve_only": "false" is not false; an argument a command does not take is no silent no-op."""
    ok = control.parse_request('{"command": "restart", "serve_only": true, "deployment": "qwen", "by": "alice"}')
    assert ok == ("restart", {"serve_only": True, "deployment": "qwen", "by": "alice"})
    assert control.parse_request('{"command": "pause", "until": 1.7e9, "reason": "x"}')[1]["until"] == 1.7e9
    for line, said in [('{"command": "restart", "serve_only": "false"}', "restart's 'serve_only' must be bool, not str"),
                       ('{"command": "restart", "serve_only": 0}', "must be bool, not int"),
                       ('{"command": "pause", "until": true}', "pause's 'until' must be int or float or null, not bool"),
                       ('{"command": "restart", "serveonly": true}', "'restart' takes no argument 'serveonly'"),
                       ('{"command": "reset", "by": 7}', "reset's 'by' must be str, not int")]:
        with pytest.raises(ValueError, match=re.escape(said)):
            control.parse_request(line)
    state = tmp_path / "state"
    state.mkdir()
    server = control.ControlServer(str(state), lambda command, args: f"did {command} {args.get('serve_only')}")
    try:
        with pytest.raises(control.Refused, match="must be bool"):
            control.request(str(state), "restart", serve_only="false")
        assert control.request(str(state), "restart", serve_only=False) == "did restart False"
    finally:
        server.close()


def test_a_caller_the_control_socket_refuses_is_told_permission_denied(tmp_path: Path) -> None:
    """Issue 42 (LOW): not the daemon's user (a forked child as nobody): "permission denied", not "does not
    answer"."""
    state = tmp_path / "state"
    state.mkdir()
    server = control.ControlServer(str(state), lambda command, _: command)
    try:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another user asks, as a non-root operator would
            try:
                os.close(read)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    said = f"answered: {control.ask(str(state), 'ping')}"
                except control.NotAnswering as e:
                    said = str(e)
                os.write(write, said.encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as f:
            said = f.read()
        os.waitpid(pid, 0)
        assert said.startswith(f"permission denied on {state / 'control.sock'}: only the daemon's own user"), said
    finally:
        server.close()
