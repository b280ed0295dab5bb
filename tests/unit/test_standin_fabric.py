"""The testbed's stand-ins below vLLM held to the real formats (docs/wire-formats.md §8): each node's host tree
(spark_testbed/hosttree.py) read by the real host-facts script as this machine's own "/" is, its files shaped
as the kernel's; the fault switches seen by spark_supervisor.judge.fabric as what they are; the vLLM stand-in's NCCL
lines read by logscan.transports as the captured real ones; the nvidia-smi stand-in's lost NVML as the real
one's. No testbed needed: the trees are built in a temporary testbed directory."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor import config
from spark_supervisor.adapters.shell import Result
from spark_supervisor.adapters.sysfs import parse_host_facts
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.judge import fabric, logscan
from spark_supervisor.model import HostFacts, Kind, Transport
from spark_supervisor.specs import commands
from spark_supervisor.world import observe
from spark_testbed import hosttree, nvidia_smi, testbed, vllm_standin
from tests.helpers import view_of

ROOT = Path(__file__).resolve().parents[2]
NODES = ("spark-1", "spark-2")
IP = {"spark-1": "127.0.0.2", "spark-2": "127.0.0.3"}


# ------------------------------------------------------------------------------------------ helpers
def facts(root: str | Path) -> HostFacts:
    """The real host-facts script (commands.host_facts' argv) run on a root, its answer parsed."""
    argv = ["sh", "-c", commands.HOST_FACTS, "host-facts", str(root)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 0, r.stderr
    return parse_host_facts(r.stdout)


def tb_config(tmp_path: Path, fabric_table: dict[str, Any] | None = None) -> config.Config:
    """etc/testbed.toml with the testbed directory at tmp_path (each node's host_root under it); the node's
    GPU programs run by this interpreter (no venv of the checkout needed)."""
    d = tomllib.loads((ROOT / "etc" / "testbed.toml").read_text())
    for node in d["nodes"]:
        for key in ("nvidia_smi", "meminfo", "drop_caches"):
            node[key] = [sys.executable, "-m", "spark_testbed.nvidia_smi", *node[key][1:]]
    if fabric_table:
        d["deployments"][0]["fabric"] = fabric_table
    env = {"SPARK_TESTBED_DIR": str(tmp_path), "SPARK_TESTBED_SRC": str(ROOT), "SPARK_TESTBED_PYTHON": sys.base_prefix}
    return config.parse(d, str(ROOT / "etc" / "testbed.toml"), env=env)


@pytest.fixture
def tb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A testbed directory of its own with both nodes' host trees made (as `spark-testbed up` makes them)."""
    monkeypatch.setattr(testbed, "DIR", tmp_path)
    for node in NODES:
        hosttree.ensure(node)
    return tmp_path


def read_all(c: config.Config) -> dict[str, HostFacts]:
    return {n.name: facts(n.host_root) for n in c.nodes}


def view(c: config.Config) -> DeploymentView:
    return view_of(c)


def kinds(c: config.Config, hosts: dict[str, HostFacts]) -> list[str]:
    return [r.kind for r in fabric.problems(view(c), hosts)]


def changed(before: HostFacts, after: HostFacts, ip: str) -> set[str]:
    """What differs between two readings of a node, by name."""
    out = {k for k in ("boot_id", "machine_id") if getattr(before, k) != getattr(after, k)}
    lb, la = before.link("lo"), after.link("lo")
    assert lb is not None and la is not None
    out |= {f"link.{k}" for k in ("operstate", "mtu", "speed_mbps") if getattr(lb, k) != getattr(la, k)}
    (pb,), (pa,) = before.rdma, after.rdma
    out |= {f"port.{k}" for k in ("device", "port", "state", "rate_gbps", "firmware") if getattr(pb, k) != getattr(pa, k)}
    if pb.roce_v2_index(ip) != pa.roce_v2_index(ip):
        out.add("port.roce_v2_index")
    if pb.gids != pa.gids:
        out.add("port.gids")
    return out


# ----------------------------------------------------------------------------- (a) the script, both roots
def test_the_real_root_of_this_machine_parses() -> None:
    f = facts("/")
    real_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert f.boot_id == real_boot and str(uuid.UUID(f.boot_id)) == f.boot_id
    mid = Path("/etc/machine-id")
    if mid.is_file() and mid.read_text().strip():
        assert re.fullmatch(r"[0-9a-f]{32}", f.machine_id) and f.machine_id == mid.read_text().strip()
    lo = f.link("lo")
    assert lo is not None and lo.mtu == int(Path("/sys/class/net/lo/mtu").read_text())
    assert {x.name for x in f.links} == {p.name for p in Path("/sys/class/net").iterdir() if (p / "mtu").exists()}
    if not Path("/sys/class/infiniband").exists():
        assert f.rdma == ()


def test_the_stand_in_tree_gives_the_modelled_spark(tb: Path) -> None:
    c = tb_config(tb)
    assert [n.host_root for n in c.nodes] == [str(hosttree.root(n)) for n in NODES]
    hosts = read_all(c)
    for node in c.nodes:
        f = hosts[node.name]
        link = fabric.fabric_link(node, f)
        assert link is not None and (link.name, link.operstate, link.mtu, link.speed_mbps) == ("lo", "up", 9000, 200000)
        assert not link.down
        (port,) = f.ports_on(node.fabric_interface, node.fabric_ip)
        assert (port.device, port.port, port.state, port.rate_gbps, port.firmware) == (
            "rocep1s0f1", 1, "ACTIVE", 200.0, "28.45.1200")
        assert port.active and port.netdevs == {"lo"}
        assert port.roce_v2_index(node.fabric_ip) == 3
        assert [(g.index, g.type) for g in port.gids] == [(0, "IB/RoCE v1"), (1, "RoCE v2"), (2, "IB/RoCE v1"),
                                                         (3, "RoCE v2")]
        assert [g.ipv4 for g in port.gids] == ["", "", node.fabric_ip, node.fabric_ip]
        assert all(g.gid.startswith("fe80:") for g in port.gids[:2])
        assert str(uuid.UUID(f.boot_id)) == f.boot_id and re.fullmatch(r"[0-9a-f]{32}", f.machine_id)
    one, two = hosts.values()
    assert one.boot_id != two.boot_id and one.machine_id != two.machine_id
    assert c.deployment.ray.env["NCCL_IB_GID_INDEX"] == "3"
    assert fabric.problems(view(c), hosts) == [] and fabric.machine_id_twins(hosts) == []


@pytest.mark.usefixtures("tb")
def test_ensure_is_idempotent_and_never_resets() -> None:
    before = facts(hosttree.root("spark-2"))
    hosttree.ensure("spark-2")
    assert facts(hosttree.root("spark-2")) == before
    hosttree.move_gid("spark-2", 5)
    hosttree.ensure("spark-2")
    assert facts(hosttree.root("spark-2")).rdma[0].roce_v2_index(IP["spark-2"]) == 5


# Each switch on spark-2, what it changes in the reading (nothing else), and what fabric.problems says.
SWITCHES: list[tuple[str, Any, set[str], list[str]]] = [
    ("move_gid 4", lambda: hosttree.move_gid("spark-2", 4), {"port.roce_v2_index", "port.gids"},
     [Kind.GID_INDEX_MOVED]),
    ("link down", lambda: hosttree.link("spark-2", False), {"link.operstate", "link.speed_mbps", "port.state"},
     [Kind.FABRIC_LINK_DOWN, Kind.FABRIC_LINK_DOWN]),
    ("mtu 1500", lambda: hosttree.mtu("spark-2", 1500), {"link.mtu"}, [Kind.FABRIC_MTU_MISMATCH]),
    ("rate 100", lambda: hosttree.rate("spark-2", 100), {"port.rate_gbps", "link.speed_mbps"}, []),
    ("reboot", lambda: hosttree.reboot("spark-2"), {"boot_id"}, []),
    ("machine-id", lambda: hosttree.machine_id("spark-2", "0123456789abcdef0123456789abcdef"), {"machine_id"}, []),
]


@pytest.mark.parametrize("name, switch, what, found", SWITCHES, ids=[s[0] for s in SWITCHES])
def test_each_fault_switch_changes_exactly_what_it_says(tb: Path, name: str, switch: Any, what: set[str],
                                                         found: list[str]) -> None:
    c = tb_config(tb)
    before = read_all(c)
    switch()
    after = read_all(c)
    assert changed(before["spark-2"], after["spark-2"], IP["spark-2"]) == what, name
    assert after["spark-1"] == before["spark-1"]
    assert kinds(c, after) == found
    hosttree.reset("spark-2")
    back = read_all(c)  # the defaults again; the boot ID kept (after a reboot, the new one)
    assert changed(before["spark-2"], back["spark-2"], IP["spark-2"]) == what & {"boot_id"}
    assert back["spark-2"].boot_id == after["spark-2"].boot_id and kinds(c, back) == []


def test_what_each_fault_reads_as(tb: Path) -> None:
    c = tb_config(tb)
    hosttree.move_gid("spark-2", 4)
    h = read_all(c)
    port = h["spark-2"].rdma[0]
    assert port.roce_v2_index(IP["spark-2"]) == 4 and [g.index for g in port.gids] == [0, 1, 3, 4]
    assert [g.type for g in port.gids if g.ipv4] == ["IB/RoCE v1", "RoCE v2"]
    (moved,) = fabric.problems(view(c), h)
    assert moved.detail == "spark-2 rocep1s0f1: 127.0.0.3 is at index 4, NCCL_IB_GID_INDEX=3"
    hosttree.move_gid("spark-2", 1)  # over the link-local slots: they are replaced
    port = read_all(c)["spark-2"].rdma[0]
    assert [(g.index, g.ipv4, g.type) for g in port.gids] == [(0, "127.0.0.3", "IB/RoCE v1"), (1, "127.0.0.3", "RoCE v2")]
    hosttree.reset("spark-2")

    hosttree.link("spark-2", False)
    h = read_all(c)
    link, port = h["spark-2"].link("lo"), h["spark-2"].rdma[0]
    assert link is not None and link.down and link.operstate == "down" and link.speed_mbps is None
    assert not port.active and port.state == "DOWN"
    assert (hosttree.root("spark-2") / "sys/class/infiniband/rocep1s0f1/ports/1/phys_state").read_text() == "3: Disabled\n"
    assert [r.detail for r in fabric.problems(view(c), h)] == ["spark-2 lo is down", "spark-2 rocep1s0f1 port 1 is DOWN"]
    hosttree.link("spark-2", True)
    assert kinds(c, read_all(c)) == []

    hosttree.mtu("spark-2", 1500)
    (mtu,) = fabric.problems(view(c), read_all(c))
    assert mtu.kind == Kind.FABRIC_MTU_MISMATCH and mtu.detail == "spark-1 lo 9000, spark-2 lo 1500"
    hosttree.reset("spark-2")

    hosttree.rate("spark-2", 100)
    h = read_all(c)
    link = h["spark-2"].link("lo")
    assert h["spark-2"].rdma[0].rate_gbps == 100.0 and link is not None and link.speed_mbps == 100000
    floor = tb_config(tb, {"min_rate_gbps": 200})
    assert kinds(floor, h) == [Kind.FABRIC_DEGRADED]  # the port says it; the link is the same cable
    hosttree.reset("spark-2")

    boots = {n: f.boot_id for n, f in read_all(c).items()}
    hosttree.reboot("spark-2")
    h = read_all(c)
    assert h["spark-2"].boot_id != boots["spark-2"] and h["spark-1"].boot_id == boots["spark-1"]
    (said,) = fabric.rebooted(view(c), boots, h)
    assert said.startswith("spark-2 (boot ID ")
    hosttree.reset("spark-2")  # the boot ID kept: the reboot stays a reboot
    assert read_all(c)["spark-2"].boot_id == h["spark-2"].boot_id
    hosttree.reset("spark-2", reboot=True)
    assert read_all(c)["spark-2"].boot_id not in (h["spark-2"].boot_id, boots["spark-2"])

    hosttree.machine_id("spark-2", read_all(c)["spark-1"].machine_id)
    (twins,) = fabric.machine_id_twins(read_all(c))
    assert twins.startswith("spark-1, spark-2 share /etc/machine-id")


def test_a_switch_refuses_what_no_host_has(tb: Path) -> None:
    bad: list[Callable[[], object]] = [
        lambda: hosttree.rate("spark-2", 123), lambda: hosttree.move_gid("spark-2", 16),
        lambda: hosttree.move_gid("spark-2", 0), lambda: hosttree.machine_id("spark-2", "not-hex"),
        lambda: hosttree.mtu("spark-2", 10), lambda: hosttree.write("spark-2", colour="red")]
    for switch in bad:
        with pytest.raises(ValueError):
            switch()
    assert read_all(tb_config(tb))["spark-2"].rdma[0].roce_v2_index(IP["spark-2"]) == 3


@pytest.mark.usefixtures("tb")
def test_a_rewrite_replaces_the_whole_tree_at_once() -> None:
    """The tree is a symlink renamed onto a generation written in full: a reader sees the old tree or the new."""
    link = hosttree.root("spark-2")
    first = link.resolve()
    hosttree.move_gid("spark-2", 6)
    second = link.resolve()
    assert link.is_symlink() and first != second and first.is_dir()  # the one before is kept for a late reader
    hosttree.move_gid("spark-2", 7)
    assert not first.exists() and second.is_dir()
    assert sorted(p.name for p in (link.parent / "host.d").iterdir()) == sorted([second.name, link.resolve().name])
    assert not [p for p in link.parent.iterdir() if p.name.endswith(".tmp") or p.name.startswith(".host-")]


# --------------------------------------------------------------------- (b) the files, as the kernel's
# docs/wire-formats.md §8.2's example contents, each with the shape every value of its kind has.
FORMATS: dict[str, tuple[str, str]] = {
    "sys/class/net/*/operstate": (r"up|down|unknown|lowerlayerdown|notpresent|dormant|testing", "up"),
    "sys/class/net/*/carrier": (r"[01]", "1"),
    "sys/class/net/*/mtu": (r"\d+", "9000"),
    "sys/class/net/*/speed": (r"-1|\d+", "200000"),
    "sys/class/infiniband/*/fw_ver": (r"\d+\.\d+\.\d+", "28.45.1200"),
    "sys/class/infiniband/*/ports/*/state": (r"\d: [A-Z_]+", "4: ACTIVE"),
    "sys/class/infiniband/*/ports/*/phys_state": (r"\d+: [A-Za-z]+", "5: LinkUp"),
    "sys/class/infiniband/*/ports/*/rate": (r"\d+(\.\d+)? Gb/sec \((1|2|4|8|12)X [A-Z0-9]+\)", "200 Gb/sec (4X HDR)"),
    "sys/class/infiniband/*/ports/*/gids/*": (r"([0-9a-f]{4}:){7}[0-9a-f]{4}", "0000:0000:0000:0000:0000:ffff:c0a8:c80d"),
    "sys/class/infiniband/*/ports/*/gid_attrs/types/*": (r"RoCE v2|IB/RoCE v1", "RoCE v2"),
    "sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*": (r"[\w.-]+", "enp1s0f1np1"),
    "proc/sys/kernel/random/boot_id": (r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                                       "5f5238c9-2adb-46fb-a075-f85a26edd426"),
    "etc/machine-id": (r"[0-9a-f]{32}", "3d1219c7c4c5404aaa1f6d2a48adfda4"),
}


def test_the_formats_hold_for_their_own_examples() -> None:
    for pattern, (shape, example) in FORMATS.items():
        assert re.fullmatch(shape, example), pattern


@pytest.mark.usefixtures("tb")
@pytest.mark.parametrize("root", ["stand-in", "/"])
def test_every_file_of_the_tree_is_one_value_as_the_kernel_writes_it(root: str) -> None:
    """The stand-in's files and this machine's own (where it has them) have the same shape."""
    base = hosttree.root("spark-2") if root == "stand-in" else Path("/")
    seen = 0
    for pattern, (shape, _) in FORMATS.items():
        for path in base.glob(pattern):
            try:
                text = path.read_text()
            except OSError:  # a real carrier or speed of a link that is down: not readable
                continue
            assert text.endswith("\n") and text.count("\n") == 1, (path, text)
            assert re.fullmatch(shape, text[:-1]), (path, text)
            seen += 1
    if root == "stand-in":  # 16 GID slots, 4 types and netdevs, 4 port and device files, 4 of the link, 2 ids
        assert seen == 34
    else:
        assert seen >= 3  # boot_id, machine-id, a link's files at least


@pytest.mark.usefixtures("tb")
def test_the_stand_in_files_hold_the_documented_examples() -> None:
    port = hosttree.root("spark-2") / "sys/class/infiniband/rocep1s0f1/ports/1"

    def cat(p: Path) -> str:
        return p.read_text().removesuffix("\n")
    assert cat(port / "state") == "4: ACTIVE" and cat(port / "phys_state") == "5: LinkUp"
    assert cat(port / "rate") == "200 Gb/sec (4X HDR)"
    assert cat(port.parents[1] / "fw_ver") == "28.45.1200"
    assert cat(port / "gids/3") == "0000:0000:0000:0000:0000:ffff:7f00:0003"  # 127.0.0.3, IPv4-mapped
    assert re.fullmatch(r"0000:0000:0000:0000:0000:ffff:[0-9a-f]{4}:[0-9a-f]{4}", cat(port / "gids/2"))
    assert cat(port / "gid_attrs/types/3") == "RoCE v2" and cat(port / "gid_attrs/types/2") == "IB/RoCE v1"
    assert cat(port / "gid_attrs/ndevs/3") == "lo"
    for i in range(4, 16):  # empty slots: all zeros, their type and netdev not readable
        assert cat(port / f"gids/{i}") == "0000:0000:0000:0000:0000:0000:0000:0000"
        assert not (port / f"gid_attrs/types/{i}").exists() and not (port / f"gid_attrs/ndevs/{i}").exists()
    net = hosttree.root("spark-2") / "sys/class/net/lo"
    assert (cat(net / "operstate"), cat(net / "mtu"), cat(net / "speed")) == ("up", "9000", "200000")
    assert [hosttree.rate_text(g) for g in (200, 100, 400, 25)] == [
        "200 Gb/sec (4X HDR)", "100 Gb/sec (4X EDR)", "400 Gb/sec (4X NDR)", "25 Gb/sec (1X EDR)"]


# ------------------------------------------------------------------ (c) NCCL's lines, as logscan reads them
# docs/wire-formats.md §8.1 (assumed: public logs, typed here; no capture of ours): a head rank in its own log, a
# Ray worker's in the head's with vLLM's prefix.
REAL_PREFIX = "(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO "
REAL_HEAD = "spark-1:398:398 [0] NCCL INFO "
REAL_IB = [REAL_HEAD + t for t in (
    "Bootstrap : Using enp1s0f1np1:192.168.200.12<0>", "NCCL version 2.27.7+cuda13.0",
    "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.12<0>",
    "Using network IB", "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
    "comm 0x5612a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE")] + [
    REAL_PREFIX + t for t in (
        "Bootstrap : Using enp1s0f1np1:192.168.200.13<0>",
        "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.13<0>",
        "Using network IB", "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "comm 0x7712b0 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE")]
REAL_SOCKET = [REAL_HEAD + t for t in (
    "Bootstrap : Using enp1s0f1np1:192.168.200.12<0>", "NCCL version 2.27.7+cuda13.0",
    "NCCL_IB_GID_INDEX set by environment to 3", "NET/IB : No device found.",
    "NET/Socket : Using [0]enp1s0f1np1:192.168.200.12<0>", "Using network Socket",
    "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
    "comm 0x5612a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE")] + [
    REAL_PREFIX + t for t in (
        "Bootstrap : Using enp1s0f1np1:192.168.200.13<0>", "NCCL_IB_DISABLE set by environment to 1",
        "NET/Socket : Using [0]enp1s0f1np1:192.168.200.13<0>", "Using network Socket",
        "comm 0x7712b0 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE")]
# Every text NCCL prints in §8.1, as a shape (held to the captured lines too).
_IF = r"[\w.-]+:[\d.]+<0>"
TEXTS = [rf"Bootstrap : Using {_IF}", r"NCCL version \d+\.\d+\.\d+\+cuda\d+\.\d+",
         rf"NET/IB : Using (\[\d+\][\w.-]+:\d+/(RoCE|IB) )+\[RO\]; OOB {_IF}", r"Using network (IB|Socket)",
         r"NET/IB : No device found\.", rf"NET/Socket : Using \[\d+\]{_IF}", r"NCCL_IB_DISABLE set by environment to 1",
         r"NCCL_IB_GID_INDEX set by environment to \d+",
         r"Channel \d\d/\d+ : \d+\[\d+\] -> \d+\[\d+\] \[(send|receive)\] via NET/(IB|Socket)/\d+(/GDRDMA)?",
         r"comm 0x[0-9a-f]+ rank \d+ nranks \d+ cudaDev \d+ nvmlDev \d+ busId [0-9a-f]+ commId 0x[0-9a-f]+ - Init COMPLETE"]
LINE = re.compile(r"(\(RayWorkerWrapper pid=(\d+)(?:, ip=([\d.]+))?\) )?[\w.-]+:(\d+):\d+ \[0\] NCCL INFO (.*)")


REAL_IPS = {0: "192.168.200.12", 1: "192.168.200.13"}


def shape(t: Transport, ips: dict[int, str]) -> tuple[Any, ...]:
    """What kind of Transport it is: network, rank, on its node's address, an interface named, said by which line."""
    return (t.net, t.rank, t.ip == ips.get(t.rank or 0), bool(t.interface), t.line.endswith(f"Using network {t.net}"))


def real_shapes(lines: list[str]) -> dict[int | None, tuple[Any, ...]]:
    """The captured lines' Transports, by rank."""
    return {t.rank: shape(t, REAL_IPS) for t in logscan.transports("\n".join(lines))}


def well_formed(lines: list[str]) -> str:
    """The log, each of its lines checked: NCCL's line format, a text of §8.1's."""
    for line in lines:
        m = LINE.fullmatch(line)
        assert m is not None, line
        if m.group(1):
            assert m.group(2) == m.group(4), line  # Ray's prefix names the process that prints
        assert any(re.fullmatch(t, m.group(5)) for t in TEXTS), line
    return "\n".join(lines)


def test_the_shapes_hold_for_the_captured_lines() -> None:
    well_formed(REAL_IB + REAL_SOCKET)
    assert real_shapes(REAL_IB) == {0: ("IB", 0, True, True, True), 1: ("IB", 1, True, True, True)}
    assert real_shapes(REAL_SOCKET) == {0: ("Socket", 0, True, True, True), 1: ("Socket", 1, True, True, True)}


def roots() -> list[str]:
    return [str(hosttree.root(n)) for n in NODES]


ENV = {"NCCL_IB_GID_INDEX": "3", "NCCL_SOCKET_IFNAME": "lo"}


def ray_lines(env: dict[str, str], fault: bool = False) -> list[str]:
    """The head's log of a Ray serve on both nodes: rank 0 on the driver's node, rank 1 on spark-2."""
    out = []
    for rank, node in enumerate(NODES):
        pid = 500 + rank
        r = vllm_standin.nccl_rank(rank, IP[node], env, roots(), host="vm", pid=pid, position=rank, socket_fault=fault,
                                   prefix=vllm_standin.ray_prefix(pid, IP[node], local=rank == 0))
        out += vllm_standin.nccl_lines(r, 2, 0x3F1C2B)
    return out


def mp_logs(env: dict[str, str], fault: bool = False) -> list[list[str]]:
    """Each mp rank's own log."""
    return [vllm_standin.nccl_lines(vllm_standin.nccl_rank(rank, IP[node], env, roots(), host="vm", pid=600 + rank,
                                                           position=rank, socket_fault=fault), 2, 0x3F1C2B)
            for rank, node in enumerate(NODES)]


def ranks_ips() -> dict[int, str]:
    return {0: IP["spark-1"], 1: IP["spark-2"]}


@pytest.mark.usefixtures("tb")
@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_the_stand_in_on_rdma_reads_as_the_real_ib_lines(backend: str) -> None:
    logs = [ray_lines(ENV)] if backend == "ray" else mp_logs(ENV)
    got = [t for log in logs for t in logscan.transports(well_formed(log))]
    assert {t.rank: shape(t, ranks_ips()) for t in got} == real_shapes(REAL_IB)
    assert [t.interface for t in got] == ["rocep1s0f1", "rocep1s0f1"]
    if backend == "ray":  # the worker on the other node carries Ray's prefix with its node's IP; the driver's none
        assert all(line.startswith("(RayWorkerWrapper pid=501, ip=127.0.0.3) vm:501:") for line in logs[0] if ":501:" in line)
        assert all(line.startswith("(RayWorkerWrapper pid=500) vm:500:") for line in logs[0] if ":500:" in line)
    else:
        assert not any(line.startswith("(") for log in logs for line in log)
    assert sum("NCCL version 2.27.7+cuda13.0" in line for log in logs for line in log) == 1  # rank 0's alone


SOCKETS: dict[str, tuple[dict[str, str], bool, Any, list[int]]] = {  # how ranks come to use sockets, and which
    "fault file": ({}, True, None, [0, 1]),
    "NCCL_IB_DISABLE=1": ({"NCCL_IB_DISABLE": "1"}, False, None, [0, 1]),
    "gid moved": ({}, False, lambda: hosttree.move_gid("spark-2", 4), [1]),
    "link down": ({}, False, lambda: hosttree.link("spark-2", False), [1]),
}


@pytest.mark.usefixtures("tb")
@pytest.mark.parametrize("backend", ["ray", "mp"])
@pytest.mark.parametrize("how", list(SOCKETS))
def test_the_stand_in_on_sockets_reads_as_the_real_socket_lines(backend: str, how: str) -> None:
    extra, fault, switch, on_sockets = SOCKETS[how]
    if switch:
        switch()
    env = {**ENV, **extra}
    logs = [ray_lines(env, fault)] if backend == "ray" else mp_logs(env, fault)
    got = [t for log in logs for t in logscan.transports(well_formed(log))]
    assert [t.rank for t in got] == [0, 1]
    for t in got:
        real = real_shapes(REAL_SOCKET if t.rank in on_sockets else REAL_IB)
        assert shape(t, ranks_ips()) == real[t.rank]
        assert t.socket == (t.rank in on_sockets)
        assert t.interface == ("lo" if t.socket else "rocep1s0f1")
    said = "\n".join(line for log in logs for line in log)
    assert ("NCCL_IB_DISABLE set by environment to 1" in said) == ("NCCL_IB_DISABLE" in extra)
    assert ("NET/IB : No device found." in said) == ("NCCL_IB_DISABLE" not in extra)


def test_the_fallback_is_what_the_supervisor_judges_it(tb: Path) -> None:
    """The stand-in's socket rank, read from its log, is FabricFallback where the node's fabric is RDMA."""
    c = tb_config(tb)
    hosts = read_all(c)
    got = logscan.transports("\n".join(ray_lines(ENV, fault=True)))
    reason = fabric.fallback(view(c), got, hosts)
    assert reason is not None and reason.kind == Kind.FABRIC_FALLBACK
    assert reason.detail.startswith("spark-1 rank 0 uses NET/Socket on lo (") and "spark-2 rank 1 uses NET/Socket" in reason.detail
    assert fabric.fallback(view(c), logscan.transports("\n".join(ray_lines(ENV))), hosts) is None


@pytest.mark.usefixtures("tb")
def test_a_rank_whose_tree_is_not_known_uses_rdma_and_gid_search_without_an_index() -> None:
    assert vllm_standin.nccl_transport(ENV, None, IP["spark-2"], False) == ("IB", "", "rocep1s0f1")
    hosttree.move_gid("spark-2", 4)
    root = str(hosttree.root("spark-2"))
    assert vllm_standin.nccl_transport(ENV, root, IP["spark-2"], False) == ("Socket", "no-device", "")
    assert vllm_standin.nccl_transport({}, root, IP["spark-2"], False) == ("IB", "", "rocep1s0f1")  # NCCL's own search
    assert vllm_standin.nccl_transport({**ENV, "NCCL_IB_GID_INDEX": "4"}, root, IP["spark-2"], False)[0] == "IB"
    assert vllm_standin.nccl_transport(ENV, root, IP["spark-1"], False)[0] == "Socket"  # not its address
    assert vllm_standin.root_of(roots(), IP["spark-2"], 0) == root  # found by its address, whatever the position
    assert vllm_standin.root_of(roots(), None, 1) == root and vllm_standin.root_of(roots(), "10.0.0.1", 5) is None


class FakeRay:
    """What ray_nccl asks of Ray: its nodes and the driver's address."""

    def __init__(self) -> None:
        self.util = argparse.Namespace(get_node_ip_address=lambda: "127.0.0.2")

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": "b" * 8, "NodeManagerAddress": "127.0.0.3", "NodeManagerHostname": "host-b", "Alive": True},
                {"NodeID": "a" * 8, "NodeManagerAddress": "127.0.0.2", "NodeManagerHostname": "host-a", "Alive": True}]


def test_ray_ranks_come_in_vllm_order_with_their_nodes_trees(tb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_HOST_ROOTS", ",".join(reversed(roots())))  # matched by address, not position
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "3")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    monkeypatch.delenv("STANDIN_FAULT_FILE", raising=False)
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    hosttree.move_gid("spark-2", 4)
    ranks = vllm_standin.ray_nccl(FakeRay(), {0: "b" * 8, 1: "a" * 8})
    assert [(r.rank, r.ip, r.host, r.net) for r in ranks] == [(0, "127.0.0.2", "host-a", "IB"),
                                                                  (1, "127.0.0.3", "host-b", "Socket")]
    assert ranks[0].prefix == f"(RayWorkerWrapper pid={ranks[0].pid}) "
    assert ranks[1].prefix == f"(RayWorkerWrapper pid={ranks[1].pid}, ip=127.0.0.3) " and ranks[0].pid != ranks[1].pid
    got = logscan.transports("\n".join(line for r in ranks for line in vllm_standin.nccl_lines(r, 2, 1)))
    assert [(t.rank, t.ip, t.net) for t in got] == [(0, "127.0.0.2", "IB"), (1, "127.0.0.3", "Socket")]
    fault = tb / "fault"
    fault.write_text("socket\n")
    monkeypatch.setenv("STANDIN_FAULT_FILE", str(fault))
    assert [r.net for r in vllm_standin.ray_nccl(FakeRay(), {0: "a" * 8, 1: "b" * 8})] == ["Socket", "Socket"]


@pytest.mark.usefixtures("tb")
def test_mp_rank_zero_knows_a_follower_on_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STANDIN_HOST_ROOTS", ",".join(roots()))
    monkeypatch.setenv("NCCL_IB_GID_INDEX", "3")
    monkeypatch.delenv("NCCL_IB_DISABLE", raising=False)
    monkeypatch.delenv("STANDIN_FAULT_FILE", raising=False)
    a = argparse.Namespace(node_rank=0, nnodes=2, master_addr="127.0.0.2", master_port=29501)
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.2")
    me, slow = vllm_standin.mp_nccl(a, 2)
    assert (me.rank, me.ip, me.net, slow) == (0, "127.0.0.2", "IB", False)
    hosttree.link("spark-2", False)
    me, slow = vllm_standin.mp_nccl(a, 2)
    assert (me.net, slow) == ("IB", True)  # its own RDMA is fine; the ring goes at the follower's pace
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.3")
    me, slow = vllm_standin.mp_nccl(argparse.Namespace(node_rank=1, nnodes=2, master_addr="127.0.0.2",
                                                       master_port=29501), 2)
    assert (me.rank, me.ip, me.net, slow) == (1, "127.0.0.3", "Socket", True)


def test_on_sockets_the_engine_decodes_at_half_speed_composing_with_slow(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STANDIN_FAULT_FILE", raising=False)
    e = vllm_standin.Engine()
    assert e.interval() == pytest.approx(1 / vllm_standin.TOKENS_PER_S)
    e.net_speed = vllm_standin.SOCKET_SPEED
    assert e.interval() == pytest.approx(2 / vllm_standin.TOKENS_PER_S)
    fault = tmp_path / "fault"
    fault.write_text("slow 10\n")
    monkeypatch.setenv("STANDIN_FAULT_FILE", str(fault))
    assert e.interval() == pytest.approx(1 / 5)


# --------------------------------------------------------------------------------------- (d) NVML lost
def smi(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spark_testbed.nvidia_smi", "--state", str(state), *args],
                          capture_output=True, text=True, timeout=30, check=False)


def test_nvml_lost_is_the_real_text_and_exit_and_reads_as_gpu_access_lost(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbed, "DIR", tmp_path)
    (tmp_path / "spark-1").mkdir()
    testbed.write_gpu("spark-1", meminfo=testbed.page_cache_full())
    state = tmp_path / "spark-1" / "gpu.json"
    before = nvidia_smi.read_state(str(state))
    testbed.gpu_access_lost("spark-1")
    assert nvidia_smi.read_state(str(state)) == {**before, "nvml_lost": True}  # the rest kept
    for query in (["-q", "-x"], ["--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]):
        r = smi(state, *query)
        assert (r.returncode, r.stdout, r.stderr) == (255, "Failed to initialize NVML: Unknown Error\n", ""), query
        assert observe._nvidia(Result(r.returncode, r.stdout, r.stderr)) == "Failed to initialize NVML: Unknown Error"
    assert observe.NVML_LOST == nvidia_smi.NVML_LOST
    r = smi(state, "--meminfo")  # /proc/meminfo, not NVML: still read
    assert r.returncode == 0 and r.stdout.startswith("MemTotal:")
    testbed.gpu_access_lost("spark-1", lost=False)
    assert nvidia_smi.read_state(str(state)) == before
    r = smi(state, "-q", "-x")
    assert r.returncode == 0 and "<product_name>NVIDIA GB10</product_name>" in r.stdout
    assert not isinstance(observe._nvidia(Result(r.returncode, r.stdout, r.stderr)), str)
