"""The serve wrapper run for real (sh, a temp directory): its prune removes only what it made, a cache
directory it did not make is a refusal, and a stop never signals a pid that is no longer its serve."""

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from spark_supervisor.config import serve_hash
from spark_supervisor.judge import logscan
from spark_supervisor.model.reason import Kind
from spark_supervisor.specs import commands
from spark_testbed.testbed import until
from tests.helpers import cfg, recorded_serve_pid

CUR = "0123456789ab"
MARK = commands.CACHE_MARK


def _wrapper(d: Path, cache: str, keep: int = 2, cap_mib: int = 1000, logs: str = "", *serve: str) -> subprocess.CompletedProcess[str]:
    argv = ["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", str(d), CUR, cache, str(keep), str(cap_mib),
            logs, "n", "2", "1", "1", *(serve or ("true",))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _entry(cache: Path, name: str, age: int, marked: bool = True, mib: int = 0) -> Path:
    e = cache / name
    e.mkdir(parents=True)
    if mib:
        (e / "blob").write_bytes(b"x" * (mib << 20))
    if marked:
        (e / MARK).touch()
        os.utime(e / MARK, (1000 + age, 1000 + age))
    return e


def _precious(tmp_path: Path) -> Path:
    p = tmp_path / "precious"
    p.mkdir()
    (p / "weights.safetensors").write_text("model")
    (p / MARK).touch()  # even a marker inside does not make a link's target ours
    return p


def test_the_spec_hash_is_the_format_the_prune_takes() -> None:
    h = serve_hash(cfg(), cfg().deployment)
    assert len(h) == commands.SPEC_HASH_LEN and set(h) <= set("0123456789abcdef")


def test_the_prune_removes_only_entries_it_made_named_as_spec_hashes(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "dep"
    cache.mkdir(parents=True)
    (cache / MARK).touch()
    for i, name in enumerate(["aaaaaaaaaaa1", "aaaaaaaaaaa2", "aaaaaaaaaaa3"]):
        _entry(cache, name, i)
    _entry(cache, "bbbbbbbbbbbb", 0, marked=False)  # a spec-hash name, no marker
    _entry(cache, "not-a-hash", 0)  # marked, another name
    _entry(cache, "ABCDEF012345", 0)  # upper case: not the hash format
    _entry(cache, "aaaaaaaaaaa", 0)  # one digit short
    fake = _entry(cache, "cccccccccccc", 0, marked=False)
    (fake / MARK).symlink_to(tmp_path / "elsewhere")  # a marker that is a link
    (cache / "dddddddddddd").symlink_to(_precious(tmp_path))  # a link named like a hash
    (cache / "eeeeeeeeeeee").write_text("a file named like a hash")
    (cache / "notes.txt").write_text("the operator's")
    r = _wrapper(tmp_path / "serve", str(cache), keep=2)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [MARK, CUR, "aaaaaaaaaaa3", "bbbbbbbbbbbb", "not-a-hash", "ABCDEF012345", "aaaaaaaaaaa", "cccccccccccc",
         "dddddddddddd", "eeeeeeeeeeee", "notes.txt"])
    assert (tmp_path / "precious" / "weights.safetensors").read_text() == "model"
    assert (cache / CUR / MARK).is_file() and (cache / CUR / "tmp").is_dir()


def test_the_size_cap_counts_and_removes_only_entries_it_made(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "dep"
    cache.mkdir(parents=True)
    (cache / MARK).touch()
    _entry(cache, "aaaaaaaaaaa1", 1, mib=2)
    _entry(cache, "aaaaaaaaaaa2", 2, mib=2)
    _entry(cache, "bbbbbbbbbbbb", 0, marked=False, mib=3)  # big, not ours: neither counted nor removed
    (cache / "dddddddddddd").symlink_to(_precious(tmp_path))
    r = _wrapper(tmp_path / "serve", str(cache), keep=10, cap_mib=3)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in cache.iterdir()) == sorted([MARK, CUR, "aaaaaaaaaaa2", "bbbbbbbbbbbb", "dddddddddddd"])
    r = _wrapper(tmp_path / "serve", str(cache), 10, 1)
    assert sorted(p.name for p in cache.iterdir()) == sorted([MARK, CUR, "bbbbbbbbbbbb", "dddddddddddd"])
    assert (tmp_path / "precious" / "weights.safetensors").read_text() == "model"


def _refused(tmp_path: Path, cache: Path, what: str) -> None:
    d = tmp_path / "serve"
    r = _wrapper(d, str(cache), 1, 1, "", "sh", "-c", "touch ran")
    assert r.returncode == commands.NOT_OURS_EXIT, r.stderr
    line = f"spark-serve: {commands.NOT_OURS}: {what}"
    assert r.stderr.startswith(line) and r.stderr.count("\n") == 1
    assert (d / "log").read_text().startswith(line) and (d / "exit").read_text().strip() == str(commands.NOT_OURS_EXIT)
    assert not (d / "ran").exists()  # the serve did not start
    state = subprocess.run(["sh", "-c", commands.SERVE_STATE, "s", str(d), "1000"], capture_output=True, text=True,
                           timeout=30, check=False).stdout
    assert state.split("\n")[0].split()[4:] == ["0", str(commands.NOT_OURS_EXIT)] and line in state


def test_a_cache_directory_it_did_not_make_is_a_refusal_not_a_deletion(tmp_path: Path) -> None:
    models = tmp_path / "models" / "dep"
    (models / "Qwen3-8B").mkdir(parents=True)
    (models / "Qwen3-8B" / "model.safetensors").write_text("weights")
    (models / "aaaaaaaaaaa1").mkdir()
    before = sorted(str(p) for p in models.rglob("*"))
    _refused(tmp_path, models, f"{models} holds files spark-supervisor did not create (Qwen3-8B)")
    assert sorted(str(p) for p in models.rglob("*")) == before


def test_a_hidden_file_or_a_link_makes_an_unmarked_directory_not_ours(tmp_path: Path) -> None:
    makers: tuple[tuple[str, Callable[[Path], object]], ...] = (
        (".cache", lambda p: p.write_text("x")), ("aaaaaaaaaaa1", lambda p: p.symlink_to(tmp_path)))
    for name, make in makers:
        c = tmp_path / name.strip(".") / "dep"
        c.mkdir(parents=True)
        make(c / name)
        _refused(tmp_path, c, f"{c} holds files spark-supervisor did not create ({name})")
        assert sorted(p.name for p in c.iterdir()) == [name]


def test_a_link_as_the_cache_or_as_its_entry_is_refused_and_followed_nowhere(tmp_path: Path) -> None:
    precious = _precious(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(precious)
    _refused(tmp_path, link, f"{link} is a symbolic link")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / MARK).touch()
    (cache / CUR).symlink_to(precious)
    _refused(tmp_path, cache, f"{cache}/{CUR} is not a directory spark-supervisor made")
    assert sorted(p.name for p in precious.iterdir()) == [MARK, "weights.safetensors"]


def test_an_earlier_versions_cache_is_taken_over_and_its_entries_never_pruned(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i in range(3):
        _entry(cache, f"aaaaaaaaaaa{i}", i, marked=False)
    assert _wrapper(tmp_path / "serve", str(cache), 1, 1).returncode == 0
    assert sorted(p.name for p in cache.iterdir()) == [MARK, CUR, "aaaaaaaaaaa0", "aaaaaaaaaaa1", "aaaaaaaaaaa2"]


def test_the_log_prune_removes_only_its_own_launch_files(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    ours = [f"2020010{i}T000000Z-n-{CUR}.log" for i in range(1, 5)]
    for name in ours:
        (logs / name).write_text("old")
    (logs / "app.log").write_text("the operator's")
    (logs / "20200101T000000Z-n-ab_c.log").write_text("not a spec hash, not our name")
    (logs / f"20191231T000000Z-n-{'f' * 12}.log").symlink_to(_precious(tmp_path) / "weights.safetensors")
    assert _wrapper(tmp_path / "serve", "", 2, 1, str(logs)).returncode == 0
    left = sorted(p.name for p in logs.iterdir())
    assert "app.log" in left and "20200101T000000Z-n-ab_c.log" in left and f"20191231T000000Z-n-{'f' * 12}.log" in left
    assert [n for n in ours if n in left] == [ours[-1]]  # with this launch's, the newest 2 of ours stay
    assert (tmp_path / "precious" / "weights.safetensors").read_text() == "model"


def _start_ticks(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_a_pid_that_is_another_process_by_now_is_never_signalled(tmp_path: Path) -> None:
    d = tmp_path / "serve"
    d.mkdir()
    other = subprocess.Popen(["sleep", "60"])  # an unrelated live process holding the recorded pid
    try:
        (d / "process").write_text(f"{other.pid} {int(_start_ticks(other.pid)) + 1}\n")  # a start time not its own
        (d / "pid").write_text(f"{other.pid}\n")
        (d / "spec").write_text(f"{CUR}\n")
        (d / "started").write_text("2026-01-01T00:00:00Z\n")
        state = subprocess.run(["sh", "-c", commands.SERVE_STATE, "s", str(d), "10"], capture_output=True,
                               text=True, timeout=30, check=False).stdout
        assert state.split()[1] == str(other.pid) and state.split()[4] == "0"  # recorded, not running
        r = subprocess.run(["sh", "-c", commands.SERVE_STOP, "s", str(d), "1"], capture_output=True, text=True,
                           timeout=30, check=False)
        assert r.returncode == 0 and other.poll() is None  # alive: not signalled
        assert not (d / "process").exists() and not (d / "pid").exists()
        (d / "pid").write_text(f"{other.pid}\n")  # an earlier wrapper's pid alone: not a session leader
        subprocess.run(["sh", "-c", commands.SERVE_STOP, "s", str(d), "1"], timeout=30, check=False)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def test_the_recorded_serve_is_its_pid_and_start_time_and_a_stop_ends_it(tmp_path: Path) -> None:
    d = tmp_path / "serve"
    w = subprocess.Popen(["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", str(d), CUR, "", "1", "1", "", "n",
                          "1", "1", "1", "sh", "-c", "echo up; exec sleep 60"])
    try:
        until(lambda: recorded_serve_pid(d) not in ("", str(w.pid)) and (d / "pid").read_text().strip()
              == recorded_serve_pid(d) and "up" in (d / "log").read_text(), 10, "the serve's pid and log", every=0.02)
        pid, ticks = (d / "process").read_text().split()
        assert (d / "pid").read_text().strip() == pid and ticks == _start_ticks(int(pid))
        subprocess.run(["sh", "-c", commands.SERVE_STOP, "s", str(d), "5"], timeout=30, check=True)
        assert w.wait(timeout=10) == 0 and not (d / "process").exists()
    finally:
        w.kill()


def test_once_the_serve_ended_its_pid_is_never_signalled_even_a_session_leader(tmp_path: Path) -> None:
    d = tmp_path / "serve"
    d.mkdir()
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # looks like a serve: leads its session
    try:
        (d / "pid").write_text(f"{other.pid}\n")
        (d / "exit").write_text("0\n")
        subprocess.run(["sh", "-c", commands.SERVE_STOP, "s", str(d), "1"], timeout=30, check=True)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


def _state(d: Path) -> tuple[str, ...]:
    """The serve-state script's first line, split: serve-state <pid> <spec> <started> <running> [<exit>]."""
    out = subprocess.run(["sh", "-c", commands.SERVE_STATE, "s", str(d), "0"], capture_output=True, text=True,
                         timeout=30, check=False).stdout
    return tuple(out.partition("\n")[0].split())


def _launch(d: Path, *serve: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", str(d), CUR, "", "1", "1", "", "n",
                             "1", "1", "1", *serve])


def test_a_late_end_of_a_forgotten_serve_never_marks_the_next_launch_ended(tmp_path: Path) -> None:
    """Issue 42, item 11: the old wrapper, between its serve's death and its record of it, outlived the stop that
    forgot its serve and the launch of the next one: its end must not be written into the new record."""
    d = tmp_path / "serve"
    old = _launch(d, "sh", "-c", "trap '' TERM; exec sleep 60")
    new: subprocess.Popen[bytes] | None = None
    try:
        until(lambda: recorded_serve_pid(d) not in ("", str(old.pid)), 10, "the old serve recorded", every=0.02)
        serve = int(recorded_serve_pid(d))
        for name in ("pid", "process", "exit", "spec", "started"):  # what the stop forgets (its kill held off)
            (d / name).unlink(missing_ok=True)
        new = _launch(d, "sleep", "60")
        until(lambda: recorded_serve_pid(d) not in ("", str(new.pid if new else 0)), 10, "the new serve recorded",
              every=0.02)
        os.kill(serve, 9)  # the old serve dies now: its wrapper reaches its end
        old.wait(timeout=10)
        assert not (d / "exit").exists(), "the old serve's end was written into the new record"
        st = _state(d)
        assert st[1] == recorded_serve_pid(d) and st[4] == "1", st  # the new serve, running
    finally:
        old.kill()
        if new is not None:
            subprocess.run(["sh", "-c", commands.SERVE_STOP, "s", str(d), "1"], timeout=30, check=False)
            new.kill()
            new.wait(timeout=10)


def test_a_launch_never_reads_as_a_serve_that_ended_without_its_exit_code(tmp_path: Path) -> None:
    """Read as fast as it can be from the launch to its end, the state is always one of: no serve, a serve
    running, or a serve ended with its exit code -- never a serve ended with none (ServeExited: exit code None)."""
    d = tmp_path / "serve"
    seen: set[tuple[str, ...]] = set()
    w = _launch(d, "sh", "-c", "exit 3")
    try:
        while True:
            done = w.poll() is not None
            st = _state(d)
            seen.add(("absent",) if len(st) < 5 or st[1] == "0" else st[4:])
            if done:
                break
        assert all(s in {("absent",), ("1",), ("0", "3")} for s in seen), seen
        assert ("0", "3") in seen
    finally:
        w.kill()
        w.wait(timeout=10)


def test_a_cache_that_cannot_be_written_ends_the_launch_recorded_with_its_reason(tmp_path: Path) -> None:
    """Issue 42, item 11: a cache removed under the running container cannot be written (its mount names the
    deleted directory); /proc/1 stands in for it here (a directory nothing can be made in). The wrapper said so
    and recorded its end: before, a failed redirection of `:` ended the shell at once (POSIX: a special
    built-in's), leaving a serve claimed with no exit code -- "ServeExited: exit code None", repaired in a loop."""
    d = tmp_path / "serve"
    w = subprocess.run(["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", str(d), CUR, "/proc/1", "1", "1", "",
                        "n", "1", "1", "1", "sh", "-c", "echo up"], capture_output=True, text=True, timeout=30)
    assert "spark-serve: CacheDirGone: /proc/1 cannot be written" in w.stderr, w.stderr
    assert (d / "exit").read_text().strip() == "74" and not (d / "process").exists()
    st = _state(d)
    assert st[4:] == ("0", "74"), st
    f = logscan.classify((d / "log").read_text())
    assert f is not None and f.reason == Kind.CACHE_DIR_GONE and not f.deterministic

