"""`discover`'s pure derivations on facts shaped like two real DGX Sparks (docs/wire-formats.md §8.2): the
fabric subnet chosen, the RDMA devices and GID index of it, the [stale] candidates with why, and the config
written with its annotations, which the config loader takes."""

from __future__ import annotations

import tomllib

from spark_supervisor.config import parse
from spark_supervisor.judge import discovery_config as dc
from spark_supervisor.judge.discovery import (
    ImageSeen,
    ModelSeen,
    NodeReading,
    choose_image,
    complete_models,
    fabrics,
    looks_like_vllm,
    oom_killers,
    stale_candidates,
)
from spark_supervisor.model import (
    Container,
    Gid,
    Gpu,
    GpuProcess,
    HostFacts,
    ImageReport,
    Link,
    Listener,
    ModelReport,
    RdmaPort,
    Unit,
)

FE80 = "fe80:0000:0000:0000:0eb4:61ff:fe2a:0001"


def _mapped(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"


def spark(name: str, fabric_ip: str, lan_ip: str, *, gid_index: int = 3, **kw: object) -> NodeReading:
    """A Spark as discover reads it: the cabled port enp1s0f1np1 (rocep1s0f1) on the fabric, its twin
    enP2p1s0f1np1 (roceP2p1s0f1) without an address, the management LAN, Docker's bridge and loopback."""
    gids = (Gid(0, FE80, "", "IB/RoCE v1", "enp1s0f1np1"), Gid(1, FE80, "", "RoCE v2", "enp1s0f1np1"),
            Gid(gid_index - 1, _mapped(fabric_ip), fabric_ip, "IB/RoCE v1", "enp1s0f1np1"),
            Gid(gid_index, _mapped(fabric_ip), fabric_ip, "RoCE v2", "enp1s0f1np1"))
    host = HostFacts(boot_id="b", hostname=name, links=(
        Link("enp1s0f1np1", "up", 9000, 200000), Link("enP2p1s0f1np1", "up", 9000, 200000),
        Link("enP7s7", "up", 1500, 10000), Link("docker0", "up", 1500, None), Link("lo", "unknown", 65536)),
        rdma=(RdmaPort("rocep1s0f1", 1, "ACTIVE", 200.0, "28.45.1200", gids),
              RdmaPort("roceP2p1s0f1", 1, "ACTIVE", 200.0, "28.45.1200",
                       (Gid(0, FE80, "", "IB/RoCE v1", "enP2p1s0f1np1"),))))
    interfaces = {"lo": ("127.0.0.1/8", "::1/128"), "enP7s7": (f"{lan_ip}/24",), "docker0": ("172.17.0.1/16",),
                  "enp1s0f1np1": (f"{fabric_ip}/24", "fe80::eb4:61ff:fe2a:1/64")}
    args: dict[str, object] = {"host": host, "interfaces": interfaces}
    args.update(kw)
    return NodeReading(name, "head" if name == "spark-1" else "worker", "local" if name == "spark-1" else name,
                       **args)  # type: ignore[arg-type]


def test_the_fabric_is_the_shared_subnet_with_rdma_not_the_lan_nor_a_bridge() -> None:
    nodes = [spark("spark-1", "192.168.200.12", "192.168.1.20"), spark("spark-2", "192.168.200.13", "192.168.1.21")]
    found = fabrics(nodes)
    assert [f.network for f in found] == ["192.168.200.0/24", "192.168.1.0/24"]  # docker0 and lo: one address twice
    best = found[0]
    assert best.rdma and best.gid_index == 3
    assert {n: (s.interface, s.ip, s.mtu) for n, s in best.nodes.items()} == {
        "spark-1": ("enp1s0f1np1", "192.168.200.12", 9000), "spark-2": ("enp1s0f1np1", "192.168.200.13", 9000)}
    assert best.devices == {"spark-1": ("rocep1s0f1",), "spark-2": ("rocep1s0f1",)}  # not the twin without the IP
    assert not found[1].rdma


def test_gid_indexes_that_differ_give_no_single_index() -> None:
    nodes = [spark("spark-1", "192.168.200.12", "192.168.1.20"),
             spark("spark-2", "192.168.200.13", "192.168.1.21", gid_index=5)]
    best = fabrics(nodes)[0]
    assert best.rdma and best.gid_index is None
    assert [p.gid_index for s in best.nodes.values() for p in s.ports] == [3, 5]
    assert any("different GID indexes" in s for s in dc.todo(_found(nodes), ray=True))


def test_no_shared_subnet_is_said() -> None:
    nodes = [spark("spark-1", "192.168.200.12", "192.168.1.20"), spark("spark-2", "10.0.0.13", "10.1.1.21")]
    assert fabrics(nodes) == []
    assert "no shared subnet found" in dc.todo(_found(nodes), ray=True)[0]


def test_loopback_counts_only_through_distinct_rdma_addresses() -> None:
    """The testbed's nodes share loopback; their host trees put 127.0.0.2 and .3 in lo's RoCE GIDs."""
    def on_lo(name: str, ip: str) -> NodeReading:
        gids = (Gid(3, _mapped(ip), ip, "RoCE v2", "lo"),)
        host = HostFacts(links=(Link("lo", "up", 9000, 200000),), rdma=(RdmaPort("rocep1s0f1", 1, "ACTIVE", 200.0, "", gids),))
        return NodeReading(name, "head", "local", host=host, interfaces={"lo": ("127.0.0.1/8",)})
    found = fabrics([on_lo("spark-1", "127.0.0.2"), on_lo("spark-2", "127.0.0.3")])
    assert [(f.network, [s.ip for s in f.nodes.values()]) for f in found] == [("127.0.0.0/8", ["127.0.0.2", "127.0.0.3"])]


def _img(tag: str, vllm: str, ray: str = "2.49.0", iid: str = "sha256:aa") -> ImageSeen:
    return ImageSeen(tag, iid, report=ImageReport("n", tag, "k", ray_path="/usr/bin/ray" if ray else "", ray_version=ray,
                                                  vllm_path="/usr/bin/vllm", vllm_version=vllm))


def test_the_image_is_on_every_node_with_ray_and_the_newest_vllm() -> None:
    one = [_img("vllm/vllm-openai:latest", "0.20.0", ray=""), _img("spark-vllm-ray:latest", "0.19.1"),
           _img("spark-vllm-ray:old", "0.11.0"), _img("eugr/vllm-node:latest", "0.21.0")]
    nodes = [spark("spark-1", "192.168.200.12", "192.168.1.20", images=tuple(one)),
             spark("spark-2", "192.168.200.13", "192.168.1.21", images=tuple(one[:3]))]
    got, why = choose_image(nodes, ray=True)
    assert got is not None and got.tag == "spark-vllm-ray:latest"
    assert "eugr/vllm-node:latest: not on spark-2" in why
    assert any(w.startswith("vllm/vllm-openai:latest: no ray") for w in why)
    mp, _ = choose_image(nodes, ray=False)
    assert mp is not None and mp.tag == "vllm/vllm-openai:latest"  # mp needs no Ray: the newest vLLM
    preferred, _ = choose_image(nodes, ray=True, prefer="spark-vllm-ray:old")
    assert preferred is not None and preferred.tag == "spark-vllm-ray:old"  # the base's image, when it qualifies


def test_which_images_look_like_vllm() -> None:
    assert [t for t in ("vllm/vllm-openai:v0.19.1", "nvcr.io/nvidia/vllm:25.09-py3", "spark-vllm-ray:latest",
                        "registry:5000/vllm:x", "ubuntu:24.04", "nvcr.io/nvidia/pytorch:25.09", "myvllmtag:vllm")
            if looks_like_vllm(t)] == ["vllm/vllm-openai:v0.19.1", "nvcr.io/nvidia/vllm:25.09-py3",
                                      "spark-vllm-ray:latest", "registry:5000/vllm:x", "myvllmtag:vllm"]
    assert not looks_like_vllm("ubuntu:vllm")  # the tag alone does not make it one


def test_stale_candidates_each_with_why_and_ours_never() -> None:
    gpu = Gpu("NVIDIA GB10", "580.95.05", None, None, (GpuProcess(4242, "/usr/bin/python3", 90000),
                                                       GpuProcess(1500, "/usr/lib/xorg/Xorg", 60)))
    containers = (Container("a", "vllm_node", "nvcr.io/nvidia/vllm:25.09-py3", "running"),
                  Container("b", "proxy", "nginx:1", "running"), Container("c", "notes", "postgres:16", "running"),
                  Container("d", "llm-ray-spark-1", "spark-vllm-ray:latest", "running",
                            {"spark-supervisor.deployment": "llm"}),
                  Container("e", "old", "vllm/vllm-openai:latest", "exited"))
    units = (Unit("vllm-cluster", "active", "enabled"), Unit("vllm-proxy", "inactive", "enabled"),
             Unit("ray-head", "inactive", "disabled"), Unit("gdm", "active", "enabled"),
             Unit("earlyoom", "active", "enabled"), Unit("vllm-gone", "inactive", "", "not-found"))
    r = spark("spark-1", "192.168.200.12", "192.168.1.20", gpu=gpu, containers=containers, units=units,
              container_pids={"vllm_node": (4242, 4243), "proxy": (77,), "notes": (88,), "llm-ray-spark-1": (99,)},
              listening=(Listener("0.0.0.0", 8000, "nginx", 77), Listener("0.0.0.0", 5432, "postgres", 88)))
    got = {(c.kind, c.name): c.why for c in stale_candidates(r, (8000, 6379, 8265))}
    assert got == {
        ("container", "vllm_node"): "GPU process /usr/bin/python3 (pid 4242, 90000 MiB); runs a vLLM image "
                                    "(nvcr.io/nvidia/vllm:25.09-py3)",
        ("container", "proxy"): "listens on port 8000",
        ("unit", "vllm-cluster"): "enabled, active: named like a model server; would start again at boot and take the GPU",
        ("unit", "vllm-proxy"): "enabled, inactive: named like a model server; would start again at boot and take the GPU",
    }
    assert oom_killers(r) == ["earlyoom"]


def _found(nodes: list[NodeReading], **kw: object) -> dc.Found:
    image, why = choose_image(nodes, ray=True)
    args: dict[str, object] = {"candidates": []}
    args.update(kw)
    return dc.Found(nodes, next(iter(fabrics(nodes)), None), image, why, complete_models(nodes),
                    **args)  # type: ignore[arg-type]


def _model(node: str, path: str) -> ModelSeen:
    return ModelSeen(path, path, "dir", ModelReport(node, path, "k", path=path, source="local", files=39,
                                                     bytes=119 * 2**30))


def test_the_config_written_loads_and_says_where_each_value_came_from() -> None:
    img = (_img("spark-vllm-ray:latest", "0.19.1", iid="sha256:" + "ab" * 32),)
    m = "/models/Qwen3.5-122B-A10B-FP8"
    nodes = [spark("spark-1", "192.168.200.12", "192.168.1.20", images=img, models=(_model("spark-1", m),)),
             spark("spark-2", "192.168.200.13", "192.168.1.21", images=img, models=(_model("spark-2", m),))]
    candidates = stale_candidates(spark("spark-1", "192.168.200.12", "192.168.1.20",
                                        units=(Unit("vllm-cluster", "active", "enabled"),)), (8000,))
    found = _found(nodes, candidates=candidates, models_dir="/models")
    base = {"supervisor": {"interval": 5}, "nodes": [{"name": "spark-2", "become": ["sudo", "-n"]}]}
    doc, notes = dc.build(found, base)
    text = dc.render(doc, notes, ["head"])
    cfg = parse(tomllib.loads(text), "discovered")
    spark1, spark2 = cfg.nodes
    assert (spark1.fabric_ip, spark1.fabric_interface, spark2.fabric_ip, spark2.ssh, spark2.docker, spark2.become) == (
        "192.168.200.12", "enp1s0f1np1", "192.168.200.13", "spark-2", "ssh://spark-2", ["sudo", "-n"])
    dep = cfg.deployments[0]
    assert (dep.ray.image, dep.serve.model, dep.serve.tensor_parallel_size, dep.ray.volumes) == (
        "spark-vllm-ray:latest", m, 2, ["/models:/models:ro"])
    assert dep.ray.env["NCCL_IB_GID_INDEX"] == "3" and "NCCL_IB_HCA" not in dep.ray.env
    assert cfg.stale.units == [] and cfg.supervisor.interval == 5
    lines = text.splitlines()
    assert ('fabric_ip = "192.168.200.13"  # from spark-2: enp1s0f1np1 192.168.200.13/24, shared subnet '
            "192.168.200.0/24") in lines
    assert 'become = ["sudo", "-n"]  # from --base' in lines and "interval = 5  # from --base" in lines
    assert any(ln.startswith('NCCL_IB_GID_INDEX = "3"  # the RoCE v2 GID holding each fabric IP: spark-1: rocep1s0f1 GID 3')
               for ln in lines)
    assert any(ln.startswith("model = ") and "39 weight files, 119.0 GiB" in ln for ln in lines)
    assert any("NCCL_IB_HCA = \"=rocep1s0f1\"" in ln for ln in lines)  # said, not set
    # The candidate is in the file, commented out, with why: never enabled by discovery.
    assert '    # "vllm-cluster",  # spark-1: enabled, active: named like a model server; would start again at boot ' \
           "and take the GPU" in lines


def test_what_is_left_to_do_in_order() -> None:
    bare = [spark("spark-1", "192.168.200.12", "192.168.1.20", runtimes=("runc",)),
            spark("spark-2", "192.168.200.13", "192.168.1.21", runtimes=("nvidia", "runc"))]
    steps = dc.todo(_found(bare), ray=True)
    assert [s.split(":")[0] for s in steps] == ["spark-1", "put one image with vLLM and Ray on every node (the same ID)",
                                                "put the model on every node at the same path (e.g. under --models-dir), then discover again"]
    assert "NVIDIA Container Toolkit" in steps[0]
