"""Issue 19 item 8 (the stale rule): a container carrying any `spark-supervisor.` label is ours or another
supervisor's (a deployment's node, an image or model check, a prefetch, a page-cache drop, a concurrent
`check --preflight`'s helper): never stale, whatever the stale rules match. Only the owner rules remove it,
by its deployment's name."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from spark_supervisor.config import OWNER_LABEL, ROLE_LABEL
from spark_supervisor.model import Container, Phase, RemoveContainers, Status
from spark_supervisor.plan import is_orphan, is_stale, plan
from spark_supervisor.world import backend
from spark_supervisor.world.observe import World
from tests.fakes import FakeEngine
from tests.helpers import cfg, data, node_obs, obs, view_of

IMAGE = "nvcr.io/nvidia/vllm:25.11-py3"
C = cfg(data(stale={"containers": ["vllm_node", "image-check"], "image_patterns": ["nvcr.io/nvidia/vllm:*"],
                    "container_labels": ["com.example.stack=vllm"]}))
HELPER_LABELS = [
    {ROLE_LABEL: "image-check"}, {ROLE_LABEL: "model-check"}, {ROLE_LABEL: "drop-caches"},
    {"spark-supervisor.helper": "image-check"}, {"spark-supervisor.helper": "drop-caches"},
    {"spark-supervisor.helper": "model-prefetch", OWNER_LABEL: "someone-elses"},
    {"spark-supervisor.anything-new": "x"},
]


def helper(labels: dict[str, str], name: str = "vllm_node") -> Container:
    return Container("c1", name, IMAGE, "exited", {**labels, "com.example.stack": "vllm"})


@pytest.mark.parametrize("labels", HELPER_LABELS)
def test_a_helper_container_of_this_or_another_daemon_is_never_stale(labels: dict[str, str]) -> None:
    c = helper(labels)  # matched by name, by image and by label: still not stale
    assert not is_stale(c, C)


def test_the_same_container_without_our_labels_is_stale() -> None:
    assert is_stale(helper({}), C)


@pytest.mark.parametrize("labels", [x for x in HELPER_LABELS if OWNER_LABEL not in x])
def test_a_helper_without_an_owner_is_no_orphan_either(labels: dict[str, str]) -> None:
    assert not is_orphan(helper(labels), C, C.deployment, member=True)
    assert not is_orphan(helper(labels), C, C.deployment, member=False)


def test_the_hygiene_step_leaves_every_helper_container_alone() -> None:
    cs = tuple(helper(labels, f"h{i}") for i, labels in enumerate(HELPER_LABELS) if OWNER_LABEL not in labels)
    nodes = {"spark-1": node_obs("spark-1", cs), "spark-2": node_obs("spark-2", cs)}
    st = Status()
    st.advance(Phase.DETECTING, st.why, 0, 0)
    d = plan(obs(C, nodes=nodes), st, view_of(C), 1)
    assert not any(isinstance(a, RemoveContainers) for a in d.actions), d


def teardown(listed: dict[str, list[Container]]) -> dict[str, list[str]]:
    engines = {n: FakeEngine(cs) for n, cs in listed.items()}
    # the world, of which teardown reads the config and each node's engine
    world = cast(World, SimpleNamespace(cfg=C, view=view_of(C), nodes={n: SimpleNamespace(docker=e) for n, e in engines.items()}))
    backend.teardown(world, SimpleNamespace(info=lambda *_, **__: None, error=lambda *_, **__: None))
    return {n: e.removed for n, e in engines.items()}


def test_teardown_never_removes_another_owners_container_that_has_our_name() -> None:
    claimed = Container("c", "qwen-ray-spark-1", IMAGE, "running", {OWNER_LABEL: "another-daemons-qwen"})
    assert teardown({"spark-1": [claimed], "spark-2": []}) == {"spark-1": [], "spark-2": []}


def test_teardown_removes_ours_by_label_and_an_unlabelled_one_by_its_name() -> None:
    ours = Container("a", "renamed", IMAGE, "running", {OWNER_LABEL: "qwen"})
    unlabelled = Container("b", "qwen-ray-spark-2", IMAGE, "running", {})
    stranger = Container("d", "qwen-ray-spark-9", IMAGE, "exited", {})
    assert teardown({"spark-1": [ours], "spark-2": [unlabelled, stranger]}) == {
        "spark-1": ["renamed"], "spark-2": ["qwen-ray-spark-2"]}
