"""Deadlines learned from history (issue 23): a load's deadline and stall limit from the good loads of its key.

A load's key is what makes one load like another: the image each member runs (by ID), the NVIDIA driver, the
nodes, the model and the serve spec (``key``). Each load that this daemon saw launched and that reached SERVING
is kept for its key in the deployment's state directory (``loads.json``, the last ``KEEP`` per key, the
``KEYS`` most recent keys): how long it was LOADING (what LoadTimeout measures) and its longest silence (no
load progress: what LoadStalled measures). A failed load, or one found under way (adopted, paused), is never
kept.

``limits`` (pure) gives the next load its deadline and stall limit. With ``learn_after`` good loads of its key,
and the last good load of the same key, they are max(floor, p95 x margin) -- never above the configured
``deadline`` and ``stall_timeout``, which stay the cold budget. A first load after a change of its key (a new
image, driver, node set, model or spec), with too little history, or after a load that missed a learned limit
gets the cold budget, and says why ("cold start expected: image changed since the last load").

``LoadClock`` follows the reconciler's phases: it sets Status.load_limits as a load enters LOADING (the planner
reads them there), and records the load once it reaches SERVING."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

from ..base.log import Log
from ..config.identity import named, node_container_name
from ..config.schema import Readiness
from ..config.view import DeploymentView
from ..model import Kind, LoadLimits, Observation, Phase, Status
from ..state import names, statefile

FILE = names.LOADS
KEEP = 20  # loads kept per key
KEYS = 10  # keys kept (the most recently loaded)
COLD = "configured cold budget"
# What a key is made of, in the order a change is named ("serve" only when nothing else explains it).
PARTS = {"images": "image", "driver": "driver", "nodes": "nodes", "model": "model"}


def key(view: DeploymentView, obs: Observation, full: Observation | None, pinned: dict[str, str]
        ) -> tuple[str, dict[str, object]]:
    """The load's key: its hash and its parts. The image each member's container runs by ID (else the one
    pinned for it, else the tag), the drivers the last full observation read (``full``), the nodes, the model
    and the serve spec."""
    dep = view.dep
    images = []
    for n in view.members:
        node = obs.nodes.get(n.name)
        c = named(node.containers, node_container_name(dep, n)) if node else None
        images.append(c.image_id if c is not None and c.image_id else pinned.get(n.name) or dep.ray.image)
    drivers = {g.driver for n in view.members if full is not None and (o := full.nodes.get(n.name)) is not None
               and (g := o.gpu) is not None and g.driver}
    parts: dict[str, object] = {"images": sorted(set(images)), "driver": sorted(drivers),
                                "nodes": sorted(n.name for n in view.members), "model": dep.serve.model,
                                "serve": view.serve_hash}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16], parts


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (of few values: the largest but the rare outlier)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _seconds(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < 1e7 else None


def _good(x: object) -> tuple[float, float] | None:
    """A kept load's (seconds LOADING, longest silence); None when malformed."""
    load, gap = (_seconds(x.get("load_s")), _seconds(x.get("gap_s"))) if isinstance(x, dict) else (None, None)
    return (load, gap) if load is not None and gap is not None else None


def _loads(doc: dict[str, Any], k: str) -> list[dict[str, Any]]:
    """The well-formed loads kept for key ``k``, as written."""
    keys = doc.get("keys")
    entry = keys.get(k) if isinstance(keys, dict) else None
    loads = entry.get("loads") if isinstance(entry, dict) else None
    return [x for x in loads if _good(x) is not None][-KEEP:] if isinstance(loads, list) else []


def history(doc: dict[str, Any], k: str) -> list[tuple[float, float]]:
    """The good loads kept for key ``k``: (seconds LOADING, longest silence). Anything malformed is left out."""
    return [g for x in _loads(doc, k) if (g := _good(x)) is not None]


def changed(before: object, parts: dict[str, object]) -> str:
    """What differs between the last good load's key parts and these, in words ("image", "image and driver")."""
    if not isinstance(before, dict):
        return "the key"
    names = [word for part, word in PARTS.items() if before.get(part) != parts[part]]
    if not names:
        names = ["serve spec"] if before.get("serve") != parts["serve"] else ["the key"]
    return " and ".join(names)


def limits(r: Readiness, doc: dict[str, Any], k: str, parts: dict[str, object], missed: str = "") -> LoadLimits:
    """The deadline and stall limit of a load of key ``k`` (``parts``), from the history ``doc`` (loads.json).
    ``missed``: the learned limit the last load of this daemon missed ("": none)."""
    def cold(why: str = COLD, said: str = "") -> LoadLimits:
        return LoadLimits(r.deadline, r.stall_timeout, why, why, said)
    if not r.learn_deadlines:
        return cold("configured (learn_deadlines = false)")
    kept, last = doc.get("keys"), doc.get("last")
    keys: dict[str, Any] = kept if isinstance(kept, dict) else {}
    last = last if isinstance(last, str) else ""
    if missed:
        return cold(said=f"cold start expected: the last load missed its learned {missed}")
    if not last:
        return cold(said="cold start expected: no good load recorded yet")
    if last != k:
        entry = keys.get(last)
        before = entry.get("key") if isinstance(entry, dict) else None
        return cold(said=f"cold start expected: {changed(before, parts)} changed since the last load")
    loads = history(doc, k)
    n = len(loads)
    if n < r.learn_after:
        return cold(f"{COLD}: {n} of {r.learn_after} good loads recorded for this key")
    margin = r.deadline_margin
    deadline, d_why = _learned(p95([x for x, _ in loads]), margin, r.deadline_floor, "deadline_floor", r.deadline, n)
    stall, s_why = _learned(p95([g for _, g in loads]), margin, r.stall_floor, "stall_floor", r.stall_timeout, n)
    return LoadLimits(deadline, stall, d_why, s_why, learned=True)


def _learned(p: float, margin: float, floor: float, floor_name: str, budget: float, n: int) -> tuple[float, str]:
    """One learned limit and why: max(floor, p95 x margin), never above the configured cold budget."""
    of = f"p95 {p:.0f}s x {margin:g} of {n} good loads"
    value = max(floor, p * margin)
    if value >= budget:
        return budget, f"{COLD} (learned {of} is not below it)"
    if p * margin < floor:
        return value, f"learned: {floor_name} {floor:.0f}s ({of} is below it)"
    return value, f"learned: {of}"


def record(state_dir: str, k: str, parts: dict[str, object], load_s: float, gap_s: float, wall: float) -> None:
    """One good load kept for its key (the last KEEP; the KEYS most recently loaded keys), and its key made the
    last. A damaged file is started afresh. Raises OSError when it cannot be written."""
    doc = statefile.read_json(state_dir, FILE)
    kept = doc.get("keys")
    keys = {h: e for h, e in kept.items() if isinstance(e, dict)} if isinstance(kept, dict) else {}
    at = statefile.iso(wall)
    keys[k] = {"key": parts, "at": at, "loads": [*_loads(doc, k), {"load_s": round(load_s, 1),
                                                                  "gap_s": round(gap_s, 1), "at": at}][-KEEP:]}
    newest = sorted(keys, key=lambda h: str(keys[h].get("at", "")), reverse=True)[:KEYS]
    statefile.write_json(state_dir, FILE, {"last": k, "keys": {h: keys[h] for h in newest}})


class LoadClock:
    """One deployment's loads as they happen: the limits each runs under (Status.load_limits, set as it enters
    LOADING), its duration and longest silence, kept (``record``) once it reaches SERVING."""

    def __init__(self, log: Log, wall: Callable[[], float] = time.time):
        self.log, self.wall = log, wall
        self._phase = Phase.DETECTING  # the phase at the last note
        self._since = -1.0  # Status.since of the LOADING spell it follows (-1: none)
        self._launched = False  # the spell began with the serve's launch (else found under way: not timed)
        self._serve = ""  # the serve instance loading
        self._key: tuple[str, dict[str, object]] = ("", {})
        self._progress_at = 0.0  # Status.load_progress_at as last seen
        self._gap = 0.0  # the longest silence of the load so far
        self._done: tuple[str, float, float] | None = None  # (serve, seconds LOADING, longest silence): until SERVING
        self._missed = ""  # the learned limit the last load missed: the next one gets the cold budget

    def note(self, st: Status, obs: Observation, full: Observation | None, view: DeploymentView, now: float) -> None:
        """After a tick (its phase decided): a load entered, followed, left or made good."""
        serve = obs.serve.identity if obs.serve is not None and obs.serve.present else ""
        was, self._phase = self._phase, st.phase
        if st.phase == Phase.LOADING:
            if st.since != self._since:
                self._enter(st, obs, full, view, serve, was)
            self._watch(st, now)
            return
        if self._since >= 0:
            self._left(st, serve, now)
        if st.phase == Phase.SERVING and self._done is not None and self._done[0] == serve:
            self._record(view, *self._done[1:])
        if st.phase != Phase.VERIFYING:
            self._done = None

    def _enter(self, st: Status, obs: Observation, full: Observation | None, view: DeploymentView, serve: str,
               was: Phase) -> None:
        self._since, self._serve, self._launched = st.since, serve, was == Phase.STARTING_VLLM
        self._progress_at, self._gap, self._done = st.load_progress_at, 0.0, None
        self._key = k, parts = key(view, obs, full, st.pinned)
        st.load_limits = lim = limits(view.dep.readiness, statefile.read_json(view.state_dir, FILE), k, parts,
                                      self._missed)
        self.log.info("load.limits", deadline_s=round(lim.deadline), deadline=lim.deadline_why,
                      stall_s=round(lim.stall), stall=lim.stall_why, cold=lim.cold or None, key=k)

    def _watch(self, st: Status, now: float) -> None:
        at = st.load_progress_at
        if at != self._progress_at:
            if self._progress_at:
                self._gap = max(self._gap, at - self._progress_at)
            self._progress_at = at
        if at:
            self._gap = max(self._gap, now - at)

    def _left(self, st: Status, serve: str, now: float) -> None:
        """The spell of LOADING ended this tick: on to VERIFYING (timed, if launched here), or not."""
        if st.phase in (Phase.VERIFYING, Phase.SERVING) and self._launched and serve == self._serve:
            self._watch(st, now)
            self._done = (serve, st.since - self._since, self._gap)
        lim = st.load_limits
        why = str(st.why)  # the fault itself, or a repair put off or refused that names it
        if lim is not None and lim.learned and (Kind.LOAD_TIMEOUT in why or Kind.LOAD_STALLED in why):
            self._missed = "deadline" if Kind.LOAD_TIMEOUT in why else "stall limit"
        self._since = -1.0

    def _record(self, view: DeploymentView, load_s: float, gap_s: float) -> None:
        k, parts = self._key
        self._done, self._missed = None, ""
        try:
            record(view.state_dir, k, parts, load_s, gap_s, self.wall())
        except OSError as e:
            self.log.error("state.write_failed", file=FILE, error=str(e))
            return
        self.log.info("load.recorded", load_s=round(load_s, 1), longest_silence_s=round(gap_s, 1), key=k)
