"""How the loop sleeps between ticks: until the next tick is due, a signal or control request, or a change seen by
a deployment's quick check. The quick checks run at their interval, and at once on a cue (a process in one of our
containers ended: a serve's wrapper, perhaps); a cue makes the loop tick only if they saw a change.

Heavy but earned: it is how a dead serve's repair starts within 1 s and a lost node's within 1 s of Ray's
notice (docs/benchmarks.md), at the idle cost of a quick check a second. Measure before you simplify it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..reconcile.reconciler import Reconciler
from ..report.notify import Notifier


class Waiting:
    def __init__(self, clock: Callable[[], float], notifier: Notifier):
        self.clock, self.notifier = clock, notifier
        self._wake = threading.Event()
        self._cued = False  # woken by a cue only (so far): the quick checks run, the loop ticks only on a change

    def wake(self) -> None:
        """From a signal handler or the control socket's thread, once the signal or request is recorded."""
        self._wake.set()

    def cue(self) -> None:
        """From an engine's event thread (backend.on_exec_ended): only records and wakes."""
        self._cued = True
        self._wake.set()

    def wait(self, seconds: float, reconcilers: Iterable[Reconciler], pending: Callable[[], bool]) -> None:
        """Sleep ``seconds`` at most, the systemd watchdog fed; ``pending``: a signal or request is waiting."""
        # Each phase, and so each quick interval, holds for the whole wait: nothing here moves a phase.
        quick = [r for r in reconcilers if r.quick_interval()]
        every = min([r.quick_interval() for r in quick] + [self.notifier.watchdog_interval or seconds, seconds])
        deadline = self.clock() + seconds
        while True:
            self.notifier.watchdog(self.clock())
            left = deadline - self.clock()
            if left <= 0:
                break
            if self._wake.wait(min(left, every)):
                if not self._cued:
                    break
                self._cued = False  # then a signal or request after the clear wakes the next wait
                self._wake.clear()
                if pending():
                    break
            if self.clock() < deadline and self._quick_changed(quick):
                break
        self._wake.clear()

    @staticmethod
    def _quick_changed(quick: list[Reconciler]) -> bool:
        """The quick checks between ticks: a deployment that saw a change ticks at once."""
        changed = [r for r in quick if r.quick()]
        for r in changed:
            r.due_at = 0.0
        return bool(changed)
