"""The backend: what the reconcile loop needs from the world (observe, act, the quick check between ticks,
teardown), with RealBackend over the adapters in production and a fake in unit tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..adapters import AdapterError
from ..adapters import docker as docker_adapter
from ..adapters.quick import QuickProbe
from ..adapters.shell import control_dir
from ..base.log import Log
from ..config import identity
from ..config.view import DeploymentView
from ..judge import completion
from ..model import Action, EndpointObservation, Kind, Observation, Outcome, RayObservation, Reason
from . import prove as prove_mod
from .act import ActionFailed, Actor
from .observe import Observer, World

Fingerprint = tuple[frozenset[str] | None, str]


def fingerprint(ray: RayObservation | None, endpoint: EndpointObservation | None) -> Fingerprint:
    """What the quick check compares between ticks: the Ray nodes alive and the /health result."""
    return ray_alive(ray), completion.health_result(endpoint)


def ray_alive(ray: RayObservation | None) -> frozenset[str] | None:
    """The addresses Ray lists alive (None: Ray was not read)."""
    return frozenset(n.ip for n in ray.alive) if ray is not None and ray.reachable else None


class Backend(Protocol):
    """What the loop needs from the world; RealBackend in production, a fake in unit tests."""

    def observe(self, full: bool) -> Observation: ...
    def run(self, action: Action) -> Outcome: ...
    def quick(self) -> Fingerprint: ...
    def teardown(self) -> list[str]: ...
    def prove(self) -> Reason | None: ...
    def pin(self, images: dict[str, str]) -> None: ...
    def close(self) -> None: ...


class RealBackend:
    def __init__(self, view: DeploymentView, log: Log, heartbeat: Callable[[], None] | None = None, *,
                 dry: bool = False):
        """dry: a dry run's (act.Actor's ``dry``): its proof changes nothing anywhere."""
        cfg = view.cfg
        self.world = World(view, control_dir=control_dir(cfg.supervisor.state_dir), follow_events=not dry)
        self.observer = Observer(self.world, recent=self._recent)
        self.actor, self.log = Actor(self.world, log, heartbeat, dry=dry), log
        self.quick_probe = QuickProbe(self.world.ray.url if self.world.view.dep.uses_ray else "", self.world.api.url,
                                      api=self.world.api.kept)
        self._seen: tuple[float, RayObservation | None, EndpointObservation | None] = (0.0, None, None)
        self._fresh_s = cfg.healing.quick_check_interval + 0.25

    def observe(self, full: bool) -> Observation:
        return self.observer.observe(full)

    def run(self, action: Action) -> Outcome:
        return self.actor.run(action)

    def quick(self) -> Fingerprint:
        # Without a dashboard Ray is read at ticks only (observe.Observer._ray_gcs): its last reading stands.
        ray = self.quick_probe.ray_nodes() if self.observer.ray_via == "dashboard" else self.observer.last_ray
        health = self.quick_probe.health()
        self._seen = (time.monotonic(), ray if self.observer.ray_via == "dashboard" else None, health)
        return fingerprint(ray, health)

    def _recent(self) -> tuple[RayObservation | None, EndpointObservation | None]:
        """The last quick check's Ray nodes and /health while they are fresh: a tick need not ask again."""
        at, ray, health = self._seen
        return (ray, health) if time.monotonic() - at <= self._fresh_s else (None, None)

    def teardown(self) -> list[str]:
        return teardown(self.world, self.log)

    def prove(self) -> Reason | None:
        """Whether this spec can start on every member (a change is proven before it replaces what serves)."""
        return prove_mod.prove(self.world, self.actor)

    def pin(self, images: dict[str, str]) -> None:
        """Start these images (node -> ID) from now on, not what the tag names (Status.pinned)."""
        self.actor.pins = dict(images)

    def close(self) -> None:
        self.quick_probe.close()
        self.world.close()


def on_exec_ended(cue: Callable[[], None]) -> Callable[[], None]:
    """Call ``cue`` (from an engine's event thread) whenever a process run in one of our containers on an engine
    the daemon follows ends, a serve's wrapper among them: a cue to run the quick checks now, never itself
    evidence. Returns the call that stops it."""
    return docker_adapter.LISTINGS.listen(cue)


def teardown(world: World, log: Log) -> list[str]:
    """Remove every container this deployment owns, on every node, workers first."""
    dep = world.view.dep
    removed, errors = [], []
    for node in reversed(world.view.members):
        a = world.nodes[node.name]
        try:
            names = identity.teardown_targets(a.docker.containers(), dep, node)
            for name in names:
                if a.docker.remove(name):
                    removed.append(f"{node.name}/{name}")
                    log.info("teardown.container_removed", node=node.name, container=name)
        except AdapterError as e:
            errors.append(f"{node.name}: {e}")
            log.error("teardown.failed", node=node.name, error=str(e))
    if errors:
        raise ActionFailed(Kind.TEARDOWN_INCOMPLETE, "; ".join(errors))
    return removed
