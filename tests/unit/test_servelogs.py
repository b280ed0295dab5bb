"""The serve's log on the host: the names the wrapper gives each launch, choosing the current and previous
one, keeping the newest, the size cap (the real wrapper under sh, on a temporary directory), and
`spark-supervisor logs` on the local node."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_supervisor import config
from spark_supervisor.cli import main
from spark_supervisor.specs import commands
from spark_supervisor.world import servelogs
from spark_supervisor.world.servelogs import Launch, Problem, launches, log_name, parse_name, pick
from spark_testbed.testbed import until
from tests.helpers import cfg, data


def _sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kw)


def wrapper(state: Path, logs: Path | str, *serve: str, spec: str = "h1", node: str = "spark-1", keep: int = 5,
            cap_mib: int = 100, every: str = "0.05") -> list[str]:
    return ["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", str(state), spec, "", "1", "1", str(logs), node,
            str(keep), str(cap_mib), every, *serve]


# ------------------------------------------------------------------------------------------- names
def test_a_launch_is_named_by_its_start_node_and_spec_and_read_back() -> None:
    name = log_name("2026-12-03T08:17:15Z", "spark-1", "0123abcdef45")
    assert name == "20261203T081715Z-spark-1-0123abcdef45.log"
    assert parse_name(name) == Launch("20261203T081715Z", 0, "spark-1", "0123abcdef45", name)
    assert parse_name(name).started_at == "2026-12-03T08:17:15Z"  # type: ignore[union-attr]
    odd = log_name("2026-12-03T08:17:15Z", "rack-2.node_b-1", "ff", seq=3)
    assert odd == "20261203T081715Z_3-rack-2.node_b-1-ff.log"
    assert parse_name(odd) == Launch("20261203T081715Z", 3, "rack-2.node_b-1", "ff", odd)
    for other in ("current", f"{name}.1", "notes.txt", "20261203T081715Z-ab.log", "x-spark-1-ab.log"):
        assert parse_name(other) is None, other


def test_launches_are_ordered_by_start_then_number_and_current_and_previous_are_chosen() -> None:
    names = ["20261203T090000Z-spark-1-b.log", "20261203T081715Z_1-spark-1-a.log", "current",
             "20261203T081715Z-spark-1-a.log", "20261203T081715Z-spark-1-a.log.1", "README",
             "20261203T100000Z-spark-2-c.log"]
    found = launches(names, "spark-1")
    assert [x.name for x in found] == ["20261203T081715Z-spark-1-a.log", "20261203T081715Z_1-spark-1-a.log",
                                       "20261203T090000Z-spark-1-b.log"]
    assert pick(found).name == "20261203T090000Z-spark-1-b.log"  # type: ignore[union-attr]
    assert pick(found, previous=True).name == "20261203T081715Z_1-spark-1-a.log"  # type: ignore[union-attr]
    assert pick(found[:1], previous=True) is None and pick([]) is None
    assert servelogs.parts(found[0], names) == ["20261203T081715Z-spark-1-a.log.1", "20261203T081715Z-spark-1-a.log"]
    assert servelogs.parts(found[2], names) == ["20261203T090000Z-spark-1-b.log"]


def test_the_last_lines_span_a_rotated_part_and_the_key_is_redacted() -> None:
    older, newer = [b"1\n", b"2\n", b"3\n"], [b"4\n", b"5\n"]
    assert list(servelogs.last_lines([older, newer], 3)) == [b"3\n", b"4\n", b"5\n"]
    assert list(servelogs.last_lines([older, newer], None)) == older + newer
    assert servelogs.redact(b"VLLM_API_KEY=sk-1 x\n", ["sk-1"]) == b"VLLM_API_KEY=[redacted] x\n"
    assert servelogs.redact(b"sk-1\n", []) == b"sk-1\n"
    assert servelogs.redact(b"\xff https://u:p@h/x\n", []) == b"\xff https://[redacted]@h/x\n"  # bytes kept as they are


# ------------------------------------------------------------------------------------------- the wrapper
def test_each_launch_gets_its_own_file_on_the_host_and_the_state_stays_in_the_container(tmp_path: Path) -> None:
    state, logs = tmp_path / "state", tmp_path / "logs" / "spark-1"
    r = _sh(wrapper(state, logs, "sh", "-c", "echo first launch"))
    assert r.returncode == 0, r.stderr
    first = (state / "started").read_text().strip()
    assert sorted(os.listdir(logs)) == [log_name(first, "spark-1", "h1"), "current"]
    assert (logs / log_name(first, "spark-1", "h1")).read_text() == "first launch\n"
    # The pid, spec, started and exit files stay where they were (a pid must not outlive its namespace).
    assert sorted(p.name for p in state.iterdir()) == ["exit", "log", "pid", "spec", "started"]
    assert os.readlink(state / "log") == str(logs / log_name(first, "spark-1", "h1"))
    r = _sh(wrapper(state, logs, "sh", "-c", "echo second launch", spec="h2"))
    assert r.returncode == 0, r.stderr
    found = launches(os.listdir(logs), "spark-1")
    assert len(found) == 2 and found[0].spec_hash == "h1" and found[1].spec_hash == "h2"
    assert found[1].started_at == (state / "started").read_text().strip()
    assert os.readlink(logs / "current") == found[1].name  # relative: the same on the host and in the container
    assert (logs / "current").read_text() == "second launch\n"
    assert os.readlink(state / "log.prev") == str(logs / found[0].name)
    out = _sh(["sh", "-c", commands.SERVE_STATE, "spark-serve", str(state), "1000"]).stdout
    assert out.split("\n", 1)[1] == "second launch\n"  # the daemon's tail reads through the link


def test_a_launch_within_the_same_second_as_others_is_numbered_after_them(tmp_path: Path) -> None:
    state, logs = tmp_path / "state", tmp_path / "logs"
    logs.mkdir()
    now = datetime.now(UTC)
    for s in range(-2, 30):  # whatever second the wrapper starts in, it is taken
        stamp = (now + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%SZ")
        (logs / log_name(stamp, "other", "x", seq=4)).write_text("")  # the ones before it were pruned
    assert _sh(wrapper(state, logs, "true", keep=100)).returncode == 0
    mine = launches(os.listdir(logs), "spark-1")
    assert len(mine) == 1 and mine[0].seq == 5  # after every other of its second, never in a gap
    assert mine[0].started_at == (state / "started").read_text().strip()


def test_only_the_newest_launches_are_kept_with_their_rotated_parts(tmp_path: Path) -> None:
    state, logs = tmp_path / "state", tmp_path / "logs"
    made = []
    for i in range(4):
        assert _sh(wrapper(state, logs, "sh", "-c", f"echo launch {i}", keep=2)).returncode == 0
        made.append(launches(os.listdir(logs))[-1].name)
        (logs / f"{made[-1]}.1").write_text("older part\n")
    assert made == sorted(made, key=lambda n: parse_name(n))  # type: ignore[arg-type,return-value]
    assert sorted(os.listdir(logs)) == sorted(["current", made[2], f"{made[2]}.1", made[3], f"{made[3]}.1"])
    assert (logs / "current").read_text() == "launch 3\n"


def test_a_log_past_its_cap_is_copied_aside_and_emptied_while_the_serve_writes_on(tmp_path: Path) -> None:
    state, logs = tmp_path / "state", tmp_path / "logs"
    go = tmp_path / "go"
    serve = ("head -c 1500000 /dev/zero | tr '\\0' x; echo; "
             f"while [ ! -f {go} ]; do sleep 0.05; done; echo after the cut; sleep 60")
    p = subprocess.Popen(wrapper(state, logs, "sh", "-c", serve, cap_mib=1))
    try:
        until(lambda: os.path.isdir(logs) and any(n.endswith(".log.1") for n in os.listdir(logs)), 20,
              "the log copied aside")
        (name,) = [x.name for x in launches(os.listdir(logs))]
        go.write_text("")
        until(lambda: "after the cut" in (logs / name).read_text(errors="replace"), 20, "the serve writing on")
        live = (logs / name).read_bytes()
        assert live.startswith(b"after the cut\n") and b"\0" not in live  # O_APPEND: no hole where it was
        assert (logs / f"{name}.1").stat().st_size > 1_000_000
        assert _sh(["sh", "-c", commands.SERVE_STATE, "spark-serve", str(state), "100"]).stdout.split()[4] == "1"
    finally:
        _sh(["sh", "-c", commands.SERVE_STOP, "spark-serve", str(state), "5"])
        p.kill()
        p.wait(timeout=10)


def test_a_log_directory_that_cannot_be_made_falls_back_to_the_container(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (tmp_path / "file").write_text("")
    r = _sh(wrapper(state, tmp_path / "file" / "logs", "sh", "-c", "echo still served"))
    assert r.returncode == 0 and (state / "exit").read_text() == "0\n"
    assert not (state / "log").is_symlink() and (state / "log").read_text() == "still served\n"


# ------------------------------------------------------------------------------------------- config
def test_the_log_directory_is_mounted_where_a_serve_runs_and_is_part_of_the_spec() -> None:
    c = cfg()
    dep = c.deployment
    head = commands.node_container(c, dep, c.nodes[0]).options["volumes"]
    assert head["/var/log/spark-supervisor/serve/qwen"] == {"bind": "/var/log/spark-supervisor/serve/qwen",
                                                            "mode": "rw"}
    assert "/var/log/spark-supervisor/serve/qwen" not in commands.node_container(c, dep, c.nodes[1]).options["volumes"]
    d = data()
    d["deployments"][0]["serve"].update(distributed_executor_backend="mp")
    mp = cfg(d)
    assert all("/var/log/spark-supervisor/serve/qwen" in commands.node_container(mp, mp.deployment, n).options["volumes"]
               for n in mp.nodes)  # every rank logs
    assert commands.serve_launch(mp, mp.deployment, "h", mp.nodes[1])[9:11] == [
        "/var/log/spark-supervisor/serve/qwen/spark-2", "spark-2"]
    d = data()
    d["deployments"][0]["serve"].update(log_keep=9, log_max_mib=7)
    kept = cfg(d)
    assert config.serve_hash(kept, kept.deployment) == config.serve_hash(c, dep)  # taken at the next launch
    d["deployments"][0]["serve"]["log_host_dir"] = "/srv/logs/"
    moved = cfg(d)
    assert moved.deployment.serve.log_host_dir == "/srv/logs"
    assert config.ray_hash(moved, moved.deployment) != config.ray_hash(c, dep)  # a new mount: new containers
    d["deployments"][0]["serve"]["log_host_dir"] = ""
    off = cfg(d)
    assert commands.serve_log_dir(off.deployment, off.nodes[0]) == ""
    assert commands.serve_launch(off, off.deployment, "h")[9] == ""


@pytest.mark.parametrize("patch, fragment", [
    ({"log_host_dir": "logs"}, "must be an absolute directory other than /"),
    ({"log_host_dir": "/"}, "must be an absolute directory other than /"),
    ({"log_host_dir": "/var/log/a:b"}, "without ':' or whitespace"),
    ({"log_keep": 0}, "greater than or equal to 1"),
    ({"log_max_mib": 0}, "greater than or equal to 1"),
])
def test_a_bad_log_setting_is_one_line_naming_its_key(patch: dict[str, Any], fragment: str) -> None:
    d = data()
    d["deployments"][0]["serve"].update(patch)
    with pytest.raises(config.ConfigError) as e:
        config.parse(d, "/etc/x.toml", env={})
    key = next(iter(patch))
    assert len(e.value.problems) == 1 and e.value.problems[0].startswith(
        f"/etc/x.toml: deployments[0].serve.{key}: "), e.value.problems
    assert fragment in e.value.problems[0], e.value.problems


# ------------------------------------------------------------------------------------------- the command
def write(tmp_path: Path, **serve: Any) -> tuple[Path, Path]:
    d = data()
    d["deployments"][0]["serve"]["log_host_dir"] = str(tmp_path / "serve-logs")
    d["deployments"][0]["serve"].update(serve)
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(d))
    return path, tmp_path / "serve-logs" / "qwen" / "spark-1"


def test_logs_prints_the_current_or_previous_launch_of_the_head(tmp_path: Path, capsysbinary: Any) -> None:
    key = tmp_path / "key"
    key.write_text("sk-secret-123\n")
    key.chmod(0o600)
    path, logs = write(tmp_path)
    d = data()
    d["deployments"][0]["serve"]["log_host_dir"] = str(tmp_path / "serve-logs")
    d["deployments"][0]["readiness"] = {"api_key_file": str(key)}
    path.write_text(tomli_w.dumps(d))
    logs.mkdir(parents=True)
    old = log_name("2026-12-03T08:00:00Z", "spark-1", "aaa")
    new = log_name("2026-12-03T09:00:00Z", "spark-1", "bbb")
    (logs / old).write_text("old 1\nold 2\n")
    (logs / f"{new}.1").write_text("new 1\nnew 2\n")
    (logs / new).write_text("new 3 api_key=sk-secret-123\nnew 4\n")
    assert main(["logs", "--config", str(path)]) == 0
    out, err = capsysbinary.readouterr()
    assert out == b"new 1\nnew 2\nnew 3 api_key=[redacted]\nnew 4\n"
    assert err.decode().startswith(f"spark-1: {logs}/{new} (launch 2026-12-03T09:00:00Z, serve spec bbb, its older")
    assert main(["logs", "qwen", "--previous", "--config", str(path)]) == 0
    assert capsysbinary.readouterr().out == b"old 1\nold 2\n"
    assert main(["logs", "--lines", "3", "--config", str(path)]) == 0
    assert capsysbinary.readouterr().out == b"new 2\nnew 3 api_key=[redacted]\nnew 4\n"
    (logs / old).unlink()
    assert main(["logs", "-p", "--config", str(path)]) == 1
    assert b"no previous launch of the serve logged on spark-1" in capsysbinary.readouterr().err


def test_logs_says_plainly_what_it_cannot_show(tmp_path: Path, capsysbinary: Any) -> None:
    path, logs = write(tmp_path)
    assert main(["logs", "--config", str(path)]) == 1
    assert f"qwen: no launch of the serve logged on spark-1 in {logs}".encode() in capsysbinary.readouterr().err
    assert main(["logs", "other", "--config", str(path)]) == 2
    assert b"no deployment 'other' in the config (deployments: qwen)" in capsysbinary.readouterr().err
    assert main(["logs", "--node", "spark-2", "--config", str(path)]) == 2
    assert b"qwen: no serve runs on spark-2: its serve runs on spark-1 only" in capsysbinary.readouterr().err
    assert main(["logs", "--node", "spark-9", "--config", str(path)]) == 2
    assert b"not one of its nodes (spark-1, spark-2)" in capsysbinary.readouterr().err
    path, _ = write(tmp_path, log_host_dir="")
    assert main(["logs", "--config", str(path)]) == 1
    assert b"the serve's log is kept in the container only" in capsysbinary.readouterr().err
    with pytest.raises(SystemExit):
        main(["logs", "--lines", "0", "--config", str(path)])


def test_several_deployments_need_a_name_and_an_mp_worker_runs_a_rank() -> None:
    d = data()
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    second = {"name": "embed", "nodes": ["spark-1"], "serve": {"model": "e", "distributed_executor_backend": "mp",
                                                             "gpu_memory_utilization": 0.05, "port": 8001}}
    d["deployments"].append(second)
    d["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.5
    c = cfg(d)
    with pytest.raises(Problem, match="several deployments: name one \\(qwen, embed\\)"):
        servelogs.resolve(c, None, None)
    dep, node = servelogs.resolve(c, "qwen", "spark-2")
    assert (dep.name, node.name) == ("qwen", "spark-2")
    assert servelogs.resolve(c, "embed", None)[1].name == "spark-1"


def test_a_stream_is_copied_redacted_and_its_failure_is_an_exit_status(capsysbinary: Any) -> None:
    assert servelogs._stream(["sh", "-c", "echo a sk-1 b; echo c"], ["sk-1"], timeout=30, hold_stdin=False) == 0
    assert capsysbinary.readouterr().out == b"a [redacted] b\nc\n"
    assert servelogs._stream(["sh", "-c", "echo x; exit 2"], [], timeout=30, hold_stdin=False) == 1
    with pytest.raises(Problem, match="did not finish within 1s"):
        servelogs._stream(["sleep", "30"], [], timeout=1, hold_stdin=False)


def test_one_redactor_for_the_daemons_log_logs_and_the_bundle(tmp_path: Path, capsysbinary: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 (LOW): redaction was uneven (`logs` hid only the API key; the bundle kept URL credentials and the
    webhook's path token). One redactor (redaction.scrub over config.known_secrets) for all three: a URL's
    userinfo, whatever URL; the webhook's token-like path segments; values of names like *_KEY and *PASS*."""
    import os
    import tarfile

    from spark_supervisor.base import redaction
    from spark_supervisor.config import known_secrets, load
    from spark_supervisor.report import journal as daemon_logs
    token, team, bot = "XXXXwebhookTOKEN0123", "T0123ABCD", "B0456EFGH"
    monkeypatch.setenv("WANDB_KEY", "wandb-secret-42")
    monkeypatch.setenv("DB_PASS", "pa55word-secret")
    path, logs = write(tmp_path)
    d = data()
    d["deployments"][0]["serve"]["log_host_dir"] = str(tmp_path / "serve-logs")
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    d["alerts"] = {"webhook": f"https://hooks.slack.com/services/{team}/{bot}/{token}"}
    path.write_text(tomli_w.dumps(d))
    logs.mkdir(parents=True)
    name = log_name("2026-12-03T09:00:00Z", "spark-1", "bbb")
    leak = (f"fetch https://alice:s3cr3t-pw@models.example.com/x posting to /services/{team}/{bot}/{token} "
            "with wandb-secret-42 and pa55word-secret\n")
    (logs / name).write_text(leak)
    secrets = ("s3cr3t-pw", token, team, bot, "wandb-secret-42", "pa55word-secret")
    assert main(["logs", "--config", str(path)]) == 0
    shown = capsysbinary.readouterr().out.decode()
    assert "https://[redacted]@models.example.com/x" in shown and not any(s in shown for s in secrets), shown
    assert main(["report", "--config", str(path), "--out", str(tmp_path / "b.tar.gz")]) == 0
    capsysbinary.readouterr()
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        bundled = "".join(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
    assert leak.split()[0] in bundled and not any(s in bundled for s in secrets)
    cfg_ = load(str(path))
    daemon_logs.register_config(cfg_)
    daemon_logs.register_environment(dict(os.environ))
    logged = str(daemon_logs._scrub(leak))
    assert not any(s in logged for s in secrets), logged
    out = redaction.scrub(leak, known_secrets(cfg_, {"WANDB_KEY": "wandb-secret-42"}))
    assert not any(s in out for s in secrets[:5]) and "pa55word-secret" in out  # DB_PASS not in that environment
