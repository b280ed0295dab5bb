"""Day-one qualification (judge.qualify): each break an audit of real Sparks found is named before the load, with
its fix, from positive evidence only; a node whose facts were not read is no verdict."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spark_supervisor.adapters.sysfs import parse_host_facts
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.judge.preflight import preflight
from spark_supervisor.judge.qualify import hca_entries, qualification, stack_memory_problems
from spark_supervisor.model import Container, HostFacts, Link, Memory, Observation, RdmaPort
from tests.helpers import cfg, data, node_obs, obs, ray_container, view_of

# A Spark's RDMA devices: the twin functions of each port (NVIDIA dgx-spark-playbooks, nvidia/nccl/README.md).
SPARK = HostFacts(links=(Link("enp1s0f1np1", "up", 9000, 200000),),
                  rdma=(RdmaPort("rocep1s0f1", 1, "ACTIVE"), RdmaPort("roceP2p1s0f1", 1, "ACTIVE")))


def with_facts(c: Any, **facts: HostFacts | None) -> Observation:
    o = obs(c)
    nodes = {n: replace(o.nodes[n], host=facts.get(n, SPARK)) for n in o.nodes}
    return replace(o, nodes=nodes)


def config(env: dict[str, str] | None = None, **node2: Any) -> Any:
    d = data()
    if env is not None:
        d["deployments"][0]["ray"] = {"env": env}
    d["nodes"][1].update(node2)
    return cfg(d)


def test_an_hca_filter_that_matches_no_device_of_a_member_is_named_with_its_fix() -> None:
    c = config({"NCCL_IB_HCA": "mlx5"})
    got = qualification(view_of(c), with_facts(c))
    assert got == [f"NcclHcaUnmatched: {n}: NCCL_IB_HCA entry 'mlx5' matches no RDMA device (has roceP2p1s0f1, "
                   "rocep1s0f1); NCCL would fall back to sockets: unset NCCL_IB_HCA (NCCL picks the RoCE devices "
                   "itself) or name devices the node has" for n in ("spark-1", "spark-2")]
    assert qualification(view_of(c), with_facts(c, **{"spark-2": None})) == got[:1]  # not read: no verdict


def test_an_hca_filter_naming_the_sparks_devices_or_a_prefix_of_them_passes() -> None:
    for value in ("rocep1s0f1,roceP2p1s0f1", "roce", "=rocep1s0f1:1", "^mlx5", ""):
        c = config({"NCCL_IB_HCA": value})
        assert qualification(view_of(c), with_facts(c)) == [], value
    c = config({"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"})  # no RDMA wanted: the filter is moot
    assert qualification(view_of(c), with_facts(c)) == []
    c = config({"NCCL_IB_HCA": "=roce"})  # exact: a prefix is not a device
    assert [p.split(":")[0] for p in qualification(view_of(c), with_facts(c))] == ["NcclHcaUnmatched"] * 2


def test_hca_entries_follow_nccls_syntax() -> None:
    assert hca_entries("mlx5_0:1,mlx5_1") == ["mlx5_0", "mlx5_1"]
    assert hca_entries("=rocep1s0f1:1") == ["=rocep1s0f1"]
    assert hca_entries("^mlx5") == [] and hca_entries(" ") == []


def test_per_node_nccl_values_under_ray_are_refused_as_vllm_would_overwrite_them() -> None:
    c = config(fabric_interface="enP2p1s0f1np1")  # the worker cabled on the other port
    got = qualification(view_of(c), with_facts(c))
    assert len(got) == 1 and got[0].startswith(
        "PerNodeEnvOverwritten: spark-2: NCCL_SOCKET_IFNAME=enP2p1s0f1np1 (head: enp1s0f1np1), "
        "UCX_NET_DEVICES=enP2p1s0f1np1 (head: enp1s0f1np1): vLLM's Ray executor")
    c = config(env={"NCCL_IB_GID_INDEX": "3"}, fabric_interface="enp1s0f1np1")
    c2 = cfg({**data(), "nodes": [data()["nodes"][0], {**data()["nodes"][1], "env": {"NCCL_IB_GID_INDEX": "5"}}]})
    assert qualification(view_of(c), with_facts(c)) == []  # the same everywhere
    assert qualification(view_of(c2), with_facts(c2)) == []  # the head sets none: nothing carried over it
    c3 = cfg({**data(), "nodes": [data()["nodes"][0], {**data()["nodes"][1], "env": {"NCCL_IB_GID_INDEX": "5"}}],
              "deployments": [{**data()["deployments"][0], "ray": {"image": "i:1", "env": {"NCCL_IB_GID_INDEX": "3"}}}]})
    assert [p[:61] for p in qualification(view_of(c3), with_facts(c3))] == [
        "PerNodeEnvOverwritten: spark-2: NCCL_IB_GID_INDEX=5 (head: 3)"]


def test_the_serves_own_environment_is_what_vllm_carries_to_every_rank() -> None:
    """Under Ray the driver's environment (the head's container and the serve's env) reaches every rank: an
    HCA filter set in serve.env is judged on every member."""
    d = data()
    d["deployments"][0]["serve"]["env"] = {"NCCL_IB_HCA": "mlx5"}
    c = cfg(d)
    assert [p.split(":")[:2] for p in qualification(view_of(c), with_facts(c))] == [
        ["NcclHcaUnmatched", " spark-1"], ["NcclHcaUnmatched", " spark-2"]]
    d = data()
    d["nodes"][1]["fabric_interface"] = "enP2p1s0f1np1"
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"  # each rank keeps its own env
    assert qualification(view_of(cfg(d)), with_facts(cfg(d))) == []


def test_an_active_earlyoom_is_named_and_systemd_oomd_is_not() -> None:
    c = config()
    got = qualification(view_of(c), with_facts(c, **{"spark-2": replace(SPARK, oom_killers=("earlyoom",))}))
    assert len(got) == 1 and got[0].startswith("OomKillerActive: spark-2: earlyoom runs and may kill one rank's")
    assert "`systemctl disable --now earlyoom` on spark-2" in got[0]
    assert qualification(view_of(c), with_facts(c, **{"spark-1": replace(SPARK, oom_killers=("systemd-oomd",))})) == []


def test_the_host_facts_script_lines_name_the_oom_killers_and_nothing_else() -> None:
    out = ("host-facts\nsys/class/net/lo/mtu:65536\nproc/812/comm:earlyoom\nproc/90/comm:systemd-oomd\n"
           "proc/x/comm:earlyoom\n")
    assert parse_host_facts(out).oom_killers == ("earlyoom", "systemd-oomd")


def test_preflight_carries_the_qualification() -> None:
    c = config({"NCCL_IB_HCA": "mlx5"})
    o = with_facts(c)
    o = replace(o, nodes={n: replace(x, interfaces={"enp1s0f1np1": (f"{ip}/24",)}) for (n, x), ip in
                          zip(o.nodes.items(), ("192.168.200.12", "192.168.200.13"), strict=True)})
    assert [p.split(":")[0] for p in preflight(view_of(c), o)] == ["NcclHcaUnmatched"] * 2
    assert node_obs("x").host is None


def stack(llm: float, aux: float) -> Any:
    d = data()
    d["deployments"][0]["serve"]["gpu_memory_utilization"] = llm
    d["deployments"].append({"name": "embeddings", "nodes": ["spark-1"], "after": ["qwen"], "required": False,
                             "serve": {"model": "Qwen/Qwen3-Embedding-0.6B", "served_model_name": "embed",
                                       "distributed_executor_backend": "mp", "gpu_memory_utilization": aux,
                                       "port": 8001}})
    return cfg(d)


def test_an_auxiliary_that_cannot_fit_beside_the_llm_and_the_nodes_own_use_is_named_before_the_load() -> None:
    c = stack(0.85, 0.08)  # passes `check`: 0.93 <= 1 - share_margin
    aux = DeploymentView.of(c, c.deployments[1])
    busy = Memory(122880, 105000)  # a desktop, its browser and the page cache it will not give back: 17 GiB in use
    o = replace(obs(c), nodes={n: replace(x, memory=busy) for n, x in obs(c).nodes.items()})
    got = stack_memory_problems(aux, o)
    assert got == ["StackDoesNotFit: spark-1: qwen 0.85 + embeddings 0.08 = 0.93 of MemTotal 122880 MiB asks 114278 "
                   "MiB, but the node has 105000 MiB available beside what it runs now (less the share margin: 98856 "
                   "MiB): lower embeddings's gpu_memory_utilization or place it on another node"]
    assert qualification(aux, o) == []  # check --preflight only
    assert stack_memory_problems(view_of(c), o) == []  # the LLM is never refused for an auxiliary's sake
    assert stack_memory_problems(DeploymentView.of(stack(0.7, 0.08), stack(0.7, 0.08).deployments[1]), o) == []
    running = replace(o, nodes={**o.nodes, "spark-1": replace(o.nodes["spark-1"], containers=(ray_container(c, "spark-1"),))})
    assert stack_memory_problems(aux, running) == []  # its own use is in MemAvailable now: no verdict
    old = Container("id-old", "vllm_node", "vllm/vllm-openai:latest", "running")
    stale = replace(o, nodes={**o.nodes, "spark-1": replace(o.nodes["spark-1"], containers=(old,))})
    assert stack_memory_problems(aux, stale) == []  # the old stack's use is about to go: no verdict either
    discrete = replace(o, nodes={n: replace(x, gpu=replace(x.gpu, total_mib=98304)) for n, x in o.nodes.items() if x.gpu})
    assert stack_memory_problems(aux, discrete) == []  # a GPU with its own memory: vLLM's own figure, not this one
