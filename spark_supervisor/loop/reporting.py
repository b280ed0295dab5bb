"""What the loop tells the world after every pass: systemd (STATUS=, READY=1, EXTEND_TIMEOUT_USEC while
the start makes progress) and the status file (status.json, rewritten when it changes). And one thing it
tells during a pass: bytes arriving in an image pull, which blocks its pass (``PullProgress``)."""

from __future__ import annotations

import math
import threading

from ..base.log import Log
from ..model import Phase
from ..reconcile.reconciler import Reconciler
from ..report.notify import Notifier
from ..report.statusdoc import DeploymentDoc, StatusDoc
from ..state import statefile
from .reload import Reloader
from .stack import Stack


class PullProgress:
    """Bytes arriving in an image pull are start progress. A pull blocks its pass for as long as it takes (a
    ~20 GB image on a slow link outlasts TimeoutStartSec, and the EXTEND_S that the pass before it bought),
    so the report after the pass comes too late: the pull's heartbeat says when bytes arrived (``moved``),
    and an extension is due at most every ``every_s``, while not READY. A pull that stops moving stops
    asking, so a stalled pull still meets the timeout within ``extend_s`` of its last byte. The pulls of
    one pass run in parallel threads, hence the lock."""

    def __init__(self, extend_s: float):
        self.every_s = extend_s / 6  # several chances per extension: one late heartbeat does not end the start
        self.moved_at = -math.inf  # when bytes last arrived (the start's progress, beside the reconcilers')
        self._sent_at = -math.inf
        self._lock = threading.Lock()

    def moved(self, now: float, ready: bool) -> bool:
        """Bytes arrived at ``now``: whether to extend the start timeout now."""
        with self._lock:
            self.moved_at = max(self.moved_at, now)
            if ready or now - self._sent_at < self.every_s:
                return False
            self._sent_at = now
            return True


class Reporter:
    # While nothing but the probes' counts changes, the status file is rewritten this often (seconds).
    STATUS_REFRESH_S = statefile.STATUS_REFRESH_S

    # How long each EXTEND_TIMEOUT_USEC buys: more than the longest tick, so the next one arrives in time.
    EXTEND_S = 180.0

    def __init__(self, stack: Stack, reloader: Reloader, notifier: Notifier, *, log: Log):
        self.stack, self.reloader, self.notifier, self.log = stack, reloader, notifier, log
        self._last_doc: dict[str, object] | None = None  # the change key of the last status written
        self._written_at = 0.0
        self._stall_logged = False
        self._last_status = ""
        self._state_write_error = ""
        self.ready_sent = False
        self.pulls = PullProgress(self.EXTEND_S)

    def pull_moved(self, now: float) -> None:
        """Bytes arrived in an image pull (called from the pull's heartbeat, in the pass): before READY, the
        start timeout extended as the pass's report would (after READY, nothing: systemd has no timeout then)."""
        if self.pulls.moved(now, self.ready_sent):
            self.notifier.extend_timeout(self.EXTEND_S)

    def changed(self) -> None:
        """Something the change key may not see changed: the status file is written on the next pass."""
        self._last_doc = None

    def report(self, now: float) -> None:
        """After a pass: STATUS= (and READY=1), the start timeout extended, the status file written."""
        self._announce()
        self._extend_start(now)
        self.write_status(now)

    def _announce(self) -> None:
        """STATUS= when the line changed; READY=1 once every required deployment serves."""
        line = self.status_line()
        if line != self._last_status:
            self._last_status = line
            self.notifier.status(line)
        if not self.ready_sent and (self.stack.cfg.supervisor.ready_when == "started" or self.stack.pause is not None
                                    or all(r.status.phase == Phase.SERVING for r in self.stack.required())):
            self.ready_sent = True
            self.notifier.ready(line)
            self.log.info("daemon.ready", phases={n: r.status.phase.value for n, r in self.stack.reconcilers.items()})

    def _extend_start(self, now: float) -> None:
        """While not yet READY, keep systemd's start timeout alive as long as the start makes progress."""
        if self.ready_sent:
            return
        # A pull that moved until the end of its pass counts: it may have outlasted start_stall_timeout.
        last = max(max(r.last_progress for r in self.stack.required()), self.pulls.moved_at)
        if now - last <= self.stack.cfg.supervisor.start_stall_timeout:
            self.notifier.extend_timeout(self.EXTEND_S)
        elif not self._stall_logged:
            self._stall_logged = True
            behind = min(self.stack.required(), key=lambda r: r.last_progress)  # the one that moved last longest ago
            self.log.error("start.stalled", deployment=behind.view.name, phase=behind.status.phase.value,
                           reason=behind.status.reason, no_progress_s=round(now - last))

    def status_line(self) -> str:
        return self._phase_line() + self.reloader.note()

    def _phase_line(self) -> str:
        rs = list(self.stack.reconcilers.values())
        pause = self.stack.pause
        if pause is not None:
            return f"PAUSED {pause.text()}"
        if len(rs) == 1:
            return rs[0].phase_line()
        serving = sum(r.status.phase == Phase.SERVING for r in rs)
        if serving == len(rs):
            return f"SERVING {serving}/{len(rs)} deployments"
        worst = min((r for r in rs if r.status.phase != Phase.SERVING), key=_severity)
        return f"{serving}/{len(rs)} serving; {worst.name} {worst.phase_line()}"

    def reloaded(self) -> None:
        """After a reload: the status file written on the next pass, and systemd told the reload is over."""
        self._last_doc = None
        # READY=1 ends the reload; before the first READY it would also end the start, so not then.
        self._last_status = self.status_line()
        if self.ready_sent:
            self.notifier.ready(self._last_status)
        else:
            self.notifier.status(self._last_status)

    def write_status(self, now: float) -> None:
        stack, state_dir = self.stack, self.stack.cfg.supervisor.state_dir
        problems = tuple(p for p in (self._state_write_error, stack.pausing.problem) if p)
        docs = [r.document(self.reloader.config_path, self.reloader.config_hash, problems)
                for r in stack.reconcilers.values()]
        # The first deployment's document at the top, as with one deployment; every one under "deployments".
        doc: StatusDoc = {**docs[0], "summary": self._phase_line(), "deployments": docs,
                          "pause": stack.pause.to_json() if stack.pause else None, "reload": self.reloader.doc()}
        key = _change_key(doc)  # compared as dicts: the documents of deployments that did not tick are the same objects
        if key != self._last_doc or now - self._written_at >= self.STATUS_REFRESH_S:
            self._last_doc, self._written_at = key, now
            try:
                statefile.write(state_dir, doc)
                self._state_write_error = ""
            except OSError as e:
                if not self._state_write_error:
                    self.log.error("status.write_failed", error=str(e), state_dir=state_dir)
                self._state_write_error = f"cannot write the status file: {e.strerror or e}"
                self._last_doc = None  # try again next tick
                stack.metrics.state_write_failed("status")


def _severity(r: Reconciler) -> int:
    order = [Phase.FAILED, Phase.DEGRADED, Phase.BACKOFF, Phase.PAUSED, Phase.STOPPING, Phase.DETECTING, Phase.CLEANING,
             Phase.WAITING, Phase.STARTING_RAY, Phase.STARTING_VLLM, Phase.LOADING, Phase.VERIFYING, Phase.SERVING]
    return order.index(r.status.phase)


def _change_key(doc: StatusDoc) -> dict[str, object]:
    """What makes a new status file worth writing at once: all but the daemon's clock, the probes' success
    counts and times, and the engine's times (refreshed every STATUS_REFRESH_S). A probe's last result and its
    failures in a row are news; so are the engine read or not (and why), a stall, and the users' requests,
    running and waiting, which an idle engine keeps at 0."""
    def one(d: DeploymentDoc) -> dict[str, object]:
        out = {k: v for k, v in d.items() if k not in ("daemon", "liveness", "deployments")}
        live, engine = d["liveness"], d["liveness"].get("engine")
        out["liveness"] = {
            "health": (live["health"]["last"], live["health"]["failures"]),
            "deep": (live["deep"]["last"], live["deep"]["failures"]),
            "engine": (engine["read"], engine["error"], bool(engine["stalled_s"]), engine["running"],
                       engine["waiting"]) if engine else None}
        return out
    return {**one(doc), "deployments": [one(d) for d in doc["deployments"]]}
