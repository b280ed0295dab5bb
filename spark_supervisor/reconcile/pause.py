"""Maintenance mode: the pause every deployment is under (or none), when it ends on the daemon's clock,
and the pause file in the state directory that lets it outlive a restart of the daemon."""

from __future__ import annotations

from collections.abc import Callable

from ..base.log import Log
from ..model import Pause
from ..state import statefile


class PauseState:
    def __init__(self, state_dir: str, *, log: Log, clock: Callable[[], float], wall: Callable[[], float]):
        self.state_dir, self.log, self.clock, self.wall = state_dir, log, clock, wall
        self.problem = ""  # a saved pause that was set aside, or that could not be saved
        self.deadline: float | None = None  # the daemon's clock: when the pause ends
        self.pause = self._load()

    def _load(self) -> Pause | None:
        """A pause outlives a restart of the daemon (maintenance often includes one); an expired one does
        not; a file that is not a valid pause is moved aside (the daemon starts unpaused, and says so)."""
        p, self.problem = statefile.load_pause(self.state_dir, self.wall())
        if self.problem:
            self.log.error("state.pause_unusable", problem=self.problem)
        if p is not None and p.expired(self.wall()):
            return None
        if p is not None:
            self.deadline = self._deadline(p)
            self.log.warning("daemon.paused", pause=p.text(), since="before this start")
        return p

    def _deadline(self, pause: Pause) -> float | None:
        """When the pause ends on the daemon's (monotonic) clock: a wall clock stepped forward or back
        while it runs neither ends nor stretches it."""
        return None if pause.until is None else self.clock() + max(0.0, pause.until - self.wall())

    def set(self, pause: Pause | None) -> Pause | None:
        """Pause (or resume with None), kept in the state directory; returns the pause it was under."""
        was, self.pause = self.pause, pause
        self.deadline = None if pause is None else self._deadline(pause)
        try:
            statefile.write_pause(self.state_dir, pause)
            self.problem = ""
        except OSError as e:  # still paused (or resumed) in memory; a restart would not know
            self.log.error("state.write_failed", file=statefile.PAUSE, error=str(e))
            self.problem = (f"cannot save the {'pause' if pause else 'resume'} in {statefile.PAUSE}: "
                            f"{e.strerror or e}; a restart of the daemon would not know it")
        return was

    def ends(self, now: float) -> bool:
        """True when the pause's deadline has passed."""
        return self.deadline is not None and now >= self.deadline
