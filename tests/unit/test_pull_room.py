"""A pull starts only where the engine's disk has room (ray.pull_min_free_gib, issue 22): the free space of the
engine's DockerRootDir, read with `df -Pk` on the node; a free space that cannot be read is no evidence."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.shell import Result
from spark_supervisor.model import Kind
from spark_supervisor.world import act
from spark_supervisor.world.act import ActionFailed, Actor, free_gib
from spark_supervisor.world.observe import NodeAdapters, World
from tests.helpers import cfg, data, view_of

DF = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n/dev/nvme0n1p2  3843862672 3801862672  {kib} 99% /\n"


class Engine:
    def __init__(self, fail: bool = False) -> None:
        self.pulled: list[str] = []
        self.fail = fail

    def has_image(self, _image: str) -> bool:
        return False

    def root_dir(self) -> str:
        if self.fail:
            raise AdapterError("DockerUnreachable", "no answer")
        return "/var/lib/docker"

    def pull(self, image: str, **_: Any) -> None:
        self.pulled.append(image)

    def reset(self) -> None:
        pass

    close = reset


class Shell:
    def __init__(self, out: str) -> None:
        self.out = out
        self.ran: list[list[str]] = []

    def run(self, argv: list[str], _timeout: float | None = None) -> Result:
        self.ran.append(argv)
        return Result(0, self.out, "")


def actor(free_kib: int | None, fail: bool = False) -> tuple[Actor, Engine, Shell, World]:
    d = data()
    d["deployments"][0].setdefault("ray", {}).update(image_pull="if-missing")
    world = World(view_of(cfg(d)))
    node = world.cfg.nodes[1]
    engine, shell = Engine(fail), Shell(DF.format(kib=free_kib) if free_kib is not None else "df: no such dir\n")
    world.nodes[node.name] = NodeAdapters(node, shell, engine)  # type: ignore[arg-type]
    return Actor(world, structlog.get_logger()), engine, shell, world


def test_df_reads_the_available_column() -> None:
    assert free_gib(DF.format(kib=42 * (1 << 20))) == 42.0
    assert free_gib("garbage") is None and free_gib("") is None


def test_a_pull_that_would_not_fit_is_refused_with_the_figures_and_nothing_is_pulled() -> None:
    a, engine, shell, world = actor(12 * (1 << 20))
    try:
        with pytest.raises(ActionFailed) as e:
            act.ensure_image(a, world.nodes["spark-2"], "nvcr.io/nvidia/vllm:26.01")
        assert e.value.why.kind == Kind.DISK_TOO_FULL and e.value.deterministic
        assert "12.0 GiB free in /var/lib/docker, under ray.pull_min_free_gib = 40" in e.value.reason
        assert shell.ran == [["df", "-Pk", "/var/lib/docker"]] and engine.pulled == []
    finally:
        world.close()


@pytest.mark.parametrize("free_kib, fail", [(100 * (1 << 20), False), (None, False), (1, True)])
def test_room_enough_or_unknown_pulls(free_kib: int | None, fail: bool) -> None:
    a, engine, _, world = actor(free_kib, fail)
    try:
        act.ensure_image(a, world.nodes["spark-2"], "nvcr.io/nvidia/vllm:26.01")
        assert engine.pulled == ["nvcr.io/nvidia/vllm:26.01"]
    finally:
        world.close()
