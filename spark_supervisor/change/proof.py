"""A change proven before it replaces what serves: prove, then switch.

A reload that changes what a serving deployment runs (its Ray or serve spec) would tear it down and only
then find out whether the new spec can start: a mistyped image tag or a model missing on one node turns a
working model into a dark cluster. So before the switch each such deployment's new spec is proven
(``Backend.prove``: spark_supervisor.world.prove) while the old one keeps serving. A proof that fails refuses the
whole reload: the previous config stays, nothing is stopped, and the reason is shown (``ChangeRefused: …``),
alerted and counted (loop.reload). A proof is I/O, so it runs on a thread of its own and the loop picks up
its verdict.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..base.log import Log
from ..config.view import DeploymentView
from ..model import Reason
from ..world.backend import Backend
from ..world.prove import REFUSED


@dataclasses.dataclass
class Proving:
    """The proofs of one reload. ``key`` names what is proven (the file read and the specs), so a reload of
    another file starts afresh; ``result`` is set once every proof ended: the refusals by deployment (empty: proven)."""

    key: tuple[str, ...]
    names: list[str]
    result: Future[dict[str, Reason]]
    seen: bool = False  # its verdict was acted on


Start = Callable[[tuple[str, ...], dict[str, DeploymentView], Callable[[DeploymentView], Backend], Any], Proving]


def refusals(views: dict[str, DeploymentView], backend_factory: Callable[[DeploymentView], Backend],
             log: Log) -> dict[str, Reason]:
    """Each deployment's new spec proven with a backend of its own (closed after): the refusals by deployment."""
    refused = {}
    for name, view in views.items():
        try:
            backend = backend_factory(view)
            try:
                why = backend.prove()
            finally:
                backend.close()
        except Exception as e:  # a proof that breaks proves nothing: the change waits for one that runs
            log.exception("change.proof_error", deployment=name)
            why = Reason(REFUSED, f"the proof could not run: {type(e).__name__}: {e}"[:300])
        if why is not None:
            refused[name] = why
    return refused


def start(key: tuple[str, ...], views: dict[str, DeploymentView], backend_factory: Callable[[DeploymentView], Backend],
          log: Log) -> Proving:
    """The proofs on a daemon thread: one stuck on an engine must not hold the daemon's exit."""
    result: Future[dict[str, Reason]] = Future()
    threading.Thread(target=lambda: result.set_result(refusals(views, backend_factory, log)), daemon=True,
                     name="prove").start()
    return Proving(key, sorted(views), result)
