"""The status document the daemon writes under its state directory and `status` reads.

Schema (``schema: 1``): phase, reason, since (UTC ISO), history[{phase, reason, at}], failures,
backoff_until, verdict{passed, why, finish_reason, field, latency_s}, progress, deployment{name, model,
served_model_name, tensor_parallel_size, endpoint, ray_hash, serve_hash}, nodes{name: {fabric_ip, role,
error, docker_version, gpu{name, driver, processes}, memory{total_mib, available_mib}, containers[]}},
ray{reachable, error, nodes_alive, gpus, nodes[]}, serve{pid, running, exit_code, started_at, spec_hash},
config{path, hash}, daemon{pid, updated}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .config import OWNER_LABEL, Config, ray_hash, serve_hash
from .model import Observation, Status

FILE = "status.json"


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds") if wall else ""


def document(st: Status, obs: Observation | None, cfg: Config, config_path: str, config_hash: str,
             now_wall: float, mono_to_wall: float) -> dict[str, Any]:
    dep = cfg.deployment
    doc: dict[str, Any] = {
        "schema": 1,
        "phase": st.phase.value,
        "reason": st.reason,
        "since": iso(st.since_wall),
        "history": [{"phase": t.phase.value, "reason": t.reason, "at": iso(t.wall)} for t in st.history],
        "failures": st.failures,
        "backoff_until": iso(st.backoff_until + mono_to_wall) if st.backoff_until else "",
        "verdict": dataclasses.asdict(st.verdict) if st.verdict else None,
        "liveness": {"health": dataclasses.asdict(st.health), "deep": dataclasses.asdict(st.deep)},
        "repairs": {"in_window": st.repairs_in_window, "budget": cfg.healing.repair_budget,
                    "window_s": cfg.healing.repair_window},
        "progress": st.progress,
        "load_fraction": round(st.load_fraction, 3),
        "eta_s": round(st.eta_s) if st.eta_s is not None else None,
        "deployment": {"name": dep.name, "model": dep.serve.model, "served_model_name": dep.serve.name,
                       "tensor_parallel_size": dep.serve.tensor_parallel_size, "endpoint": cfg.endpoint(dep),
                       "nodes": [n.name for n in cfg.members(dep)],
                       "ray_hash": ray_hash(cfg, dep), "serve_hash": serve_hash(cfg, dep)},
        "config": {"path": config_path, "hash": config_hash},
        "daemon": {"pid": os.getpid(), "updated": iso(now_wall)},
        "nodes": {},
        "ray": None,
        "serve": None,
    }
    for n in cfg.nodes:
        entry: dict[str, Any] = {"fabric_ip": n.fabric_ip, "role": n.role}
        o = obs.nodes.get(n.name) if obs else None
        if o is not None:
            entry.update(error=o.error, docker_version=o.docker_version, probe_errors=list(o.probe_errors),
                         containers=[{"name": c.name, "state": c.state, "image": c.image}
                                     for c in o.containers if c.labels.get(OWNER_LABEL) == dep.name],
                         gpu=dataclasses.asdict(o.gpu) if o.gpu else None,
                         memory=dataclasses.asdict(o.memory) if o.memory else None)
        doc["nodes"][n.name] = entry
    if obs and obs.ray:
        doc["ray"] = {"reachable": obs.ray.reachable, "error": obs.ray.error,
                      "nodes_alive": len(obs.ray.alive), "gpus": obs.ray.gpus,
                      "nodes": [dataclasses.asdict(r) for r in obs.ray.nodes]}
    if obs and obs.serve:
        s = obs.serve
        doc["serve"] = {"pid": s.pid, "running": s.running, "exit_code": s.exit_code, "started_at": s.started_at,
                        "spec_hash": s.spec_hash,
                        "endpoint": dataclasses.asdict(obs.endpoint) if obs.endpoint else None}
    return doc


def write(state_dir: str, doc: dict[str, Any]) -> None:
    """Atomically replace the status file (readers never see half a document)."""
    path = Path(state_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".status.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path / FILE)
    except BaseException:
        os.unlink(tmp)
        raise


def read(state_dir: str) -> dict[str, Any]:
    with open(Path(state_dir) / FILE) as f:
        return json.load(f)  # type: ignore[no-any-return]


class RepairLog:
    """Repairs with their wall-clock times, persisted so the budget survives restarts and reboots."""

    FILE = "repairs.json"

    def __init__(self, state_dir: str):
        self.path = Path(state_dir) / self.FILE
        try:
            self.entries: list[dict[str, Any]] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = []

    def recent(self, now_wall: float, window: float) -> list[dict[str, Any]]:
        return [e for e in self.entries if now_wall - float(e.get("at", 0)) < window]

    def add(self, now_wall: float, kind: str, reason: str) -> None:
        self.entries = [*self.entries[-99:], {"at": now_wall, "when": iso(now_wall), "kind": kind, "reason": reason}]
        self._save()

    def clear(self) -> None:
        self.entries = []
        self._save()

    def _save(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.entries, indent=1))
            os.replace(tmp, self.path)
        except OSError:
            pass  # the budget then only lives in memory; the status file write reports the broken state dir
