"""Upgrade day (issue 44, item 5), under the real systemd of test_systemd.py's head container: the release at
RELEASE installed as its owner did (its own `make install` of its own tree, its own etc/testbed.toml), serving;
then this tree's `make install` over it and `systemctl restart spark-supervisor`, as docs/operator-guide.md
("Upgrading") tells an owner. The new daemon adopts what serves -- the same containers on both nodes, the same
serve process, no action but the read-only checks of the serve -- reads the old version's config and state
files without setting any aside, and the install does not reload systemd (the unit file did not change since
RELEASE)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import testbed
from spark_testbed.harness import ROOT, serve_pids
from spark_testbed.testbed import head_exec
from tests.integration.test_systemd import (
    CONFIG,
    SMI,
    UNIT,
    entries,
    events,
    owned_ids,
    props,
    put,
    serving,
    wait_unit,
)

RELEASE = "bc869ac"  # the release an owner runs today: the one the day-one audit walked (issue 44)
STATE = "/var/lib/spark-supervisor"
VENV = "/opt/spark-supervisor/venv"
PIP_ENV = {"PIP_CERT": "/etc/ssl/certs/ca-certificates.crt"}
READ_ONLY = {"Verify", "Measure"}  # the actions that change nothing (spark_supervisor/model/action.py)
# Warnings about what is seen live, not read from a file, that a loaded machine may cause at any time (a slow
# probe): the serve's own checks judge those. Any other warning from the new daemon fails the test.
LIVE_NOISE = {"probe.health_failed", "observe.unknown", "perf.unmeasured", "watch.failed"}
INSTALL_TIMEOUT = 900  # a first install pip-installs the dependencies (from the host's package sources)


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False, timeout=60)


def release_tree(dest: Path) -> None:
    """RELEASE's whole tree, from `git archive` (the work tree is never touched; no network)."""
    tar = _git("archive", "--format=tar", RELEASE)
    if tar.returncode != 0:  # a shallow clone: the release is not in its history
        pytest.fail(f"git archive {RELEASE}: {tar.stderr.decode().strip()} (fetch the whole history: "
                    "git fetch --unshallow)")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(dest, filter="data")


def release_config(tree: Path) -> dict[str, Any]:
    """RELEASE's own etc/testbed.toml as test_systemd.expanded_config expands the current one (a config an
    owner of that release had, which the new daemon must go on reading): the stand-in nvidia-smi, the state
    directory the unit allows; no stale units (nothing to clean: the test is about what serves)."""
    text = (tree / "etc" / "testbed.toml").read_text()
    for k, v in testbed.env().items():
        text = text.replace("${" + k + "}", v)
    d = tomllib.loads(text)
    d["supervisor"]["state_dir"] = STATE
    smi, gpu = ["/usr/bin/python3", SMI], f"{testbed.DIR}/spark-1/gpu.json"
    d["nodes"][0].update(nvidia_smi=[*smi, "--state", gpu], meminfo=[*smi, "--state", gpu, "--meminfo"],
                         drop_caches=[*smi, "--state", gpu, "--drop-caches"])
    d["stale"]["units"] = []
    return d


def reloads() -> int:
    """How many times systemd has reloaded (PID 1 logs each: "Reloading."); `journalctl --sync` first, so that
    every message logged before it is counted."""
    head_exec("journalctl", "--sync")
    out = head_exec("journalctl", "_PID=1", "-o", "cat", "--no-pager").stdout
    return sum(line.startswith("Reloading") for line in out.splitlines())


def state_files() -> dict[str, int]:
    """Every file under the state directory (the control socket and the lock aside): path -> size."""
    out = head_exec("find", STATE, "-type", "f", "-printf", "%P %s\\n").stdout
    return {p: int(s) for p, s in (line.rsplit(" ", 1) for line in out.splitlines()) if p != "lock"}


# Run by the installed venv's python after the upgrade: the new version's own readers over each state file the
# old version wrote (they skip what they cannot take, so what they return is compared with what is there).
READ_BACK = """import json, sys
from spark_supervisor.reconcile import loadtimes
from spark_supervisor.state import names, records, statefile
state, deployment, nodes = sys.argv[1], sys.argv[2], sys.argv[3:]
h = records.read(state, deployment)
loads = statefile.read_json(state, names.LOADS)
print(json.dumps({"records": len(h.records), "problems": h.problems,
                  "loads": len(loadtimes.history(loads, loads.get("last", ""))),
                  "kv": statefile.read_json(state, names.KV_CACHE),
                  "checked": {n: sorted(statefile.read_node(state, n)) for n in nodes}}))
"""


def installed(module: str) -> str:
    """The installed venv's copy of one of spark_supervisor's files ("" when it has none)."""
    code = ("import pathlib, sysconfig; p = pathlib.Path(sysconfig.get_paths()['purelib'], 'spark_supervisor', "
            f"{module!r}); print(p.read_text() if p.exists() else '', end='')")
    return head_exec(f"{VENV}/bin/python3", "-c", code).stdout


@pytest.fixture(scope="module")
def old_release(tb: dict[str, str]) -> Iterator[dict[str, Any]]:
    """RELEASE installed in a fresh head container with its own `make install`, started and SERVING.
    Afterwards the head container and every node container are gone, as the testbed was."""
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    # Under the testbed's directory: the head container mounts it (and /tmp in there is its own).
    tree = Path(tempfile.mkdtemp(prefix=f"release-{RELEASE}.", dir=testbed.DIR))
    try:
        release_tree(tree)
        testbed.systemd_head()
        head_exec("make", "-C", str(tree), "install", "PYTHON=/usr/bin/python3", timeout=INSTALL_TIMEOUT, env=PIP_ENV)
        put(SMI, (ROOT / "spark_testbed" / "nvidia_smi.py").read_text())
        ssh_home = testbed.DIR / "home" / ".ssh"
        for f in ("config", "known_hosts"):
            put(f"/root/.ssh/{f}", (ssh_home / f).read_text())
        config = release_config(tree)
        put(CONFIG, tomli_w.dumps(config))
        head_exec("systemctl", "enable", UNIT)
        head_exec("systemctl", "start", "--no-block", UNIT)
        wait_unit(serving, 150, f"{RELEASE} SERVING")
        yield config
    finally:
        testbed.docker("spark-1", "rm", "-f", testbed.HEAD, check=False)
        testbed.clean_containers()
        shutil.rmtree(tree, ignore_errors=True)


def test_make_install_over_a_serving_release_adopts_it_and_reads_its_state(old_release: dict[str, Any]) -> None:
    # What RELEASE serves, and what it keeps.
    assert installed("statefile.py") and not installed("state/names.py")  # RELEASE's layout: before the layers
    ids, serve = owned_ids(), serve_pids("spark-1")
    assert len(serve) == 1, serve
    old = props()
    # Past what RELEASE writes once it serves: its status, the record, the load time, the KV-cache best, the
    # checks of the nodes.
    dep = old_release["deployments"][0]["name"]
    written = {"status.json", *(f"deployments/{dep}/{f}" for f in
                                ("records.jsonl", "loads.json", "kv.json", "images.json"))}
    testbed.until(lambda: written <= set(state_files()), 30, f"{RELEASE}'s state files")
    before = state_files()
    dep_dir = f"{STATE}/deployments/{dep}"
    lines = sum(bool(line.strip()) for line in head_exec("cat", f"{dep_dir}/records.jsonl").stdout.splitlines())
    kv = json.loads(head_exec("cat", f"{dep_dir}/kv.json").stdout)
    was = json.loads(head_exec("cat", f"{STATE}/status.json").stdout)["deployment"]
    actions = len(events("action.started"))
    reloaded = reloads()
    assert reloaded > 0  # RELEASE's `make install` reloaded systemd: the count sees reloads

    # The upgrade, as an owner runs it: this tree's `make install`, then a restart of the unit.
    t0 = time.monotonic()
    out = head_exec("make", "--no-print-directory", "-C", str(ROOT), "install", "PYTHON=/usr/bin/python3",
                    timeout=INSTALL_TIMEOUT, env=PIP_ENV).stdout
    assert "unchanged: no systemctl daemon-reload" in out, out  # the unit file is RELEASE's
    assert reloads() == reloaded
    assert "kept the existing " + CONFIG in out
    assert installed("loop/daemon.py") == (ROOT / "spark_supervisor" / "loop" / "daemon.py").read_text()
    assert not installed("statefile.py")  # the old release's modules are gone, not mixed in
    # Before the restart, the owner's check (docs/operator-guide.md): the new code takes the old config and
    # hashes its spec as the running daemon did, so the restart will adopt.
    check = head_exec(f"{VENV}/bin/spark-supervisor", "check", "-c", CONFIG).stdout
    assert f"ray {was['ray_hash']} serve {was['serve_hash']}" in check, (check, was)
    # The old daemon ran on, untouched, until the restart.
    now = props()
    assert (now["MainPID"], now["NRestarts"]) == (old["MainPID"], old["NRestarts"]) and serving(now), now
    t1 = time.monotonic()
    # Not --no-block: the restart returns once the new daemon is READY, which an adopted serve is at once.
    head_exec("systemctl", "restart", UNIT, timeout=60)
    p = wait_unit(lambda p: p["MainPID"] not in (old["MainPID"], "0") and serving(p), 10, "the new daemon SERVING")
    t2 = time.monotonic()
    pid = p["MainPID"]

    # It adopted what served: the same containers, the same serve process, and of the actions only those
    # that read the serve (an adopted serve is verified and measured, as after any daemon restart).
    assert owned_ids() == ids, "the upgrade replaced the containers"
    assert serve_pids("spark-1") == serve, "the upgrade restarted the serve"
    ran = [e["action"] for e in events("action.started")[actions:]]
    assert set(ran) <= READ_ONLY, ran
    started = [e for e in entries("EVENT=daemon.started", f"_PID={pid}")]
    assert len(started) == 1 and json.loads(started[0]["JSON"])["config"] == CONFIG
    # It read the old config and state files: nothing set aside, no problem said, no warning logged.
    after = state_files()
    assert not [f for f in after if ".bad-" in f], after
    assert set(before) <= set(after), sorted(set(before) - set(after))
    assert "repairs.json" not in after  # nothing charged to the repair budget
    warned = [(e["EVENT"], json.loads(e["JSON"])) for e in entries("-p", "warning", f"_PID={pid}")]
    assert [w for w in warned if w[0] not in LIVE_NOISE] == [], warned
    status = head_exec(f"{VENV}/bin/spark-supervisor", "status", "--json", "-c", CONFIG, check=False)
    assert status.returncode == 0, status.stdout + status.stderr
    doc = json.loads(status.stdout)
    assert doc["running"] is True and doc["phase"] == "SERVING" and not doc["config_problems"], doc
    assert [d["state_problems"] for d in [doc, *doc["deployments"]]] == [[]] * (1 + len(doc["deployments"]))
    now_doc = doc["deployments"][0]["deployment"]
    assert (now_doc["ray_hash"], now_doc["serve_hash"]) == (was["ray_hash"], was["serve_hash"])  # the same spec
    # The new version's readers take every record, load time, KV-cache best and node check the old one wrote.
    read = json.loads(head_exec(f"{VENV}/bin/python3", "-c", READ_BACK, dep_dir, dep, *testbed.NODES).stdout)
    assert read["records"] >= lines >= 1 and read["problems"] == [], read
    assert read["loads"] >= 1 and read["kv"] == kv != {}, read
    assert all(read["checked"].values()), read
    text = head_exec(f"{VENV}/bin/spark-supervisor", "status", "-c", CONFIG).stdout
    assert "SERVING" in text
    print(f"\nupgraded {RELEASE} -> this tree: make install {t1 - t0:.1f}s, restart to SERVING (adopted) {t2 - t1:.1f}s; "
          f"read back: {read['records']} records, {read['loads']} load times, KV-cache bests {read['kv']}; "
          f"state files kept: {sorted(before)}")
