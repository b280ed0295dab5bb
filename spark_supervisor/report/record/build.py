"""A deployment's record: what ran and how it went, made each time it reaches SERVING (and, for "what changed",
when it goes FAILED or DEGRADED). Pure: the loop (reconcile.recording) gathers what it already holds into
``Sources``; ``build`` turns it into one JSON object.

Every fact is a value, ``UNKNOWN`` when it was not read, or ``NONE`` when it was read and is positively not
there (no /etc/dgx-release, no RDMA device, an image with no repo digest): unknown is not absent. The serve's
environment is kept by name only, but for the fabric's own variables (``RAY_*``, ``NCCL_*``, ``VLLM_HOST_IP``),
whose values go through redaction; and every string of the record is redacted again against the
deployment's secrets on the way out, so that no secret reaches a record, a diff or a report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...base import redaction
from ...config import Node
from ...config.view import DeploymentView
from ...judge import fabric, loadrate
from ...judge.loadrate import LoadRead
from ...judge.logscan import Step
from ...model import Gpu, HostFacts, ImageReport, ModelReport, PerfVerdict, Transport
from ...model.host import NONE
from ...specs import commands
from ...state.records import SCHEMA
from ...state.statefile import iso

UNKNOWN = "unknown"
SERVING = "SERVING"  # the verdict of a record made when the deployment reached SERVING
MAX_DECISIONS = 20  # the decisions a record names (the newest): a record stays small
_FABRIC_ENV = ("RAY_", "NCCL_")  # the variables whose values a record keeps (redacted), beside VLLM_HOST_IP


@dataclass(frozen=True)
class Decided:
    """A decision the daemon took between two records: a repair, a page-cache drop, a rollback."""

    at: float  # wall clock
    what: str  # "repair serve", "repair gang", "page-cache drop", "rollback"
    reason: str


@dataclass(frozen=True)
class Sources:
    """What a record is made of: what the loop holds when the deployment reaches SERVING (or goes bad)."""

    view: DeploymentView
    at: float  # wall clock
    verdict: str  # the phase it was made in: SERVING, FAILED or DEGRADED
    reason: str = ""  # a bad verdict's reason
    serve_id: str = ""  # the serve instance it is of (ServeObservation.identity; "" none)
    hosts: Mapping[str, HostFacts] = field(default_factory=dict)  # Status.hosts
    gpus: Mapping[str, Gpu] = field(default_factory=dict)  # the last full observation's
    running: Mapping[str, str] = field(default_factory=dict)  # node -> the image ID its node container runs
    images: Mapping[str, ImageReport] = field(default_factory=dict)  # Status.images: this start's checks
    bringup: Mapping[str, float] = field(default_factory=dict)  # statusdoc.bringup: phase -> seconds
    steps: tuple[Step, ...] = ()  # logscan.timeline of the serve's log
    kv_tokens: int = 0  # 0: not read
    perf: PerfVerdict | None = None
    transports: tuple[Transport, ...] = ()
    decisions: tuple[Decided, ...] = ()
    load_read: LoadRead | None = None  # judge.loadrate.loaded of the serve's log (rank 0's own weights)
    disk_gb_s: float | None = None  # the serve node's disk, read sequentially (None: not measured)


def build(src: Sources) -> dict[str, Any]:
    """The record of ``src``, as JSON values, redacted."""
    view = src.view
    perf = src.perf if src.perf is not None and src.perf.serve == src.serve_id else None
    rec = {
        "schema": SCHEMA, "deployment": view.name, "at": iso(src.at), "wall": src.at, "verdict": src.verdict,
        "good": src.verdict == SERVING and not (perf is not None and perf.regression),
        "reason": src.reason, "changed": "", "serve_id": src.serve_id,
        "nodes": {n.name: node(n, src) for n in view.members},
        "image": view.dep.ray.image,
        "model": model(view, src.images),
        "serve": serve(view),
        "results": results(src, perf),
        "decisions": [{"at": iso(d.at), "what": d.what, "reason": d.reason}
                      for d in sorted(src.decisions, key=lambda d: d.at)[-MAX_DECISIONS:]],
    }
    return {k: scrub(v, view.secrets) for k, v in rec.items()}


def scrub(value: object, secrets: tuple[str, ...] | list[str]) -> object:
    """Every string in ``value`` with the known secrets replaced (a reason or a log line may quote one)."""
    if isinstance(value, str):
        return redaction.text(value, secrets)
    if isinstance(value, dict):
        return {k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, secrets) for v in value]
    return value


def known(value: str) -> str:
    return value or UNKNOWN


def node(n: Node, src: Sources) -> dict[str, Any]:
    """One member: its host, its GPU, its fabric, and the image it runs with what is in it."""
    h, g = src.hosts.get(n.name), src.gpus.get(n.name)
    return {
        "host": {k: known(getattr(h, k)) if h is not None else UNKNOWN
                 for k in ("hostname", "kernel", "os", "os_version", "dgx", "boot_id")},
        "gpu": {"name": known(g.name), "driver": known(g.driver), "cuda": known(g.cuda)} if g is not None else
               {"name": UNKNOWN, "driver": UNKNOWN, "cuda": UNKNOWN},
        "fabric": fabric_facts(n, h),
        "image": image(n.name, src),
    }


def fabric_facts(n: Node, h: HostFacts | None) -> dict[str, Any]:
    """The member's fabric interface and the RDMA ports on it (every port when none can be told to be)."""
    if h is None:
        return {"interface": n.fabric_interface or UNKNOWN, "mtu": UNKNOWN, "speed_gbps": UNKNOWN, "rdma": UNKNOWN}
    link = fabric.fabric_link(n, h)
    ports = h.ports_on(n.fabric_interface, n.fabric_ip) or h.rdma
    rdma: dict[str, Any] | str = {
        f"{p.device}/{p.port}": {"firmware": known(p.firmware), "state": known(p.state),
                                 "rate_gbps": p.rate_gbps if p.rate_gbps is not None else UNKNOWN,
                                 "gid_index": g if (g := p.roce_v2_index(n.fabric_ip)) is not None else NONE}
        for p in ports} or NONE  # the facts were read: no RDMA device is "none"
    return {"interface": n.fabric_interface or (link.name if link is not None else UNKNOWN),
            "mtu": link.mtu if link is not None and link.mtu is not None else UNKNOWN,
            "speed_gbps": link.speed_mbps / 1000 if link is not None and link.speed_mbps is not None else UNKNOWN,
            "rdma": rdma}


def image(name: str, src: Sources) -> dict[str, Any]:
    """The image a member runs (by ID: its container's, else the one its check inspected for this start) and,
    when its check was of that very image, its repo digests and what is in it."""
    r = src.images.get(name)
    image_id = src.running.get(name) or (r.image_id if r is not None else "")
    of_it = r is not None and bool(image_id) and r.image_id == image_id
    versions = {"vllm": "vllm_version", "torch": "torch_version", "transformers": "transformers_version",
                "ray": "ray_version", "nccl": "nccl_version", "python": "vllm_python"}
    return {"id": known(image_id),
            "digest": (", ".join(r.repo_digests) or NONE) if of_it and r is not None else UNKNOWN,
            **{k: known(getattr(r, attr)) if of_it else UNKNOWN for k, attr in versions.items()}}


def model(view: DeploymentView, images: Mapping[str, ImageReport]) -> dict[str, Any]:
    """The model as the image check found it on the serve's node (the head), else on the first member found."""
    s = view.dep.serve
    found: list[ModelReport] = [r.model for n in view.members if (r := images.get(n.name)) is not None
                                and r.model is not None and r.model.path and not r.model.missing
                                and not r.model.unchecked and not r.model.prefetch]
    m = found[0] if found else None
    out: dict[str, Any] = {"name": s.model, "revision_asked": s.revision or NONE}
    if m is None:
        return {**out, "source": UNKNOWN, "path": UNKNOWN, "revision": UNKNOWN, "shards": UNKNOWN, "bytes": UNKNOWN,
                "config_sha256": UNKNOWN}
    return {**out, "source": m.source, "path": m.path,
            "revision": m.revision or (NONE if m.source == "local" else UNKNOWN),
            "shards": m.files, "bytes": m.bytes, "config_sha256": known(m.config_sha256)}


def serve(view: DeploymentView) -> dict[str, Any]:
    """The serve as launched: its argv (secret flags redacted), the names of its environment's variables, and
    the fabric's variables with their values per member (secret-named ones redacted)."""
    cfg, dep = view.cfg, view.dep
    head = view.serve_node
    serving = {n.name for n in view.serve_nodes}

    def env(n: Node) -> dict[str, str]:
        launched = commands.serve_env(cfg, dep, view.serve_hash, n) if n.name in serving else {}
        return {**commands.node_container(cfg, dep, n).environment, **launched}
    argv = commands.shown_argv(cfg, dep, commands.serve_argv(dep, commands.rank_args(cfg, dep, head)))
    return {"argv": argv, "env": sorted(env(head)),
            "fabric_env": {n.name: redaction.env({k: v for k, v in sorted(env(n).items())
                                                  if k.startswith(_FABRIC_ENV) or k == "VLLM_HOST_IP"}, view.secrets)
                           for n in view.members}}


def results(src: Sources, perf: PerfVerdict | None) -> dict[str, Any]:
    """How the bring-up went and what it came up with."""
    return {
        "bringup_s": dict(src.bringup),
        "load_s": {s.milestone: s.seconds if s.seconds is not None else UNKNOWN for s in src.steps},
        "kv_cache_tokens": src.kv_tokens or UNKNOWN,
        "performance": performance(perf),
        # none seen (NCCL's INFO lines off, not logged yet) is not "no transport": unknown
        "transports": {(str(t.rank) if t.rank is not None else f"? {t.ip}"): f"{t.net} on {_on(src.view, t)}"
                       for t in src.transports} or UNKNOWN,
        "load_read": load_read(src.load_read, src.disk_gb_s),
    }


def load_read(read: LoadRead | None, disk_gb_s: float | None) -> dict[str, Any] | str:
    """How fast rank 0 read its weights, beside its disk, and what to do when far below (judge.loadrate)."""
    if read is None:
        return UNKNOWN
    said = loadrate.verdict(read, disk_gb_s)
    return {"gib": round(read.gib, 2), "seconds": round(read.seconds, 1), "gb_s": round(read.gb_s, 3),
            "disk_gb_s": round(disk_gb_s, 2) if disk_gb_s else UNKNOWN, **({"verdict": said} if said else {})}


def performance(v: PerfVerdict | None) -> dict[str, Any]:
    if v is None:
        return {"verdict": UNKNOWN}
    if v.error:
        return {"verdict": "unmeasured", "detail": v.error}
    return {"verdict": "regression" if v.regression else "ok", "decode_tps": v.decode_tps, "ttft_s": v.ttft_s,
            "reference": v.reference or NONE, **({"detail": v.regression} if v.regression else {})}


def _on(view: DeploymentView, t: Transport) -> str:
    m = fabric.member(view, t)
    return m.name if m is not None else t.ip or "?"
