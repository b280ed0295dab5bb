"""The test doubles of the package's interfaces, in one place and held to them by mypy (the assignments at
the end): a fake Backend (scripted observations, recorded actions), the fake clock and the recording
notifier, a Docker engine as the observer calls it, and the daemon built on them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import structlog
import tomli_w

from spark_supervisor.act import ActionFailed
from spark_supervisor.adapters import AdapterError
from spark_supervisor.backend import Backend, Fingerprint
from spark_supervisor.loop import proof
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    Action,
    CheckImage,
    Container,
    ImageReport,
    Observation,
    Reason,
    Verdict,
    Verify,
)
from spark_supervisor.notify import Notifier
from tests.helpers import cfg, data, images


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Notes(Notifier):
    """The real notifier's messages, recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def send(self, *fields: str) -> None:
        self.sent.append("\n".join(fields))


class FakeBackend:
    """Scripted observations; records actions; fails the ones told to."""

    def __init__(self) -> None:
        self.next: Observation | None = None
        self.ran: list[Action] = []
        self.fail: dict[type, ActionFailed] = {}
        self.reports: dict[str, ImageReport] = {}  # what CheckImage finds, per node
        self.closed = False
        self.refusal: Reason | None = None  # what a proof of this backend's spec finds (None: proven)
        self.proofs = 0
        self.pinned: dict[str, str] = {}  # what pin() was last told

    def observe(self, _full: bool) -> Observation:
        assert self.next is not None
        return self.next

    def run(self, action: Action) -> Verdict | ImageReport | None:
        self.ran.append(action)
        if type(action) in self.fail:
            raise self.fail[type(action)]
        if isinstance(action, Verify):
            return Verdict(True, "content answered", action.serve)
        if isinstance(action, CheckImage):
            return self.reports[action.node]
        return None

    def quick(self) -> Fingerprint:
        return (None, "unknown")

    def teardown(self) -> list[str]:
        return []

    def prove(self) -> Reason | None:
        self.proofs += 1
        return self.refusal

    def pin(self, images: dict[str, str]) -> None:
        self.pinned = dict(images)

    def close(self) -> None:
        self.closed = True


def make(tmp_path: Path, d: dict[str, Any] | None = None) -> tuple[Daemon, FakeBackend, Clock, Notes, Path]:
    d = d or data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    backend, clock, notes = FakeBackend(), Clock(), Notes()
    daemon = Daemon(str(path), cfg(d), log=structlog.get_logger(), backend_factory=lambda _: backend,
                    notifier=notes, clock=clock, wall=lambda: 1.7e9 + clock.t, rng=lambda: 1.0,
                    prove=proof.start_inline)
    backend.reports = daemon.status.images = images(daemon.cfg)  # checked and fit (the check: test_image_*)
    return daemon, backend, clock, notes, path


class FakeEngine:
    """A node's Docker engine as the observer calls it; `fail` makes a call raise what the real one would."""

    def __init__(self, containers: list[Container], fail: dict[str, AdapterError] | None = None) -> None:
        self.listed, self.fail, self.connected = containers, fail or {}, True
        self.calls: list[str] = []
        self.removed: list[str] = []

    def _call(self, what: str) -> None:
        self.calls.append(what)
        if what in self.fail:
            raise self.fail[what]

    def containers(self) -> list[Container]:
        self._call("containers")
        return list(self.listed)

    def version(self) -> str:
        self._call("version")
        return "28.3.3"

    def ended(self, _name: str) -> tuple[int | None, str]:
        self._call("ended")
        return 137, "Killed"

    def pids(self, _name: str) -> list[int]:
        self._call("pids")
        return [os.getpid()]

    def remove(self, name: str) -> bool:
        self._call("remove")
        self.removed.append(name)
        return True

    def reset(self) -> None:
        self._call("reset")


# Held to the interfaces: a method missing or of another shape fails mypy here, not in a test's run.
_backend: Backend = FakeBackend()
