"""Images pinned by ID (issue 22, item 3): once a deployment serves, the image ID each member's container runs
is what its repairs start, not whatever its tag names by then; a reload's new spec starts from its tag."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import structlog

from spark_supervisor.model import EndpointObservation, EndpointState, Phase
from spark_supervisor.specs import commands
from spark_supervisor.world import act
from spark_supervisor.world.act import Actor
from spark_supervisor.world.observe import World
from tests.fakes import make
from tests.helpers import cfg, obs, serve_running, sole, view_of

ID = {"spark-1": "sha256:" + "1" * 64, "spark-2": "sha256:" + "2" * 64}


def test_reaching_serving_pins_the_image_each_member_runs(tmp_path: Path) -> None:
    daemon, be, clock, _, _ = make(tmp_path)
    c = daemon.cfg
    o = obs(c, deployed=True, serve=serve_running(c),
            endpoint=EndpointObservation(EndpointState.UP, health=200, models=(c.deployment.serve.name,)))
    nodes = {n: dataclasses.replace(x, containers=tuple(dataclasses.replace(k, image_id=ID[n]) for k in x.containers))
             for n, x in o.nodes.items()}
    be.next = dataclasses.replace(o, nodes=nodes)
    for _ in range(6):
        daemon.tick()
        if sole(daemon).status.phase == Phase.SERVING:
            break
    assert sole(daemon).status.phase == Phase.SERVING
    assert be.pinned == ID and sole(daemon).status.pinned == ID
    doc = json.loads((tmp_path / "state" / "status.json").read_text())
    assert {n: x["pinned_image"] for n, x in doc["nodes"].items()} == ID


def test_a_pinned_node_starts_its_image_by_id_and_the_others_by_tag() -> None:
    c = cfg()
    world = World(view_of(c))
    try:
        actor = Actor(world, structlog.get_logger())
        actor.pins = {"spark-2": ID["spark-2"]}
        spec = {n.name: commands.node_container(c, c.deployment, n) for n in c.nodes}
        assert actor._pinned("spark-2", spec["spark-2"]).image == ID["spark-2"]
        assert actor._pinned("spark-1", spec["spark-1"]).image == c.deployment.ray.image
        assert actor._pinned("spark-2", spec["spark-2"]).labels == spec["spark-2"].labels  # the same spec hash
    finally:
        world.close()


def test_a_settings_change_keeps_the_pins_on_the_new_backend(tmp_path: Path) -> None:
    import copy

    import tomli_w

    from tests.unit.test_stack import EMBED, serving, stack
    from tests.unit.test_stack import make as make_stack
    d = stack({**EMBED, "after": []})
    daemon, be, clock, _, path = make_stack(tmp_path, d)
    serving(daemon, be, "embed")
    q = daemon.reconcilers["qwen"]
    v = q.view.cfg
    o = obs(v, deployed=True, serve=serve_running(v),
            endpoint=EndpointObservation(EndpointState.UP, health=200, models=(v.deployment.serve.name,)))
    be["qwen"].next = dataclasses.replace(o, nodes={n: dataclasses.replace(x, containers=tuple(
        dataclasses.replace(k, image_id=ID[n]) for k in x.containers)) for n, x in o.nodes.items()})
    for _ in range(6):
        daemon.tick()
        if q.status.phase == Phase.SERVING:
            break
    assert be["qwen"].pinned == ID
    d2 = copy.deepcopy(d)
    d2["healing"] = {"deep_probe_interval": 120}  # settings only: a new backend, the same spec
    path.write_text(tomli_w.dumps(d2))
    daemon.reload()
    assert be["qwen"] is q.backend and be["qwen"].pinned == ID and q.status.pinned == ID


def test_a_pinned_image_gone_is_named_never_pulled_and_the_operator_can_move_past_it(tmp_path: Path) -> None:
    """Issue 42, item 6: the pinned ID pruned on spark-2: named, deterministic (no budget burned on a pull of a
    name that does not exist); a reset, or a reload, starts what the tag names."""
    import pytest

    from spark_supervisor.model import Kind
    from spark_supervisor.world.act import ActionFailed
    from tests.fakes import ActorEngine, FakeShell
    from tests.unit.test_stack import make as make_stack

    c = cfg()
    world = World(view_of(c))
    try:
        actor = Actor(world, structlog.get_logger())
        actor.pins = dict(ID)
        engine = ActorEngine("spark-2")
        engine.images = set()  # nothing on this engine
        a = dataclasses.replace(world.nodes["spark-2"], docker=engine, shell=FakeShell())  # type: ignore[arg-type]
        with pytest.raises(ActionFailed) as e:
            act.ensure_image(actor, a, ID["spark-2"])
        assert e.value.why.kind == Kind.PINNED_IMAGE_GONE and e.value.deterministic
        assert e.value.why.detail.startswith(f"pinned image {ID['spark-2'][:19]} is gone on spark-2")
        assert "`spark-supervisor reset` (or a reload) starts what" in e.value.why.detail
        assert engine.pulled == []
    finally:
        world.close()
    from spark_supervisor.model import Reason
    from tests.helpers import data
    d = data()
    daemon, be, clock, _, path = make_stack(tmp_path, d)
    q = daemon.reconcilers["qwen"]
    for how in ("reset", "reload"):
        q.status.pinned = dict(ID)
        q.backend.pin(ID)
        q.status.advance(Phase.FAILED, Reason(Kind.PINNED_IMAGE_GONE, "gone"), clock.t, 1.7e9)
        if how == "reset":
            daemon.rearm("reset")
        else:
            daemon.reload()  # the same file: no change, and still the way past it
        assert q.status.pinned == {} and be["qwen"].pinned == {} and q.status.phase != Phase.FAILED, how
