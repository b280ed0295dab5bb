"""A reload (SIGHUP): the config file read again and the stack moved to it, or the previous config kept
with the reason; a reload that would remove or replace a deployment, staged until the file is read again
the same; and one that would replace a serving deployment, applied only once its new spec is proven
startable on every member while the old one keeps serving (change.proof)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from .. import config as config_mod
from ..base import files
from ..base.log import Log
from ..change import proof
from ..config.view import DeploymentView, views
from ..judge.admission import share_fits
from ..model import Reason
from ..model.document import ReloadDoc
from ..report import journal
from ..report.notify import Notifier
from ..state import statefile
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

    def __init__(self, config_path: str, config_hash: str, stack: Stack, notifier: Notifier, *, log: Log,
                 clock: Callable[[], float], wall: Callable[[], float], prove: proof.Start = proof.start):
        self.config_path, self.config_hash, self.stack, self.notifier = config_path, config_hash, stack, notifier
        self.prove = prove
        self.log, self.clock, self.wall = log, clock, wall
        self.reload_error = ""  # kept in STATUS= and the status file until a reload succeeds
        self.reload_at = 0.0  # wall clock of the last reload
        self.staged: _Staged | None = None
        self.proving: proof.Proving | None = None
        self.refused: dict[str, Reason] = {}  # deployment -> why the last reload's change was refused

    PROOF_POLL_S = 0.5  # how soon the loop looks again at a proof under way

    def due(self, now: float) -> bool:
        """True when a staged reload is to read the file again, or a proof has its verdict."""
        p = self.proving
        return ((self.staged is not None and now >= self.staged.due)
                or (p is not None and not p.seen and p.result.done()))

    def next_due(self) -> float:
        """When (the daemon's clock) a staged reload reads the file again, or a proof is looked at; inf when
        neither waits."""
        if self.proving is not None and not self.proving.seen:
            return self.clock() + self.PROOF_POLL_S
        return math.inf if self.staged is None else self.staged.due

    def reload(self, *, again: bool = False) -> None:
        """SIGHUP: read the config again (config.load: bounded, regular files only) and move to it.
        ``again``: the loop reads it again for a staged reload or a proof's verdict (a SIGHUP proves afresh)."""
        self.notifier.reloading()
        self.reload_at = self.wall()
        try:
            self._reload(again)
        except Exception as e:  # whatever the file holds, a reload must never take the supervisor down
            self.log.exception("config.unusable", path=self.config_path, kept="previous config")
            self.reload_error = f"{self.config_path}: cannot set up: {type(e).__name__}: {e}"[:300]
            self.staged = self.proving = None

    def _reload(self, again: bool) -> None:
        before = config_mod.file_hash(self.config_path)
        try:
            new = config_mod.load(self.config_path)
        except config_mod.ConfigError as e:
            self.log.error("config.invalid", path=self.config_path, problems=e.problems, kept="previous config")
            self.reload_error, self.staged, self.proving, self.refused = e.problems[0], None, None, {}
            return
        cfg = self.stack.cfg
        if new.supervisor.state_dir != cfg.supervisor.state_dir:
            # The lock and the control socket live there: moving it would let a second daemon in.
            self.reload_error = (f"{self.config_path}: supervisor.state_dir cannot change on reload "
                                 f"(restart the service to move it to {new.supervisor.state_dir})")
            self.log.error("config.invalid", path=self.config_path, problems=[self.reload_error],
                           kept="previous config")
            self.staged, self.proving, self.refused = None, None, {}
            return
        self.reload_error = ""
        read_as = before if before and config_mod.file_hash(self.config_path) == before else ""
        wanted = views(new)  # once for this reading of the file
        changes = self.stack.destructive(wanted)
        proving_this = self.proving is not None and bool(read_as) and self.proving.key[0] == read_as
        if changes and not proving_this and not self._settled(read_as, changes):  # a file proven has settled
            return
        self.staged = None
        proving = self.stack.to_prove(wanted)
        unfit = {name: why for name, view in proving.items()
                 if (why := share_fits(view, (r := self.stack.reconcilers[name]).view, r.last_full)) is not None}
        if unfit:  # known from the last full reading: no proof needed to refuse it
            self._refuse(unfit)
            self.proving = None
            return
        if proving:
            refused = self._proven(read_as, proving, again)
            if refused is None:
                return  # proving: the loop reads the file again once the verdict is in
            if refused:
                self._refuse(refused)
                return
        self.proving, self.refused = None, {}
        self.stack.rollbacks.notes.clear()  # what they were about is replaced by this file
        changed = new != cfg
        journal.register_config(new)  # a key or secret the new file brings is redacted from here on
        for w in new.warnings:
            self.log.warning("config.warning", problem=w)
        self.log.info("config.reloaded", path=self.config_path, changed=changed,
                      deployments={n: {"ray_hash": v.ray_hash, "serve_hash": v.serve_hash} for n, v in wanted.items()})
        if changed:
            self.stack.apply(new, wanted)
            self.config_hash = config_mod.file_hash(self.config_path)
        else:
            for r in self.stack.reconcilers.values():
                self.stack.retry_failed(r, "reload")

    def _proven(self, file_hash: str, views: dict[str, DeploymentView], again: bool) -> dict[str, Reason] | None:
        """The refusals of the proofs of ``views`` (empty: proven), or None while they run. A proof is started
        when none runs for this file and these specs; a SIGHUP (not ``again``) proves a finished one afresh:
        the operator may have loaded the missing image since."""
        key = (file_hash, *sorted(f"{n}:{v.ray_hash}:{v.serve_hash}" for n, v in views.items()))
        p = self.proving
        if p is None or p.key != key or not file_hash or (not again and p.result.done()):
            self.proving = self.prove(key, views, self.stack.backend_factory, self.log)
            self.log.warning("change.proving", deployments=sorted(views),
                             why="a change replaces what serves only once it is proven startable on every member")
            return None
        if not p.result.done():
            return None
        p.seen = True
        return p.result.result()

    def _refuse(self, refused: dict[str, Reason]) -> None:
        """The change is not made: the previous config stays, and the refusal is shown, alerted and counted."""
        self.refused = refused
        self.reload_error = "; ".join(self._refusals())[:600]
        for name, why in refused.items():
            self.log.error("change.refused", deployment=name, reason=str(why), kept="previous config")
            r = self.stack.reconcilers.get(name)
            phase = r.status.phase.value if r is not None else ""
            self.stack.alerter.emit(name, "change_refused", phase=phase, reason=str(why), reason_kind=why.kind)
            self.stack.metrics.bound(name).change_refused()

    def _refusals(self) -> list[str]:
        """The refusals as shown: "ChangeRefused: <deployment>: <why>"."""
        return [f"{why.kind}: {name}: {why.detail}" for name, why in self.refused.items()]

    def _settled(self, file_hash: str, changes: list[str]) -> bool:
        """True when a reload that removes or replaces deployments read the same file SETTLE_S after it was
        staged; else it is staged (afresh if the file changed) and read again at its time by the loop."""
        now, st = self.clock(), self.staged
        if st is not None and file_hash and st.file_hash == file_hash:
            if now < st.due:
                return False  # the same file, not settled yet: the loop reads it again at st.due
            held = files.writers(self.config_path)  # a writer stalled mid-file: the same bytes twice, half a file
            if not held:
                return True
            st.due = now + self.SETTLE_S
            self.log.warning("config.still_written", path=self.config_path, pids=held[:8], changes=changes,
                             why="the file is open for writing: read again once it is closed")
            return False
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
        if self._proving_text():
            return f" (reload proving: {self._proving_text()})"
        if self.stack.rollbacks.notes:
            return f" ({'; '.join(str(r) for r in self.stack.rollbacks.notes)})"
        return ""

    def _proving_text(self) -> str:
        p = self.proving
        if p is None or p.seen:
            return ""
        return (f"replaces {', '.join(repr(n) for n in p.names)} once its new spec is proven on every member "
                "(image, serve arguments and model checked, the model fetched where it is missing); it serves on "
                "meanwhile")

    def _staged_text(self) -> str:
        assert self.staged is not None
        return (f"{', '.join(self.staged.changes)}; applied once the file is read again unchanged "
                f"{self.SETTLE_S:g}s later")

    def doc(self) -> ReloadDoc | None:
        """The last reload, when it failed or waits: the status file's "reload"."""
        rolled = [str(r) for r in self.stack.rollbacks.notes]
        if not self.reload_error and self.staged is None and not self._proving_text() and not rolled:
            return None
        return {"error": self.reload_error or None, "at": statefile.iso(self.reload_at),
                "staged": self._staged_text() if self.staged is not None and not self.reload_error else None,
                "proving": self._proving_text() or None, "refused": self._refusals(),
                "rolled_back": rolled}
