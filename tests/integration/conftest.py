"""The real two-node testbed: two Docker engines, SSH to the worker, Ray in containers, a real notify socket.

Started by the tests themselves (spark_testbed.testbed.up is idempotent); `make test` installs what it needs.

Isolation, so that a test that fails (or a noisy machine that slows everything down) cannot cascade into
the next one: every test that uses `clean` (and so `supervisor` and `serving_daemon`) starts from a reset
testbed and resets it again afterwards, whatever happened: processes a fault stopped are continued, the
engines and sshd are up, the daemons it started are killed, every node container is removed, the GPUs are
idle and no serve fault is armed.

A verified SERVING deployment shared by the tests that do not need a fresh one (the `shared` fixture): one
daemon and deployment per module and config, kept SERVING from one test to the next. Each test's starting
state is verified before it runs (shared_starting_state: SERVING with nothing unknown, exactly our containers
running on each node, exactly the serves expected, no fault armed, nothing stopped, the GPUs idle, the hosts'
fabric healthy) and a test after a failed one, or after a verification that fails, gets a fresh reset and
bring-up instead, so that a failure cannot cascade. Any other test drops the shared deployment first (its
daemon killed, the testbed reset), so nothing of it runs behind a test that did not ask for it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from spark_testbed import faults, hosttree, nvidia_smi, testbed
from spark_testbed.harness import (
    OWNED,
    RANKS,
    Supervisor,
    container_violations,
    verify_serving,
    write_config,
)

pytestmark = pytest.mark.testbed

FAULT_FILE = testbed.DIR / "serve-fault"


def reset_testbed() -> None:
    """Back to an empty, healthy testbed."""
    faults.thaw_all()  # first: a stopped dockerd would hang everything below
    FAULT_FILE.unlink(missing_ok=True)
    testbed.up()  # an engine or sshd a test stopped is started again (idempotent)
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
        hosttree.reset(node)  # a healthy fabric again, the boot ID kept (a test that rebooted one keeps it)


@pytest.fixture(scope="session")
def tb() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or not Path("/usr/sbin/dockerd").exists():
        pytest.fail("the testbed needs root and the Debian packages from `make deps`")
    faults.thaw_all()
    testbed.up()
    env = testbed.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the daemon and docker-py's SSH transport read HOME/.ssh
    yield env
    faults.thaw_all()
    testbed.clean_containers()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def no_unexpected_probe_errors() -> Iterator[None]:
    """No daemon logged a probe's unforeseen error during the test: the guard that keeps one odd answer from
    blinding the daemon (adapters.guarded) must not hide a bug."""
    for d in Supervisor.STARTED:
        d.new_unexpected()
    yield
    found = [f"{d.log_path.name}: {e.get('probe')}: {e.get('error')}" for d in Supervisor.STARTED
             for e in d.new_unexpected()]
    Supervisor.STARTED[:] = [d for d in Supervisor.STARTED if d.proc.poll() is None]  # read to their end
    assert not found, f"a probe raised an unforeseen exception: {found}"


@pytest.fixture
def clean(tb: dict[str, str]) -> Iterator[None]:
    """Each test starts from empty engines and idle GPUs, and leaves nothing behind."""
    reset_testbed()
    yield
    reset_testbed()


@pytest.fixture
def supervisor(clean: None, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """Start daemons; each is killed after the test, before the testbed is reset (it would re-create)."""
    started: list[Supervisor] = []

    def start(config: Path, name: str = "daemon") -> Supervisor:
        s = Supervisor(config, tmp_path, name)
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop(signal.SIGKILL)


@pytest.fixture
def serving_daemon(request: pytest.FixtureRequest, supervisor: Callable[..., Supervisor],
                   tmp_path: Path) -> Supervisor:
    """A daemon brought to SERVING from a clean testbed, verified: exactly our containers, running, on
    each node, and exactly one serve process. The config is etc/testbed.toml patched with the test
    module's PATCH (and DEPLOYMENT) if it has them."""
    patch: dict[str, Any] | None = getattr(request.module, "PATCH", None)
    d = supervisor(write_config(tmp_path, patch, deployment=getattr(request.module, "DEPLOYMENT", None)))
    d.wait_phase("SERVING", 240)
    verify_serving(d)
    return d


# ------------------------------------------------------------------------ a shared SERVING deployment
REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each phase's report kept on the item: the shared deployment is not handed on after a failure."""
    rep = yield
    item.stash.setdefault(REPORTS, {})[rep.when] = rep
    return rep


def idle_gpu(node: str) -> list[str]:
    """What differs in a node's GPU state file from the idle GPU reset_testbed writes (testbed.write_gpu): a
    process nvidia-smi lists (one the file names that has exited since is not listed, as by the real one),
    or any other figure (its memory, NVML lost)."""
    path = str(testbed.DIR / node / "gpu.json")
    state, listed = nvidia_smi.read_state(path), nvidia_smi.load_state(path)["processes"]
    out = []
    if [p.get("name") for p in listed] != ["/usr/lib/xorg/Xorg"]:
        out.append(f"{node}: GPU processes {listed}")
    if set(state) - {"name", "driver", "total_mib", "processes"}:
        out.append(f"{node}: GPU state {sorted(set(state) - {'name', 'driver', 'total_mib', 'processes'})}")
    return out


def one_deployment(s: dict[str, Any]) -> bool:
    """The status of a config with one deployment SERVING with nothing unknown and no reload pending."""
    return bool(s["phase"] == "SERVING" and not s.get("unknown") and s.get("reload") is None
                and not str(s.get("reason", "")).startswith("ObservationUnknown"))


def expected(owned: dict[str, str], ranks: dict[str, int]) -> dict[str, dict[str, int]]:
    """node -> {container: its serve processes} for one deployment owning `owned`, `ranks` serves per node."""
    return {node: {name: ranks[node]} for node, name in owned.items()}


def settled(s: dict[str, Any]) -> bool:
    """Nothing carried over that a fresh bring-up does not have, in every deployment: no failures counted, no
    probe failing in a row, no user's request in the engine. (Not backoff_until: SERVING keeps the last one,
    as a fresh bring-up that once backed off does.)"""
    for d in s.get("deployments") or [s]:
        live, engine = d.get("liveness") or {}, (d.get("liveness") or {}).get("engine") or {}
        if (d.get("failures") or (live.get("health") or {}).get("failures")
                or (live.get("deep") or {}).get("failures") or engine.get("running") or engine.get("waiting")):
            return False
    return True


def shared_starting_state(d: Supervisor, expect: dict[str, dict[str, int]],
                          serving: Callable[[dict[str, Any]], bool] = one_deployment) -> list[str]:
    """Why the deployment of the shared daemon `d` is not a verified SERVING to start a test from (empty:
    it is): the daemon alive and its status `serving` (default: SERVING with nothing unknown); on each node
    exactly the containers of `expect` (node -> {container: serve processes}), running, each with its serve
    processes, and none on any other node; no serve fault armed, no process a fault stopped, the engines and
    sshd up, the GPUs idle, every host's fabric as reset_testbed leaves it."""
    if d.proc.poll() is not None:
        return [f"the daemon exited with {d.proc.returncode}"]
    try:  # a passing test leaves SERVING behind; a few ticks for its status to say so
        d.wait(lambda s: serving(s) and settled(s), 30, "SERVING, nothing unknown, nothing carried over")
    except AssertionError as e:
        return [str(e).splitlines()[0][:300]]
    nodes = sorted(set(testbed.NODES) | set(expect))
    out = []
    out += [f"{node}: sshd not running" for node in nodes if node != next(iter(testbed.NODES))  # the head: none
            if not testbed._alive(testbed._ssh_dir(node) / "sshd.pid")]
    out += container_violations(expect, testbed.running_nodes())  # a node the deployment does not use: none there
    out += [f"serve fault armed: {p}" for p in testbed.DIR.glob("serve-fault*")]
    out += [f"a process a fault stopped: {p.name}" for p in faults.FROZEN.glob("*")] if faults.FROZEN.is_dir() else []
    for node in nodes:
        for what, find in (("dockerd", faults.dockerd_pid), ("containerd", faults.containerd_pid)):
            try:
                if faults.is_stopped(find(node)):
                    out.append(f"{node}: {what} stopped")
            except (faults.FaultError, psutil.Error, OSError) as e:  # not running, or not the testbed's
                out.append(f"{node}: {what}: {e}")
        out += idle_gpu(node)
        host = hosttree.read(node)
        if node in testbed.NODES and host != {**hosttree.defaults(node), "boot_id": host.get("boot_id")}:
            out.append(f"{node}: host tree {host}")
    return out


class SharedDeployment:
    """One daemon and its deployment kept SERVING across tests (one module's at a time)."""

    def __init__(self) -> None:
        self.daemon: Supervisor | None = None
        self.key = ""
        self.config, self.config_hash = b"", ""  # what the daemon was brought up on: its file, and as it said
        self.fresh: list[str] = []  # the fallbacks to a fresh bring-up, for the summary

    def drop(self) -> None:
        """Its daemon killed and the testbed reset: nothing of it left."""
        if self.daemon is not None:
            d, self.daemon, self.key = self.daemon, None, ""
            d.stop(signal.SIGKILL)
            reset_testbed()

    def get(self, item: pytest.Item, tmp_factory: pytest.TempPathFactory, key: str, config: Callable[[Path], Path],
            expect: dict[str, dict[str, int]], *, serving: Callable[[dict[str, Any]], bool] = one_deployment,
            fresh: bool = False, before: Callable[[], object] | None = None, timeout: float = 240) -> Supervisor:
        """The daemon SERVING the config `config(dir)` writes (known by `key`), verified; the previous test's if
        it is the same key and verifies (shared_starting_state(expect, serving)), else a fresh reset and
        bring-up. fresh: a fresh bring-up whatever is
        there (what the test itself starts from; not a fallback). before: run on the reset testbed before a
        fresh bring-up's daemon starts (a mess for it to clear, say)."""
        key = json.dumps([key, expect], sort_keys=True)
        if self.daemon is not None and not fresh:
            why = (["another config"] if key != self.key else []) or self.drifted() or shared_starting_state(
                self.daemon, expect, serving)
            if not why:
                return self.daemon
            self.fresh.append(f"{item.nodeid}: {'; '.join(why)[:600]}")
            print(f"the shared deployment is not reused: {why}; a fresh bring-up")
        if self.daemon is not None:
            self.drop()  # the testbed reset with it
        else:
            reset_testbed()
        if before is not None:
            before()
        tmp = tmp_factory.mktemp("shared")
        d = self.daemon = Supervisor(config(tmp), tmp, "shared")
        self.key, self.config = key, d.config.read_bytes()
        self.config_hash = str(d.wait(serving, timeout, "a fresh bring-up SERVING")["config"]["hash"])
        why = shared_starting_state(d, expect, serving)
        assert not why, f"a fresh bring-up is not a verified SERVING: {why}"
        return d

    def drifted(self) -> list[str]:
        """Why the shared daemon no longer runs the config it was brought up on (a test that changed it and did
        not put it back, or put the file back without the daemon reloading it)."""
        assert self.daemon is not None
        if self.daemon.config.read_bytes() != self.config:
            return ["its config file was changed and not put back"]
        hash_now = str(((self.daemon.status() or {}).get("config") or {}).get("hash"))
        return [] if hash_now == self.config_hash else [f"it runs config {hash_now}, brought up on {self.config_hash}"]

    def respawn(self) -> Supervisor:
        """A new daemon on the shared deployment's config, the shared one from now on (the test stopped the old
        one: a daemon restart; the next test verifies what it leaves, as always)."""
        assert self.daemon is not None and self.daemon.proc.poll() is not None, "the shared daemon still runs"
        old = self.daemon
        old.stop(signal.SIGKILL)  # its notify socket and log closed (it has exited)
        self.daemon = Supervisor(old.config, old.tmp, f"shared-{time.monotonic_ns()}")
        return self.daemon


SHARED = SharedDeployment()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that does not ask for the shared deployment starts without it (before its own fixtures)."""
    if "shared" not in getattr(item, "fixturenames", ()):
        SHARED.drop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SHARED.fresh:
        terminalreporter.write_line(f"shared deployment: {len(SHARED.fresh)} fresh bring-up(s) after a starting "
                                    "state that failed its verification:")
        for line in SHARED.fresh:
            terminalreporter.write_line(f"  {line}")


@pytest.fixture(scope="module")
def shared_module(tb: dict[str, str]) -> Iterator[SharedDeployment]:
    yield SHARED
    SHARED.drop()  # the module's last test is done with it


class Shared:
    """What the `shared` fixture hands a test: shared(patch, deployment, owned=, ranks=) for etc/testbed.toml
    patched so (one deployment: `owned` node -> its container, `ranks` node -> its serves); shared.config(key,
    config, expect, ...) for a config of the test's own making (SharedDeployment.get); shared.respawn() for a
    daemon restarted on it."""

    def __init__(self, request: pytest.FixtureRequest, deployment: SharedDeployment,
                 tmp_factory: pytest.TempPathFactory) -> None:
        self.request, self.deployment, self.tmp_factory = request, deployment, tmp_factory

    def __call__(self, patch: dict[str, Any] | None = None, deployment: dict[str, Any] | None = None, *,
                 owned: dict[str, str] = OWNED, ranks: dict[str, int] = RANKS) -> Supervisor:
        return self.config(json.dumps([patch, deployment], sort_keys=True),
                           lambda tmp: write_config(tmp, patch, deployment=deployment), expected(owned, ranks))

    def config(self, key: str, config: Callable[[Path], Path], expect: dict[str, dict[str, int]], *,
               serving: Callable[[dict[str, Any]], bool] = one_deployment, fresh: bool = False,
               before: Callable[[], object] | None = None, timeout: float = 240) -> Supervisor:
        return self.deployment.get(self.request.node, self.tmp_factory, key, config, expect, serving=serving,
                                   fresh=fresh, before=before, timeout=timeout)

    def respawn(self) -> Supervisor:
        return self.deployment.respawn()


@pytest.fixture
def shared(request: pytest.FixtureRequest, shared_module: SharedDeployment,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """shared(patch, deployment, owned=, ranks=): a daemon SERVING etc/testbed.toml patched so, verified
    (shared_starting_state), the same one as the previous test's if that test passed, asked for the same and
    left it verified; otherwise a fresh reset and bring-up. After a test that failed it is dropped at once.
    Events, repairs and budget are the daemon's since its start: a test counts from its own start."""
    yield Shared(request, shared_module, tmp_path_factory)
    reports = request.node.stash.get(REPORTS, {})
    if any(r.failed for r in reports.values()) or "call" not in reports:
        shared_module.drop()
