"""The command line's edges: status exit codes and --json, global options on either side of the
subcommand, --version, completion, the man page, the config's JSON Schema."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import cast

import pytest
import tomli_w

from spark_supervisor import cli
from spark_supervisor.loop.daemon import lock_state_dir
from spark_supervisor.model import Phase, Status
from spark_supervisor.model.document import StatusDoc
from spark_supervisor.report import statusdoc
from spark_supervisor.state import statefile
from tests.helpers import cfg, data, view_of

ROOT = Path(__file__).resolve().parents[2]


def doc(phase: str = "SERVING", name: str = "qwen", required: bool = True) -> StatusDoc:
    """A status document as the daemon writes it, for one deployment. Typed as the whole document (without
    the stack's keys, which status_code and the renderers read with .get, as they read any file)."""
    c = cfg(data(deployments=[{**data()["deployments"][0], "name": name, "required": required}]))
    d = statusdoc.document(Status(phase=Phase.SERVING), None, view_of(c), "/etc/x.toml", "abc", time.time(), 0.0)
    d["phase"] = phase  # any string: the lead's PAUSED and phases this version does not know
    return cast(StatusDoc, d)


def stack(*docs: StatusDoc) -> StatusDoc:
    """Several deployments: the first one's fields on top, every one under "deployments" (loop/reporting.py)."""
    return cast(StatusDoc, {**docs[0], "deployments": list(docs), "summary": f"{len(docs)} deployments"})


# ---- the exit code, a pure function -------------------------------------------------------------

@pytest.mark.parametrize(("phase", "code"), [
    ("SERVING", 0), ("FAILED", 1), ("PAUSED", 151),
    *[(p, 150) for p in ("DEGRADED", "BACKOFF", "DETECTING", "CLEANING", "WAITING", "STARTING_RAY",
                         "STARTING_VLLM", "LOADING", "VERIFYING", "STOPPING")],
])
def test_each_phase_has_its_lsb_exit_code(phase: str, code: int) -> None:
    assert cli.status_code(doc(phase), running=True) == code


def test_every_phase_the_daemon_has_is_judged() -> None:
    """A phase added to the model without a place here would read as 'unknown' (4): catch it."""
    assert all(cli.status_code(doc(p.value), running=True) != cli.ST_UNKNOWN for p in Phase)


def test_not_running_and_unknown() -> None:
    assert cli.status_code(doc("SERVING"), running=False) == 3  # a stale file: the daemon is gone
    assert cli.status_code(None, running=False) == 3
    assert cli.status_code(None, running=True) == 4  # running, but no readable status
    assert cli.status_code(doc("SERVING"), running=None) == 4  # cannot tell whether it runs
    assert cli.status_code(doc("SOMETHING_NEW"), running=True) == 4
    assert cli.status_code(cast(StatusDoc, {"phase": None}), running=True) == 4  # as a file may say


def test_only_required_deployments_count() -> None:
    serving, extra_failed = doc("SERVING", "main"), doc("FAILED", "extra", required=False)
    assert cli.status_code(stack(serving, extra_failed), running=True) == 0
    assert cli.status_code(stack(doc("LOADING", "main"), doc("SERVING", "extra", required=False)),
                           running=True) == 150
    assert cli.status_code(stack(serving, doc("FAILED", "second")), running=True) == 1
    # none required: every one counts
    both = stack(doc("SERVING", "a", required=False), doc("DEGRADED", "b", required=False))
    assert cli.status_code(both, running=True) == 150


def test_failed_outranks_paused_outranks_degraded() -> None:
    assert cli.status_code(stack(doc("PAUSED", "a"), doc("FAILED", "b")), running=True) == 1
    assert cli.status_code(stack(doc("PAUSED", "a"), doc("DEGRADED", "b")), running=True) == 151
    assert cli.status_code(stack(doc("SERVING", "a"), doc("BACKOFF", "b")), running=True) == 150


# ---- `status` against a state directory ---------------------------------------------------------

@pytest.fixture
def daemon_lock(tmp_path: Path) -> Iterator[Path]:
    """The state directory with its lock held, as a running daemon holds it."""
    fd = lock_state_dir(str(tmp_path))
    yield tmp_path
    os.close(fd)


def status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_no_daemon_no_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = status(capsys, "--state-dir", str(tmp_path))
    assert (code, out) == (3, "") and "is spark-supervisor running?" in err
    code, out, _ = status(capsys, "--state-dir", str(tmp_path), "--json")
    assert code == 3
    got = json.loads(out)
    assert got["running"] is False and got["phase"] is None and "is spark-supervisor running?" in got["error"]


def test_a_stale_status_is_shown_but_not_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    statefile.write(str(tmp_path), doc("SERVING"))
    code, out, _ = status(capsys, "--state-dir", str(tmp_path))
    assert code == 3
    assert out.startswith("NOT RUNNING: no spark-supervisor holds") and "\nSERVING for " in out
    code, out, _ = status(capsys, "--state-dir", str(tmp_path), "--json")
    got = json.loads(out)
    assert code == 3 and got["running"] is False and got["phase"] == "SERVING"


@pytest.mark.parametrize(("phase", "code"), [("SERVING", 0), ("FAILED", 1), ("LOADING", 150), ("PAUSED", 151)])
def test_running_daemon(daemon_lock: Path, capsys: pytest.CaptureFixture[str], phase: str, code: int) -> None:
    statefile.write(str(daemon_lock), doc(phase))
    got_code, out, _ = status(capsys, "--state-dir", str(daemon_lock))
    assert got_code == code and out.startswith(f"{phase} for ")
    got_code, out, _ = status(capsys, "--state-dir", str(daemon_lock), "--json")
    got = json.loads(out)
    assert got_code == code and got["running"] is True and got["phase"] == phase


def test_running_daemon_without_a_readable_status(daemon_lock: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock), "--json")
    assert code == 4 and json.loads(out) == {"running": True, "phase": None,
                                             "error": f"no status in {daemon_lock} yet: the daemon is starting"}
    (daemon_lock / statefile.FILE).write_text('{"phase": "SERV')  # torn or corrupt
    code, out, err = status(capsys, "--state-dir", str(daemon_lock))
    assert code == 4 and out == "" and "cannot read the status" in err
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock), "--json")
    assert code == 4 and json.loads(out)["running"] is True


def test_a_stack_is_judged_on_its_required_deployments(daemon_lock: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    statefile.write(str(daemon_lock), stack(doc("SERVING", "main"), doc("BACKOFF", "extra", required=False)))
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock))
    assert code == 0 and "== extra (not required)" in out
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock), "--json")
    got = json.loads(out)
    assert code == 0 and got["running"] is True and [d["phase"] for d in got["deployments"]] == ["SERVING", "BACKOFF"]


def test_an_unusable_config_is_status_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor\n")
    with pytest.raises(SystemExit) as e:
        cli.main(["status", "--json", "-c", str(bad)])
    out, err = capsys.readouterr()
    assert e.value.code == 4 and json.loads(out)["running"] is None and "not valid TOML" in err


# ---- global options -----------------------------------------------------------------------------

def config_file(tmp_path: Path, name: str) -> Path:
    d = data(supervisor={"state_dir": str(tmp_path / name)})
    p = tmp_path / f"{name}.toml"
    p.write_text(tomli_w.dumps(d))
    return p


def test_config_and_json_before_or_after_the_subcommand(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    a, b = config_file(tmp_path, "a"), config_file(tmp_path, "b")
    parse = cli.parser().parse_args
    assert parse(["-c", str(a), "status"]).config == str(a)
    assert parse(["status", "-c", str(b)]).config == str(b)
    assert parse(["--config", str(a), "status", "--config", str(b)]).config == str(b)  # the nearer wins
    assert parse(["status"]).config == cli.DEFAULT_CONFIG
    assert parse(["--json", "plan"]).json and parse(["plan", "--json"]).json and not parse(["plan"]).json
    for argv in (["--json", "-c", str(a), "status"], ["status", "--json", "--config", str(a)],
                 ["-c", str(b), "status", "-c", str(a), "--json"]):
        assert cli.main(argv) == 3
        got = json.loads(capsys.readouterr().out)
        assert got["running"] is False and str(tmp_path / "a") in got["error"]


def test_json_where_a_command_has_none_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--json", "run"])
    assert e.value.code == 2 and "`run` has no JSON output" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--json"])


def test_check_takes_the_config_before_the_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["-c", str(config_file(tmp_path, "a")), "check"]) == 0
    assert "OK: deployment 'qwen'" in capsys.readouterr().out


def test_check_prints_the_configs_warnings_and_still_passes(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = data(supervisor={"state_dir": str(tmp_path / "w")})
    d["deployments"][0]["serve"]["env"] = {"HF_TOKEN": "hf_literal_in_the_file"}
    p = tmp_path / "w.toml"
    p.write_text(tomli_w.dumps(d))
    assert cli.main(["-c", str(p), "check"]) == 0
    err = capsys.readouterr().err
    assert "warning: " in err and "HF_TOKEN" in err and "hf_literal_in_the_file" not in err


# ---- version, python -m, schema, completion, man page -------------------------------------------

def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    want = metadata.version("spark-supervisor")
    assert want == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"spark-supervisor {want}\n"
    assert cli.main(["version", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == want
    out = subprocess.run([sys.executable, "-m", "spark_supervisor", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert (out.returncode, out.stdout) == (0, f"spark-supervisor {want}\n")


def test_status_stays_light(tmp_path: Path) -> None:
    """`status` imports none of the heavy modules (it answers in well under a second)."""
    code = ("import sys; from spark_supervisor import cli; rc = cli.main(['status', '--json', '--state-dir', "
            f"{str(tmp_path)!r}]); heavy = {{'docker', 'httpx', 'argcomplete', 'ray', 'paramiko'}}; "
            "print(sorted(heavy & set(sys.modules)), file=sys.stderr); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 3 and out.stderr.strip().splitlines()[-1] == "[]", out.stderr


def test_schema_is_the_configs_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["$schema"].startswith("https://json-schema.org/") and schema["type"] == "object"
    assert set(schema["required"]) == {"nodes", "deployments"} and schema["additionalProperties"] is False
    example = tomllib.loads((ROOT / "etc" / "spark-supervisor.toml").read_text())
    assert set(example) <= set(schema["properties"])
    deployment = schema["$defs"]["Deployment"]["properties"]
    assert set(example["deployments"][0]) <= set(deployment)


def test_the_example_configs_are_valid_under_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    """What an editor validating against `schema` says of configs the daemon accepts: no false alarm."""
    import jsonschema
    cli.main(["schema"])
    validator = jsonschema.Draft202012Validator(json.loads(capsys.readouterr().out))
    for name in ("spark-supervisor.toml", "examples/stack.toml", "testbed.toml"):
        example = tomllib.loads((ROOT / "etc" / name).read_text())
        assert not [e.message for e in validator.iter_errors(example)], name
    assert [e.message for e in validator.iter_errors({**example, "bogus": 1})] == \
        ["Additional properties are not allowed ('bogus' was unexpected)"]


def test_completion_script_and_completions(capsys: pytest.CaptureFixture[str]) -> None:
    scripts = {}
    for shell in ("bash", "zsh"):
        assert cli.main(["completion", shell]) == 0
        scripts[shell] = capsys.readouterr().out
        assert "spark-supervisor" in scripts[shell] and "_ARGCOMPLETE" in scripts[shell]

    def complete(line: str) -> set[str]:
        """What bash offers at the end of `line`, with the script sourced as ~/.bashrc would."""
        words = line.split() + ([""] if line.endswith(" ") else [])
        script = (f"{scripts['bash']}\nCOMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}; "
                  f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
                  f"_python_argcomplete spark-supervisor {shlex.quote(words[-1])} {shlex.quote(words[-2])}\n"
                  'printf "%s\\n" "${COMPREPLY[@]}"\n')
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
        out = subprocess.run(["bash", "--norc", "--noprofile"], input=script, env=env, capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return {w.strip() for w in out.stdout.splitlines() if w.strip()}
    assert complete("spark-supervisor st") == {"status"}
    assert {"check", "pause", "status", "schema", "completion"} <= complete("spark-supervisor ")
    assert {"--config", "--json", "--version"} <= complete("spark-supervisor -")
    assert complete("spark-supervisor status --st") == {"--state-dir"}
    assert complete("spark-supervisor -c x completion ") >= {"bash", "fish", "tcsh", "zsh"}


def test_man_page_is_generated_from_the_parser_and_committed() -> None:
    """man/spark-supervisor.1 is what `make man` writes now: regenerate and commit it when this fails."""
    pytest.importorskip("argparse_manpage")
    out = subprocess.run([sys.executable, str(ROOT / "man" / "generate.py"), "--check"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    page = (ROOT / "man" / "spark-supervisor.1").read_text()
    commands = next(a for a in cli.parser()._actions if a.dest == "command").choices
    assert commands and all(f"spark\\-supervisor {name.replace('-', chr(92) + '-')}" in page
                            or f"\\,{name}\\/" in page for name in commands)
    for section in (".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH FILES"):
        assert section in page


def test_a_status_a_running_daemon_wrote_long_ago_says_how_old(daemon_lock: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42 (LOW): the daemon runs but its status file is old (a full disk): shown, and said to be stale."""
    old = doc("SERVING")
    old["daemon"]["updated"] = statefile.iso(time.time() - 3 * 3600)
    statefile.write(str(daemon_lock), old)
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock))
    assert out.startswith("STALE: the daemon runs but wrote this 3h00m ago (it writes it at least every 30s)"), out
    assert "\nSERVING for " in out
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock), "--json")
    assert 3 * 3600 <= json.loads(out)["age_s"] < 3 * 3600 + 60
    statefile.write(str(daemon_lock), doc("SERVING"))  # fresh: no word of it
    code, out, _ = status(capsys, "--state-dir", str(daemon_lock))
    assert out.startswith("SERVING for "), out


def test_status_with_a_mistyped_config_on_disk_shows_what_runs_and_the_files_problems(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42 (LOW): a mistyped file on disk (the daemon rightly kept the config it read last), or a
    `${HF_TOKEN}` this shell lacks: status shows what runs, and the file's problems beside it."""
    import tomli_w

    from tests.helpers import data
    state = tmp_path / "state"
    fd = lock_state_dir(str(state))
    try:
        statefile.write(str(state), doc("SERVING"))
        d = data()
        d["supervisor"]["state_dir"] = str(state)
        d["deployments"][0]["serve"]["env"] = {"HF_TOKEN": "${HF_TOKEN}"}
        d["supervisor"]["intervall"] = 5  # a typo
        path = tmp_path / "c.toml"
        path.write_text(tomli_w.dumps(d))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        code, out, err = status(capsys, "-c", str(path))
        assert code == 0 and out.startswith("SERVING for "), (out, err)
        assert err.startswith(f"{path} has problems (a running daemon keeps the config it read last):\n  {path}: ")
        assert "HF_TOKEN is not set" in err, err
        monkeypatch.setenv("HF_TOKEN", "hf_x")  # the variable there: the typo is the problem
        code, out, err = status(capsys, "-c", str(path))
        assert code == 0 and out.startswith("SERVING for ") and "intervall" in err, (out, err)
        code, out, _ = status(capsys, "--json", "-c", str(path))
        got = json.loads(out)
        assert got["phase"] == "SERVING" and any("intervall" in p for p in got["config_problems"])
        path.write_text("[supervisor\n")  # not even TOML: where the state is cannot be told
        with pytest.raises(SystemExit) as e:
            cli.main(["status", "-c", str(path)])
        out, err = capsys.readouterr()
        assert e.value.code == 4 and out == "" and str(path) in err
    finally:
        os.close(fd)
