"""The unit under a real systemd: the head node is a container with systemd as PID 1 and host networking,
the supervisor installed in it with `make install`, the old stack's units installed and enabled in it.
The tests run in order, as one operator's day: boot, reload, hang, restart, reboot."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import testbed
from spark_testbed.harness import ROOT, containers
from spark_testbed.testbed import head_exec, until

UNIT = "spark-supervisor"
STALE_UNITS = {"vllm-cluster": "vllm_node", "vllm-reranker": "reranker", "vllm-embeddings": "vllm_embeddings",
               "vllm-proxy": None}
OWNED = {"spark-1": "testbed-ray-spark-1", "spark-2": "testbed-ray-spark-2"}
CONFIG = "/etc/spark-supervisor/spark-supervisor.toml"
SMI = "/usr/local/lib/spark-testbed/nvidia_smi.py"


def expanded_config(**supervisor: Any) -> dict[str, Any]:
    text = (ROOT / "etc" / "testbed.toml").read_text()
    for k, v in testbed.env().items():
        text = text.replace("${" + k + "}", v)
    d = tomllib.loads(text)
    d["supervisor"].update({"state_dir": "/var/lib/spark-supervisor", **supervisor})
    # The stand-in (stdlib only), copied into the container by the `head` fixture: the installed venv holds
    # the daemon and nothing else, and the source may live under /tmp, which the unit's PrivateTmp hides.
    smi = ["/usr/bin/python3", SMI]
    gpu = f"{testbed.DIR}/spark-1/gpu.json"
    d["nodes"][0].update(nvidia_smi=[*smi, "--state", gpu], meminfo=[*smi, "--state", gpu, "--meminfo"],
                         drop_caches=[*smi, "--state", gpu, "--drop-caches"])
    d["stale"].update(units=["vllm-proxy", "vllm-embeddings", "vllm-reranker", "vllm-cluster"], disable=True)
    return d


def put(path: str, text: str) -> None:
    head_exec("mkdir", "-p", str(Path(path).parent))
    subprocess.run(["docker", "-H", f"unix://{testbed.sock('spark-1')}", "exec", "-i", testbed.HEAD,
                    "sh", "-c", 'cat > "$1"', "sh", path], input=text, text=True, check=True, timeout=30)


def stale_unit(name: str, container: str | None) -> str:
    if container is None:
        start = "/bin/sleep infinity"
        stop = ""
    else:
        dk = f"/usr/local/bin/docker -H unix://{testbed.sock('spark-1')}"
        start = f"{dk} run --rm --name {container} --network host {testbed.BUSYBOX} sleep 1000000"
        stop = f"ExecStop={dk} rm -f {container}\n"
    return (f"[Unit]\nDescription=old stack: {name}\n\n[Service]\nExecStart={start}\n{stop}"
            "Restart=always\n\n[Install]\nWantedBy=multi-user.target\n")


def props() -> dict[str, str]:
    out = head_exec("systemctl", "show", UNIT, "-p",
                    "ActiveState,SubState,StatusText,Result,NRestarts,MainPID,ExecMainStatus").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def wait_unit(cond: Any, timeout: float, what: str) -> dict[str, str]:
    def check() -> dict[str, str] | None:
        p = props()
        return p if cond(p) else None
    try:
        return until(check, timeout, what, every=0.3)  # type: ignore[return-value]
    except TimeoutError as e:
        raise AssertionError(f"{e}: {props()}\n{journal()[-3000:]}") from None


def serving(p: dict[str, str]) -> bool:
    return p.get("ActiveState") == "active" and p.get("StatusText", "").startswith("SERVING")


def journal() -> str:
    return head_exec("journalctl", "-u", UNIT, "-o", "cat", "--no-pager").stdout


def entries(*query: str) -> list[dict[str, Any]]:
    """The daemon's own journal entries (native protocol) that match the journalctl arguments."""
    out = head_exec("journalctl", "-u", UNIT, "-o", "json", "--no-pager", *query, "SYSLOG_IDENTIFIER=" + UNIT).stdout
    return [e for e in map(json.loads, out.splitlines()) if "JSON" in e]


def events(name: str) -> list[dict[str, Any]]:
    """The events of that name, each the whole event as the daemon logged it (the entry's JSON= field)."""
    return [json.loads(e["JSON"]) for e in entries("EVENT=" + name)]


def owned_ids() -> dict[str, str]:
    return {node: containers(node)[name]["id"] for node, name in OWNED.items()}


@pytest.fixture(scope="module")
def head(tb: dict[str, str]) -> Iterator[str]:
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    testbed.systemd_head()
    head_exec("make", "-C", str(ROOT), "install", "PYTHON=/usr/bin/python3", timeout=900,
              env={"PIP_CERT": "/etc/ssl/certs/ca-certificates.crt"})
    put(SMI, (ROOT / "spark_testbed" / "nvidia_smi.py").read_text())
    put(CONFIG, tomli_w.dumps(expanded_config()))
    ssh_home = testbed.DIR / "home" / ".ssh"
    for f in ("config", "known_hosts"):
        put(f"/root/.ssh/{f}", (ssh_home / f).read_text())
    for name, container in STALE_UNITS.items():
        put(f"/etc/systemd/system/{name}.service", stale_unit(name, container))
    head_exec("systemctl", "daemon-reload")
    head_exec("systemctl", "enable", "--now", *STALE_UNITS)
    until(lambda: set(STALE_UNITS.values()) - {None} <= set(containers("spark-1")), 60, "stale containers")
    yield testbed.HEAD
    testbed.docker("spark-1", "rm", "-f", testbed.HEAD, check=False)
    testbed.clean_containers()


def test_the_shipped_unit_passes_systemd_analyze_verify(head: str, tmp_path: Path) -> None:
    unit = tmp_path / "spark-supervisor.service"
    text = (ROOT / "systemd" / "spark-supervisor.service").read_text()
    unit.write_text(text.replace("/opt/spark-supervisor/venv/bin/spark-supervisor",
                                 str(Path(shutil.which("python3") or "/usr/bin/python3"))))
    host = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (host.returncode, host.stderr.strip()) == (0, "")
    inside = head_exec("systemd-analyze", "verify", "/etc/systemd/system/spark-supervisor.service", check=False)
    assert (inside.returncode, inside.stderr.strip()) == (0, ""), inside.stderr
    security = head_exec("systemd-analyze", "security", "--no-pager", UNIT, check=False).stdout
    print("\n" + security.strip().splitlines()[-1])  # the exposure score, quoted in the README


def phase_split() -> str:
    """Seconds spent in each phase of the last start, from the journal's phase.changed events."""
    from datetime import datetime
    changes = events("phase.changed")
    start = [i for i, e in enumerate(changes) if e["from"] in ("DETECTING", "STOPPING")][-1]
    times = [(e["to"], datetime.fromisoformat(e["timestamp"])) for e in changes[start:]]
    t0 = datetime.fromisoformat(events("daemon.started")[-1]["timestamp"])
    parts, prev = [], ("DETECTING", t0)
    for phase, t in times:
        parts.append(f"{prev[0]} {(t - prev[1]).total_seconds():.1f}s")
        prev = (phase, t)
    return f"start to SERVING {(prev[1] - t0).total_seconds():.1f}s: " + ", ".join(parts)


def test_boot_brings_the_deployment_to_serving(head: str) -> None:
    assert props()["ActiveState"] == "inactive"
    head_exec("systemctl", "enable", UNIT)
    head_exec("systemctl", "start", "--no-block", UNIT)
    wait_unit(lambda p: p["ActiveState"] == "activating", 30, "activating")
    p = wait_unit(serving, 150, "active and SERVING")
    assert p["StatusText"] == "SERVING Qwen3.5-122B-A10B-FP8 on 2 nodes"
    for unit in STALE_UNITS:  # stopped ("failed" when the killed docker CLI exits non-zero) and disabled
        assert head_exec("systemctl", "is-active", unit, check=False).stdout.strip() in ("inactive", "failed")
        assert head_exec("systemctl", "is-enabled", unit, check=False).stdout.strip() == "disabled"
    assert set(containers("spark-1")) == {testbed.HEAD, OWNED["spark-1"]}
    # The journal holds the story as structured lines.
    stopped = [e["unit"] for e in events("clean.unit_stopped")]
    assert stopped == ["vllm-proxy", "vllm-embeddings", "vllm-reranker", "vllm-cluster"]
    assert [e["unit"] for e in events("clean.unit_disabled")] == stopped
    phases = [e["to"] for e in events("phase.changed")]
    assert phases[0] == "CLEANING" and phases[-1] == "SERVING" and "STARTING_RAY" in phases
    print("\nboot:", phase_split())


def test_reload_applies_a_probe_interval_in_place_and_keeps_the_old_config_when_broken(head: str) -> None:
    before = owned_ids()
    put(CONFIG, tomli_w.dumps(expanded_config(interval=3)))
    head_exec("systemctl", "reload", UNIT)
    until(lambda: events("config.reloaded"), 30, "config.reloaded")
    assert events("config.reloaded")[-1]["changed"] is True
    assert wait_unit(serving, 30, "still serving")
    assert owned_ids() == before

    put(CONFIG, "[nodes\n")
    head_exec("systemctl", "reload", UNIT)
    p = wait_unit(lambda p: "reload failed" in p["StatusText"], 30, "reload failure in StatusText")
    assert p["ActiveState"] == "active" and p["StatusText"].startswith("SERVING")
    status = head_exec("systemctl", "status", "--no-pager", UNIT, check=False).stdout
    assert "reload failed" in status and "not valid TOML" in status
    assert events("config.invalid")[-1]["kept"] == "previous config"
    # The good file again: `systemctl reload` returns once the SIGHUP is sent (ExecReload=kill), so wait for
    # the daemon's reading of it. It is the config that runs: nothing changed, the failure is cleared.
    reloads = len(events("config.reloaded"))
    put(CONFIG, tomli_w.dumps(expanded_config(interval=3)))
    head_exec("systemctl", "reload", UNIT)
    until(lambda: len(events("config.reloaded")) > reloads, 30, "config.reloaded of the good file")
    assert events("config.reloaded")[-1]["changed"] is False
    wait_unit(lambda p: serving(p) and "reload failed" not in p["StatusText"], 30, "the reload failure cleared")
    assert owned_ids() == before


# The test's own hook, put into the installed venv for this test only (the daemon has no test switch): with
# SPARK_TEST_HANG_FILE in its environment, the main loop's tick blocks for good once that file exists, while
# the daemon's other threads (the control socket, the metrics, the engine followers) go on.
HANG_HOOK = """import os, threading


def install():
    hang = os.environ.get("SPARK_TEST_HANG_FILE")
    if not hang:
        return
    from spark_supervisor.loop import daemon
    tick = daemon.Daemon._tick

    def hanging(self, *, due_only):
        if os.path.exists(hang):
            self.log.warning("test.hanging", file=hang)
            threading.Event().wait()
        return tick(self, due_only=due_only)
    daemon.Daemon._tick = hanging
"""


def test_a_hung_main_loop_is_killed_by_the_watchdog_and_restarted(head: str) -> None:
    site = head_exec("/opt/spark-supervisor/venv/bin/python3", "-c",
                     "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    hook, pth = f"{site}/spark_test_hang.py", f"{site}/spark-test-hang.pth"
    put(hook, HANG_HOOK)
    put(pth, "import spark_test_hang; spark_test_hang.install()\n")
    try:
        put(f"/etc/systemd/system/{UNIT}.service.d/test-watchdog.conf",
            "[Service]\nWatchdogSec=4s\nRestartSec=1s\nEnvironment=SPARK_TEST_HANG_FILE=/run/spark-hang\n")
        head_exec("systemctl", "daemon-reload")
        head_exec("systemctl", "restart", "--no-block", UNIT)
        restarts = int(wait_unit(serving, 120, "serving after restart")["NRestarts"])
        head_exec("touch", "/run/spark-hang")
        wait_unit(lambda p: int(p["NRestarts"]) > restarts, 60, "an automatic restart")
        assert "Failed with result 'watchdog'" in head_exec("journalctl", "-u", UNIT, "--no-pager").stdout
    finally:
        head_exec("rm", "-f", "/run/spark-hang", hook, pth, f"/etc/systemd/system/{UNIT}.service.d/test-watchdog.conf")
        head_exec("systemctl", "daemon-reload")
    wait_unit(serving, 120, "serving after the watchdog restart")


def test_the_journal_has_a_priority_per_level_and_the_events_fields(head: str) -> None:
    """By now the journal holds info events (the starts), a warning (test.hanging, just before the watchdog
    kill) and an error (config.invalid, the broken reload)."""
    def by_priority(p: str) -> set[str]:
        return {e["EVENT"] for e in entries("-p", p)}
    until(lambda: by_priority("warning") >= {"test.hanging", "config.invalid"}, 30,
          "test.hanging and config.invalid under -p warning")
    warnings = by_priority("warning")
    assert not warnings & {"daemon.started", "daemon.ready", "clean.unit_stopped"}, warnings
    assert all(int(e["PRIORITY"]) <= 4 for e in entries("-p", "warning"))
    errors = by_priority("err")
    assert "config.invalid" in errors and "test.hanging" not in errors, errors
    # Fields are queryable: by event, by deployment, by phase; MESSAGE reads as a line of text.
    started = entries("EVENT=daemon.started")
    assert started and all(e["EVENT"] == "daemon.started" and e["PRIORITY"] == "6" for e in started)
    assert started[-1]["MESSAGE"].startswith("daemon.started config=" + CONFIG)
    name = expanded_config()["deployments"][0]["name"]
    mine = entries("DEPLOYMENT=" + name)
    assert "phase.changed" in {e["EVENT"] for e in mine} and all(e["DEPLOYMENT"] == name for e in mine)
    serving_ = entries("EVENT=phase.changed", "PHASE=SERVING")
    assert serving_ and all(json.loads(e["JSON"])["to"] == "SERVING" for e in serving_)
    assert serving_[-1]["MESSAGE"].startswith(f"phase.changed deployment={name} from=")
    invalid = entries("EVENT=config.invalid")[-1]
    assert "not valid TOML" in invalid["MESSAGE"] and "\n" not in invalid["MESSAGE"]
    print("\n" + head_exec("journalctl", "-u", UNIT, "-p", "warning", "-o", "short-iso", "--no-pager", "-n", "4",
                           "SYSLOG_IDENTIFIER=" + UNIT).stdout.strip())
    # Without the journal socket the same events go to stderr with the "<N>" prefix, and journald still files
    # them at their priority (a transient unit, so the daemon's own stream is left alone).
    code = ("from spark_supervisor.report import journal; journal.SOCKET = '/run/no-such-socket'; journal.setup(); "
            "log = journal.get(deployment='x'); log.info('fallback.info'); log.warning('fallback.warning')")
    head_exec("systemd-run", "--wait", "--quiet", "--unit=spark-log-fallback", "/opt/spark-supervisor/venv/bin/python3",
              "-c", code)

    def fallback() -> list[dict[str, Any]]:
        out = head_exec("journalctl", "-u", "spark-log-fallback", "-p", "warning", "-o", "json", "--no-pager").stdout
        return [e for e in map(json.loads, out.splitlines()) if "fallback" in str(e.get("MESSAGE"))]
    until(fallback, 30, "the <N>-prefixed warning in the journal")
    assert [(json.loads(e["MESSAGE"])["event"], e["PRIORITY"]) for e in fallback()] == [("fallback.warning", "4")]


def test_restart_with_on_stop_leave_adopts_the_serving_containers(head: str) -> None:
    before = owned_ids()
    pid = props()["MainPID"]
    head_exec("systemctl", "restart", "--no-block", UNIT)
    p = wait_unit(lambda p: p["MainPID"] not in (pid, "0") and serving(p), 120, "serving after restart")
    assert owned_ids() == before, "the loaded model must survive a supervisor restart"
    assert p["StatusText"].startswith("SERVING")


def test_reboot_comes_back_to_serving_with_no_command_typed(head: str) -> None:
    testbed.clean_containers()  # a power cycle kills every container on both nodes
    testbed.docker("spark-1", "restart", testbed.HEAD, timeout=120)
    until(lambda: head_exec("systemctl", "is-system-running", check=False).stdout.strip() in ("running", "degraded"),
          60, "systemd up again")
    p = wait_unit(serving, 150, "SERVING after the reboot")
    assert re.match(r"SERVING .* on 2 nodes", p["StatusText"])
    for unit in STALE_UNITS:  # disabled at the first boot: they stay off
        assert head_exec("systemctl", "is-active", unit, check=False).stdout.strip() in ("inactive", "failed")
    assert set(containers("spark-2")) == {OWNED["spark-2"]}
    print("\nreboot:", phase_split())


def test_reset_goes_through_the_control_socket_and_a_config_broken_at_start_is_not_restarted(head: str) -> None:
    wait_unit(serving, 150, "serving")
    # make install keeps the config (it may name an API key file) and its example private.
    for path in (CONFIG, CONFIG + ".example"):
        assert head_exec("stat", "-c", "%a", path).stdout.strip() == "600", path
    out = head_exec("/opt/spark-supervisor/venv/bin/spark-supervisor", "reset", "-c", CONFIG).stdout
    assert "will re-arm" in out
    until(lambda: events("reconcile.reset"), 30, "the daemon reset its budget")
    # A config that cannot be used at start: exit 78 and no restart loop (RestartPreventExitStatus=78).
    good = head_exec("cat", CONFIG).stdout
    put(CONFIG, "[nodes\n")
    head_exec("systemctl", "restart", "--no-block", UNIT)
    p = wait_unit(lambda p: p["ActiveState"] == "failed", 60, "failed at start")
    assert (p["SubState"], p["ExecMainStatus"], p["Result"]) == ("failed", "78", "exit-code"), p
    assert "not valid TOML" in head_exec("journalctl", "-u", UNIT, "--no-pager", "-n", "30").stdout
    # Said on stderr before the logger exists: the unit's SyslogLevel=err puts it under -p err.
    assert "not valid TOML" in head_exec("journalctl", "-u", UNIT, "--no-pager", "-p", "err", "-n", "30").stdout
    put(CONFIG, good)
    head_exec("systemctl", "reset-failed", UNIT)
    head_exec("systemctl", "start", "--no-block", UNIT)
    wait_unit(serving, 150, "serving again with the fixed config")
