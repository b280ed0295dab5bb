"""The deployment's phases, and the pause (maintenance mode) that holds it in PAUSED."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from .document import PauseDoc


class Phase(StrEnum):
    DETECTING = "DETECTING"
    WAITING = "WAITING"  # for the deployments it starts after (deployments.after)
    CLEANING = "CLEANING"
    STARTING_RAY = "STARTING_RAY"
    STARTING_VLLM = "STARTING_VLLM"
    LOADING = "LOADING"
    VERIFYING = "VERIFYING"
    SERVING = "SERVING"
    DEGRADED = "DEGRADED"
    BACKOFF = "BACKOFF"
    FAILED = "FAILED"
    STOPPING = "STOPPING"
    PAUSED = "PAUSED"  # maintenance: observing and reporting, acting on nothing (`spark-supervisor pause`)


@dataclass(frozen=True)
class Pause:
    """Maintenance mode: observe and report, act on nothing and spend no repair budget, until resumed or
    until ``until`` (wall clock; None: until resumed).

    Every pause is checked where it is made (the CLI, a control request, the file on disk): a time that is
    not a finite number, a deadline that is not after ``at`` or further than ``MAX_S`` away, or a text
    that is not a short string is a ValueError, never a pause that breaks whatever shows it."""

    by: str
    reason: str
    at: float
    until: float | None = None

    MAX_S: ClassVar[float] = 30 * 86400.0  # longer is a typo, or a deployment left unsupervised for good
    TEXT_MAX: ClassVar[int] = 300
    _LATEST: ClassVar[float] = 1e11  # year 5138: what time.gmtime and every display can still show

    def __post_init__(self) -> None:
        for name in ("by", "reason"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > self.TEXT_MAX:
                raise ValueError(f"pause {name}: a text of at most {self.TEXT_MAX} characters, not {self._short(value)}")
        if not self._finite(self.at) or not 0 <= self.at <= self._LATEST:
            raise ValueError(f"pause at: a time (seconds since the epoch), not {self._short(self.at)}")
        if self.until is not None:
            if not self._finite(self.until):
                raise ValueError(f"pause until: a time (seconds since the epoch), not {self._short(self.until)}")
            if self.until <= self.at:
                raise ValueError("pause until: already past: give a time in the future")
            if self.until - self.at > self.MAX_S:
                raise ValueError(f"pause until: at most {self.MAX_S / 86400:g} days ahead "
                                 f"(resume, then pause again, to stay paused longer)")

    @staticmethod
    def _finite(x: object) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

    @staticmethod
    def _short(x: object) -> str:
        return repr(x)[:40]

    def text(self) -> str:
        def hm(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))
        return (f"by {self.by} at {hm(self.at)} " + (f"until {hm(self.until)}" if self.until else "until resumed")
                + (f": {self.reason}" if self.reason else ""))

    def expired(self, wall: float) -> bool:
        return self.until is not None and wall >= self.until

    def to_json(self) -> PauseDoc:
        return {"by": self.by, "reason": self.reason, "at": self.at, "until": self.until}

    @classmethod
    def from_json(cls, d: object) -> Pause | None:
        """From the state file; None for anything malformed (a pause is only kept if it is readable)."""
        if not isinstance(d, dict):
            return None
        try:
            return cls(by=d["by"], reason=d.get("reason", ""), at=d["at"], until=d.get("until"))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
