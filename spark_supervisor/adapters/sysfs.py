"""Parse scripts/host-facts.sh (a node's sysfs, boot ID and machine-id; docs/wire-formats.md §8.2). Pure."""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict

from ..model import Gid, HostFacts, Link, RdmaPort
from ..model.host import NONE
from . import AdapterError
from .shell import Result

MARK = "host-facts"  # the first line of a whole answer
_NET = re.compile(r"sys/class/net/([^/]+)/(operstate|mtu|speed)$")
_DEV = re.compile(r"sys/class/infiniband/([^/]+)/fw_ver$")
_PORT = re.compile(r"sys/class/infiniband/([^/]+)/ports/(\d{1,4})/(state|rate|gids/(\d{1,4})|gid_attrs/types/(\d{1,4})|"
                   r"gid_attrs/ndevs/(\d{1,4}))$")
_COMM = re.compile(r"proc/\d{1,10}/comm$")  # the script's OOM-killer lines (only those names are printed)
_RATE = re.compile(r"(\d{1,7}(?:\.\d{1,3})?)\s*Gb/sec")  # bounded: a crafted tree is no crash
# The identity lines (not sysfs): the script's own, and the release files' KEY=value lines it picked.
_SAID = {"uname_r": "kernel", "hostname": "hostname", "proc/sys/kernel/random/boot_id": "boot_id",
         "etc/machine-id": "machine_id"}
_RELEASE = ("etc/os-release", "usr/lib/os-release", "etc/dgx-release")


def _int(v: str) -> int | None:
    return int(v) if re.fullmatch(r"-?\d{1,12}", v) else None


def gid_ipv4(gid: str) -> str:
    """The IPv4 address an IPv4-mapped GID holds (``...:0000:ffff:c0a8:c80d`` -> 192.168.200.13), else ""."""
    try:
        addr = ipaddress.IPv6Address(gid)
    except ValueError:
        return ""
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else ""


def parse_host_facts(out: str) -> HostFacts:
    """The script's answer. Raises AdapterError on one without its first line (an answer lost or cut short is
    unknown, never "no links"); a line it cannot place is left out."""
    head, _, body = out.partition("\n")
    if head.strip() != MARK:
        raise AdapterError("HostFactsUnreadable", f"no {MARK} line in its answer ({len(out)} bytes)")
    facts: dict[str, str] = {}
    links: dict[str, dict[str, str]] = defaultdict(dict)
    firmware: dict[str, str] = {}
    ports: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    gids: dict[tuple[str, int], dict[int, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    release: dict[str, str] = {}
    absent: set[str] = set()
    oom_killers: set[str] = set()
    for line in body.splitlines():
        path, sep, value = line.partition(":")
        if not sep:
            continue
        value = value.strip()
        if path in _SAID:
            facts[_SAID[path]] = value
        elif path == "absent":
            absent.add(value)
        elif path in _RELEASE:
            name, _, said = value.partition("=")
            release.setdefault(name, said.strip().strip("'\""))
        elif _COMM.fullmatch(path):
            oom_killers.add(value[:64])
        elif m := _NET.fullmatch(path):
            links[m.group(1)][m.group(2)] = value
        elif m := _DEV.fullmatch(path):
            firmware[m.group(1)] = value
        elif m := _PORT.fullmatch(path):
            key = (m.group(1), int(m.group(2)))
            what = m.group(3)
            if what in ("state", "rate"):
                ports[key][what] = value
            else:
                index = int(next(g for g in m.groups()[3:] if g is not None))
                field = "gid" if what.startswith("gids/") else "type" if "/types/" in what else "netdev"
                gids[key][index][field] = value
                ports[key]  # noqa: B018  (a port known by its GIDs alone still is one)
    return HostFacts(
        boot_id=facts.get("boot_id", ""), machine_id=facts.get("machine_id", ""),
        kernel=facts.get("kernel", ""), hostname=facts.get("hostname", ""),
        os=NONE if "etc/os-release" in absent else release.get("PRETTY_NAME", ""),
        os_version=NONE if "etc/os-release" in absent else release.get("VERSION_ID", ""),
        dgx=NONE if "etc/dgx-release" in absent else _dgx(release),
        oom_killers=tuple(sorted(oom_killers)),
        links=tuple(Link(name, v.get("operstate", ""), _int(v.get("mtu", "")),
                         s if (s := _int(v.get("speed", ""))) is not None and s >= 0 else None)
                    for name, v in sorted(links.items())),
        rdma=tuple(RdmaPort(dev, port, _state(v.get("state", "")), _rate(v.get("rate", "")), firmware.get(dev, ""),
                            tuple(Gid(i, g["gid"], gid_ipv4(g["gid"]), g.get("type", ""), g.get("netdev", ""))
                                  for i, g in sorted(gids[(dev, port)].items()) if g.get("gid")))
                   for (dev, port), v in sorted(ports.items())))


def host_facts_of(r: Result) -> HostFacts:
    """The host-facts script's run on a node (commands.host_facts), read: the daemon's observation and `diagnose`
    read it alike. A run that failed raises AdapterError, as an answer that is not one does."""
    if r.rc != 0:
        raise AdapterError("HostFactsFailed", (r.err.strip() or f"exit {r.rc}")[-200:])
    return parse_host_facts(r.out)


def _dgx(release: dict[str, str]) -> str:
    """/etc/dgx-release in a few words: its name and the DGX OS (or software build) version ("": not read)."""
    name = release.get("DGX_PRETTY_NAME") or release.get("DGX_NAME", "")
    version = release.get("DGX_OS_VERSION") or release.get("DGX_SWBUILD_VERSION", "")
    return " ".join(x for x in (name, version) if x)


def _state(v: str) -> str:
    """"4: ACTIVE" -> "ACTIVE"."""
    return v.partition(":")[2].strip() if ":" in v else v


def _rate(v: str) -> float | None:
    m = _RATE.match(v)
    return float(m.group(1)) if m else None
