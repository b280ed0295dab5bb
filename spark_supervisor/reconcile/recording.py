"""The record in the loop (spark_supervisor.report.record): made from what the reconciler already holds, with no
round trip of its own -- each member's host facts (Status.hosts), the last full observation's GPUs, the
node containers' image IDs, this start's image and model checks, the serve's log, the load's figures, the
performance verdict, the transports, and the decisions since the record before.

Each time a deployment reaches SERVING with a serve not recorded yet, its record is added to its history;
a performance verdict measured later is added to that record (a regression makes it not good). Each time it
goes FAILED or DEGRADED, the facts as they are then are compared with the last good record: what changed is
kept on the status (shown by `status`, sent with the alert) and the facts in ``record-bad.json``. A record
that cannot be written is logged, never a crash of the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..base.log import Log
from ..config.identity import node_container_name
from ..config.view import DeploymentView
from ..judge import loadrate, logscan
from ..model import ImageReport, Observation, Phase, Status
from ..report import statusdoc
from ..report.record import UNKNOWN, Decided, Sources, build, what_changed
from ..report.record.build import performance
from ..state import records, statefile
from ..world.act import kept_report

BAD = (Phase.FAILED, Phase.DEGRADED)
NOTES_KEPT = 50  # decisions noted between two records, at most


class Recordable(Protocol):
    """What the recorder reads of a deployment's reconciler (reconcile.reconciler.Reconciler)."""

    view: DeploymentView
    status: Status
    last_obs: Observation | None
    last_full: Observation | None
    wall: Callable[[], float]
    log: Log

    @property
    def repairs(self) -> statefile.RepairLog: ...


class Recorder:
    """One deployment's records; the decisions noted since its last record (page-cache drops, rollbacks: the
    repairs are read from the repair log)."""

    def __init__(self) -> None:
        self.notes: list[Decided] = []
        self._dropped: frozenset[str] = frozenset()  # Status.page_cache_dropped at the last tick
        self._serve = ""  # the serve of the newest record, while its performance verdict is still to come
        # What going bad reads of the history (``_brief``), as this recorder last read or wrote it, and the
        # (state directory, deployment) it is of: the file is read for it once, not on every FAILED or DEGRADED
        self._kept: tuple[tuple[str, str], records.History] | None = None

    def note(self, what: str, reason: str, at: float) -> None:
        self.notes = [*self.notes[-(NOTES_KEPT - 1):], Decided(at, what, reason)]

    def after_tick(self, r: Recordable) -> None:
        """After each tick: the page cache dropped on more nodes (with the tick's reason: why), and the
        performance verdict of the newest record's serve when it came in."""
        _guarded(r, self._after_tick)

    def _after_tick(self, r: Recordable) -> None:
        st = r.status
        dropped, self._dropped = st.page_cache_dropped - self._dropped, st.page_cache_dropped
        if dropped:
            self.note("page-cache drop", f"{', '.join(sorted(dropped))}: {st.reason}", r.wall())
        if self._serve and st.perf is not None and st.perf.serve == self._serve:
            self._serve = ""
            self.measured(r)

    def entered(self, r: Recordable) -> None:
        """The phase changed: a record at SERVING, what changed at FAILED or DEGRADED."""
        _guarded(r, self._entered)

    def _entered(self, r: Recordable) -> None:
        st = r.status
        st.changed = ""
        if st.phase == Phase.SERVING:
            self._served(r)
        elif st.phase in BAD:
            st.changed = self._went_bad(r)

    def measured(self, r: Recordable) -> None:
        """A performance verdict came in: the record of its serve gets it, if that record has none yet."""
        v, view = r.status.perf, r.view
        h = records.read(view.state_dir, view.name)
        rec = h.newest
        if v is None or rec is None or rec.get("serve_id") != v.serve:
            return
        kept = rec.get("results")
        results: dict[str, Any] = kept if isinstance(kept, dict) else {}
        said = results.get("performance")
        if isinstance(said, dict) and said.get("verdict") not in (None, "unknown"):
            return
        update = {"results": results | {"performance": performance(v)},
                  "good": bool(rec.get("good")) and not v.regression}

        def amend() -> None:  # a regression makes the record not good: the one before it is the good one then
            if records.amend(view.state_dir, view.name, v.serve, update, r.wall()):
                self._keep(view, records.History([*h.records[:-1], {**rec, **update}][-records.KEEP:]))
        self._try(r, "amend", amend)

    def _served(self, r: Recordable) -> None:
        view = r.view
        h = self._keep(view, records.read(view.state_dir, view.name))
        src = self.sources(r, h)
        rec = build(src)
        self._serve = src.serve_id if rec["results"]["performance"]["verdict"] == UNKNOWN else ""
        if h.newest is not None and src.serve_id and h.newest.get("serve_id") == src.serve_id:
            return  # the same serve again (DEGRADED and back, a daemon restarted beside it): recorded already
        if self._try(r, "append", lambda: self._keep(view, records.append(view.state_dir, rec, src.at))):
            self.notes = []
            r.log.info("record.written", serve=src.serve_id, problems=h.problems or None)

    def _went_bad(self, r: Recordable) -> str:
        view, st = r.view, r.status
        h = self._history(view)
        src = self.sources(r, h)
        good = h.good()  # a serve's own record when it is still good (DEGRADED on the fabric since), else the one
        rec = build(src)  # before it (a throughput regression made its own not good)
        rec["changed"] = changed = what_changed(good[0] if good else None, rec)
        self._try(r, "write bad", lambda: records.write_bad(view.state_dir, rec))
        if changed:
            r.log.warning("record.changed", phase=st.phase.value, changed=changed)
        return changed

    def _keep(self, view: DeploymentView, h: records.History) -> records.History:
        """``h``, the history as just read or written: what going bad reads of it kept (``_brief``)."""
        self._kept = (view.state_dir, view.name), _brief(h)
        return h

    def _history(self, view: DeploymentView) -> records.History:
        """What going bad reads of the history: as kept, read from the file only when nothing is kept of it."""
        of = (view.state_dir, view.name)
        if self._kept is None or self._kept[0] != of:
            self._kept = of, _brief(records.read(*of))
        return self._kept[1]

    def sources(self, r: Recordable, h: records.History) -> Sources:
        """What the record is made of, from what the reconciler holds; the decisions since ``h``'s newest."""
        st, view, obs, full = r.status, r.view, r.last_obs, r.last_full
        serve = obs.serve if obs is not None and obs.serve is not None and obs.serve.present else None
        serve_id = serve.identity if serve is not None else ""
        since = float((h.newest or {}).get("wall") or 0.0)
        repairs = [Decided(float(e["at"]), f"repair {e.get('kind', '')}".strip(), str(e.get("reason", "")))
                   for e in r.repairs.entries if float(e["at"]) > since]
        return Sources(
            view, r.wall(), st.phase.value, reason=st.reason if st.phase in BAD else "", serve_id=serve_id,
            hosts=dict(st.hosts), gpus={n: o.gpu for n, o in (full.nodes.items() if full else ()) if o.gpu},
            running=(ids := running(view, obs)), images=checks(view, st, ids), bringup=statusdoc.bringup(st),
            steps=tuple(logscan.timeline(serve.log_tail)) if serve is not None else (),
            load_read=loadrate.loaded(serve.log_tail) if serve is not None else None,
            disk_gb_s=disk_rate(st, view.serve_node.name),
            kv_tokens=st.kv_cache.tokens if st.kv_cache is not None and st.kv_cache.serve == serve_id else 0,
            perf=st.perf, transports=st.transports if st.transports_of == serve_id else (),
            decisions=tuple(repairs + [d for d in self.notes if d.at > since]))

    def _try(self, r: Recordable, what: str, write: Callable[[], object]) -> bool:
        try:
            write()
            return True
        except (OSError, ValueError) as e:  # the record is lost, not the loop
            r.log.error("record.write_failed", what=what, error=str(e)[:300])
            self._kept = None  # a write that failed may have left the history otherwise (set aside): read it again
            return False


def _brief(h: records.History) -> records.History:
    """What going bad reads of a history: its newest good record (compared with) and its newest (the decisions
    are those since it); one record when they are one."""
    newest, good = h.newest, h.good()[:1]
    return records.History([*(g for g in good if g is not newest), *([newest] if newest is not None else [])])


def _guarded(r: Recordable, step: Callable[[Recordable], None]) -> None:
    """A bug in the record must not end the tick it is part of (nor keep its alert from going out)."""
    try:
        step(r)
    except Exception as e:  # logged with its traceback; the loop goes on without this record
        r.log.exception("record.crashed", error=f"{type(e).__name__}: {e}"[:300])


def checks(view: DeploymentView, st: Status, ids: dict[str, str]) -> dict[str, ImageReport]:
    """This start's image checks; for a member not checked in this run (a deployment adopted after the daemon
    restarted) the check kept of the very image its container runs (images.json, by image ID), if any."""
    found = dict(st.images)
    missing = [n for n in ids if n not in found]
    kept = statefile.read_json(view.state_dir, statefile.NODES) if missing else {}
    for node in missing:
        entry = kept.get(node)
        if isinstance(entry, dict) and entry.get("image_id") == ids[node]:
            if (r := kept_report(entry.get("report"), ids[node])) is not None:
                found[node] = r
    return found


def running(view: DeploymentView, obs: Observation | None) -> dict[str, str]:
    """node -> the image ID its node container runs, as listed (none where it is not listed)."""
    if obs is None:
        return {}
    dep = view.dep
    return {n.name: c.image_id for n in view.members if n.name in obs.nodes and not obs.nodes[n.name].error
            for c in obs.nodes[n.name].containers
            if c.name == node_container_name(dep, n) and c.image_id and c.running}


def disk_rate(st: Status, node: str) -> float | None:
    """The disk's sequential read rate under the model on ``node``, as its model check measured it (kept with the
    check, so measured once per node and model key)."""
    r = st.images.get(node)
    return r.model.disk_gb_s if r is not None and r.model is not None else None
