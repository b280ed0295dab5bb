"""A testbed node's host tree: a stand-in for the kernel's sysfs and procfs (and /etc/machine-id) of a DGX
Spark, under which the daemon reads the node's fabric and identity facts (the node's `host_root`,
spark_supervisor/specs/scripts/host-facts.sh) and the vLLM stand-in decides whether NCCL could use RDMA.

The testbed's nodes share one kernel and this machine has no RDMA hardware, so each node gets a tree of its
own at <testbed dir>/<node>/host, rendered from a small JSON state beside it (<testbed dir>/<node>/host.json).
It models a Spark's fabric (docs/wire-formats.md §8.2), one value per file with the kernel's trailing newline:

    proc/sys/kernel/random/boot_id            a random UUID per node, new at reboot()
    etc/machine-id                            32 hex digits, distinct and stable per node
    sys/class/net/<if>/{operstate,mtu,speed,carrier}
                                              <if> = the node's fabric_interface in etc/testbed.toml ("lo"): "up",
                                              9000, 200000 (Mb/s), 1. While the link is down (an interface set
                                              down) speed and carrier are absent: reading them fails (EINVAL).
    sys/class/infiniband/rocep1s0f1/fw_ver    28.45.1200 (a ConnectX-7)
    .../ports/1/{state,phys_state,rate,link_layer}
                                              "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", "Ethernet"
    .../ports/1/gids/0..15                    0 and 1: the link-local fe80 GID; 2 and 3 (gid_index - 1 and
                                              gid_index): the node's fabric IPv4 as an IPv4-mapped GID
                                              (0000:0000:0000:0000:0000:ffff:7f00:0003 for 127.0.0.3); the rest
                                              all zeros (empty slots)
    .../ports/1/gid_attrs/{types,ndevs}/<n>   for the filled slots only: "IB/RoCE v1" at 0 and gid_index - 1,
                                              "RoCE v2" at 1 and gid_index; ndevs the interface. An empty slot's
                                              type cannot be read on a real host; here its file is absent.

It is held to the real formats by a contract test (tests/unit/test_standin_fabric.py): the real host-facts
script reads it as it reads this machine's own "/", and its files match docs/wire-formats.md §8.2.

The switches (each rewrites the whole tree from the state, atomically: see write()):

    write(node, **state)   set any state keys (STATE_KEYS) and render
    link(node, up)         the link up, or down: operstate "down", port "1: DOWN", phys_state "3: Disabled"
    mtu(node, value)       the interface's MTU
    rate(node, gbps)       the port's rate ("100 Gb/sec (4X EDR)") and the interface's speed (gbps x 1000)
    move_gid(node, index)  the RoCE v2 IPv4 GID to `index`, the v1 one to index - 1 (as after a peer's reboot
                           or a netplan change): its old slots are empty, what was at the new ones is replaced
    write(node, processes=["earlyoom"])
                           host processes by name, each a proc/<pid>/comm (an OOM killer that runs)
    reboot(node)           a new boot ID
    machine_id(node, v)    the machine-id (e.g. one shared by two nodes flashed from one image)
    reset(node)            back to the defaults, the boot ID kept (reset(node, reboot=True): a new one)
    ensure(node)           the tree made if missing (testbed.up); an existing state is never reset
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import testbed

INTERFACE = "lo"  # the nodes' fabric_interface in etc/testbed.toml
DEVICE = "rocep1s0f1"  # a Spark's first ConnectX-7 RoCE device
PORT = 1
FIRMWARE = "28.45.1200"
GID_SLOTS = 16
EMPTY_GID = ":".join(["0000"] * 8)
ROCE_V1, ROCE_V2 = "IB/RoCE v1", "RoCE v2"
MTU = 9000
RATE_GBPS = 200.0
GID_INDEX = 3  # where the RoCE v2 IPv4 GID is (etc/testbed.toml's NCCL_IB_GID_INDEX)
# The state's keys, each with its type; the defaults are defaults(node).
STATE_KEYS: dict[str, type | tuple[type, ...]] = {
    "interface": str, "ip": str, "up": bool, "mtu": int, "rate_gbps": (int, float), "gid_index": int,
    "boot_id": str, "machine_id": str, "processes": list}
# The lane speeds the kernel names in a port's rate (ib_sysfs rate_show: "<rate> Gb/sec (<width>X <name>)").
_LANES = (("SDR", 2.5), ("DDR", 5.0), ("QDR", 10.0), ("FDR", 14.0625), ("EDR", 25.0), ("HDR", 50.0), ("NDR", 100.0))


def root(node: str) -> Path:
    """The node's host tree (its host_root): a symlink to the generation in use under host.d/."""
    return testbed.DIR / node / "host"


def state_file(node: str) -> Path:
    return testbed.DIR / node / "host.json"


def defaults(node: str) -> dict[str, Any]:
    """A healthy Spark's fabric for the node; its machine-id is derived from its name (distinct, stable)."""
    return {"interface": INTERFACE, "ip": testbed.ALL_NODES[node], "up": True, "mtu": MTU, "rate_gbps": RATE_GBPS,
            "gid_index": GID_INDEX, "boot_id": str(uuid.uuid4()),
            "machine_id": hashlib.sha256(f"spark-testbed machine-id {node}".encode()).hexdigest()[:32],
            "processes": []}


def read(node: str) -> dict[str, Any]:
    """The node's state as last written; {} when it has none."""
    try:
        state = json.loads(state_file(node).read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(state, dict):
        raise ValueError(f"{state_file(node)}: not a JSON object")
    return state


def _check(state: dict[str, Any]) -> None:
    unknown = sorted(set(state) - set(STATE_KEYS))
    if unknown:
        raise ValueError(f"unknown host tree state {', '.join(unknown)} (known: {', '.join(STATE_KEYS)})")
    for key, value in state.items():
        want = STATE_KEYS[key]
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise ValueError(f"host tree state {key}: {value!r} is not {want}")
    if not 1 <= state.get("gid_index", GID_INDEX) < GID_SLOTS:
        raise ValueError(f"gid_index {state['gid_index']}: the IPv4 GIDs take index - 1 and index, of 0..{GID_SLOTS - 1}")
    if "rate_gbps" in state:
        rate_text(state["rate_gbps"])
    if "machine_id" in state and not re.fullmatch(r"[0-9a-f]{32}", state["machine_id"]):
        raise ValueError(f"machine-id {state['machine_id']!r}: not 32 lower-case hex digits")
    if "boot_id" in state:
        uuid.UUID(state["boot_id"])
    if "ip" in state and ipaddress.ip_address(state["ip"]).version != 4:
        raise ValueError(f"ip {state['ip']}: not an IPv4 address")
    if not all(isinstance(x, str) and re.fullmatch(r"[\w.-]{1,15}", x) for x in state.get("processes", [])):
        raise ValueError(f"processes {state['processes']!r}: not a list of process names (comm: 1-15 characters)")
    if "mtu" in state and not 68 <= state["mtu"] <= 65536:
        raise ValueError(f"mtu {state['mtu']}: out of 68..65536")


def rate_text(gbps: float) -> str:
    """The kernel's rate line for a port at `gbps` (200 -> "200 Gb/sec (4X HDR)"), the widest lanes first."""
    for width in (4, 2, 1):
        for name, lane in _LANES:
            if abs(width * lane - gbps) < 1e-6:
                return f"{gbps:g} Gb/sec ({width}X {name})"
    raise ValueError(f"{gbps:g} Gb/s is no InfiniBand/RoCE rate (width 1, 2 or 4 x {', '.join(n for n, _ in _LANES)})")


def ipv4_gid(ip: str) -> str:
    """The IPv4-mapped GID of an address, as sysfs prints it (127.0.0.3 -> ...:0000:ffff:7f00:0003)."""
    return ipaddress.IPv6Address(f"::ffff:{ip}").exploded


def link_local_gid(node: str) -> str:
    """The port's fe80 GID (an EUI-64 from a made-up MAC of the node)."""
    n = int(node.rsplit("-", 1)[1])
    return f"fe80:0000:0000:0000:4eb9:3bff:fe{n >> 8 & 0xff:02x}:{n & 0xff:02x}01"


def gid_table(node: str, state: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """The filled slots: index -> (GID, type)."""
    ll, v4, at = link_local_gid(node), ipv4_gid(state["ip"]), state["gid_index"]
    table = {0: (ll, ROCE_V1), 1: (ll, ROCE_V2)}
    table.update({at - 1: (v4, ROCE_V1), at: (v4, ROCE_V2)})
    return table


def files(node: str, state: dict[str, Any]) -> dict[str, str]:
    """The tree's files (path relative to the root -> content) for a state."""
    iface, up = state["interface"], state["up"]
    net = f"sys/class/net/{iface}"
    dev = f"sys/class/infiniband/{DEVICE}"
    port = f"{dev}/ports/{PORT}"
    out = {"proc/sys/kernel/random/boot_id": state["boot_id"], "etc/machine-id": state["machine_id"],
           f"{net}/operstate": "up" if up else "down", f"{net}/mtu": str(state["mtu"]),
           f"{dev}/fw_ver": FIRMWARE, f"{dev}/node_type": "1: CA",
           f"{port}/state": "4: ACTIVE" if up else "1: DOWN", f"{port}/phys_state": "5: LinkUp" if up else "3: Disabled",
           f"{port}/rate": rate_text(state["rate_gbps"]), f"{port}/link_layer": "Ethernet"}
    if up:  # a link set down: reading its speed or carrier fails (EINVAL)
        out[f"{net}/speed"] = str(round(state["rate_gbps"] * 1000))
        out[f"{net}/carrier"] = "1"
    for i, name in enumerate(state.get("processes", [])):  # what runs on the host besides (e.g. an OOM killer)
        out[f"proc/{4000 + i}/comm"] = name
    table = gid_table(node, state)
    for i in range(GID_SLOTS):
        gid, kind = table.get(i, (EMPTY_GID, ""))
        out[f"{port}/gids/{i}"] = gid
        if kind:
            out[f"{port}/gid_attrs/types/{i}"] = kind
            out[f"{port}/gid_attrs/ndevs/{i}"] = iface
    return {k: v + "\n" for k, v in out.items()}


@contextmanager
def _locked(node: str) -> Iterator[None]:
    """One writer of a node's tree at a time (the state is read, changed and written back)."""
    (testbed.DIR / node).mkdir(parents=True, exist_ok=True)
    with open(testbed.DIR / node / ".host.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _atomic_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _render(node: str, state: dict[str, Any]) -> None:
    """The whole tree at once: a new generation written in full under host.d/, then the `host` symlink
    renamed onto it (a reader that resolved the old one reads the old tree to its end: the generation before
    is kept, older ones go)."""
    link = root(node)
    gens = link.parent / "host.d"
    gens.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix="gen-", dir=gens))
    for rel, text in files(node, state).items():
        path = new / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o444)  # sysfs attributes are read-only to the daemon too
    new.chmod(0o755)
    before = os.readlink(link) if link.is_symlink() else ""
    if link.exists() and not link.is_symlink():  # a tree of an older layout: a plain directory
        shutil.rmtree(link)
    tmp_link = link.parent / f".host-{new.name}"
    tmp_link.symlink_to(os.path.relpath(new, link.parent))
    os.replace(tmp_link, link)
    keep = {new.name, Path(before).name}
    for old in gens.iterdir():
        if old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def write(node: str, **state: Any) -> dict[str, Any]:
    """The node's state with `state` set (on its current state, or the defaults when it has none), saved to
    host.json and rendered: the tree is replaced as a whole, and host.json too (tmp file, rename). Returns it."""
    _check(state)
    with _locked(node):
        full = {**defaults(node), **read(node), **state}
        _check(full)
        _render(node, full)
        _atomic_text(state_file(node), json.dumps(full, indent=1, sort_keys=True) + "\n")
    return full


def ensure(node: str) -> dict[str, Any]:
    """The node's tree as its state says, made with the defaults where there is none (idempotent: an existing
    state, faults included, is kept, and its tree rendered again only if it is missing)."""
    if state_file(node).is_file() and (root(node) / "sys").is_dir():
        return read(node)
    return write(node)


def link(node: str, up: bool) -> dict[str, Any]:
    return write(node, up=up)


def mtu(node: str, value: int) -> dict[str, Any]:
    return write(node, mtu=value)


def rate(node: str, gbps: float) -> dict[str, Any]:
    return write(node, rate_gbps=gbps)


def move_gid(node: str, index: int) -> dict[str, Any]:
    return write(node, gid_index=index)


def reboot(node: str) -> dict[str, Any]:
    return write(node, boot_id=str(uuid.uuid4()))


def machine_id(node: str, value: str) -> dict[str, Any]:
    return write(node, machine_id=value)


def reset(node: str, reboot: bool = False) -> dict[str, Any]:
    """Back to the defaults; the boot ID kept (unless reboot=True, or the node has none yet)."""
    fresh = defaults(node)
    if not reboot and (boot := read(node).get("boot_id")):
        fresh["boot_id"] = boot
    return write(node, **fresh)
