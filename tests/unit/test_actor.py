"""The actor at its edge (issue 21): whole actions through Actor.run, on the real World of a config with each
node's engine and shell faked (tests/fakes.py). What it asks of which node, and what becomes of a failure:
an adapter's error comes out as ActionFailed with the adapter's kind (retried first when transient), a
failure the actor judges as ActionFailed with its Kind, never anything else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_supervisor.adapters import AdapterError, NotFoundError, TransientError, Unreachable
from spark_supervisor.adapters.shell import Result
from spark_supervisor.config import HASH_LABEL, HELPER_LABEL, NODE_LABEL, OWNER_LABEL, ROLE_LABEL, Config
from spark_supervisor.config.identity import PREFETCH_ROLE, node_container_name
from spark_supervisor.model import (
    Container,
    DropPageCache,
    Kind,
    Phase,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    StopUnits,
)
from spark_supervisor.plan import plan
from spark_supervisor.specs import commands
from spark_supervisor.world import act
from spark_supervisor.world.act import ActionFailed, Actor
from tests.fakes import Events, FakeShell, fake_world
from tests.helpers import cfg, data, images, node_obs, obs, ray_container, view_of

FAST_RETRY = {"stop_after_attempt": 3, "wait_initial": 0.01, "wait_max": 0.01}  # three tries, no real wait


def config(mp: bool = False, **ray: Any) -> Config:
    d = data(retry=dict(FAST_RETRY))
    if mp:
        d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    if ray:
        d["deployments"][0].setdefault("ray", {}).update(ray)
    return cfg(d)


class Rig:
    """An Actor on a fake world, with a journal of every engine call across the nodes in order."""

    def __init__(self, c: Config) -> None:
        self.cfg, self.log = c, Events()
        self.journal: list[str] = []
        self.world, self.engines, self.shells = fake_world(c, self.journal)
        self.actor = Actor(self.world, self.log)


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Iterator[Rig]:
    r = Rig(getattr(request, "param", None) or config())
    try:
        yield r
    finally:
        r.world.close()


# ------------------------------------------------------------------------------------ RemoveContainers
def test_remove_containers_removes_the_names_given_on_that_node_and_nothing_else(rig: Rig) -> None:
    rig.engines["spark-2"].listed = [Container("a", "qwen-ray-spark-2", "img", "running"),
                                     Container("b", "other", "img", "running")]
    rig.actor.run(RemoveContainers("spark-2", ("qwen-ray-spark-2", "gone-already"), "replace"))
    assert sorted(rig.engines["spark-2"].removed) == ["gone-already", "qwen-ray-spark-2"]
    assert rig.engines["spark-1"].calls == []  # the other node is not touched
    # a removal is logged for what existed only
    assert [kw["container"] for kw in rig.log.named("clean.container_removed")] == ["qwen-ray-spark-2"]
    assert rig.log.named("clean.container_removed")[0]["why"] == "replace"


def test_a_planned_replacement_removes_only_what_identity_says_the_deployment_owns(rig: Rig) -> None:
    """The spec changed: the plan tears the deployment down, workers first, and the actor removes exactly
    its node containers. Its prefetch, a helper, a stranger and an unlabelled container with a node
    container's name on another node stay."""
    c, dep = rig.cfg, rig.cfg.deployment
    ours = {n: ray_container(c, n, spec="an-older-spec") for n in ("spark-1", "spark-2")}
    prefetch = Container("p", f"{dep.name}-model-spark-1", dep.ray.image, "running",
                         {OWNER_LABEL: dep.name, ROLE_LABEL: PREFETCH_ROLE, HELPER_LABEL: PREFETCH_ROLE,
                          NODE_LABEL: "spark-1"})
    helper = Container("h", "image-check-1", dep.ray.image, "exited", {HELPER_LABEL: "image-check"})
    stranger = Container("s", "postgres", "postgres:16", "running", {})
    misnamed = Container("m", node_container_name(dep, c.nodes[1]), dep.ray.image, "running", {})  # on spark-1
    listed = {"spark-1": [ours["spark-1"], prefetch, helper, stranger, misnamed], "spark-2": [ours["spark-2"]]}
    for n, cs in listed.items():
        rig.engines[n].listed = cs
    st = Status(images=images(c))
    st.advance(Phase.SERVING, st.why, 0, 0)
    d = plan(obs(c, nodes={n: node_obs(n, tuple(cs)) for n, cs in listed.items()}), st, view_of(c), 10)
    assert d.phase == Phase.CLEANING and d.actions, d
    for action in d.actions:
        rig.actor.run(action)
    assert rig.engines["spark-1"].removed == [ours["spark-1"].name]
    assert rig.engines["spark-2"].removed == [ours["spark-2"].name]
    assert [e for e in rig.journal if e.endswith("remove")] == ["spark-2 remove", "spark-1 remove"]  # workers first


def stale_images() -> Config:
    d = data(retry=dict(FAST_RETRY))
    d["stale"]["image_patterns"] = ["vllm/vllm-openai:*"]  # the deployment's own image matches too
    return cfg(d)


@pytest.mark.parametrize("rig", [stale_images()], indirect=True)
def test_a_planned_cleaning_removes_the_stale_container_beside_ours_and_not_ours(rig: Rig) -> None:
    """The stale rules match our containers' image as well: the labels alone tell them apart."""
    c = rig.cfg
    assert c.deployment.ray.image.startswith("vllm/vllm-openai:")
    stale = Container("v", "old-serve", "vllm/vllm-openai:v0.11", "running", {})
    listed = {"spark-1": [ray_container(c, "spark-1"), stale], "spark-2": [ray_container(c, "spark-2")]}
    for n, cs in listed.items():
        rig.engines[n].listed = cs
    st = Status(images=images(c))
    st.advance(Phase.SERVING, st.why, 0, 0)
    d = plan(obs(c, deployed=True, nodes={n: node_obs(n, tuple(cs)) for n, cs in listed.items()}), st, view_of(c), 10)
    assert d.actions == (RemoveContainers("spark-1", ("old-serve",), "stale"),), d
    rig.actor.run(d.actions[0])
    assert rig.engines["spark-1"].removed == ["old-serve"] and rig.engines["spark-2"].removed == []


# ------------------------------------------------------------------------------ starting and serving
@pytest.mark.parametrize("node", ["spark-1", "spark-2"])
def test_start_container_runs_the_nodes_own_spec_on_that_node_only(rig: Rig, node: str) -> None:
    c, dep = rig.cfg, rig.cfg.deployment
    rig.actor.run(StartContainer(node))
    [spec] = rig.engines[node].started
    n = next(x for x in c.nodes if x.name == node)
    assert spec == commands.node_container(c, dep, n)
    assert spec.name == node_container_name(dep, n) and spec.labels[NODE_LABEL] == node
    assert spec.labels[HASH_LABEL] == rig.world.view.ray_hash
    assert ("--head" in spec.command) is (node == "spark-1")  # the head starts Ray's head, the worker joins it
    other = "spark-2" if node == "spark-1" else "spark-1"
    assert rig.engines[other].calls == [] and rig.engines[node].pulled == []  # the image is there: no pull


def test_start_container_pulls_a_missing_image_first_when_allowed() -> None:
    r = Rig(config(image_pull="if-missing", pull_min_free_gib=0))
    try:
        r.engines["spark-2"].images = set()
        r.actor.run(StartContainer("spark-2"))
        image = r.cfg.deployment.ray.image
        assert r.engines["spark-2"].pulled == [image] and [s.image for s in r.engines["spark-2"].started] == [image]
        assert r.journal.index("spark-2 pull") < r.journal.index("spark-2 run")
    finally:
        r.world.close()


def test_start_serve_with_ray_execs_the_launch_in_the_heads_container_only(rig: Rig) -> None:
    c, dep, view = rig.cfg, rig.cfg.deployment, rig.world.view
    head = c.nodes[0]
    rig.actor.run(StartServe())
    ex, record = rig.engines["spark-1"].execs  # the launch, then the wait for its record (act.recorded)
    assert record.argv == commands.serve_state(dep, 0) and not record.detach
    assert ex.container == node_container_name(dep, head) and ex.detach
    assert ex.argv == commands.serve_launch(c, dep, view.serve_hash, head)
    assert ex.env == commands.serve_env(c, dep, view.serve_hash, head)
    assert ex.argv[:2] == ["sh", "-c"] and dep.serve.model in ex.argv and "--node-rank" not in ex.argv
    assert rig.engines["spark-2"].execs == []


def test_a_launch_returns_once_its_wrapper_recorded_the_serve_and_says_so_when_it_did_not(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42, item 11: a tick between a launch and its record must not read it as no serve, or as one ended
    with no exit code; the launch waits (bounded) for the wrapper's record of its own instance."""
    engine, answers = rig.engines["spark-1"], ["serve-state 0\n", "serve-state 42 spec t 0\n",
                                                "serve-state 42 spec t 1\n"]
    real = engine.exec

    def wrapper_slow_to_record(container: str, argv: list[str], **kw: Any) -> tuple[int, str]:
        code, out = real(container, argv, **kw)
        return (code, answers.pop(0)) if argv == commands.serve_state(rig.cfg.deployment, 0) else (code, out)
    monkeypatch.setattr(engine, "exec", wrapper_slow_to_record)
    rig.actor.run(StartServe())
    assert [e.detach for e in engine.execs] == [True, False, False, False] and answers == []
    assert not rig.log.named("serve.launch_unrecorded")
    monkeypatch.setattr(act, "LAUNCH_RECORD_S", 0.3)
    answers[:] = ["serve-state 0\n"] * 100  # never recorded: the launch goes on, and says so
    rig.actor.run(StartServe())
    assert rig.log.named("serve.launch_unrecorded") == [
        {"node": "spark-1", "container": node_container_name(rig.cfg.deployment, rig.cfg.nodes[0]), "within_s": 0.3}]


@pytest.mark.parametrize("rig", [config(mp=True)], indirect=True)
def test_start_serve_across_nodes_execs_each_rank_on_its_node_rank_0_first(rig: Rig) -> None:
    c, dep, view = rig.cfg, rig.cfg.deployment, rig.world.view
    rig.actor.run(StartServe())
    # Each rank launched once its predecessor's wrapper has recorded its serve (act.recorded).
    assert [e for e in rig.journal if e.endswith("exec")] == ["spark-1 exec"] * 2 + ["spark-2 exec"] * 2
    for rank, node in enumerate(c.nodes):
        ex, record = rig.engines[node.name].execs
        assert record.argv == commands.serve_state(dep, 0)
        assert ex.container == node_container_name(dep, node) and ex.detach
        assert ex.argv == commands.serve_launch(c, dep, view.serve_hash, node)
        at = ex.argv.index("--node-rank")
        assert ex.argv[at + 1] == str(rank) and ("--headless" in ex.argv) is (rank > 0)
        assert ex.argv[ex.argv.index("--master-addr") + 1] == c.nodes[0].fabric_ip


def test_stop_serve_stops_it_on_the_head_and_a_container_already_gone_is_no_failure(rig: Rig) -> None:
    rig.engines["spark-1"].fail["exec"] = NotFoundError("NotFound", "no such container: qwen-ray-spark-1")
    rig.actor.run(StopServe("replace"))  # no exception: its container is gone, and the serve with it
    assert rig.engines["spark-1"].calls == ["exec"] and rig.engines["spark-2"].calls == []
    assert rig.log.named("serve.stopped") == [{"nodes": ["spark-1"], "why": "replace"}]


def test_stop_units_stops_then_disables_each_unit_in_order_on_its_node(rig: Rig) -> None:
    rig.actor.run(StopUnits("spark-2", ("vllm-proxy", "vllm-cluster"), disable=True))
    assert rig.shells["spark-2"].ran == [
        ["systemctl", "stop", "vllm-proxy.service"], ["systemctl", "disable", "vllm-proxy.service"],
        ["systemctl", "stop", "vllm-cluster.service"], ["systemctl", "disable", "vllm-cluster.service"]]
    assert rig.shells["spark-1"].ran == []


# ------------------------------------------------------------------------------------------- failures
def test_a_transient_engine_error_is_retried_then_is_action_failed_with_the_adapters_kind(rig: Rig) -> None:
    rig.engines["spark-2"].fail["run"] = Unreachable("DockerUnreachable", "ssh://root@spark-2: Connection refused")
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StartContainer("spark-2"))
    assert e.value.why.kind == "DockerUnreachable" and not e.value.deterministic
    assert "ssh://root@spark-2: Connection refused" in e.value.reason
    assert rig.engines["spark-2"].calls.count("run") == FAST_RETRY["stop_after_attempt"]
    assert rig.engines["spark-2"].started == []


def test_a_transient_engine_error_that_passes_is_no_failure(rig: Rig) -> None:
    rig.engines["spark-2"].fail["remove"] = [TransientError("DockerTimeout", "remove: no answer within 30s")]
    rig.actor.run(RemoveContainers("spark-2", ("qwen-ray-spark-2",)))
    assert rig.engines["spark-2"].calls == ["remove", "remove"] and rig.engines["spark-2"].removed == ["qwen-ray-spark-2"]


def test_an_engine_answer_is_not_retried_and_is_action_failed(rig: Rig) -> None:
    rig.engines["spark-1"].fail["run"] = AdapterError("DockerError", "409 Conflict: name already in use")
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StartContainer("spark-1"))
    assert (e.value.why.kind, e.value.deterministic) == ("DockerError", False)
    assert "409 Conflict" in e.value.reason and rig.engines["spark-1"].calls.count("run") == 1


def test_a_missing_image_with_pulls_off_is_the_deterministic_image_missing(rig: Rig) -> None:
    rig.engines["spark-2"].images = set()  # image_pull = "never" by default
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StartContainer("spark-2"))
    assert e.value.why.kind == Kind.IMAGE_MISSING and e.value.deterministic
    assert "spark-2" in e.value.reason and "docker load" in e.value.reason
    assert rig.engines["spark-2"].pulled == [] and rig.engines["spark-2"].started == []


def test_a_unit_that_will_not_stop_is_systemctl_failed_with_its_stderr_and_is_not_disabled(rig: Rig) -> None:
    rig.shells["spark-2"].answers = [(["systemctl", "stop"], Result(1, "", "Job for vllm-proxy.service canceled.\n"))]
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StopUnits("spark-2", ("vllm-proxy", "vllm-cluster"), disable=True))
    assert e.value.why.kind == Kind.SYSTEMCTL_FAILED and not e.value.deterministic
    assert e.value.reason.endswith("systemctl stop vllm-proxy on spark-2: Job for vllm-proxy.service canceled.")
    assert rig.shells["spark-2"].ran == [["systemctl", "stop", "vllm-proxy.service"]]  # it stops at the first


@pytest.mark.parametrize("err", ["Failed to stop vllm-proxy.service: Access denied",
                                 "Failed to stop vllm-proxy.service: Interactive authentication required.",
                                 "sudo: a password is required"])
def test_a_user_that_may_not_stop_a_unit_is_no_privilege_with_the_way_to_allow_it(rig: Rig, err: str) -> None:
    """The same on every retry: FAILED before any load, with the fix (become and the sudoers rule)."""
    rig.shells["spark-2"].answers = [(["systemctl", "stop"], Result(1, "", err + "\n"))]
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StopUnits("spark-2", ("vllm-proxy",), disable=True))
    assert e.value.why.kind == Kind.NO_PRIVILEGE and e.value.deterministic
    assert e.value.reason.startswith(f"NoPrivilege: systemctl stop vllm-proxy on spark-2: {err}: the node's user may "
                                     "not run it: set nodes.become = [\"sudo\", \"-n\"]")


def test_a_node_unreachable_over_ssh_is_action_failed_not_an_exception_of_its_own(rig: Rig) -> None:
    rig.shells["spark-2"] = FakeShell([(["systemctl"], Unreachable("SshUnreachable", "ssh root@spark-2: "
                                                                                     "Connection refused"))])
    rig.world.nodes["spark-2"].shell = rig.shells["spark-2"]  # type: ignore[assignment]
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(StopUnits("spark-2", ("vllm-proxy",)))
    assert e.value.why.kind == "SshUnreachable" and not e.value.deterministic
    assert str(e.value) == "SshUnreachable: ssh root@spark-2: Connection refused"



@pytest.mark.parametrize("rig", [config(image_pull="if-missing")], indirect=True)
def test_a_dry_actor_pulls_nothing_removes_nothing_and_writes_no_state(rig: Rig) -> None:
    """Issue 42, item 4: `apply --dry-run --prove` proves in probe containers of what is on the nodes; an image
    that is not there is said (a reload would pull it), a prefetch's container is left to the daemon, and the
    image check's findings are not kept (images.json is the daemon's, under its lock)."""
    from pathlib import Path

    from spark_supervisor.config import identity
    from spark_supervisor.model import CheckImage, Container, PrefetchModel
    dry = act.Actor(rig.world, rig.log, dry=True)
    spark2 = rig.engines["spark-2"]
    spark2.images = set()  # the image is not on spark-2
    with pytest.raises(ActionFailed, match="not proven here"):
        dry.run(CheckImage("spark-2"))
    assert spark2.pulled == [] and dry.would == [f"pull {rig.cfg.deployment.ray.image} on spark-2 (size unknown)"]
    spark1 = rig.engines["spark-1"]
    prefetch = identity.prefetch_name(rig.cfg.deployment, rig.cfg.nodes[0])
    spark1.listed = [Container("p", prefetch, "img", "exited")]
    spark1.once = (0, "")
    with pytest.raises(ActionFailed):
        dry.run(PrefetchModel("spark-1"))
    try:
        dry.run(CheckImage("spark-1", model_later=False))
    except ActionFailed:
        pass  # what the fake's empty probe output is judged to be does not matter here
    assert spark1.removed == [] and spark1.started == []
    assert not (Path(rig.cfg.supervisor.state_dir) / "images.json").exists()


def test_a_page_cache_drop_the_user_may_not_make_is_no_privilege(rig: Rig) -> None:
    rig.shells["spark-2"].answers = [(commands.DROP_CACHES[:1], Result(
        2, "", "sh: 1: cannot create /proc/sys/vm/drop_caches: Permission denied\n"))]
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(DropPageCache("spark-2"))
    assert e.value.why.kind == Kind.NO_PRIVILEGE and e.value.deterministic
    assert "Permission denied: the node's user may not run it: set nodes.become" in e.value.reason
    rig.shells["spark-2"].answers = [(commands.DROP_CACHES[:1], Result(1, "", "sync: I/O error\n"))]
    with pytest.raises(ActionFailed) as e:
        rig.actor.run(DropPageCache("spark-2"))
    assert e.value.why.kind == Kind.PAGE_CACHE_DROP_FAILED  # not a privilege: tried again later
