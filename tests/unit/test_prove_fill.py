"""A change's model prefetched during its proof (issue 22, item 1): with [deployments.model] prefetch, the
members that lack the new spec's model are filled while the old spec serves, and the switch waits for them;
a prefetch that fails refuses the change with the node and its outcome. The actor is faked at its `run`."""

from __future__ import annotations

from typing import Any, cast

import structlog

from spark_supervisor.model import CheckImage, ImageReport, ModelReport, PrefetchModel
from spark_supervisor.specs import modelprobe
from spark_supervisor.world.act import Actor
from spark_supervisor.world.observe import World
from spark_supervisor.world.prove import fill
from tests.helpers import cfg, data, view_of


class Nodes:
    """Each node's model as a sequence of answers: a PrefetchModel starts it, every CheckImage reads the next."""

    def __init__(self, world: World, answers: dict[str, list[ModelReport]], dry: bool = False) -> None:
        self.world, self.answers, self.dry = world, answers, dry
        self.would: list[str] = []
        self.ran: list[tuple[str, str]] = []
        self.log = structlog.get_logger()

    def run(self, action: Any) -> ImageReport:
        self.ran.append((type(action).__name__, action.node))
        if isinstance(action, PrefetchModel):
            model = ModelReport(action.node, "m", "k", prefetch="running", prefetched=True)
        else:
            assert isinstance(action, CheckImage)
            model = self.answers[action.node].pop(0)
        return ImageReport(action.node, "img", "k", model=model)


def world(prefetch: bool = True) -> World:
    d = data()
    d["deployments"][0]["model"] = {"prefetch": prefetch}
    return World(view_of(cfg(d)))


def report(node: str, *missing: str) -> ImageReport:
    return ImageReport(node, "img", "k", model=ModelReport(node, "m", "k", path="/models/m", missing=missing))


def test_a_node_without_the_model_is_filled_before_the_switch() -> None:
    w = world()
    key = modelprobe.key(w.cfg, w.view.dep)
    running = ModelReport("spark-2", "m", key, prefetch="running", prefetched=True, files_done=3, files_total=7)
    done = ModelReport("spark-2", "m", key, path="/models/m", files=4, prefetched=True, detail="7 files")
    nodes = Nodes(w, {"spark-2": [running, done]})
    waited: list[float] = []
    got = fill(w, cast(Actor, nodes), {"spark-1": report("spark-1"), "spark-2": report("spark-2", "a.safetensors")},
               wait=waited.append)
    assert got is None
    assert nodes.ran == [("PrefetchModel", "spark-2"), ("CheckImage", "spark-2"), ("CheckImage", "spark-2")]
    assert len(waited) == 2  # its progress read at a pace, not in a busy loop


def test_a_prefetch_that_fails_refuses_the_change_naming_the_node_and_why() -> None:
    w = world()
    key = modelprobe.key(w.cfg, w.view.dep)
    failed = ModelReport("spark-2", "m", key, path="/models/m", missing=("a.safetensors (absent)",), prefetched=True,
                         detail="OSError: no room in /models: 9,000 bytes to fetch, 10 free")
    nodes = Nodes(w, {"spark-2": [failed]})
    got = fill(w, cast(Actor, nodes), {"spark-1": report("spark-1"), "spark-2": report("spark-2", "a.safetensors")},
               wait=lambda _: None)
    assert got is not None and str(got).startswith("ChangeRefused: ModelMissing: "), got
    assert "spark-2: a.safetensors" in str(got) and "no room in /models" in str(got), got


def test_without_prefetch_or_with_every_node_complete_nothing_is_fetched() -> None:
    for w, reports in [(world(prefetch=False), {"spark-2": report("spark-2", "a.safetensors")}),
                       (world(), {"spark-1": report("spark-1"), "spark-2": report("spark-2")})]:
        nodes = Nodes(w, {})
        assert fill(w, cast(Actor, nodes), reports, wait=lambda _: None) is None and nodes.ran == []


def test_a_dry_run_says_what_it_would_fetch_and_fetches_nothing() -> None:
    """Issue 42, item 4: `apply --dry-run --prove` starts no prefetch: it says which node would fetch the model."""
    w = world()
    nodes = Nodes(w, {}, dry=True)
    partial = ImageReport("spark-2", "img", "k", model=ModelReport("spark-2", "m", "k", missing=("a (absent)",),
                                                                    bytes_total=3 << 30))
    got = fill(w, cast(Actor, nodes), {"spark-1": report("spark-1", "b.safetensors"), "spark-2": partial})
    assert got is None and nodes.ran == []
    model = w.view.dep.serve.model
    assert nodes.would == [f"fetch {model} on spark-1 (size unknown)", f"fetch {model} on spark-2 (3.0 GiB)"]
