"""The record through the daemon (issue 25), on the fake backend: a record each time a new serve reaches
SERVING, what changed since the last good one in every FAILED or DEGRADED (status, `status`, the alert),
the decisions between two records, `record` and `record --diff` read from the state directory, and a
`report` that holds none of the secrets planted in the config, the environment and the files it reads."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_supervisor import cli
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    Action,
    EndpointObservation,
    EndpointState,
    EngineStats,
    Kind,
    Measure,
    Observation,
    Outcome,
    Phase,
    Throughput,
)
from spark_supervisor.reconcile.recording import Recorder
from spark_supervisor.report.record import build
from spark_supervisor.state import records, statefile
from spark_supervisor.world import perf
from tests.fakes import FakeBackend, make
from tests.helpers import cfg, counted, data, obs, phase_now, serve_running, sole
from tests.unit.test_record import KERNEL, A, B, checked, host, sources

UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
NEW_KERNEL = "7.0.0-1019-nvidia"


def seen(daemon: Daemon, *, image: str = A, kernels: dict[str, str] | None = None, pid: int = 77,
         gpu_lost: str = "", serve: Any = None) -> Observation:
    """The deployment as observed: every member's container running ``image``, its host facts read."""
    c = daemon.cfg
    o = dataclasses.replace(obs(c, deployed=True, serve=serve or serve_running(c, pid=pid), endpoint=UP),
                            engine=EngineStats(generated=100))
    kernels = kernels or {}
    nodes = {n: dataclasses.replace(x, host=host(n, kernel=kernels.get(n, KERNEL)),
                                    containers=tuple(dataclasses.replace(k, image_id=image) for k in x.containers))
             for n, x in o.nodes.items()}
    if gpu_lost:  # nvidia-smi on spark-2 lost NVML: no GPU reading, its words instead
        nodes["spark-2"] = dataclasses.replace(nodes["spark-2"], gpu=None, gpu_lost=gpu_lost)
    return dataclasses.replace(o, nodes=nodes)


def until(daemon: Daemon, phase: Phase, clock: Any, ticks: int = 8) -> None:
    for _ in range(ticks):
        daemon.tick()
        clock.t += 5
        if sole(daemon).status.phase == phase:
            return
    raise AssertionError(f"{phase.value} not reached: {sole(daemon).status.phase.value} {sole(daemon).status.reason}")


def recorded(tmp_path: Path) -> list[dict[str, Any]]:
    return records.read(str(tmp_path / "state" / "deployments" / "qwen"), "qwen").records


def started(tmp_path: Path, d: dict[str, Any] | None = None) -> tuple[Daemon, FakeBackend, Any, Path]:
    daemon, be, clock, _, path = make(tmp_path, d)
    be.reports = sole(daemon).status.images = checked(daemon.cfg)
    return daemon, be, clock, path


def test_a_new_serve_that_reaches_serving_is_recorded_once(tmp_path: Path) -> None:
    daemon, be, clock, _ = started(tmp_path)
    r = sole(daemon.stack)
    r.repairs.add(1.7e9 + clock.t, "serve", "ServeExited: exit code 137")  # a decision before this record
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    (rec,) = recorded(tmp_path)
    assert rec["nodes"]["spark-2"]["host"]["kernel"] == KERNEL and rec["nodes"]["spark-1"]["image"]["id"] == A
    assert rec["nodes"]["spark-1"]["image"]["vllm"] == "0.33.0" and rec["good"] is True
    assert rec["serve_id"] == serve_running(daemon.cfg).identity
    assert [(x["what"], x["reason"]) for x in rec["decisions"]] == [("repair serve", "ServeExited: exit code 137")]
    be.next = seen(daemon, gpu_lost="Failed to initialize NVML: Unknown Error")
    until(daemon, Phase.DEGRADED, clock)
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    assert len(recorded(tmp_path)) == 1  # the same serve again: recorded already


def test_going_bad_says_what_changed_in_the_status_the_alert_and_record_diff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    daemon, be, clock, path = started(tmp_path)
    r = sole(daemon.stack)
    sent: list[dict[str, Any]] = []
    r.alert = lambda _name, event, **kw: sent.append({"event": event, **kw})
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    be.next = seen(daemon, kernels={"spark-2": NEW_KERNEL}, gpu_lost="Failed to initialize NVML: Unknown Error")
    until(daemon, Phase.DEGRADED, clock)
    said = f"since the last good serve: kernel {KERNEL} → {NEW_KERNEL} on spark-2"
    assert sole(daemon).status.why.kind == Kind.GPU_ACCESS_LOST and sole(daemon).status.changed == said
    assert sent[-1]["event"] == "degraded" and sent[-1]["changed"] == said
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert doc["changed"] == said
    assert cli.main(["status", "--state-dir", str(tmp_path / "state")]) in (150, 3)
    assert f"\n  {said}\n" in capsys.readouterr().out
    assert cli.main(["record", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen: DEGRADED at ") and "its facts then: not a good serve" in out and said in out
    assert cli.main(["record", "-c", str(path), "--diff"]) == 0
    assert f"nodes.spark-2.host.kernel: {KERNEL} → {NEW_KERNEL}\n" in capsys.readouterr().out
    assert cli.main(["record", "-c", str(path), "--diff", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["verdict"] == "DEGRADED" and {"path": "nodes.spark-2.host.kernel", "old": KERNEL, "new": NEW_KERNEL} \
        in got["changes"]
    be.next = seen(daemon, kernels={"spark-2": NEW_KERNEL})
    until(daemon, Phase.SERVING, clock)
    assert sole(daemon).status.changed == "" and sent[-1]["event"] == "recovered"


def test_going_bad_compares_with_the_good_record_kept_without_reading_the_history_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry into FAILED or DEGRADED compares with the last good record: kept by the recorder as it wrote
    it, the history file (up to 2 MiB) read only by a recorder that kept nothing of it yet, and once."""
    daemon, be, clock, _ = started(tmp_path)
    r = sole(daemon.stack)
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    reads = counted(monkeypatch, records, "read")
    be.next = seen(daemon, kernels={"spark-2": NEW_KERNEL}, gpu_lost="Failed to initialize NVML: Unknown Error")
    until(daemon, Phase.DEGRADED, clock)
    said = f"since the last good serve: kernel {KERNEL} → {NEW_KERNEL} on spark-2"
    assert sole(daemon).status.changed == said and reads == []
    for _ in range(3):  # entered again (its reason changed, FAILED and back): the same, and no read
        r.recorder.entered(r)
        assert sole(daemon).status.changed == said and reads == []
    r.recorder = Recorder()  # a daemon restarted beside the deployment: it reads the file on its first need
    for _ in range(3):
        r.recorder.entered(r)
        assert sole(daemon).status.changed == said and len(reads) == 1


def test_a_start_that_fails_on_another_image_names_the_image(tmp_path: Path) -> None:
    daemon, be, clock, _ = started(tmp_path)
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    c = daemon.cfg
    failed = dataclasses.replace(serve_running(c, log="vllm serve: error: unrecognized arguments: --bogus\n", pid=78),
                                 running=False, exit_code=2)
    be.next = seen(daemon, image=B, serve=failed)
    until(daemon, Phase.FAILED, clock)
    assert sole(daemon).status.changed.startswith("since the last good serve: image sha256:aaaaaaaaaaaa… → sha256:bbbbbbbbbbbb…")
    bad, _ = records.read_bad(str(tmp_path / "state" / "deployments" / "qwen"), "qwen")
    assert bad is not None and bad["verdict"] == "FAILED" and bad["changed"] == sole(daemon).status.changed
    assert bad["reason"].startswith("ServeFailed: BadArguments") and bad["good"] is False


def test_a_throughput_regression_is_held_to_the_serve_before_it(tmp_path: Path) -> None:
    d = data()
    d["deployments"][0]["performance"] = {"baseline": 25.0}
    daemon, be, clock, _ = started(tmp_path, d)
    speed = {77: 27.4, 78: 13.1}  # the first serve as fast as ever; the one on the new image slow
    answer = be.run

    def measured(action: Action) -> Outcome:
        got = answer(action)
        if isinstance(action, Measure):
            return Throughput(action.serve, 0.2, speed[int(action.serve.split(":")[1])], 128)
        return got
    be.run = measured  # type: ignore[method-assign]
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    daemon.tick()  # its verdict
    be.next = seen(daemon, image=B, pid=78)
    be.reports = sole(daemon).status.images = checked(daemon.cfg, B)
    until(daemon, Phase.VERIFYING, clock)
    until(daemon, Phase.DEGRADED, clock)
    assert phase_now(sole(daemon).status) == Phase.DEGRADED and sole(daemon).status.why.kind == Kind.THROUGHPUT_REGRESSION
    first, second = recorded(tmp_path)
    assert first["good"] is True and first["results"]["performance"]["verdict"] == "ok"
    assert second["good"] is False and second["results"]["performance"]["verdict"] == "regression"
    assert sole(daemon).status.changed.startswith("since the last good serve: image sha256:aaaaaaaaaaaa… → sha256:bbbb")


def test_page_cache_drops_and_rollbacks_between_two_records_are_its_decisions(tmp_path: Path) -> None:
    daemon, be, clock, _ = started(tmp_path)
    r = sole(daemon.stack)
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    r.status.page_cache_dropped = frozenset({"spark-2"})
    r.recorder.after_tick(r)
    r.recorder.note("rollback", "RolledBack: qwen: ServeFailed: …", 1.7e9 + clock.t)
    r.recorder.after_tick(r)  # the same drop is not noted twice
    be.next = seen(daemon, pid=78)
    until(daemon, Phase.VERIFYING, clock)
    until(daemon, Phase.SERVING, clock)
    _, second = recorded(tmp_path)
    assert [x["what"] for x in second["decisions"]] == ["page-cache drop", "rollback"]
    assert second["decisions"][0]["reason"].startswith("spark-2: ")


def test_record_without_a_record_or_a_deployment_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    assert cli.main(["record", "-c", str(path)]) == 1 and "no record yet" in capsys.readouterr().err
    assert cli.main(["record", "nope", "-c", str(path)]) == 2 and "no deployment 'nope'" in capsys.readouterr().err
    own = str(tmp_path / "state" / "deployments" / "qwen")
    records.append(own, build(sources(cfg(d))), 1.0)
    assert cli.main(["record", "-c", str(path), "--diff"]) == 1
    assert "0 good records before it" in capsys.readouterr().err
    assert cli.main(["record", "-c", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "SERVING"


# ---------------------------------------------------------------------------------------- the bundle
SECRETS = {"api key": "sk-PLANTED-api-key-0123", "HF token": "hf_PLANTEDtokenABCDEF",
           "HF token from the environment": "hf_ENVPLANTEDtoken987", "webhook password": "s3cr3t-PLANTED",
           "webhook path": "XXXXPLANTEDhookXXXX", "alert token": "Bearer-PLANTED-alert",
           "a token in the environment only": "envonly-PLANTED-tok", "a flag's token": "hf_FLAGplanted4567"}


def test_a_report_holds_the_record_status_logs_and_config_and_none_of_the_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", SECRETS["HF token from the environment"])
    monkeypatch.setenv("NOTIFY_TOKEN", SECRETS["a token in the environment only"])  # the config names it nowhere
    key = tmp_path / "api-key"
    key.write_text(SECRETS["api key"] + "\n")
    key.chmod(0o600)
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    d["alerts"] = {"webhook": f"https://alice:{SECRETS['webhook password']}@hooks.example.com/services/T0/B0/"
                              f"{SECRETS['webhook path']}", "command": ["/usr/bin/curl", "-H", SECRETS["alert token"]]}
    dep = d["deployments"][0]
    dep["readiness"] = {"api_key_file": str(key)}
    dep["serve"]["env"] = {"HF_TOKEN": SECRETS["HF token"], "HUGGING_FACE_HUB_TOKEN": "${HF_TOKEN}"}
    dep["serve"]["log_host_dir"] = str(tmp_path / "logs")
    dep["serve"]["extra_args"] = ["--max-model-len", "8192", "--hf-token", SECRETS["a flag's token"]]
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    # What the daemon would have written, each with a secret in it (a reason, a log line that quote one)
    c = cfg(dict(d, deployments=[{**dep, "readiness": {}, "serve": {**dep["serve"], "env": {}}}]))
    leak = " ".join(SECRETS.values())
    own = str(tmp_path / "state" / "deployments" / "qwen")
    records.append(own, build(sources(c, serve_id="s1")), 1.0)
    records.write_bad(own, {**build(sources(c, verdict="FAILED", serve_id="s2")), "wall": 1.8e9,
                          "reason": f"ServeFailed: {leak}"})
    statefile.write_json(str(tmp_path / "state"), "status.json", {"phase": "FAILED", "reason": leak, "history": [
        {"at": "2026-01-01T00:00:00Z", "phase": "FAILED", "reason": leak}], "deployment": {"name": "qwen"}})
    logs = tmp_path / "logs" / "qwen" / "spark-1"
    logs.mkdir(parents=True)
    (logs / "20260101T000000Z-spark-1-0123456789ab.log").write_text(f"INFO starting\nenv: {leak}\nERROR boom\n")
    out = tmp_path / "bundle.tar.gz"
    assert cli.main(["report", "-c", str(path), "--out", str(out)]) == 0
    assert f"wrote {out} (" in capsys.readouterr().out
    with tarfile.open(out) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                   for m in tar.getmembers()}
    assert {"README.txt", "config.json", "status.json", "transitions.txt", "qwen/records.jsonl", "qwen/record-bad.json",
            "qwen/record.txt", "qwen/logs/spark-1.log"} <= set(members), sorted(members)
    for name, content in members.items():
        for what, secret in SECRETS.items():
            assert secret not in content, f"{what} in {name}"
    config = json.loads(members["config.json"])
    assert config["alerts"]["webhook"] == "https://hooks.example.com/[redacted]"
    assert config["alerts"]["command"] == ["/usr/bin/curl", "-H", "[redacted]"]
    assert config["deployments"][0]["serve"]["env"] == {"HF_TOKEN": "[redacted]", "HUGGING_FACE_HUB_TOKEN": "[redacted]"}
    assert config["deployments"][0]["readiness"]["api_key_file"] == str(key)  # where, never what
    assert config["deployments"][0]["serve"]["extra_args"] == ["--max-model-len", "8192", "--hf-token", "[redacted]"]
    assert "ERROR boom" in members["qwen/logs/spark-1.log"] and "qwen: FAILED at" in members["qwen/record.txt"]
    assert "2026-01-01T00:00:00Z FAILED: " in members["transitions.txt"]


def test_a_report_goes_to_the_state_directory_by_default_and_says_what_it_could_not_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    assert cli.main(["report", "-c", str(path)]) == 0
    said = capsys.readouterr().out
    (made,) = (tmp_path / "state" / "reports").glob("spark-supervisor-report-*.tar.gz")
    assert said.startswith(f"wrote {made} (") and made.stat().st_mode & 0o777 == 0o600
    with tarfile.open(made) as tar:
        readme = tar.extractfile(tar.getmembers()[0]).read().decode()  # type: ignore[union-attr]
    assert "not included: status: not read" in readme and "the serve's log on spark-1" in readme


def test_the_perf_key_is_unchanged_by_the_record(tmp_path: Path) -> None:
    """The record reads the verdict; it never writes perf.json (the best is the verdict's own business)."""
    daemon, be, clock, _ = started(tmp_path)
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    assert not (tmp_path / "state" / "deployments" / "qwen" / perf.FILE).exists()


def test_a_record_that_cannot_be_made_or_written_never_stops_the_tick_or_its_alert(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, be, clock, _ = started(tmp_path)
    r = sole(daemon.stack)
    sent: list[str] = []
    r.alert = lambda _name, event, **_kw: sent.append(event)
    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(records, "_write", full)  # the disk is full: the record is lost, the serve is not
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    assert recorded(tmp_path) == []
    monkeypatch.setattr("spark_supervisor.reconcile.recording.build", lambda _src: 1 / 0)  # a bug
    be.next = seen(daemon, gpu_lost="Failed to initialize NVML: Unknown Error")
    until(daemon, Phase.DEGRADED, clock)
    assert sent == ["degraded"] and sole(daemon).status.changed == ""


def test_a_deployment_adopted_after_a_restart_of_the_daemon_is_recorded_with_the_check_kept_of_its_image(
        tmp_path: Path) -> None:
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    sole(daemon).status.images = be.reports = {}  # this run has checked nothing: it found the deployment serving
    kept = dataclasses.replace(checked(c)["spark-2"], model=None)  # as the image check keeps it
    statefile.write_json(str(tmp_path / "state" / "deployments" / "qwen"), "images.json", {
        "spark-2": {"image_id": A, "key": kept.key, "report": dataclasses.asdict(kept)},
        "spark-1": {"image_id": B, "key": kept.key, "report": dataclasses.asdict(kept)}})  # of another image
    be.next = seen(daemon)
    until(daemon, Phase.SERVING, clock)
    (rec,) = recorded(tmp_path)
    assert rec["nodes"]["spark-2"]["image"]["vllm"] == "0.33.0"
    assert rec["nodes"]["spark-2"]["image"]["digest"] == "vllm/vllm-openai@sha256:" + "d" * 64
    assert rec["nodes"]["spark-1"]["image"] == {**rec["nodes"]["spark-2"]["image"], **dict.fromkeys(
        ("digest", "vllm", "torch", "transformers", "ray", "nccl", "python"), "unknown")}  # not what it runs


def test_a_report_replaces_only_a_regular_file_and_goes_to_standard_output_with_a_dash(
        tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """Issue 42, item 9: as root, `--out /dev/null` must not turn the host's /dev/null into a file, nor a link be
    replaced; `--out -` writes the bundle to standard output (the words to standard error)."""
    import os
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    fifo, link, old = tmp_path / "fifo", tmp_path / "link", tmp_path / "old.tar.gz"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere")
    old.write_bytes(b"an older report")
    for target, kind in ((fifo, "a special file"), (link, "a symbolic link"), (tmp_path, "a directory")):
        assert cli.main(["report", "-c", str(path), "--out", str(target)]) == 1
        err = capfdbinary.readouterr().err.decode()
        assert f"{target} is {kind}, not a regular file: not replaced" in err, err
    assert fifo.is_fifo() and link.is_symlink() and not (tmp_path / "elsewhere").exists()
    assert cli.main(["report", "-c", str(path), "--out", str(old)]) == 0
    with tarfile.open(old) as tar:
        assert tar.getmembers()[0].name.endswith("README.txt")
    capfdbinary.readouterr()
    assert cli.main(["report", "-c", str(path), "--out", "-"]) == 0
    got = capfdbinary.readouterr()
    assert got.err.decode().startswith("wrote the bundle to standard output (")
    with tarfile.open(fileobj=io.BytesIO(got.out)) as tar:
        assert tar.getmembers()[0].name.endswith("README.txt")
