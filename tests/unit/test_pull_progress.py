"""Pulled bytes are start progress (issue 44, item 5): an image pull blocks its pass, so while the daemon is
not READY the pull's heartbeat extends systemd's start timeout itself, rate-limited, and only while bytes
arrive; after READY nothing changes. The pure part on a fake clock, the actor's beat on a scripted pull, and
the loop's wiring on the daemon of tests.fakes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog

from spark_supervisor.loop.reporting import PullProgress, Reporter
from spark_supervisor.model import EndpointObservation, EndpointState, Phase
from spark_supervisor.world import act
from spark_supervisor.world.act import Actor
from spark_supervisor.world.backend import RealBackend
from spark_supervisor.world.observe import NodeAdapters, World
from tests.fakes import make
from tests.helpers import cfg, data, obs, serve_running, sole, view_of

EXTEND = f"EXTEND_TIMEOUT_USEC={int(Reporter.EXTEND_S * 1e6)}"


def test_moving_bytes_ask_for_an_extension_at_most_every_sixth_of_it_and_never_once_ready() -> None:
    p = PullProgress(180.0)
    assert p.every_s == 30.0 and p.moved_at == float("-inf")
    asked = [t for t in range(0, 100) if p.moved(float(t), ready=False)]  # bytes every second for 100 s
    assert asked == [0, 30, 60, 90] and p.moved_at == 99.0
    assert not p.moved(500.0, ready=True) and p.moved_at == 500.0  # READY: no start timeout left to extend
    assert p.moved(501.0, ready=False)  # (never the case in the daemon: READY is sent once)


class Pull:
    """A Docker engine whose pull plays a script: ("bytes", done, total) is a progress event in the pull's
    thread, "beat" the heartbeat that `within` calls about once a second while it waits."""

    def __init__(self, script: list[tuple[str, int, int] | str]) -> None:
        self.script = script

    def has_image(self, _image: str) -> bool:
        return False

    def root_dir(self) -> str:
        return ""  # unknown free space: no evidence either way, the pull goes on

    def pull(self, _image: str, *, timeout: float, heartbeat: Callable[[], None] | None = None,  # noqa: ARG002
             progress: Callable[[int, int], None] | None = None) -> None:
        assert heartbeat is not None and progress is not None
        for step in self.script:
            if isinstance(step, str):
                heartbeat()
            else:
                progress(step[1], step[2])

    def reset(self) -> None:
        pass

    close = reset


def pulled(script: list[tuple[str, int, int] | str], hooked: bool = True) -> tuple[list[str], list[str]]:
    """The calls the actor made while the scripted pull ran: (watchdog pings, moves told)."""
    d = data()
    d["deployments"][0].setdefault("ray", {}).update(image_pull="if-missing")
    world = World(view_of(cfg(d)))
    node = world.cfg.nodes[0]
    world.nodes[node.name] = NodeAdapters(node, None, Pull(script))  # type: ignore[arg-type]
    pings: list[str] = []
    moves: list[str] = []
    actor = Actor(world, structlog.get_logger(), heartbeat=lambda: pings.append("WATCHDOG"))
    if hooked:
        actor.pull_moved = lambda: moves.append("moved")
    try:
        act.ensure_image(actor, world.nodes[node.name], "registry.example:5000/vllm:ray")
    finally:
        world.close()
    return pings, moves


def test_a_pull_tells_moves_only_when_bytes_arrived_since_the_last_beat() -> None:
    pings, moves = pulled([("bytes", 10, 100), ("bytes", 20, 100), "beat",  # moved: told once
                           "beat",  # nothing arrived: not told
                           ("bytes", 20, 100), "beat",  # the same sizes again (a status line): not progress
                           ("bytes", 20, 150), "beat",  # a new layer's size known: the pull moves on
                           "beat", "beat"])  # stalled: silent, so the start timeout runs out
    assert pings == ["WATCHDOG"] * 6 and moves == ["moved", "moved"]


def test_a_pull_outside_the_daemon_feeds_the_watchdog_alone() -> None:
    pings, moves = pulled([("bytes", 10, 100), "beat"], hooked=False)
    assert pings == ["WATCHDOG"] and moves == []


def test_the_daemon_extends_its_start_from_a_pull_until_ready_and_a_long_pull_is_not_a_stall(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path)
    c = daemon.cfg
    assert daemon.stack.pull_moved is not None
    be.next = obs(c)
    daemon.tick()  # the first pass: started the Ray containers (the pull would have been in there)
    notes.sent.clear()
    # A pull longer than start_stall_timeout, in one pass: its bytes extend the start, rate-limited.
    stall = c.supervisor.start_stall_timeout
    moves = int(stall / 5) + 20  # bytes every 5 s, 100 s past start_stall_timeout
    for _ in range(moves):
        clock.t += 5
        daemon.stack.pull_moved()
    extends = [n for n in notes.sent if n.startswith("EXTEND_TIMEOUT_USEC")]
    assert extends and all(n == EXTEND for n in extends)
    assert len(extends) == 1 + (5 * (moves - 1)) // (Reporter.EXTEND_S / 6)  # the first at once, then every 30 s
    # The pass after it, still where the start was (no phase further on): the pull that just ended was
    # progress, so the start is not stalled.
    notes.sent.clear()
    daemon.tick()
    assert sole(daemon).status.phase == Phase.STARTING_RAY
    assert EXTEND in notes.sent and not daemon.reporter._stall_logged
    # Serving: READY sent; a pull now (a repair's) changes nothing for systemd.
    s = serve_running(c)
    up = EndpointObservation(EndpointState.UP, health=200, models=("Qwen3.5",))
    be.next = obs(c, deployed=True, serve=s, endpoint=up)
    for _ in range(3):
        daemon.tick()
    assert sole(daemon).status.phase == Phase.SERVING and daemon.reporter.ready_sent
    notes.sent.clear()
    for _ in range(20):
        clock.t += 31
        daemon.stack.pull_moved()
    assert notes.sent == []


def test_the_stack_hands_the_hook_to_the_actor_of_its_real_backends(tmp_path: Path) -> None:
    daemon, *_ = make(tmp_path)
    backend = daemon.stack._real_backend(sole(daemon).view)
    try:
        assert isinstance(backend, RealBackend) and backend.actor.pull_moved is daemon.stack.pull_moved
    finally:
        backend.close()
