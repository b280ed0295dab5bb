"""What a node's host says of itself below vLLM (docs/wire-formats.md §8): its fabric links, its RDMA ports and
their GID tables, its boot ID and machine-id; and which transport each NCCL rank chose (from the serve log)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """/sys/class/net/<name>: a network interface."""

    name: str
    operstate: str = ""  # "up", "down", "unknown" (loopback, some drivers), "" not read
    mtu: int | None = None
    speed_mbps: int | None = None  # None: -1 (not known to the driver) or not read

    @property
    def down(self) -> bool:
        """Positive evidence only: the kernel says down (or lowerlayerdown); "unknown" is not down."""
        return self.operstate in ("down", "lowerlayerdown", "notpresent")


@dataclass(frozen=True)
class Gid:
    """One filled slot of an RDMA port's GID table."""

    index: int
    gid: str  # as sysfs prints it: eight groups of four hex digits
    ipv4: str = ""  # the IPv4 address an IPv4-mapped GID holds ("": none)
    type: str = ""  # "RoCE v2", "IB/RoCE v1" ("": not readable)
    netdev: str = ""  # gid_attrs/ndevs: the interface it belongs to


@dataclass(frozen=True)
class RdmaPort:
    """/sys/class/infiniband/<device>/ports/<port>."""

    device: str
    port: int
    state: str = ""  # "ACTIVE", "DOWN", "INIT", ... ("": not read)
    rate_gbps: float | None = None
    firmware: str = ""  # the device's fw_ver
    gids: tuple[Gid, ...] = ()

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def netdevs(self) -> frozenset[str]:
        return frozenset(g.netdev for g in self.gids if g.netdev)

    def roce_v2_index(self, ipv4: str) -> int | None:
        """The GID index that holds ``ipv4`` as a RoCE v2 GID (what NCCL_IB_GID_INDEX must name); None: none."""
        return next((g.index for g in self.gids if g.ipv4 == ipv4 and g.type == ROCE_V2), None)


NONE = "none"  # a host fact positively absent (no /etc/dgx-release), as against "" (not read: unknown)


@dataclass(frozen=True)
class HostFacts:
    """One node's reading (scripts/host-facts.sh under its host_root)."""

    boot_id: str = ""  # "": not readable
    machine_id: str = ""
    links: tuple[Link, ...] = ()
    rdma: tuple[RdmaPort, ...] = ()
    kernel: str = ""  # `uname -r` of the machine the script ran on ("": not read)
    hostname: str = ""  # `uname -n`
    os: str = ""  # /etc/os-release's PRETTY_NAME (NONE: no os-release; "": not read)
    os_version: str = ""  # its VERSION_ID
    dgx: str = ""  # /etc/dgx-release: its name and version (NONE: not DGX OS; "": not read)
    oom_killers: tuple[str, ...] = ()  # user-space OOM killers running (earlyoom, systemd-oomd): their names

    def link(self, name: str) -> Link | None:
        return next((x for x in self.links if x.name == name), None)

    def ports_on(self, netdev: str, ipv4: str) -> tuple[RdmaPort, ...]:
        """The RDMA ports of the fabric: those whose GIDs belong to ``netdev`` or hold ``ipv4``."""
        return tuple(p for p in self.rdma if (netdev and netdev in p.netdevs) or any(g.ipv4 == ipv4 for g in p.gids))


ROCE_V2 = "RoCE v2"  # gid_attrs/types: the GID type NCCL uses on RoCE (UDP/IP)
_USING = re.compile(r"Using \[\d+\]([\w.-]+?)(?::\d+/\w+|:[\d.]+<)")


@dataclass(frozen=True)
class Transport:
    """The network one NCCL rank uses between nodes, as its own INFO lines say (logscan.transports)."""

    rank: int | None  # None: its "Init COMPLETE" line not seen (yet)
    ip: str  # vLLM's Ray worker prefix's address, else the one NCCL bootstrapped on ("" not said)
    net: str  # "IB" (RDMA: InfiniBand or RoCE) or "Socket"
    detail: str = ""  # e.g. "NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]" or "NET/Socket : Using [0]enp1s0f1np1:..."
    line: str = ""  # the line that says which network
    host: str = ""  # the hostname NCCL printed ("<host>:<pid>:<tid>")

    @property
    def socket(self) -> bool:
        return self.net == "Socket"

    @property
    def interface(self) -> str:
        """The interface or device named by its NET/… line ("" not said)."""
        m = _USING.search(self.detail)
        return m.group(1) if m else ""
