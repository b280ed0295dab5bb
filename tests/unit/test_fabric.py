"""Below vLLM (fabric.py and the rule steps that read it): the fabric's own facts before a start and while
serving, the transport NCCL chose, a member that rebooted, a GPU nvidia-smi lost. Captured formats from
docs/wire-formats.md §8; the pure steps alone and through plan()."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import structlog

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.shell import Result
from spark_supervisor.adapters.sysfs import gid_ipv4, host_facts_of, parse_host_facts
from spark_supervisor.config import Config
from spark_supervisor.judge import fabric, logscan
from spark_supervisor.model import (
    EndpointObservation,
    EndpointState,
    Gid,
    HostFacts,
    Kind,
    Link,
    Phase,
    RdmaPort,
    Reason,
    RemoveContainers,
    ServeObservation,
    StartContainer,
    Status,
    Verdict,
)
from spark_supervisor.plan import plan
from spark_supervisor.reconcile.tracking import Below
from spark_supervisor.world.observe import NVML_LOST, _nvidia
from tests.helpers import cfg, counted, data, images, node_obs, obs, ray_container, serve_running, view_of

C = cfg()
VIEW = view_of(C)
IPS = {"spark-1": "192.168.200.12", "spark-2": "192.168.200.13"}
IF = "enp1s0f1np1"
UP = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))


def mapped(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"


def host(node: str, *, mtu: int = 9000, link: str = "up", port: str = "ACTIVE", rate: float = 200.0,
         gid_at: int = 3, boot: str = "", machine: str = "") -> HostFacts:
    ip = IPS[node]
    gids = (Gid(0, "fe80:0000:0000:0000:5e00:00ff:fe00:0001", "", "IB/RoCE v1", IF),
            Gid(gid_at - 1, mapped(ip), ip, "IB/RoCE v1", IF), Gid(gid_at, mapped(ip), ip, "RoCE v2", IF))
    return HostFacts(boot or f"boot-{node}-0000-0000", machine or f"machine-{node}",
                     (Link(IF, link, mtu, int(rate * 1000)),),
                     (RdmaPort("roceP2p1s0f1", 1, port, rate, "28.45.1200", gids),))


def hosts(**change: dict[str, Any]) -> dict[str, HostFacts]:
    return {n: host(n, **change.get(n.replace("-", "_"), {})) for n in IPS}


def gid3(c: Config | None = None) -> Config:
    d = data()
    d["deployments"][0]["ray"] = {"env": {"NCCL_IB_GID_INDEX": "3"}}
    return cfg(d) if c is None else c


G3 = view_of(gid3())


# ------------------------------------------------------------------------------------------- the readers
SYSFS = """host-facts
proc/sys/kernel/random/boot_id:0e6c5a34-6d7e-4b7f-9b1f-3a9c2a1d0f11
etc/machine-id:3d1219c7c4c5404aaa1f6d2a48adfda4
sys/class/net/enp1s0f1np1/operstate:up
sys/class/net/enp1s0f1np1/mtu:9000
sys/class/net/enp1s0f1np1/speed:200000
sys/class/net/lo/operstate:unknown
sys/class/net/lo/speed:-1
sys/class/infiniband/roceP2p1s0f1/fw_ver:28.45.1200
sys/class/infiniband/roceP2p1s0f1/ports/1/state:4: ACTIVE
sys/class/infiniband/roceP2p1s0f1/ports/1/rate:200 Gb/sec (4X HDR)
sys/class/infiniband/roceP2p1s0f1/ports/1/gids/0:fe80:0000:0000:0000:5e00:00ff:fe00:0001
sys/class/infiniband/roceP2p1s0f1/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:c0a8:c80d
sys/class/infiniband/roceP2p1s0f1/ports/1/gids/4:0000:0000:0000:0000:0000:ffff:c0a8:c80d
sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/0:IB/RoCE v1
sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/3:IB/RoCE v1
sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/4:RoCE v2
sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/ndevs/3:enp1s0f1np1
sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/ndevs/4:enp1s0f1np1
"""


def test_the_host_facts_are_read_from_the_sysfs_formats() -> None:
    h = parse_host_facts(SYSFS)
    assert h.boot_id.startswith("0e6c5a34") and h.machine_id == "3d1219c7c4c5404aaa1f6d2a48adfda4"
    assert h.link(IF) == Link(IF, "up", 9000, 200000) and h.link("lo") == Link("lo", "unknown", None, None)
    (p,) = h.rdma
    assert (p.device, p.port, p.state, p.rate_gbps, p.firmware) == ("roceP2p1s0f1", 1, "ACTIVE", 200.0, "28.45.1200")
    assert p.roce_v2_index("192.168.200.13") == 4 and p.netdevs == {IF}
    assert not Link("lo", "unknown").down and Link(IF, "down").down
    assert gid_ipv4("0000:0000:0000:0000:0000:ffff:c0a8:c80d") == "192.168.200.13" and gid_ipv4("fe80::1") == ""


def test_a_run_of_the_host_facts_script_is_read_or_its_failure_said() -> None:
    """The observation and `diagnose` read the script's run alike (sysfs.host_facts_of)."""
    assert host_facts_of(Result(0, SYSFS, "")) == parse_host_facts(SYSFS)
    with pytest.raises(AdapterError, match="HostFactsFailed.*cannot read /sys"):
        host_facts_of(Result(1, "", "cat: cannot read /sys\n"))
    with pytest.raises(AdapterError, match="HostFactsFailed.*exit 127"):
        host_facts_of(Result(127, SYSFS, ""))


@pytest.mark.parametrize("cut", ["", "proc/sys/kernel/random/boot_id:x\n", "serve-state 1\n"])
def test_an_answer_without_its_first_line_is_unknown_not_no_links(cut: str) -> None:
    with pytest.raises(AdapterError, match="HostFactsUnreadable"):
        parse_host_facts(cut)


def test_a_host_without_rdma_devices_has_none() -> None:
    h = parse_host_facts("host-facts\nsys/class/net/eth0/mtu:1500\n")
    assert h.rdma == () and h.boot_id == "" and h.link("eth0") == Link("eth0", "", 1500, None)


NCCL_IB = """spark-1:300:310 [0] NCCL INFO Bootstrap : Using enp1s0f1np1:192.168.200.12<0>
spark-1:300:310 [0] NCCL INFO NCCL version 2.27.7+cuda13.0
spark-1:300:310 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.200.12<0>
spark-1:300:310 [0] NCCL INFO Using network IB
spark-1:300:310 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA
spark-1:300:310 [0] NCCL INFO comm 0x5612a0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE
"""
NCCL_SOCKET = """(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO NET/IB : No device found.
(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.200.13<0>
(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO Using network Socket
(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
(RayWorkerWrapper pid=412, ip=192.168.200.13) spark-2:412:429 [0] NCCL INFO comm 0x77aa10 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x3f1c2b - Init COMPLETE
"""


def test_each_ranks_transport_is_read_from_nccls_own_lines() -> None:
    ib, sock = logscan.transports("\x1b[0m" + NCCL_IB + NCCL_SOCKET)
    assert (ib.rank, ib.ip, ib.net, ib.interface) == (0, "192.168.200.12", "IB", "rocep1s0f1") and not ib.socket
    assert (sock.rank, sock.ip, sock.net, sock.interface) == (1, "192.168.200.13", "Socket", IF) and sock.socket
    assert sock.line.endswith("NCCL INFO Using network Socket")


def test_channels_alone_tell_the_network_and_a_log_without_nccl_lines_tells_nothing() -> None:
    only = "spark-2:9:9 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n"
    (t,) = logscan.transports(only)
    assert t.net == "Socket" and t.rank is None
    assert logscan.transports("INFO 12-04 10:00:00 [core.py:90] Model loading took 1 GiB and 2 seconds\n") == ()


def test_newer_nccls_rank_lines_and_a_rank_bootstrapped_off_the_fabric_are_placed() -> None:
    lan = ("(RayWorkerWrapper pid=7, ip=192.168.200.13) spark-2:7:9 [0] NCCL INFO Bootstrap : Using eno1:10.0.0.13<0>\n"
           "(RayWorkerWrapper pid=7, ip=192.168.200.13) spark-2:7:9 [0] NCCL INFO Using network Socket\n"
           "(RayWorkerWrapper pid=7, ip=192.168.200.13) spark-2:7:9 [0] NCCL INFO ncclCommInitRank comm 0x55d rank 1 "
           "nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0\n"
           "spark-2:8:8 [0] NCCL INFO Bootstrap : Using eno1:10.0.0.99<0>\n"
           "spark-2:8:8 [0] NCCL INFO Using network Socket\n")
    ray, mp = logscan.transports(lan)
    assert (ray.rank, ray.ip, ray.host) == (1, "192.168.200.13", "spark-2")  # vLLM's word for its node first
    assert (mp.ip, mp.host) == ("10.0.0.99", "spark-2")
    assert [fabric.member(VIEW, t).name for t in (ray, mp)] == ["spark-2", "spark-2"]  # type: ignore[union-attr]
    assert fabric.fallback(VIEW, (mp,), hosts()) is not None  # placed by its hostname: still a fallback


def test_a_long_line_is_not_searched_whole() -> None:
    long = "x" * 100_000 + " NCCL INFO Using network Socket\n"
    assert logscan.transports(long + NCCL_IB)[0].net == "IB" and len(logscan.transports(long)) == 0


def test_nvidia_smi_that_lost_nvml_is_read_as_gpu_access_lost() -> None:
    assert _nvidia(Result(255, f"{NVML_LOST}\n", "")) == NVML_LOST
    with pytest.raises(AdapterError, match="NvidiaSmiFailed"):
        _nvidia(Result(9, "", "No devices were found"))


# ------------------------------------------------------------------------------------------- judgments
def test_a_healthy_fabric_has_nothing_to_say() -> None:
    assert fabric.problems(G3, hosts()) == [] and fabric.judged(G3, Status(hosts=hosts())).held is None


def test_a_moved_gid_is_named_with_where_it_is_now() -> None:
    (r,) = fabric.problems(G3, hosts(spark_2={"gid_at": 4}))
    assert r == Reason(Kind.GID_INDEX_MOVED, "spark-2 roceP2p1s0f1: 192.168.200.13 is at index 4, NCCL_IB_GID_INDEX=3")
    assert fabric.problems(VIEW, hosts(spark_2={"gid_at": 4})) == []  # NCCL searches itself: nothing to hold


def test_mtu_mismatch_link_down_and_a_rate_below_the_floor() -> None:
    (r,) = fabric.problems(VIEW, hosts(spark_2={"mtu": 1500}))
    assert r.kind == Kind.FABRIC_MTU_MISMATCH and r.detail == f"spark-1 {IF} 9000, spark-2 {IF} 1500"
    down = fabric.problems(VIEW, hosts(spark_2={"link": "down", "port": "DOWN"}))
    assert [x.kind for x in down] == [Kind.FABRIC_LINK_DOWN] * 2
    d = data()
    d["deployments"][0]["fabric"] = {"min_rate_gbps": 190}
    slow = fabric.problems(view_of(cfg(d)), hosts(spark_1={"rate": 100.0}))
    assert {x.kind for x in slow} == {Kind.FABRIC_DEGRADED} and "at 100 Gb/s, below the floor of 190 Gb/s" in slow[0].detail
    why = fabric.summary(down + fabric.problems(VIEW, hosts(spark_2={"mtu": 1500})))
    assert why.kind == Kind.FABRIC_LINK_DOWN and "(also FabricMtuMismatch: " in why.detail and "ip link" in why.detail


def test_a_member_not_read_says_nothing_and_a_one_node_deployment_has_no_fabric() -> None:
    only = {"spark-1": host("spark-1")}
    assert fabric.problems(G3, only) == []
    d = data()
    d["deployments"][0]["nodes"] = ["spark-1"]
    d["deployments"][0]["serve"]["tensor_parallel_size"] = 1
    assert fabric.problems(view_of(cfg(d)), hosts(spark_2={"mtu": 1500})) == []


def test_sockets_where_the_fabric_is_rdma_is_a_fallback_and_where_it_is_not_is_nothing() -> None:
    ts = logscan.transports(NCCL_IB + NCCL_SOCKET)
    r = fabric.fallback(VIEW, ts, hosts())
    assert r is not None and r.kind == Kind.FABRIC_FALLBACK
    assert r.detail.startswith(f"spark-2 rank 1 uses NET/Socket on {IF} ((RayWorkerWrapper")
    no_rdma = {n: replace(h, rdma=()) for n, h in hosts().items()}
    assert fabric.fallback(VIEW, ts, no_rdma) is None  # a TCP-only fabric: sockets are all there is
    assert fabric.fallback(VIEW, ts, {}) is None  # nothing known of the fabric: no verdict


def test_twin_machine_ids_are_a_warning() -> None:
    h = {"spark-1": host("spark-1", machine="a" * 32), "spark-2": host("spark-2", machine="a" * 32)}
    (w,) = fabric.machine_id_twins(h)
    assert w.startswith("spark-1, spark-2 share /etc/machine-id aaaaaaaa")
    assert fabric.machine_id_twins(hosts()) == []


def test_check_and_diagnose_say_what_the_daemon_judges(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """`check --preflight` the reason a start would wait on, `diagnose` each problem; both the twins' warning."""
    from types import SimpleNamespace

    from spark_supervisor.cli import ops
    from spark_supervisor.judge import preflight
    from spark_supervisor.world import diagnose, observe
    one = "a" * 32
    facts = hosts(spark_1={"machine": one}, spark_2={"machine": one, "mtu": 1500, "link": "down", "port": "DOWN"})
    twins, found = fabric.machine_id_twins(facts), fabric.problems(VIEW, facts)
    assert len(twins) == 1 and [r.kind for r in found] == [Kind.FABRIC_LINK_DOWN] * 2 + [Kind.FABRIC_MTU_MISMATCH]
    assert fabric.findings(VIEW, hosts(), {}) == ([], [], "")

    monkeypatch.setattr(diagnose, "_host_facts", lambda a: facts[a.node.name])
    world = SimpleNamespace(cfg=C, view=VIEW, nodes={n.name: SimpleNamespace(node=n) for n in VIEW.members})
    assert diagnose.below(world) == [f"warning: {w}" for w in twins] + [  # type: ignore[arg-type]
        f"fabric: {r}" for r in found]

    nodes = {n: node_obs(n, host=facts[n]) for n in IPS}
    nodes["spark-2"] = replace(nodes["spark-2"], gpu=None, gpu_lost=NVML_LOST)
    monkeypatch.setattr(observe, "World", lambda _view: SimpleNamespace(close=lambda: None))
    monkeypatch.setattr(observe, "Observer", lambda _world: SimpleNamespace(observe=lambda **_: obs(C, nodes=nodes)))
    monkeypatch.setattr(preflight, "preflight", lambda *_: [])  # the preflight of the config: its own tests
    monkeypatch.setattr(ops, "_check_images", lambda *_, **__: [])
    monkeypatch.setattr(ops, "_access", lambda *_: [])  # host keys and privileges: tests/unit/test_access.py
    assert ops._preflight(VIEW, "") == 1
    out, err = capsys.readouterr()
    assert err == "".join(f"warning: {w}\n" for w in twins)
    assert out == f"preflight: {fabric.judged(VIEW, Status(hosts=facts, gpu_lost={'spark-2': NVML_LOST})).held}\n"
    assert out.startswith(f"preflight: GpuAccessLost: spark-2: {NVML_LOST}: ")


# ------------------------------------------------------------------------------------------- the planner
def status(phase: Phase, **kw: Any) -> Status:
    kw.setdefault("images", images(C))
    st = Status(**kw)
    st.advance(phase, Reason(), 0, 0)
    return st


def serving(c: Any = C, **kw: Any) -> Status:
    return status(Phase.SERVING, verdict=Verdict(True, "ok", serve_running(c).identity), **kw)


def test_a_moved_gid_holds_the_start_before_any_container_starts() -> None:
    c = gid3()
    st = status(Phase.CLEANING, images=images(c), hosts=hosts(spark_2={"gid_at": 4}))
    d = plan(obs(c), st, view_of(c), 10)
    assert d.phase == Phase.CLEANING and d.why.kind == Kind.GID_INDEX_MOVED and d.actions == ()
    assert "is at index 4, NCCL_IB_GID_INDEX=3: set NCCL_IB_GID_INDEX" in d.why.detail
    st.hosts = hosts()  # fixed (or the env changed): the start goes on
    assert any(isinstance(a, StartContainer) for a in plan(obs(c), st, view_of(c), 11).actions)


def test_a_lost_gpu_holds_the_start_with_its_hint() -> None:
    st = status(Phase.CLEANING, gpu_lost={"spark-2": NVML_LOST})
    nodes = {"spark-1": node_obs("spark-1"), "spark-2": node_obs("spark-2", gpu=None, gpu_lost=NVML_LOST)}
    d = plan(obs(C, nodes=nodes), st, view_of(C), 10)
    assert d.why.kind == Kind.GPU_ACCESS_LOST and d.actions == ()
    assert d.why.detail.startswith(f"spark-2: {NVML_LOST}: ") and "CDI refresh" in d.why.detail


def test_while_serving_the_fabric_is_degraded_never_a_repair() -> None:
    o = obs(C, deployed=True, serve=serve_running(C), endpoint=UP)
    d = plan(o, serving(hosts=hosts(spark_2={"mtu": 1500})), view_of(C), 10)
    assert d.phase == Phase.DEGRADED and d.why.kind == Kind.FABRIC_MTU_MISMATCH and not d.repair
    assert all(not isinstance(a, RemoveContainers) for a in d.actions)
    assert plan(o, serving(hosts=hosts()), view_of(C), 10).phase == Phase.SERVING


def test_a_socket_transport_while_serving_is_degraded_fallback_for_its_serve_only() -> None:
    s = serve_running(C, log=NCCL_IB + NCCL_SOCKET)
    o = obs(C, deployed=True, serve=s, endpoint=UP)
    ts = logscan.transports(s.log_tail)
    d = plan(o, serving(hosts=hosts(), transports=ts, transports_of=s.identity), view_of(C), 10)
    assert (d.phase, d.why.kind, d.repair) == (Phase.DEGRADED, Kind.FABRIC_FALLBACK, "")
    assert plan(o, serving(hosts=hosts(), transports=ts, transports_of="another serve"), view_of(C), 10).phase == Phase.SERVING


def test_a_member_that_rebooted_under_the_serving_deployment_is_a_gang_repair() -> None:
    o = obs(C, deployed=True, serve=serve_running(C), endpoint=UP)
    boots = {n: h.boot_id for n, h in hosts().items()}
    st = serving(hosts=hosts(spark_2={"boot": "b2-new-boot"}), boots=boots)
    d = plan(o, st, view_of(C), 10)
    assert d.repair == "gang" and d.why.kind == Kind.PEER_REBOOTED and d.why.detail.startswith("spark-2 (boot ID ")
    assert {a.node for a in d.actions if isinstance(a, RemoveContainers)} == {"spark-1", "spark-2"}
    assert plan(o, serving(hosts=hosts(), boots=boots), view_of(C), 10).phase == Phase.SERVING
    unknown = serving(hosts={"spark-1": host("spark-1")}, boots=boots)  # spark-2 not read: no evidence
    assert plan(o, unknown, view_of(C), 10).phase == Phase.SERVING
    starting = status(Phase.STARTING_RAY, hosts=hosts(spark_2={"boot": "b2-new-boot"}), boots=boots)
    assert plan(o, starting, view_of(C), 10).why.kind != Kind.PEER_REBOOTED  # a start records them afresh at SERVING


def test_cuda_init_errors_in_the_serve_log_are_gpu_access_lost_with_the_hint() -> None:
    line = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
            "calling NumCudaDevices() that might have already set the error? Error 999: unknown error")
    dead = ServeObservation(True, 77, "id-spark-1", False, 1, serve_running(C).spec_hash, "t", line + "\n")
    d = plan(obs(C, deployed=True, serve=dead), serving(), view_of(C), 10)
    assert d.repair == "gang" and d.why.kind == Kind.GPU_ACCESS_LOST and "CDI refresh" in d.why.detail
    assert {a.node for a in d.actions if isinstance(a, RemoveContainers)} == {"spark-1", "spark-2"}  # new devices


def test_a_compile_cache_removed_under_the_containers_is_a_gang_repair() -> None:
    """Issue 42, item 11: the same container cannot write it again (its mount names the deleted directory)."""
    line = "spark-serve: CacheDirGone: /var/lib/spark-supervisor/vllm-cache/qwen cannot be written (removed ...)"
    dead = ServeObservation(True, 77, "id-spark-1", False, 74, serve_running(C).spec_hash, "t", line + "\n")
    d = plan(obs(C, deployed=True, serve=dead), serving(), view_of(C), 10)
    assert d.repair == "gang" and d.why.kind == Kind.CACHE_DIR_GONE and "made anew" in d.why.detail
    assert {a.node for a in d.actions if isinstance(a, RemoveContainers)} == {"spark-1", "spark-2"}


# ------------------------------------------------------------------------------------------- kept between ticks
def test_below_keeps_each_members_last_reading_drops_the_unread_and_latches_transports() -> None:
    below, st = Below(structlog.get_logger()), status(Phase.LOADING)
    nodes = {n: node_obs(n, host=host(n)) for n in IPS}
    below.update(st, obs(C, nodes=nodes), VIEW)
    assert set(st.hosts) == {"spark-1", "spark-2"}
    nodes["spark-2"] = node_obs("spark-2", error="NodeUnreachable: x")
    below.update(st, obs(C, nodes=nodes), VIEW)
    assert set(st.hosts) == {"spark-1"}  # unknown, not the last reading
    s = serve_running(C, log=NCCL_IB + NCCL_SOCKET)
    below.update(st, obs(C, nodes=nodes, serve=s, full=False), VIEW)
    assert [t.net for t in st.transports] == ["IB", "Socket"] and st.transports_of == s.identity
    below.update(st, obs(C, nodes=nodes, serve=replace(s, log_tail="later lines\n"), full=False), VIEW)
    assert len(st.transports) == 2  # scrolled out of the tail: still known for this serve
    below.update(st, obs(C, nodes=nodes, serve=replace(s, pid=78, log_tail=""), full=False), VIEW)
    assert len(st.transports) == 0  # another serve instance: its own, once it says


def test_boot_ids_are_recorded_once_per_serve_even_one_that_is_degraded_from_the_start() -> None:
    below, st = Below(structlog.get_logger()), status(Phase.VERIFYING, hosts=hosts())
    s = serve_running(C)
    nodes = {n: node_obs(n, (ray_container(C, n),), host=host(n)) for n in IPS}
    below.update(st, obs(C, nodes=nodes, serve=s), VIEW)
    assert st.boots == {}  # not serving yet
    st.advance(Phase.SERVING, Reason(), 1, 1)
    below.update(st, obs(C, nodes=nodes, serve=s), VIEW)
    assert st.boots == {n: h.boot_id for n, h in hosts().items()} and st.boots_of == s.identity
    rebooted = {**nodes, "spark-2": node_obs("spark-2", (ray_container(C, "spark-2"),),
                                              host=host("spark-2", boot="b2-new-boot"))}
    below.update(st, obs(C, nodes=rebooted, serve=s), VIEW)
    assert st.boots["spark-2"] != "b2-new-boot"  # the same serve: the change is the rule's evidence
    d = plan(obs(C, deployed=True, nodes=rebooted, serve=s, endpoint=UP), st, view_of(C), 10)
    assert d.why.kind == Kind.PEER_REBOOTED
    # The repair's new serve comes up DEGRADED (sockets, say): recorded afresh, not repaired again.
    again = replace(s, pid=99, started_at="later")
    st.advance(Phase.DEGRADED, Reason(Kind.FABRIC_FALLBACK, "x"), 20, 20)
    below.update(st, obs(C, nodes=rebooted, serve=again), VIEW)
    assert st.boots["spark-2"] == "b2-new-boot" and st.boots_of == again.identity
    st.verdict = Verdict(True, "ok", again.identity)
    d = plan(obs(C, deployed=True, nodes=rebooted, serve=again, endpoint=UP), st, view_of(C), 30)
    assert d.why.kind != Kind.PEER_REBOOTED and not d.repair


def test_the_judgement_below_vllm_is_kept_until_its_facts_or_the_view_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner reads it every tick: judged once per change of the facts or of the view, not per tick."""
    judged = counted(monkeypatch, fabric, "problems")

    def seen(mtu: int) -> Any:  # each full observation reads its host facts afresh: other objects
        nodes = {n: node_obs(n, (ray_container(C, n),), host=host(n, mtu=mtu if n == "spark-2" else 9000))
                 for n in IPS}
        return obs(C, deployed=True, nodes=nodes, serve=serve_running(C), endpoint=UP)

    below, st = Below(structlog.get_logger()), serving()
    for t in range(3):
        o = seen(1500)
        below.update(st, o, VIEW)
        assert plan(o, st, VIEW, 10 + t).why.kind == Kind.FABRIC_MTU_MISMATCH
    assert len(judged) == 1
    reloaded = view_of(C)  # an equal view, another object: judged again on it
    below.update(st, o, reloaded)
    assert plan(o, st, reloaded, 20).why.kind == Kind.FABRIC_MTU_MISMATCH and len(judged) == 2
    o = seen(9000)  # fixed
    below.update(st, o, reloaded)
    assert plan(o, st, reloaded, 21).phase == Phase.SERVING and len(judged) == 3


# ------------------------------------------------------------------------------------------- what status shows
def test_status_shows_each_members_fabric_the_ranks_transport_and_a_lost_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from spark_supervisor.cli.status import _print_deployment
    from spark_supervisor.report import statusdoc
    ts = logscan.transports(NCCL_IB + NCCL_SOCKET)
    boots = {n: h.boot_id for n, h in hosts().items()}
    st = serving(hosts=hosts(spark_2={"boot": "0f0f0f0f-new", "gid_at": 4}), boots=boots, transports=ts,
                 transports_of="x", gpu_lost={"spark-1": NVML_LOST})
    doc = statusdoc.document(st, obs(C, deployed=True), view_of(C), "/etc/x.toml", "abc", time.time(), 0.0)
    assert doc["transports"][1] == {"rank": 1, "node": "spark-2", "net": "Socket",
                                    "detail": f"NET/Socket : Using [0]{IF}:192.168.200.13<0>"}
    h2 = doc["nodes"]["spark-2"]["host"]
    assert h2 is not None and h2["rdma"][0]["gid_index"] == 4 and h2["link"] == Link(IF, "up", 9000, 200000).__dict__
    _print_deployment(doc)
    out = capsys.readouterr().out
    assert f"  nccl rank 1 on spark-2: NET/Socket (NET/Socket : Using [0]{IF}:192.168.200.13<0>)" in out
    assert (f"  fabric: {IF} up mtu 9000 200 Gb/s; roceP2p1s0f1/1 ACTIVE 200 Gb/s, GID index 4, fw 28.45.1200; "
            "boot 0f0f0f0f (was boot-spa at SERVING: REBOOTED)") in out
    assert f"  GPU ACCESS LOST: {NVML_LOST}" in out


def test_a_crafted_tree_is_read_bounded_never_a_crash() -> None:
    odd = ("host-facts\nsys/class/infiniband/x/ports/1/rate:. Gb/sec\nsys/class/net/a/mtu:" + "9" * 5000
           + "\nsys/class/infiniband/x/ports/99999/state:4: ACTIVE\nsys/class/infiniband/x/ports/1/gids/123456:zz\n")
    h = parse_host_facts(odd)
    assert h.link("a") == Link("a", "", None, None) and [(p.port, p.rate_gbps) for p in h.rdma] == [(1, None)]
