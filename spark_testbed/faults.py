"""Observation faults on the testbed: the daemon's eyes fail while the deployment itself keeps running.

Each is a real process stopped with SIGSTOP and continued with SIGCONT, as a hung process is on a real
node (a wedged dashboard, a Docker engine stuck on its store, a containerd that no longer answers):

    ray_dashboard_hung()     the Ray dashboard of the head (dashboard/dashboard.py in the head's Ray
                             container): /api/v0/nodes does not answer; GCS, raylets and the serve go on
    docker_engine_hung(node) that node's dockerd: no Docker API call answers (containers keep running:
                             containerd and the shims are other processes)
    containerd_hung(node)    that engine's managed containerd: `docker ps` still answers (dockerd's own
                             store), `docker exec` hangs, so the daemon's serve-state exec cannot run

Each is a context manager and a start()/stop() pair; stop() always continues the process. Every stopped
process is also recorded under <testbed dir>/frozen/, so thaw_all() (the tests' and chaos' cleanup) can
continue whatever a crashed run left stopped, and it also continues any stopped testbed dockerd,
containerd or Ray dashboard it finds. The processes are found by walking from known roots (the engine's
pid file, the container's init), never by a global name search that could hit another process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from types import TracebackType

import psutil

from . import testbed
from .harness import OWNED

FROZEN = testbed.DIR / "frozen"
DASHBOARD_URL = "http://127.0.0.2:8265"  # the head's fabric IP and Ray's default dashboard port


class FaultError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------- finding processes
def dockerd_pid(node: str) -> int:
    """The node's dockerd, from the pid file the testbed keeps, checked to be that engine."""
    pid = testbed._alive(testbed.DIR / node / "dockerd.pid")
    if not pid:
        raise FaultError(f"dockerd of {node} is not running")
    cmd = psutil.Process(pid).cmdline()
    if not cmd or os.path.basename(cmd[0]) != "dockerd" or str(testbed.sock(node)) not in " ".join(cmd):
        raise FaultError(f"pid {pid} from {node}'s pid file is not its dockerd: {' '.join(cmd)[:200]}")
    return pid


def containerd_pid(node: str) -> int:
    """The containerd that the node's dockerd started and manages (its child, with the engine's exec root)."""
    parent = dockerd_pid(node)
    found: list[int] = [p.pid for p in psutil.Process(parent).children()
             if p.name() == "containerd" and str(testbed.DIR / node / "exec") in " ".join(p.cmdline())]
    if len(found) != 1:
        raise FaultError(f"expected one containerd under dockerd {parent} of {node}, found {found}")
    return found[0]


def container_init(node: str, container: str) -> int:
    pid = testbed.container_pid(node, container)
    if pid <= 0:
        raise FaultError(f"{container} on {node} is not running")
    return pid


def dashboard_pid(node: str = "spark-1", container: str = OWNED["spark-1"]) -> int:
    """The Ray dashboard head process, among the descendants of the head container's init only."""
    root = psutil.Process(container_init(node, container))
    found: list[int] = []
    for p in root.children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if len(cmd) >= 2 and "python" in os.path.basename(cmd[0]) and cmd[1].endswith("dashboard/dashboard.py"):
            found.append(p.pid)
    if len(found) != 1:
        raise FaultError(f"expected one Ray dashboard in {container} on {node}, found {found}")
    return found[0]


def is_stopped(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_STOPPED)
    except psutil.Error:
        return False


# ---------------------------------------------------------------------------------------- the faults
class Freeze:
    """SIGSTOP one process for a while; stop() (or leaving the with block) always SIGCONTs it."""

    kind = "observation"

    def __init__(self, name: str, what: str, find: Callable[[], int]):
        self.name, self.what, self._find = name, what, find
        self.pid = 0
        self.started_at = 0.0
        self.ended_at = 0.0

    def start(self) -> Freeze:
        if self.pid:
            raise FaultError(f"{self.name} already started")
        pid = self._find()
        proc = psutil.Process(pid)
        FROZEN.mkdir(parents=True, exist_ok=True)
        # Recorded before the signal: a run that dies right after still leaves what to continue.
        (FROZEN / str(pid)).write_text(json.dumps({"what": self.what, "fault": self.name,
                                                   "create_time": proc.create_time()}))
        self.pid = pid
        self.started_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        testbed.until(lambda: is_stopped(pid), 5, f"{self.what} (pid {pid}) to stop", every=0.02)
        return self

    def stop(self) -> None:
        if not self.pid:
            return
        pid, self.pid = self.pid, 0
        try:
            _cont(pid)
        finally:
            (FROZEN / str(pid)).unlink(missing_ok=True)
            self.ended_at = time.time()

    def __enter__(self) -> Freeze:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<{self.name}: {self.what}{f' pid {self.pid} stopped' if self.pid else ''}>"


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    testbed.until(lambda: not is_stopped(pid), 5, f"pid {pid} to continue", every=0.02)


def ray_dashboard_hung(node: str = "spark-1", container: str = OWNED["spark-1"]) -> Freeze:
    return Freeze("ray dashboard hung", f"the Ray dashboard in {container} on {node}",
                  lambda: dashboard_pid(node, container))


def docker_engine_hung(node: str = "spark-2") -> Freeze:
    return Freeze(f"{node} Docker engine hung", f"dockerd of {node}", lambda: dockerd_pid(node))


def containerd_hung(node: str = "spark-1") -> Freeze:
    return Freeze(f"{node} containerd hung", f"containerd of {node}'s engine", lambda: containerd_pid(node))


def thaw_all() -> list[str]:
    """Continue every process a fault stopped (recorded, or a stopped testbed engine or dashboard)."""
    done = []
    if FROZEN.is_dir():
        for rec in FROZEN.iterdir():
            try:
                pid, info = int(rec.name), json.loads(rec.read_text())
                if abs(psutil.Process(pid).create_time() - float(info["create_time"])) < 0.01:
                    _cont(pid)
                    done.append(f"{info['what']} (pid {pid})")
            except (ValueError, OSError, KeyError, psutil.Error):
                pass
            rec.unlink(missing_ok=True)
    candidates: list[tuple[str, int]] = []
    for node in testbed.NODES:
        for what, find in ((f"dockerd of {node}", dockerd_pid), (f"containerd of {node}", containerd_pid)):
            try:
                candidates.append((what, find(node)))
            except (FaultError, psutil.Error, OSError):
                pass
    try:  # only with the engine answering (it was just continued): inspect needs it
        candidates.append(("the Ray dashboard", dashboard_pid()))
    except (FaultError, psutil.Error, OSError, subprocess.SubprocessError, ValueError):
        pass
    for what, pid in candidates:
        if is_stopped(pid):
            _cont(pid)
            done.append(f"{what} (pid {pid})")
    return done


# ----------------------------------------------------------------------- checks that a fault is real
def dashboard_answers(timeout: float = 3.0, url: str = DASHBOARD_URL) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v0/nodes?limit=100", timeout=timeout) as r:  # noqa: S310
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def ray_alive_ips(timeout: float = 3.0, url: str = DASHBOARD_URL) -> set[str] | None:
    """The IPs Ray lists ALIVE, or None when the dashboard does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/api/v0/nodes?limit=100", timeout=timeout) as r:  # noqa: S310
            rows = json.loads(r.read())["data"]["result"]["result"]
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return None
    return {row["node_ip"] for row in rows if row.get("state") == "ALIVE"}


def engine_answers(node: str, timeout: float = 5.0, *, over_ssh: bool = False) -> bool:
    """`docker ps` on the node's engine answers within the timeout (the worker's as the daemon reaches it)."""
    argv = (["ssh", "-F", str(testbed.DIR / "home" / ".ssh" / "config"), "-o", "BatchMode=yes", node, "docker", "ps"]
            if over_ssh else ["docker", "-H", f"unix://{testbed.sock(node)}", "ps"])
    try:
        return subprocess.run(argv, capture_output=True, timeout=timeout, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def exec_answers(node: str, container: str, timeout: float = 5.0) -> bool:
    """`docker exec <container> true` completes within the timeout."""
    try:
        return testbed.docker(node, "exec", container, "true", check=False, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def processes_running(node: str, container: str) -> bool:
    """The container's processes exist and none is stopped (read from /proc, not through the engine)."""
    procs = _container_procs(node, container)
    return bool(procs) and not any(p.status() == psutil.STATUS_STOPPED for p in procs)


_INIT_PIDS: dict[tuple[str, str], int] = {}


def remember(node: str, container: str) -> int:
    """Note a container's init pid while its engine answers, for checks made while it does not."""
    pid = container_init(node, container)
    _INIT_PIDS[(node, container)] = pid
    return pid


def _container_procs(node: str, container: str) -> list[psutil.Process]:
    pid = _INIT_PIDS.get((node, container)) or container_init(node, container)
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def selfcheck() -> list[str]:
    """Inject each fault once against a serving testbed deployment and check that it is what it claims."""
    out = []
    head, worker = OWNED["spark-1"], OWNED["spark-2"]
    remember("spark-2", worker)
    with ray_dashboard_hung() as f:
        ok = not dashboard_answers(3)
    out.append(f"{f.name}: dashboard answered while stopped: {not ok}; answers after: {dashboard_answers(5)}")
    with containerd_hung("spark-1") as f:
        ps, ex = engine_answers("spark-1", 5), exec_answers("spark-1", head, 4)
    out.append(f"{f.name}: docker ps answered {ps}, docker exec answered {ex}; exec after: "
               f"{exec_answers('spark-1', head, 20)}")
    with docker_engine_hung("spark-2") as f:
        ps = engine_answers("spark-2", 4, over_ssh=True)
        running = processes_running("spark-2", worker)
        alive = ray_alive_ips()
    out.append(f"{f.name}: docker ps over ssh answered {ps}; worker container processes running {running}; "
               f"Ray alive {sorted(alive or [])}; ps after: {engine_answers('spark-2', 20, over_ssh=True)}")
    return out


if __name__ == "__main__":
    os.environ.update(testbed.env())
    try:
        for line in selfcheck():
            print(line)
    finally:
        print("thawed:", thaw_all() or "nothing")
