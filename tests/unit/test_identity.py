"""The identity vocabulary (spark_supervisor/config/identity.py): the labels the supervisor writes are the ones it
reads back, and each ownership question has one answer, asked of one module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from spark_supervisor.config import Config, identity
from spark_supervisor.model import Container, ContainerSpec, NodeObservation
from spark_supervisor.specs import commands
from tests.helpers import cfg, data

C = cfg()
DEP = C.deployment
HEAD, WORKER = C.members(DEP)


def two() -> Config:
    """Two deployments on the nodes: qwen and embed."""
    d = data()
    d["deployments"].append({"name": "embed", "nodes": ["spark-2"],
                             "serve": {"model": "BAAI/bge-m3", "distributed_executor_backend": "mp", "port": 8001,
                                       "gpu_memory_utilization": 0.05}})
    d["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.8
    return cfg(d)


def box(name: str, labels: dict[str, str] | None = None, image: str = "img") -> Container:
    return Container(f"id-{name}", name, image, "running", labels or {})


def built(spec: ContainerSpec) -> Container:
    return box(spec.name, spec.labels, spec.image)


def test_a_node_container_as_built_is_owned_and_read_back() -> None:
    head, worker = built(commands.node_container(C, DEP, HEAD)), built(commands.node_container(C, DEP, WORKER))
    assert head.name == identity.node_container_name(DEP, HEAD) == "qwen-ray-spark-1"
    assert identity.owns(head, DEP) and identity.owns(worker, DEP) and identity.labelled_for(head, DEP)
    assert not identity.is_helper(head) and identity.has_our_label(head) and identity.owner(head) == "qwen"
    assert identity.spec_hash(head) == identity.spec_hash(worker) is not None
    assert identity.ray_via(head) == "dashboard"
    assert identity.ray_via(built(commands.node_container(C, DEP, HEAD, dashboard=False))) == "gcs"


def test_the_prefetch_is_the_deployments_but_not_one_of_its_node_containers() -> None:
    pre = built(commands.model_prefetch(C, DEP, WORKER))
    assert pre.name == identity.prefetch_name(DEP, WORKER)
    assert identity.labelled_for(pre, DEP) and identity.is_helper(pre) and not identity.owns(pre, DEP)
    o = NodeObservation("spark-2", containers=(pre, built(commands.node_container(C, DEP, WORKER))))
    assert [c.name for c in identity.owned(o, DEP)] == ["qwen-ray-spark-2"]
    assert identity.teardown_targets(o.containers, DEP, WORKER) == [pre.name, "qwen-ray-spark-2"]


def test_a_check_helper_is_ours_to_no_deployment() -> None:
    check = built(commands.drop_caches_container("img"))
    assert identity.is_helper(check) and identity.has_our_label(check) and identity.owner(check) is None
    assert not identity.is_stale(check, C) and not identity.is_orphan(check, C, DEP, True)
    assert identity.teardown_targets([check], DEP, HEAD) == []


@pytest.mark.parametrize(("labels", "name", "member", "orphan"), [
    ({"spark-supervisor.owner": "gone"}, "x", True, True),  # a deployment no longer configured
    ({"spark-supervisor.owner": "qwen"}, "x", False, True),  # this one, on a node it no longer uses
    ({"spark-supervisor.owner": "qwen"}, "x", True, False),
    ({"spark-supervisor.owner": "embed"}, "x", False, False),  # another configured deployment's
    ({}, "qwen-ray-spark-1", True, False),  # unlabelled: never an orphan, whatever its name
])
def test_the_one_owner_rule(labels: dict[str, str], name: str, member: bool, orphan: bool) -> None:
    assert identity.is_orphan(box(name, labels), two(), DEP, member) is orphan


def test_stale_is_by_the_rules_and_never_a_container_with_our_label() -> None:
    assert identity.is_stale(box("vllm_node"), C)
    assert not identity.is_stale(box("vllm_node", {"spark-supervisor.owner": "other"}), C)
    assert not identity.is_stale(box("vllm_node", {"spark-supervisor.anything": ""}), C)
    assert not identity.is_stale(box("mine"), C)


def test_a_teardown_takes_its_own_and_never_another_deployments() -> None:
    c = two()
    embed = c.deployments[1]
    cs = [box("qwen-ray-spark-2"),  # unlabelled, by its name: ours
          box("qwen-ray-spark-2-old", {"spark-supervisor.owner": "qwen"}),  # labelled: ours, whatever its name
          box("embed-vllm-spark-2", {"spark-supervisor.owner": "embed"}),
          box("qwen-ray-spark-2", {"spark-supervisor.owner": "embed"}),  # our name, another's label: not ours
          box("vllm_node")]
    assert identity.teardown_targets(cs, DEP, WORKER) == ["qwen-ray-spark-2", "qwen-ray-spark-2-old"]
    assert identity.teardown_targets(cs, embed, WORKER) == ["embed-vllm-spark-2", "qwen-ray-spark-2"]
    assert [identity.owned_by_any(x, c) for x in cs] == [False, True, True, True, False]


LABEL_NAMES = {"OWNER_LABEL", "HASH_LABEL", "NODE_LABEL", "ROLE_LABEL", "RAY_STATE_LABEL", "HELPER_LABEL",
               "LABEL_PREFIX", "PREFETCH_ROLE"}
PACKAGE = Path(__file__).resolve().parents[2] / "spark_supervisor"


def test_only_identity_reads_and_writes_the_labels() -> None:
    """Outside config/ (which defines and checks them) and identity.py, no module names a label: each asks
    identity (an import is no use: commands re-exports PREFETCH_ROLE)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("config/", "scripts/")) or rel == "identity.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id in LABEL_NAMES:
                found.append(f"{rel}:{node.lineno} {node.id}")
            elif isinstance(node, ast.Attribute) and node.attr in LABEL_NAMES:
                found.append(f"{rel}:{node.lineno} {node.attr}")
    assert found == [], found
