"""The test doubles of the package's interfaces, in one place and held to them by mypy (the assignments at
the end): a fake Backend (scripted observations, recorded actions), the fake clock and the recording
notifier, a Docker engine as the observer calls it (and as the actor does), a node's shell, a recording
log, the world of adapters built on them, and the daemon built on the fake Backend."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import tomli_w

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.shell import Result
from spark_supervisor.base.log import Log
from spark_supervisor.change import proof
from spark_supervisor.config import Config
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    Action,
    CheckImage,
    Container,
    ContainerSpec,
    ImageReport,
    Observation,
    Outcome,
    Reason,
    Verdict,
    Verify,
)
from spark_supervisor.report.notify import Notifier
from spark_supervisor.specs import commands
from spark_supervisor.world.act import ActionFailed
from spark_supervisor.world.backend import Backend, Fingerprint
from spark_supervisor.world.observe import NodeAdapters, World
from tests.helpers import cfg, data, images, sole, view_of


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
        self.steady: Observation | None = None  # what a steady sweep sees, when told (else ``next``)
        self.asked: list[bool] = []  # each observation's ``full``
        self.ran: list[Action] = []
        self.fail: dict[type, ActionFailed] = {}
        self.reports: dict[str, ImageReport] = {}  # what CheckImage finds, per node
        self.closed = False
        self.refusal: Reason | None = None  # what a proof of this backend's spec finds (None: proven)
        self.proofs = 0
        self.pinned: dict[str, str] = {}  # what pin() was last told

    def observe(self, full: bool) -> Observation:
        assert self.next is not None
        self.asked.append(full)
        return self.next if full or self.steady is None else self.steady

    def run(self, action: Action) -> Outcome:
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


def prove_inline(key: tuple[str, ...], views: dict[str, DeploymentView],
                 backend_factory: Callable[[DeploymentView], Backend], log: Log) -> proof.Proving:
    """The daemon's proofs run at once, on the caller's thread (the fakes answer at once: the unit tests' clock
    decides); the daemon itself runs them on a thread of their own (change.proof.start)."""
    result: Future[dict[str, Reason]] = Future()
    result.set_result(proof.refusals(views, backend_factory, log))
    return proof.Proving(key, sorted(views), result)


def make(tmp_path: Path, d: dict[str, Any] | None = None) -> tuple[Daemon, FakeBackend, Clock, Notes, Path]:
    d = d or data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(d))
    backend, clock, notes = FakeBackend(), Clock(), Notes()
    daemon = Daemon(str(path), cfg(d), log=structlog.get_logger(), backend_factory=lambda _: backend,
                    notifier=notes, clock=clock, wall=lambda: 1.7e9 + clock.t, rng=lambda: 1.0,
                    prove=prove_inline)
    backend.reports = sole(daemon).status.images = images(daemon.cfg)  # checked and fit (the check: test_image_*)
    return daemon, backend, clock, notes, path


class FakeEngine:
    """A node's Docker engine as the observer calls it; `fail` makes a call raise what the real one would
    (an error: every time; a list of errors: one per call, then the call goes through)."""

    def __init__(self, containers: list[Container],
                 fail: dict[str, AdapterError | list[AdapterError]] | None = None) -> None:
        self.listed, self.fail, self.connected = containers, fail or {}, True
        self.calls: list[str] = []
        self.removed: list[str] = []
        self.trusted: list[bool] = []  # each listing: whether a kept one would have done (a steady sweep's)

    def _call(self, what: str) -> None:
        self.calls.append(what)
        err = self.fail.get(what)
        if isinstance(err, list):
            if err:
                raise err.pop(0)
        elif err is not None:
            raise err

    def containers(self, trusted: bool = False) -> list[Container]:
        self.trusted.append(trusted)  # nothing kept here: always listed
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

    # What `nvidia-smi -L` prints inside a container (the observer's ray.nvidia_smi); NVML_LOST: the GPU lost there.
    GPU_LIST = "GPU 0: NVIDIA GB10 (UUID: GPU-5a7f3c2e-9b41-4d6e-8c0f-1e2d3c4b5a69)\n"

    def exec(self, container: str, argv: list[str], *, env: dict[str, str] | None = None,  # noqa: ARG002
             detach: bool = False, what: str = "exec") -> tuple[int, str]:  # noqa: ARG002  (the engine's signature)
        self._call("exec")
        return 0, self.GPU_LIST

    def remove(self, name: str) -> bool:
        self._call("remove")
        self.removed.append(name)
        return True

    def reset(self) -> None:
        self._call("reset")

    def close(self) -> None:
        self.reset()


@dataclass(frozen=True)
class Exec:
    """One `docker exec` as the actor asked for it."""

    container: str
    argv: list[str]
    env: dict[str, str] | None
    detach: bool
    what: str


class ActorEngine(FakeEngine):
    """A node's engine as the actor calls it too: what it starts, runs to an end, execs and pulls is recorded
    (in ``journal`` as well, shared between nodes to see their order, as "node call"). ``images``: what the
    node has (None: every image); ``once``: what a short-lived helper container answers."""

    def __init__(self, node: str, containers: list[Container] | None = None,
                 fail: dict[str, AdapterError | list[AdapterError]] | None = None,
                 journal: list[str] | None = None) -> None:
        super().__init__(list(containers or []), fail)
        self.node = node
        self.journal = journal if journal is not None else []
        self.images: set[str] | None = None
        self.once: tuple[int, str] = (0, "")
        self.started: list[ContainerSpec] = []
        self.ran_once: list[ContainerSpec] = []
        self.once_timeouts: list[float | None] = []  # each run_once's own timeout (None: the engine's)
        self.timeout = 45.0  # the engine's call deadline (DockerEngine.timeout)
        self.execs: list[Exec] = []
        self.pulled: list[str] = []

    def _call(self, what: str) -> None:
        self.journal.append(f"{self.node} {what}")
        super()._call(what)

    def remove(self, name: str) -> bool:
        self._call("remove")
        self.removed.append(name)
        return any(c.name == name for c in self.listed)

    def has_image(self, image: str) -> bool:
        self._call("has_image")
        return self.images is None or image in self.images

    def image_id(self, image: str) -> str:
        self._call("image_id")
        return "sha256:" + "f" * 64 if self.images is None or image in self.images else ""

    def image_ref(self, image: str) -> tuple[str, tuple[str, ...]]:
        self._call("image_ref")
        found = self.images is None or image in self.images
        return ("sha256:" + "f" * 64, (f"{image.rpartition(':')[0]}@sha256:{'e' * 64}",)) if found else ("", ())

    def root_dir(self) -> str:
        self._call("root_dir")
        return "/var/lib/docker"

    def pull(self, image: str, *, timeout: float, heartbeat: Any = None, progress: Any = None) -> None:  # noqa: ARG002 (the engine's signature)
        self._call("pull")
        self.pulled.append(image)
        if self.images is not None:
            self.images.add(image)

    def run(self, spec: ContainerSpec) -> str:
        self._call("run")
        self.started.append(spec)
        return "c0ffee000000"

    def run_once(self, spec: ContainerSpec, *, timeout: float | None = None) -> tuple[int, str]:
        self._call("run_once")
        self.ran_once.append(spec)
        self.once_timeouts.append(timeout)
        return self.once

    def exec(self, container: str, argv: list[str], *, env: dict[str, str] | None = None,
             detach: bool = False, what: str = "exec") -> tuple[int, str]:
        self._call("exec")
        self.execs.append(Exec(container, list(argv), env, detach, what))
        if argv[2:3] == [commands.SERVE_STATE]:  # as the wrapper records a launch: its serve, running
            launched = any(e.container == container and e.argv[2:3] == [commands.SERVE_WRAPPER] for e in self.execs)
            return 0, "serve-state 42 spec 2026-12-07T10:00:00Z 1\n" if launched else "serve-state 0\n"
        return 0, self.GPU_LIST if argv[-1:] == ["-L"] else ""


class FakeShell:
    """A node's shell (adapters.shell.NodeShell) with every argv recorded. Each is answered by the first of
    ``answers`` whose argv it starts with (a Result, or an error raised as the real shell would), else by
    exit 0 and no output."""

    def __init__(self, answers: list[tuple[list[str], Result | AdapterError]] | None = None) -> None:
        self.answers = list(answers or [])
        self.ran: list[list[str]] = []
        self.unreachable: AdapterError | None = None  # what check() and reachable() raise

    def run(self, argv: list[str], timeout: float | None = None) -> Result:  # noqa: ARG002 (NodeShell's signature)
        self.ran.append(list(argv))
        for prefix, answer in self.answers:
            if argv[:len(prefix)] == prefix:
                if isinstance(answer, AdapterError):
                    raise answer
                return answer
        return Result(0, "", "")

    def check(self) -> None:
        if self.unreachable is not None:
            raise self.unreachable

    def reachable(self) -> None:
        self.check()


class Events:
    """A structlog logger's calls, recorded: (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for _, e, kw in self.lines if e == event]


def fake_world(c: Config, journal: list[str] | None = None) -> tuple[World, dict[str, ActorEngine], dict[str, FakeShell]]:
    """The real World of ``c`` (its config, view and HTTP clients) with every node's engine and shell faked.
    The caller closes it."""
    world = World(view_of(c))
    engines = {n.name: ActorEngine(n.name, journal=journal) for n in c.nodes}
    shells = {n.name: FakeShell() for n in c.nodes}
    for n in c.nodes:
        world.nodes[n.name] = NodeAdapters(n, shells[n.name], engines[n.name])  # type: ignore[arg-type]
    return world, engines, shells


# Held to the interfaces: a method missing or of another shape fails mypy here, not in a test's run.
_backend: Backend = FakeBackend()
