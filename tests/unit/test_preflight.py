from dataclasses import replace

from spark_supervisor.config import Config
from spark_supervisor.judge.preflight import parse_ip_addr, preflight
from spark_supervisor.model import Observation
from tests.helpers import cfg, data, node_obs, obs, view_of

IP_ADDR = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
2: enP7s7    inet 10.0.0.12/24 brd 10.0.0.255 scope global enP7s7\\       valid_lft forever
4: enp1s0f1np1    inet 192.168.200.12/24 brd 192.168.200.255 scope global enp1s0f1np1\\       valid_lft forever
4: enp1s0f1np1    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever
"""


def with_ifaces(c: Config, spark1: str = IP_ADDR,
                spark2: str = IP_ADDR.replace("192.168.200.12", "192.168.200.13")) -> Observation:
    return obs(c, nodes={"spark-1": node_obs("spark-1", interfaces=parse_ip_addr(spark1)),
                         "spark-2": node_obs("spark-2", interfaces=parse_ip_addr(spark2))})


def test_parse_ip_addr() -> None:
    i = parse_ip_addr(IP_ADDR)
    assert i["enp1s0f1np1"] == ("192.168.200.12/24", "fe80::1/64") and i["lo"] == ("127.0.0.1/8",)


def test_the_story_passes() -> None:
    assert preflight(view_of(cfg()), with_ifaces(cfg())) == []


def test_a_fabric_ip_on_the_wrong_interface_and_a_missing_nccl_interface() -> None:
    d = data()
    d["nodes"][1]["fabric_interface"] = "enP7s7"  # the management LAN
    d["nodes"][1]["env"] = {"NCCL_SOCKET_IFNAME": "ib0"}
    problems = preflight(view_of(cfg(d)), with_ifaces(cfg(d)))
    assert "spark-2: fabric IP 192.168.200.13 is not on enP7s7 (10.0.0.12/24)" in problems
    assert "spark-2: NCCL_SOCKET_IFNAME=ib0 matches no interface" in problems


def test_a_cluster_wide_vllm_host_ip_and_pack_placement() -> None:
    d = data()
    d["deployments"][0]["serve"]["placement_strategy"] = "PACK"
    c = cfg(d)
    # (a cluster-wide VLLM_HOST_IP in ray.env is refused by the config itself.) PACK across one-GPU nodes is not.
    assert preflight(view_of(c), with_ifaces(c)) == [
        'TP x PP = 2 spans nodes with 1 GPU each: set placement_strategy = "SPREAD"']
    d["nodes"][1]["env"] = {"VLLM_HOST_IP": "192.168.200.12"}
    assert "spark-2: VLLM_HOST_IP=192.168.200.12 is not its fabric IP 192.168.200.13" in preflight(view_of(cfg(d)), with_ifaces(cfg(d)))


def test_unreadable_interfaces_are_not_a_verdict() -> None:
    c = cfg()
    o = with_ifaces(c)
    o = replace(o, nodes={k: replace(v, interfaces=None) for k, v in o.nodes.items()})
    assert preflight(view_of(c), o) == []
