"""A reload (SIGHUP): the config file read again and the stack moved to it, or the previous config kept
with the reason; and a reload that would remove or replace a deployment, staged until the file is read
again the same."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from .. import config as config_mod
from .. import logs, statefile
from ..notify import Notifier
from .stack import Stack


@dataclasses.dataclass
class _Staged:
    """A reload that would remove or replace a deployment, waiting to find the file the same again."""

    file_hash: str  # "" when the file changed while it was read: it must be read again in any case
    due: float  # the daemon's clock: when the file is read again
    changes: list[str]


class Reloader:
    # A reload that would remove or replace a deployment is applied only once the file, read again this much
    # later, is found byte for byte the same: a file caught while being written must not tear anything down.
    SETTLE_S = 2.0

    def __init__(self, config_path: str, config_hash: str, stack: Stack, notifier: Notifier, *, log: Any,
                 clock: Callable[[], float], wall: Callable[[], float]):
        self.config_path, self.config_hash, self.stack, self.notifier = config_path, config_hash, stack, notifier
        self.log, self.clock, self.wall = log, clock, wall
        self.reload_error = ""  # kept in STATUS= and the status file until a reload succeeds
        self.reload_at = 0.0  # wall clock of the last reload
        self.staged: _Staged | None = None

    def due(self, now: float) -> bool:
        """True when a staged reload is to read the file again."""
        return self.staged is not None and now >= self.staged.due

    def next_due(self) -> float:
        """When (the daemon's clock) a staged reload reads the file again; inf when none is staged."""
        return math.inf if self.staged is None else self.staged.due

    def reload(self) -> None:
        """SIGHUP: read the config again (config.load: bounded, regular files only) and move to it."""
        self.notifier.reloading()
        self.reload_at = self.wall()
        try:
            self._reload()
        except Exception as e:  # whatever the file holds, a reload must never take the supervisor down
            self.log.exception("config.unusable", path=self.config_path, kept="previous config")
            self.reload_error = f"{self.config_path}: cannot set up: {type(e).__name__}: {e}"[:300]
            self.staged = None

    def _reload(self) -> None:
        before = config_mod.file_hash(self.config_path)
        try:
            new = config_mod.load(self.config_path)
        except config_mod.ConfigError as e:
            self.log.error("config.invalid", path=self.config_path, problems=e.problems, kept="previous config")
            self.reload_error, self.staged = e.problems[0], None
            return
        cfg = self.stack.cfg
        if new.supervisor.state_dir != cfg.supervisor.state_dir:
            # The lock and the control socket live there: moving it would let a second daemon in.
            self.reload_error = (f"{self.config_path}: supervisor.state_dir cannot change on reload "
                                 f"(restart the service to move it to {new.supervisor.state_dir})")
            self.log.error("config.invalid", path=self.config_path, problems=[self.reload_error],
                           kept="previous config")
            self.staged = None
            return
        self.reload_error = ""
        read_as = before if before and config_mod.file_hash(self.config_path) == before else ""
        changes = self.stack.destructive(new)
        if changes and not self._settled(read_as, changes):
            return
        self.staged = None
        changed = new != cfg
        logs.register_config(new)  # a key or secret the new file brings is redacted from here on
        for w in new.warnings:
            self.log.warning("config.warning", problem=w)
        self.log.info("config.reloaded", path=self.config_path, changed=changed,
                      deployments={d.name: {"ray_hash": config_mod.ray_hash(new, d),
                                            "serve_hash": config_mod.serve_hash(new, d)} for d in new.deployments})
        if changed:
            self.stack.apply(new)
            self.config_hash = config_mod.file_hash(self.config_path)

    def _settled(self, file_hash: str, changes: list[str]) -> bool:
        """True when a reload that removes or replaces deployments read the same file SETTLE_S after it was
        staged; else it is staged (afresh if the file changed) and read again at its time by the loop."""
        now, st = self.clock(), self.staged
        if st is not None and file_hash and st.file_hash == file_hash:
            if now >= st.due:
                return True
            return False  # the same file, not settled yet: the loop reads it again at st.due
        self.staged = _Staged(file_hash, now + self.SETTLE_S, changes)
        self.log.warning("config.staged", path=self.config_path, changes=changes, read_again_in_s=self.SETTLE_S,
                         why="a reload that removes or replaces a deployment waits for the file to be the same again")
        return False

    def note(self) -> str:
        """What STATUS= adds after the phases: the failed reload, or the staged one; "" when neither."""
        if self.reload_error:
            return f" (reload failed: {self.reload_error})"
        if self.staged is not None:
            return f" (reload staged: {self._staged_text()})"
        return ""

    def _staged_text(self) -> str:
        assert self.staged is not None
        return (f"{', '.join(self.staged.changes)}; applied once the file is read again unchanged "
                f"{self.SETTLE_S:g}s later")

    def doc(self) -> dict[str, Any] | None:
        """The last reload, when it failed or waits: the status file's "reload"."""
        if not self.reload_error and self.staged is None:
            return None
        return {"error": self.reload_error or None, "at": statefile.iso(self.reload_at),
                "staged": self._staged_text() if self.staged is not None and not self.reload_error else None}
