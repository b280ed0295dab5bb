"""The local two-node testbed: two Docker engines, SSH to the "worker", images, GPU state files.

    spark-testbed up [N]  start (idempotent) N nodes (2): dockerd per node, an sshd per worker, images
    spark-testbed env     print the variables etc/testbed.toml needs (eval "$(spark-testbed env)")
    spark-testbed down    remove the testbed's containers and stop its daemons

Node spark-1 (head, 127.0.0.2) has the engine at <dir>/spark-1/docker.sock, used directly.
Node spark-2 (worker, 127.0.0.3) has its own engine at <dir>/spark-2/docker.sock, reached only over
SSH: sshd sets DOCKER_HOST for its sessions, so `ssh spark-2 docker ...` and docker-py's ssh://spark-2
both land on it. Both engines get a fake nvidia-container-runtime-hook so `--gpus all` is accepted.
Nothing under /etc, /var/run/docker.sock or root's ~/.ssh is touched, but for the non-root operator's user
and sudoers file while its test runs (spark_testbed/nonroot.py; `down` removes them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

from . import nvidia_smi

DIR = Path(os.environ.get("SPARK_TESTBED_DIR", "/var/lib/spark-testbed"))  # not /var/tmp: the unit has PrivateTmp=yes
SRC = Path(__file__).resolve().parent.parent
PYTHON = Path(sys.base_prefix)
MAX_NODES = 8
# spark-<i> at 127.0.0.<i+1>; every node but the head is reached only over SSH, spark-<i> on port 2220+i.
ALL_NODES = {f"spark-{i}": f"127.0.0.{i + 1}" for i in range(1, MAX_NODES + 1)}
NODES = {n: ip for n, ip in list(ALL_NODES.items())[:2]}  # the default two-node cluster
SSH_PORT = 2222  # spark-2's
NONROOT_USER = "sparkop"  # the non-root operator of spark_testbed/nonroot.py


def nodes(count: int = 2) -> dict[str, str]:
    """The first `count` nodes: name -> fabric IP."""
    if not 2 <= count <= MAX_NODES:
        raise ValueError(f"a testbed has 2 to {MAX_NODES} nodes, not {count}")
    return dict(list(ALL_NODES.items())[:count])


def ssh_port(node: str) -> int:
    return 2220 + int(node.rsplit("-", 1)[1])
HOSTFS = "spark-testbed/hostfs:latest"
BUSYBOX = "spark-testbed/busybox:latest"


def until(cond: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> object:
    """Wait for a condition with a deadline (never a bare sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def sock(node: str) -> Path:
    return DIR / node / "docker.sock"


def docker(node: str, *args: str, check: bool = True, timeout: float = 60,
           input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", "-H", f"unix://{sock(node)}", *args], capture_output=True,
                          check=check, timeout=timeout, input=input)


def env() -> dict[str, str]:
    return {"SPARK_TESTBED_DIR": str(DIR), "SPARK_TESTBED_SRC": str(SRC), "SPARK_TESTBED_PYTHON": str(PYTHON),
            "HOME": str(DIR / "home")}


def _alive(pidfile: Path) -> int:
    """The PID in a daemon's pidfile if that process is still the daemon the testbed started: its command line
    names the pidfile's own directory (sshd's `-f <dir>/sshd_config`, dockerd's `--pidfile <dir>/…`). A PID
    alone is not enough: a pidfile that outlived its daemon (a machine restored from a snapshot, a SIGKILL)
    names a PID the system gives to any process later, and "alive" would then skip the start and kill a
    stranger on the stop."""
    try:
        pid = int(pidfile.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return 0
    return pid if f"{pidfile.parent}/" in cmdline else 0


def start_dockerd(node: str) -> None:
    d = DIR / node
    d.mkdir(parents=True, exist_ok=True)
    if _alive(d / "dockerd.pid") and docker(node, "version", check=False).returncode == 0:
        return
    fakebin = DIR / "fakebin"
    fakebin.mkdir(exist_ok=True)
    hook = fakebin / "nvidia-container-runtime-hook"
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    hook.chmod(0o755)
    (DIR / "daemon.json").write_text(json.dumps({"runtimes": {"nvidia": {"path": "runc"}}}))
    args = ["dockerd", "--config-file", str(DIR / "daemon.json"), "-H", f"unix://{sock(node)}",
            "--data-root", str(d / "data"), "--exec-root", str(d / "exec"), "--pidfile", str(d / "dockerd.pid")]
    # Every testbed container uses host networking, as on the Sparks: no bridge, no iptables changes.
    args += ["--bridge", "none", "--iptables=false", "--ip-masq=false"]
    penv = {**os.environ, "PATH": f"{fakebin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    with open(d / "dockerd.log", "ab") as logf:  # setsid --fork: dockerd outlives us, reparented to init
        subprocess.run(["setsid", "--fork", *args], stdout=logf, stderr=logf, stdin=subprocess.DEVNULL, env=penv,
                       check=True, timeout=30)
    until(lambda: docker(node, "version", check=False).returncode == 0, 30, f"dockerd of {node}")


IMAGE_VERSION = "2"  # bump when an image's content changes


def _import(node: str, image: str, build: Callable[[Path], None]) -> None:
    r = docker(node, "image", "inspect", "--format", "{{index .Config.Labels \"v\"}}", image, check=False)
    if r.returncode == 0 and r.stdout.decode().strip() == IMAGE_VERSION:
        return
    root = DIR / "rootfs" / f"{image.split('/')[1].split(':')[0]}-{IMAGE_VERSION}"
    if not root.exists():
        build(root)
    tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True, timeout=300)
    docker(node, "import", "-c", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "-c", f"LABEL v={IMAGE_VERSION}", "-", image, input=tar.stdout, timeout=300)


def _hostfs(root: Path) -> None:
    """An empty image that runs the host's /usr, Python and venv, bind-mounted read-only."""
    # sbin stays a real directory: docker --init bind-mounts /sbin/docker-init, which cannot land in /usr (ro).
    for d in ("usr", "sbin", "tmp", "etc", "proc", "sys", "dev", "root", "run", "var/tmp", str(PYTHON).lstrip("/"),
              str(SRC).lstrip("/")):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link in ("bin", "lib", "lib64"):
        (root / link).symlink_to(f"usr/{link}")
    for f in ("passwd", "group", "nsswitch.conf"):
        if Path("/etc", f).exists():
            shutil.copy(Path("/etc", f), root / "etc" / f)


def _busybox(root: Path) -> None:
    (root / "bin").mkdir(parents=True)
    for d in ("tmp", "etc", "proc", "sys", "dev"):
        (root / d).mkdir()
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "sleep", "cat", "echo", "true"):
        (root / "bin" / applet).symlink_to("busybox")


# ------------------------------------------------------------------------------ the head under systemd
DEBIAN = "spark-testbed/debian:bookworm"
SYSTEMD = "spark-testbed/systemd:bookworm"
HEAD = "spark-1-systemd"
SYSTEMD_DOCKERFILE = f"""FROM {DEBIAN}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      systemd systemd-sysv dbus python3 python3-venv make openssh-client procps && apt-get clean
RUN systemctl mask systemd-udevd.service systemd-udevd-kernel.socket systemd-udevd-control.socket \\
      getty.target console-getty.service systemd-logind.service systemd-timesyncd.service \\
      sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount systemd-resolved.service
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
"""


def debian_mirror() -> str:
    for line in Path("/etc/apt/sources.list.d/debian.sources").read_text().splitlines():
        if line.startswith("URIs:"):
            return line.split()[1]
    return "http://deb.debian.org/debian"


def _debian(root: Path) -> None:
    subprocess.run(["debootstrap", "--variant=minbase", "--include=ca-certificates", "bookworm", str(root),
                    debian_mirror()], check=True, capture_output=True, timeout=900)


def systemd_image(node: str = "spark-1") -> None:
    """A Debian image with systemd as PID 1 (built once, cached in the node's engine)."""
    if docker(node, "image", "inspect", SYSTEMD, check=False).returncode == 0:
        return
    _import(node, DEBIAN, _debian)
    docker(node, "build", "--network", "host", "-t", SYSTEMD, "-", input=SYSTEMD_DOCKERFILE.encode(), timeout=900)


def systemd_head() -> str:
    """The head node as a container with systemd as PID 1, host networking, the testbed mounted."""
    systemd_image()
    if docker("spark-1", "inspect", HEAD, check=False).returncode == 0:
        docker("spark-1", "rm", "-f", HEAD)
    mounts = ["-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro", "-v", f"{DIR}:{DIR}", "-v", f"{SRC}:{SRC}:ro",
              "-v", "/usr/bin/docker:/usr/local/bin/docker:ro"]
    for shared in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf", "/etc/xdg/pip", "/opt/wheels",
                   "/opt/pypi", "/opt/pypi-more"):  # the host's package sources, for `make install`
        if Path(shared).exists():
            mounts += ["-v", f"{shared}:{shared}:ro"]
    docker("spark-1", "run", "-d", "--name", HEAD, "--label", "spark-testbed.infra=1", "--network", "host",
           "--cap-add", "SYS_ADMIN", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
           *mounts, SYSTEMD)
    until(lambda: head_exec("systemctl", "is-system-running", check=False).stdout.strip()
          in ("running", "degraded"), 60, "systemd in the head container")
    return HEAD


def head_exec(*argv: str, check: bool = True, timeout: float = 120,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v}")]
    p = subprocess.run(["docker", "-H", f"unix://{sock('spark-1')}", "exec", *envs, HEAD, *argv],
                       capture_output=True, text=True, timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {HEAD}: exit {p.returncode}: {p.stderr.strip()[-500:]}")
    return p


def _ssh_dir(node: str) -> Path:
    return DIR / ("ssh" if node == "spark-2" else f"ssh-{node}")


def start_sshd(node: str = "spark-2") -> None:
    """An sshd for one worker node, on 127.0.0.1:<ssh_port(node)>, whose sessions see that node's engine
    (DOCKER_HOST), so the node is reached only over real SSH. Keys are shared by every node's sshd."""
    keys, d = DIR / "ssh", _ssh_dir(node)
    home = DIR / "home" / ".ssh"
    for x in (keys, d, home):
        x.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(exist_ok=True)
    for key in ("host_ed25519", "client_key"):
        if not (keys / key).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / key)], check=True)
    shutil.copy(keys / "client_key.pub", keys / "authorized_keys")
    port = ssh_port(node)
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {keys / 'host_ed25519'}",
        f"PidFile {d / 'sshd.pid'}", "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        f"AuthorizedKeysFile {keys / 'authorized_keys'}", "LogLevel VERBOSE", "MaxStartups 50:30:100",
        "MaxSessions 50",
        # The non-root operator's sessions (spark_testbed/nonroot.py, while a test makes the user) find the
        # node's systemctl and sysctl stand-ins first. sshd takes the first SetEnv that applies: the user's
        # block comes first, then everyone's.
        f"Match User {NONROOT_USER}",
        f"  SetEnv DOCKER_HOST=unix://{sock(node)} PATH={DIR / 'nonroot' / node / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "Match all", f"  SetEnv DOCKER_HOST=unix://{sock(node)}", ""]))
    hostkey = (keys / "host_ed25519.pub").read_text().split()
    workers = list(ALL_NODES)[1:]
    (home / "known_hosts").write_text("".join(f"[127.0.0.1]:{ssh_port(n)} {hostkey[0]} {hostkey[1]}\n"
                                              for n in workers))
    (home / "config").write_text("".join("\n".join([
        f"Host {n}", "  HostName 127.0.0.1", f"  Port {ssh_port(n)}", "  User root",
        f"  IdentityFile {keys / 'client_key'}", "  IdentitiesOnly yes", "  StrictHostKeyChecking yes",
        f"  UserKnownHostsFile {home / 'known_hosts'}", ""]) for n in workers))
    if _alive(d / "sshd.pid"):
        return
    subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(d / "sshd_config")], check=True)
    subprocess.run(["/usr/sbin/sshd", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], check=True)
    until(lambda: _alive(d / "sshd.pid"), 10, f"sshd of {node}")


def stop_sshd(sessions: bool = False, node: str = "spark-2") -> None:
    """Stop a node's listener; with sessions=True also cut every open session (a host that went away)."""
    pidfile = _ssh_dir(node) / "sshd.pid"
    pid = _alive(pidfile)
    if not pid:
        return
    children = []
    if sessions:
        import psutil
        # The per-connection sshd processes only: killing what runs inside a session (the login shell's
        # rc files, e.g. `pyenv rehash`) can leave its locks behind and hang every later login.
        children = psutil.Process(pid).children(recursive=False)
    os.kill(pid, signal.SIGTERM)
    for child in children:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    until(lambda: not _alive(pidfile), 10, f"sshd of {node} to stop")


def write_gpu(node: str, processes: list[dict[str, object]] | None = None,
              meminfo: dict[str, int] | Literal["host"] | None = None) -> None:
    """The GPU as nvidia-smi will report it: GB10, unified memory, Xorg always present (as on a desktop).
    Each process is recorded with its start time, so it stops being listed when it exits even if its PID
    is reused. meminfo: the node's /proc/meminfo in MiB (page_cache_full(), memory_held(), or {total_mib,
    free_mib, cached_mib, available_mib}); without it the node has nvidia_smi.DEFAULT_MEMINFO; "host": the
    host's real /proc/meminfo, for a test that means to read it (never dropped)."""
    procs = [{"pid": 1, "name": "/usr/lib/xorg/Xorg", "used_mib": 40, "type": "G"},
             *({**p, "start": nvidia_smi.proc_start(p["pid"])} for p in processes or [])]
    state: dict[str, object] = {"name": "NVIDIA GB10", "driver": "580.95.05", "total_mib": None, "processes": procs}
    if meminfo:
        state["meminfo"] = meminfo
    path = DIR / node / "gpu.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def gpu_access_lost(node: str, lost: bool = True, where: str = "host") -> None:
    """The node lost its GPU devices: where="container" is what a host `systemctl daemon-reload` without NVIDIA's
    CDI refresh does (the containers' `nvidia-smi -L` prints NVML's "Unknown Error" and exits 255, the host's
    still works; NVIDIA/nvidia-container-toolkit #48); where="host" makes the host's nvidia-smi fail too
    (nvidia_smi.NVML_LOST); meminfo still reads. lost=False gives the GPU back. The rest of the state is kept."""
    path = DIR / node / "gpu.json"
    state = nvidia_smi.read_state(str(path))
    key = {"host": "nvml_lost", "container": "container_nvml_lost"}[where]
    if lost:
        state[key] = True
    else:
        state.pop(key, None)
    nvidia_smi._write_atomic(str(path), state)


def _meminfo(total_mib: int, used_mib: int, cached_mib: int) -> dict[str, int]:
    if not 0 <= cached_mib <= total_mib - used_mib:
        raise ValueError(f"cached_mib {cached_mib} does not fit in {total_mib} MiB with {used_mib} MiB used")
    # The kernel's MemAvailable is about MemFree plus the reclaimable page cache.
    return {"total_mib": total_mib, "free_mib": total_mib - used_mib - cached_mib, "cached_mib": cached_mib,
            "available_mib": total_mib - used_mib}


def page_cache_full(total_mib: int = 122880, cached_mib: int | None = None, used_mib: int = 8192) -> dict[str, int]:
    """A node after a model loaded once: its weight shards fill the page cache, so MemFree (20% of the
    total by default) is short of the testbed's --gpu-memory-utilization 0.5 while MemAvailable is enough.
    Dropping the caches (`spark-testbed-nvidia-smi --drop-caches`) lets vLLM start."""
    return _meminfo(total_mib, used_mib, total_mib - used_mib - total_mib // 5 if cached_mib is None else cached_mib)


def memory_held(total_mib: int = 122880, used_mib: int | None = None, cached_mib: int | None = None) -> dict[str, int]:
    """A node where processes hold the memory (60% of the total by default): MemAvailable is short of 0.5 x
    MemTotal too, so dropping the caches does not help."""
    used = total_mib * 3 // 5 if used_mib is None else used_mib
    return _meminfo(total_mib, used, total_mib // 5 if cached_mib is None else cached_mib)


STALE = ("vllm_node", "reranker", "vllm_embeddings")


def container_pid(node: str, name: str) -> int:
    return int(docker(node, "inspect", "--format", "{{.State.Pid}}", name).stdout.decode().strip())


def plant_stale(node: str, names: tuple[str, ...] = STALE) -> list[int]:
    """What a reboot leaves: the old stack's containers running, vllm_node holding the GPU."""
    pids = []
    for name in names:
        docker(node, "rm", "-f", name, check=False)
        docker(node, "run", "-d", "--name", name, "--network", "host", "--label", "com.example.stack=old-vllm",
               BUSYBOX, "sleep", "1000000")
        pids.append(container_pid(node, name))
    write_gpu(node, [{"pid": pids[0], "name": "VLLM::Worker_TP0", "used_mib": 19135}])
    return pids


DEMO_TIMEOUT = 600  # seconds `make demo` waits for SERVING


class DemoFailed(Exception):
    pass


def demo_outcome(doc: dict[str, Any] | None, waited: float, exit_code: int | None) -> str:
    """Why the demo stopped short of SERVING, in the daemon's own words: its last status."""
    if exit_code is not None:
        head = f"the daemon exited with {exit_code} after {waited:.0f}s"
    elif doc and doc.get("phase") == "FAILED":
        head = f"the daemon gave up (FAILED) after {waited:.0f}s"
    else:
        head = f"SERVING was not reached within {waited:.0f}s"
    if not doc:
        return f"{head}, and the daemon wrote no status: its own output above says why."
    kind = doc.get("reason_kind") or ""
    lines = [f"{head}. The daemon's last status:",
             f"  phase:  {doc.get('phase') or '?'} since {doc.get('since') or '?'}",
             f"  reason: {doc.get('reason') or '(none given)'}"]
    if doc.get("progress"):
        lines.append(f"  load:   {doc['progress']}")
    history = [h for h in doc.get("history") or [] if isinstance(h, dict)][-5:]
    if history:
        lines.append("  last transitions:")
        lines += [f"    {h.get('at', '?')} {h.get('phase', '?')}" + (f": {h['reason']}" if h.get("reason") else "")
                  for h in history]
    cfg = "etc/testbed.toml"
    if doc.get("phase") == "FAILED":
        hint = (f"fix the cause{f' ({kind})' if kind else ''}, then `make demo` again, or `spark-supervisor reset "
                f"--config {cfg}` beside a running daemon")
    else:
        hint = f"the daemon's log above shows each attempt; `spark-supervisor status --config {cfg}` shows the nodes"
    lines.append(f"  hint:   {hint}")
    return "\n".join(lines)


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is None:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(timeout=30)


def demo(timeout: float = DEMO_TIMEOUT) -> int:
    """`make demo`: plant the post-reboot mess on both nodes, then run the daemon until it serves."""
    from spark_supervisor.state import statefile
    up()
    clean_containers()
    for node in NODES:
        plant_stale(node)
        print(f"{node}: planted stale containers {', '.join(STALE)} (vllm_node holds 19135 MiB of GPU memory)")
    cfg = str(SRC / "etc" / "testbed.toml")
    state_dir = DIR / "supervisor"
    (state_dir / statefile.FILE).unlink(missing_ok=True)
    bindir = Path(sys.executable).parent
    daemon = subprocess.Popen([str(bindir / "spark-supervisor"), "run", "--config", cfg], env={**os.environ, **env()})
    t0 = time.monotonic()

    def status() -> dict[str, Any] | None:
        try:
            doc = statefile.read(str(state_dir))
        except (OSError, ValueError):
            return None
        return cast(dict[str, Any], doc) if isinstance(doc, dict) else None  # as read: any JSON object

    def settled() -> bool:
        doc = status()
        return daemon.poll() is not None or (doc or {}).get("phase") in ("SERVING", "FAILED")
    try:
        try:
            until(settled, timeout, "SERVING", every=0.5)
        except TimeoutError:
            pass
        doc = status()
        if daemon.poll() is not None or (doc or {}).get("phase") != "SERVING":
            raise DemoFailed(demo_outcome(doc, time.monotonic() - t0, daemon.poll()))
        print(f"\nSERVING after {time.monotonic() - t0:.1f}s. `spark-supervisor status`:\n", flush=True)
        subprocess.run([str(bindir / "spark-supervisor"), "status", "--config", cfg], env={**os.environ, **env()},
                       check=False, timeout=30)
    finally:
        _stop(daemon)
    print("\nThe daemon stopped with on_stop = \"leave\": the deployment keeps serving at http://127.0.0.2:8000."
          "\n`make demo-down` removes it and stops the testbed.")
    return 0


def up(count: int = 2) -> None:
    """The first `count` nodes up (idempotent); nodes beyond them that are already up stay up. Each node gets
    its stand-in host tree (hosttree.ensure: made if missing, never reset)."""
    from . import hosttree
    DIR.mkdir(parents=True, exist_ok=True)
    for node in nodes(count):
        start_dockerd(node)
        _import(node, HOSTFS, _hostfs)
        _import(node, BUSYBOX, _busybox)
        if not (DIR / node / "gpu.json").exists():
            write_gpu(node)
        hosttree.ensure(node)
        fake_model(node)
        if node != "spark-1":
            start_sshd(node)
    (DIR / "supervisor").mkdir(exist_ok=True)


# The testbed's model (etc/testbed.toml) as a tiny stand-in in each node's own Hugging Face cache
# (HF_HOME=<dir>/<node>/hf per node), laid out as huggingface_hub leaves it: blobs, snapshot links, refs/main.
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
MODEL_REV = "0123456789abcdef0123456789abcdef01234567"
MODEL_SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


def model_snapshot(node: str) -> Path:
    return DIR / node / "hf" / "hub" / ("models--" + MODEL.replace("/", "--")) / "snapshots" / MODEL_REV


def fake_model(node: str) -> Path:
    """The stand-in model in a node's cache, each file put back when missing (idempotent): the snapshot."""
    import hashlib
    snap = model_snapshot(node)
    repo = snap.parent.parent
    files = {"config.json": b'{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}',
             "model.safetensors.index.json": json.dumps({
                 "metadata": {"total_size": 4000 * len(MODEL_SHARDS)},
                 "weight_map": {f"model.layers.{i}.weight": s for i, s in enumerate(MODEL_SHARDS)}}).encode()}
    files.update({s: bytes([i]) * 4096 for i, s in enumerate(MODEL_SHARDS)})
    for d in (repo / "blobs", repo / "refs", snap):
        d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.is_file() or blob.stat().st_size != len(data):
            blob.write_bytes(data)
        link, target = snap / name, os.path.relpath(blob, snap)
        if not link.is_symlink() or os.readlink(link) != target:
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
    (repo / "refs" / "main").write_text(MODEL_REV)
    return snap


def running_nodes() -> list[str]:
    """The nodes whose engine is up now."""
    return [n for n in ALL_NODES if _alive(DIR / n / "dockerd.pid")]


RAY_NO_DASHBOARD = DIR / "ray-nodash"


def ray_without_dashboard() -> Path:
    """A venv with the testbed's Ray version installed without its extras (`pip install ray`, not
    ray[default]): Ray without a dashboard, as in an image built that way. Its `ray` script; cached."""
    import ray  # the project venv's: the same version on every node of the cluster
    ray_bin = RAY_NO_DASHBOARD / "bin" / "ray"
    marker = RAY_NO_DASHBOARD / f".ray-{ray.__version__}"
    if marker.exists():
        return ray_bin
    shutil.rmtree(RAY_NO_DASHBOARD, ignore_errors=True)
    subprocess.run([str(PYTHON / "bin" / "python3"), "-m", "venv", str(RAY_NO_DASHBOARD)], check=True, timeout=300)
    subprocess.run([str(RAY_NO_DASHBOARD / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                    f"ray=={ray.__version__}"], check=True, timeout=900, capture_output=True)
    probe = subprocess.run([str(RAY_NO_DASHBOARD / "bin" / "python"), "-c", "import ray.dashboard.optional_deps"],
                           capture_output=True, timeout=120, check=False)
    if probe.returncode == 0:
        raise RuntimeError(f"{RAY_NO_DASHBOARD}: the dashboard's dependencies came with ray: not a test of its absence")
    marker.touch()
    return ray_bin


def clean_containers(*, infra: bool = False) -> None:
    """Remove the nodes' containers (a power cycle); the systemd head container only with infra=True."""
    for node in running_nodes():
        if docker(node, "version", check=False).returncode != 0:
            continue
        rows = docker(node, "ps", "-a", "--format", "{{.ID}} {{.Label \"spark-testbed.infra\"}}").stdout.decode()
        ids = [r.split()[0] for r in rows.splitlines() if r.strip() and (infra or len(r.split()) == 1)]
        if ids:
            docker(node, "rm", "-f", *ids, check=False)


def down() -> None:
    from . import nonroot
    nonroot.remove()
    clean_containers(infra=True)
    for node in list(ALL_NODES)[1:]:
        stop_sshd(node=node)
    for node in running_nodes():
        pid = _alive(DIR / node / "dockerd.pid")
        if pid:
            os.kill(pid, signal.SIGTERM)
            pidfile = DIR / node / "dockerd.pid"
            def stopped(p: Path = pidfile) -> bool:
                return not _alive(p)
            until(stopped, 30, f"dockerd of {node} to stop")


def main(argv: list[str] | None = None) -> int:
    cmd = (argv if argv is not None else sys.argv[1:]) or ["up"]
    if cmd[0] == "up":  # spark-testbed up [NODES]
        count = int(cmd[1]) if len(cmd) > 1 else int(os.environ.get("SPARK_TESTBED_NODES", "2"))
        up(count)
        print(f"testbed up in {DIR}: nodes {', '.join(f'{n}={ip}' for n, ip in nodes(count).items())}")
    elif cmd[0] == "env":
        for k, v in env().items():
            print(f"export {k}={v}")
    elif cmd[0] == "down":
        down()
    elif cmd[0] == "clean":
        clean_containers()
    elif cmd[0] == "demo":
        try:
            return demo()
        except DemoFailed as e:
            print(f"\nmake demo: FAILED: {e}", file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
