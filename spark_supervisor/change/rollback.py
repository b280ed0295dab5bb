"""The way back from a change that failed once switched to: the last spec that served, per deployment; and
the images a serving deployment's repairs start, by ID.

A change is proven before the switch (change.proof), but a proof cannot see everything: a model that loads and
then kills the engine on its first request, a start that misses its deadline. So when a reload replaces a
serving deployment, the spec it ran is kept, and the new one is on probation until it reaches SERVING. If it
fails first -- FAILED, or a failed attempt at its start or verification -- the deployment is put back on
the spec it ran and the image IDs it ran (its compile cache is still warm), `RolledBack: <the new spec's failure>` is shown until the
next reload, alerted and logged; the operator's file is left as it is, and a later reload tries it again.
``[changes] rollback = false`` turns it off (the failed spec then stays, as any other failure).

A failure rolls back only when it says the new spec cannot serve (CANNOT_SERVE): FAILED (a deterministic
failure, or the repair budget spent), a missed load deadline or stall, a failed verification -- or, of transient
failures (a Docker timeout, say), the repair budget's worth in a row. One transient failure is retried on the new
spec: it costs nothing, where a rollback costs two loads and drops the operator's change.

Both the pins and the way back are kept in the deployment's state directory (KEPT) and restored when the daemon
starts again (a watchdog restart, `systemctl restart`, the head's reboot): a repair after a restart starts the
images that served, and a change that fails after it is still rolled back. Each is restored only for the spec it
was kept for (a config changed while the daemon was down starts from its tags, with no way back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..base.log import Log
from ..config import Config, ConfigError, parse
from ..config.identity import node_container_name
from ..config.view import DeploymentView
from ..model import Kind, Phase, Reason
from ..reconcile.reconciler import Reconciler
from ..report.alerts import Alerter
from ..state import names, statefile
from ..world.backend import Backend

KEPT = names.CHANGES  # in the deployment's state directory
# Reasons that say a spec cannot serve: a rollback's cause at once (else FAILED, or the budget's worth of failures).
CANNOT_SERVE = frozenset({Kind.LOAD_TIMEOUT, Kind.LOAD_STALLED, Kind.SANITY_FAILED, Kind.SERVE_WEDGED})

Held = tuple[DeploymentView, dict[str, str], float]  # the way back: the view that served, its image IDs, since


def spec_hashes(view: DeploymentView) -> tuple[str, str]:
    """What a deployment runs: its Ray and serve spec hashes (a change of either replaces it)."""
    return view.ray_hash, view.serve_hash


def pin_what_serves(r: Reconciler) -> None:
    """Serving: the image ID each member's container runs is what its repairs start from now on (Status.pinned),
    not whatever its tag names by then: a tag re-pulled underneath is picked up by a reload, never by a repair."""
    obs, dep = r.last_obs, r.view.dep
    if obs is None:
        return
    ids = {n.name: c.image_id for n in r.view.members if n.name in obs.nodes
           for c in obs.nodes[n.name].containers if c.name == node_container_name(dep, n) and c.image_id}
    if ids and ids != r.status.pinned:
        r.status.pinned = ids
        r.backend.pin(ids)
        r.log.info("image.pinned", image=dep.ray.image, ids=ids)


def cannot_serve(r: Reconciler) -> bool:
    """Whether the spec on probation has shown it cannot serve (the module's docstring)."""
    st = r.status
    return (st.phase == Phase.FAILED or st.why.kind in CANNOT_SERVE
            or st.failures >= max(1, r.view.cfg.healing.repair_budget))


class Rollbacks:
    def __init__(self, log: Log) -> None:
        self.log = log
        # deployment -> what its KEPT document last written held: its spec, its pins, its probation entry
        self.kept: dict[str, tuple[tuple[str, str], dict[str, str], Held | None]] = {}
        # deployment -> the view it ran before the switch, the image IDs it ran (Status.pinned), and when its
        # phase then began (SERVING counts as the change made good only once entered after the switch)
        self.probation: dict[str, tuple[DeploymentView, dict[str, str], float]] = {}
        self.notes: list[Reason] = []  # the rollbacks since the last reload applied: shown with the reload

    def switched(self, name: str, before: Reconciler, after: DeploymentView) -> None:
        """A reload is about to replace what ``before`` runs with ``after``: keep the view it runs if it has
        served (the way back) -- serving now, or pinned by serving and in a repair at the switch (a proof can
        outlast the serve it began beside) -- unless the new config turns rollbacks off."""
        self.probation.pop(name, None)
        served = before.status.phase in (Phase.SERVING, Phase.DEGRADED) or bool(before.status.pinned)
        if after.cfg.changes.rollback and served:
            self.probation[name] = (before.view, dict(before.status.pinned), before.status.since_wall)
            self.log.info("change.switched", deployment=name, way_back="the spec that served")

    def due(self, name: str, r: Reconciler) -> tuple[DeploymentView, dict[str, str], Reason] | None:
        """After a tick of ``r``: the view to go back to, the images it ran and why, when the spec on probation
        failed first."""
        held = self.probation.get(name)
        if held is None:
            return None
        back, pinned, switched_in = held
        st = r.status
        if st.phase == Phase.SERVING and st.since_wall != switched_in:
            self.probation.pop(name)  # the change made it: this spec is the way back from now on
            self.log.info("change.proven_by_serving", deployment=name)
            return None
        if not cannot_serve(r):
            return None
        self.probation.pop(name)
        why = Reason(Kind.ROLLED_BACK, f"{name}: {st.reason or st.phase.value}"[:600])
        self.notes.append(why)
        self.log.error("change.rolled_back", deployment=name, reason=str(why))
        return back, pinned, why

    def roll_back_if_due(self, name: str, r: Reconciler, backend_factory: Callable[[DeploymentView], Backend],
                         alerter: Alerter) -> None:
        """After a tick of ``r``: back to the spec that served, when the one switched to failed first."""
        back = self.due(name, r)
        if back is None:
            return
        view, pinned, why = back
        backend = backend_factory(view)
        backend.pin(pinned)  # the way back is the very images that served, not what their tags name now
        r.status.pinned = pinned
        r.reconfigure(view, backend, "rollback")
        r.recorder.note("rollback", str(why), r.wall())
        alerter.emit(name, "rolled_back", phase=r.status.phase.value, reason=str(why), reason_kind=why.kind)

    # ------------------------------------------------------------------ kept across a restart (KEPT)
    def keep(self, name: str, r: Reconciler) -> None:
        """Its pins and way back written to its state directory when they changed. Asked after every tick, so
        the document (the way back's whole config among it) is made only when what it holds is not what was
        last written: the same spec, the same pins, the same probation entry (by identity)."""
        held = self.probation.get(name)
        spec, pinned = spec_hashes(r.view), dict(r.status.pinned)
        last = self.kept.get(name)
        if last is not None and last[0] == spec and last[1] == pinned and last[2] is held:
            return
        doc = {"spec": list(spec), "pinned": pinned,
               "way_back": None if held is None else {"config": held[0].cfg.model_dump(mode="json", exclude_defaults=True),
                                                      "pinned": held[1], "since": held[2]}}
        try:
            statefile.atomic_write(Path(r.view.state_dir) / KEPT, json.dumps(doc, sort_keys=True), 0o600)
            self.kept[name] = (spec, pinned, held)
        except OSError as e:
            r.log.error("state.write_failed", file=KEPT, error=str(e))

    def restore(self, name: str, r: Reconciler, whole: Config) -> None:
        """At start: the pins and way back kept for the spec it runs now (none for another: its tags)."""
        path = Path(r.view.state_dir) / KEPT
        try:
            doc = json.loads(statefile.read_state(path))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            r.log.warning("changes.unreadable", file=str(path), error=f"{type(e).__name__}: {e}"[:300])
            return
        if not isinstance(doc, dict) or doc.get("spec") != list(spec_hashes(r.view)):
            r.log.info("changes.not_restored", why="kept for another spec (the config changed while stopped)")
            return
        pinned = _ids(doc.get("pinned"))
        if pinned:
            r.status.pinned = pinned
            r.backend.pin(pinned)
            r.log.info("image.pins_restored", ids=pinned)
        back = doc.get("way_back")
        if isinstance(back, dict):
            view = _view(back.get("config"), whole, str(path))
            since = back.get("since")
            if view is None or not isinstance(since, int | float):
                r.log.warning("changes.way_back_unreadable", file=str(path))
            else:
                self.probation[name] = (view, _ids(back.get("pinned")), float(since))
                r.log.info("change.way_back_restored", deployment=name)


def forget_kept(state_dir: str) -> str:
    """A deployment torn down by the operator: its pins and way back forgotten (KEPT removed); why not, or ""."""
    try:
        (Path(state_dir) / KEPT).unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        return f"cannot remove {Path(state_dir) / KEPT}: {e.strerror or e} (its pinned images stay)"
    return ""


def _ids(raw: object) -> dict[str, str]:
    """node -> image ID, from a kept document (anything else: none)."""
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str) and v}


def _view(raw: object, whole: Config, source: str) -> DeploymentView | None:
    """The view a kept section ran on (its own nodes and state directory), owned beside the whole config's
    deployments; None when it no longer validates."""
    if not isinstance(raw, dict):
        return None
    try:
        cfg = parse(raw, source)
    except ConfigError:
        return None
    cfg._owners = whole.owners | {cfg.deployment.name}
    return DeploymentView.of(cfg, cfg.deployment)
