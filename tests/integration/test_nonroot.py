"""The non-root operator (issue 44, item 3): the worker reached as a normal user in the docker group (the testbed's
`sparkop`, a real account on the worker's real sshd), with `become = ["sudo", "-n"]` and a real sudoers rule,
exactly the one specs.privilege writes (docs/privileges.md), for the stale unit's stop and disable and the
page-cache drop. systemctl and sysctl are stood in on each node (no systemd here, one shared kernel): they refuse
a non-root caller as the real ones do, and log who changed what.

The access checks of `check --preflight` (world.access) fire on planted causes before any serve starts and clear
when fixed: an unknown host key (an empty known_hosts, on both the ssh and the ssh:// Docker path) and a user
who may not run the commands (no sudoers rule; no `become` at all)."""

from __future__ import annotations

import os
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.adapters.shell import control_dir
from spark_supervisor.config import loader
from spark_supervisor.config.root import deployment_dir
from spark_supervisor.specs import privilege
from spark_testbed import nonroot, testbed
from spark_testbed.harness import BIN, ROOT, Supervisor, containers, write_config

pytestmark = pytest.mark.skipif(bool(nonroot.available()), reason=f"non-root operator: {nonroot.available()}")

UNIT = "vllm-proxy.service"
SMI = str(Path(testbed.__file__).resolve().parent / "nvidia_smi.py")


def close_masters(tmp_path: Path) -> None:
    """The shared SSH connections of the daemons of this test's configs, which outlive a killed daemon
    (ControlPersist), closed through their control sockets: the user cannot be removed while one is open."""
    for path in tmp_path.rglob("config.toml"):
        cfg = loader.load(path)
        ctl = control_dir(deployment_dir(cfg.supervisor.state_dir, cfg.deployments[0].name))
        subprocess.run(["ssh", "-F", str(testbed.DIR / "home" / ".ssh" / "config"), "-o", f"ControlPath={ctl}/ssh-%C",
                        "-O", "exit", f"{nonroot.USER}@spark-2"], capture_output=True, timeout=30, check=False)


@pytest.fixture
def sparkop(clean: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The user and the stand-ins for one test, removed after it (after its daemons are stopped: this fixture
    comes first); the head's stand-ins first on the PATH of what the test runs (the daemon and the CLI run the
    head's commands themselves)."""
    nonroot.ensure()
    monkeypatch.setenv("PATH", f"{nonroot.bin_dir('spark-1')}:{os.environ['PATH']}")
    try:
        yield
    finally:
        close_masters(tmp_path)
        nonroot.remove()


def config(tmp_path: Path, *, become: bool = True, known_hosts: str = "") -> Path:
    """etc/testbed.toml with spark-2 reached as sparkop, the built-in page-cache drop on it, and one stale unit
    (stopped, then disabled). Its probes run with the system's Python: sparkop cannot read the dev venv's."""
    d: dict[str, Any] = tomllib.loads((ROOT / "etc" / "testbed.toml").read_text())
    worker = d["nodes"][1]
    gpu = f"{testbed.DIR}/spark-2/gpu.json"
    worker.update(ssh=f"{nonroot.USER}@spark-2", docker=f"ssh://{nonroot.USER}@spark-2:{testbed.ssh_port('spark-2')}",
                  nvidia_smi=["/usr/bin/python3", SMI, "--state", gpu],
                  meminfo=["/usr/bin/python3", SMI, "--state", gpu, "--meminfo"])
    del worker["drop_caches"]
    if become:
        worker["become"] = ["sudo", "-n"]
    if known_hosts:
        worker["known_hosts"] = known_hosts
    d["stale"].update(units=["vllm-proxy"], disable=True)
    sub = tmp_path / ("become" if become else "plain") / (Path(known_hosts).name or "default")
    sub.mkdir(parents=True, exist_ok=True)
    return write_config(sub, base=d)


def allow(path: Path) -> str:
    """The worker's sudoers rule, exactly as specs.privilege writes it for this config (the stand-ins' paths)."""
    cfg = loader.load(path)
    rule = privilege.sudoers_rule(nonroot.USER, privilege.root_commands(cfg, cfg.nodes[1]), nonroot.paths("spark-2"))
    nonroot.allow(rule)
    return rule


def preflight(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), "check", "--preflight", "--config", str(path)],
                          capture_output=True, text=True, timeout=180, check=False)


def ours(node: str) -> list[str]:
    return [n for n in containers(node) if n.startswith("testbed-")]


def test_a_worker_reached_as_a_normal_user_serves_with_its_stale_unit_stopped_through_sudo(
        sparkop: None, supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    path = config(tmp_path)
    allow(path)
    for node in ("spark-1", "spark-2"):
        nonroot.plant_unit(node, UNIT)
    testbed.plant_stale("spark-2")
    testbed.write_gpu("spark-2", meminfo=testbed.page_cache_full())
    pre = preflight(path)
    assert pre.returncode == 0 and "preflight: OK" in pre.stdout, pre.stdout + pre.stderr
    d = supervisor(path)
    d.wait_phase("SERVING", 240)
    assert nonroot.unit("spark-2", UNIT) == ("inactive", "disabled")
    # Through sudo (uid 0), and disabled without the daemon-reload that detaches running containers' GPUs.
    assert nonroot.calls("spark-2")[:2] == [f"uid=0 systemctl stop {UNIT}", f"uid=0 systemctl disable {UNIT}"]
    assert "uid=0 sysctl -w vm.drop_caches=3" in nonroot.calls("spark-2")
    assert "spark-2" in [e["node"] for e in d.events("memory.page_cache_dropped")]
    assert not set(testbed.STALE) & set(containers("spark-2"))  # removed through the docker group
    assert ours("spark-2")


def test_the_access_checks_fire_on_planted_causes_before_any_start_and_clear_when_fixed(
        sparkop: None, tmp_path: Path) -> None:
    # No sudoers rule: sudo -n -l refuses, and the hint is the rule that would allow it.
    path = config(tmp_path)
    out = preflight(path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"spark-2: privilege: NoPrivilege: {nonroot.USER} may not run `sudo -n systemctl stop {UNIT}`" in out.stdout
    assert "NOPASSWD: SPARK_SUPERVISOR" in out.stdout and "disable vllm-proxy.service" in out.stdout
    # No become at all: a user that is not root.
    out = preflight(config(tmp_path, become=False))
    assert out.returncode == 1 and "is not root and nodes.become is not set" in out.stdout, out.stdout
    # A known_hosts without the worker's key: refused on both paths, named, with the fix.
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    allow(path)
    out = preflight(config(tmp_path, known_hosts=str(empty)))
    assert out.returncode == 1, out.stdout + out.stderr
    for check in ("ssh host key", "docker ssh:// host key"):
        assert f"spark-2: {check}: HostKeyUnknown: 127.0.0.1:2222 is not in {empty}" in out.stdout, out.stdout
    assert f"ssh-keyscan -H -p 2222 127.0.0.1 >> {empty}" in out.stdout
    assert not ours("spark-1") and not ours("spark-2")  # nothing was started
    # Fixed: the known_hosts that has the key, and the rule in place.
    good = testbed.DIR / "home" / ".ssh" / "known_hosts"
    for fixed in (path, config(tmp_path, known_hosts=str(good))):
        out = preflight(fixed)
        assert out.returncode == 0 and "preflight: OK" in out.stdout, out.stdout + out.stderr
