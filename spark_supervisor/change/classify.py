"""What a move from one config to another does to each deployment, and to the supervisor's own settings: pure.
Read by `spark-supervisor apply --dry-run` and by the daemon's reload (loop.stack: what it stages, what it
proves first): a Ray spec that differs replaces the deployment, a serve spec alone relaunches its serve,
anything else of it is applied in place."""

from __future__ import annotations

import dataclasses
from enum import StrEnum
from typing import Any

from ..config import Config
from ..config.view import DeploymentView, views


class Change(StrEnum):
    UNCHANGED = "unchanged"
    SETTINGS = "settings only"  # applied in place: nothing stops
    ADDED = "added"  # started
    REMOVED = "removed"  # torn down
    SERVE_RESTART = "serve-only restart"  # the serve relaunched in the containers it runs in
    REPLACE = "replace"  # its containers and serve replaced


@dataclasses.dataclass(frozen=True)
class DeploymentChange:
    name: str
    change: Change
    differs: tuple[str, ...] = ()  # the deployment's sections that differ (ray, serve, readiness, ...)

    @property
    def stops(self) -> bool:
        """Whether it stops what this deployment runs now (what a change is proven for first)."""
        return self.change in (Change.REMOVED, Change.SERVE_RESTART, Change.REPLACE)


def _sections(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, ...]:
    return tuple(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def diff(old: Config, new: Config) -> tuple[list[DeploymentChange], tuple[str, ...]]:
    """Each deployment's change (deployment_changes) and the supervisor's own settings that differ (top-level
    sections other than the deployments)."""
    settings = _sections({k: v for k, v in old.model_dump().items() if k != "deployments"},
                         {k: v for k, v in new.model_dump().items() if k != "deployments"})
    return deployment_changes(views(old), views(new)), settings


def deployment_changes(olds: dict[str, DeploymentView], news: dict[str, DeploymentView]) -> list[DeploymentChange]:
    """Each deployment's change from the views it runs on to the new ones (the old order, then the ones added)."""
    out = []
    for name in [*olds, *(n for n in news if n not in olds)]:
        o, n = olds.get(name), news.get(name)
        if n is None:
            out.append(DeploymentChange(name, Change.REMOVED))
            continue
        if o is None:
            out.append(DeploymentChange(name, Change.ADDED))
            continue
        differs = _sections(o.dep.model_dump(), n.dep.model_dump())
        if o.ray_hash != n.ray_hash:
            change = Change.REPLACE
        elif o.serve_hash != n.serve_hash:
            change = Change.SERVE_RESTART
        else:
            change = Change.SETTINGS if differs else Change.UNCHANGED  # the file's own settings: apart
        out.append(DeploymentChange(name, change, differs))
    return out
