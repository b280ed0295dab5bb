"""`status`: what the daemon last wrote, as text, JSON or a live progress bar, with the exit codes of
`systemctl status` (base.ST_*)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the document's types only: `status` stays fast to start
    from ..model.document import DeploymentDoc, EngineDoc, HostDoc, NodeDoc, PerfDoc, StatusDoc

from .base import (
    ST_DEGRADED,
    ST_FAILED,
    ST_NOT_RUNNING,
    ST_PAUSED,
    ST_SERVING,
    ST_UNKNOWN,
    TRANSITIONAL,
    state_dir_of,
)


def _ago(iso: str) -> str:
    from datetime import datetime
    if not iso:
        return "?"
    s = max(0, int(time.time() - datetime.fromisoformat(iso).timestamp()))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def status_code(doc: StatusDoc | None, running: bool | None) -> int:
    """`status`'s exit code for a status document (None: none could be read) and whether a daemon holds
    the state directory (None: cannot be told)."""
    if running is False:
        return ST_NOT_RUNNING
    if running is None or not isinstance(doc, dict):
        return ST_UNKNOWN
    docs = [d for d in (doc.get("deployments") or [doc]) if isinstance(d, dict)]
    required = [d for d in docs if _required(d)] or docs
    phases = [d.get("phase") for d in required]
    if not phases or any(p not in TRANSITIONAL | {"SERVING", "FAILED", "PAUSED"} for p in phases):
        return ST_UNKNOWN  # a document this version cannot judge is not "serving"
    if "FAILED" in phases:
        return ST_FAILED
    if all(p == "SERVING" for p in phases):
        return ST_SERVING
    return ST_PAUSED if "PAUSED" in phases else ST_DEGRADED


def _required(doc: DeploymentDoc) -> bool:
    """Whether a deployment counts for the exit code (one a document does not say of: it does)."""
    dep = doc.get("deployment")
    return dep.get("required", True) if dep else True


def _where(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The state directory to read (--state-dir, else the config's) and the config's problems, if any."""
    if args.state_dir:
        return args.state_dir, []
    try:
        return state_dir_of(args.config)
    except SystemExit:
        if args.json:
            print(json.dumps({"running": None, "phase": None,
                              "error": f"{args.config}: cannot read the config (see standard error)"}))
        raise SystemExit(ST_UNKNOWN) from None


def _say_problems(path: str, problems: list[str]) -> None:
    """The config's problems, beside what runs (never instead of it), on standard error."""
    if problems:
        print(f"{path} has problems (a running daemon keeps the config it read last):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)


def cmd_status(args: argparse.Namespace) -> int:
    from ..state import control, statefile
    state_dir, problems = _where(args)
    if args.follow:  # before the first status exists too: the daemon may only be starting
        return cmd_follow(state_dir)
    running: bool | None
    try:
        running = control.daemon_holds_lock(state_dir)
    except OSError as e:
        running, error = None, f"cannot tell whether a daemon holds {state_dir}/lock: {e.strerror or e}"
    doc: StatusDoc | None = None
    try:
        doc = statefile.read(state_dir)
    except FileNotFoundError:
        error = (f"no status in {state_dir}: is spark-supervisor running?" if not running else
                 f"no status in {state_dir} yet: the daemon is starting")
        doc = None
    except (OSError, ValueError) as e:
        error = f"cannot read the status in {state_dir}: {getattr(e, 'strerror', None) or e}"
        doc = None
    code = status_code(doc, running)
    age = _age_s(doc)
    _say_problems(args.config, problems)
    if args.json:
        print(json.dumps({**doc, "running": running, "age_s": age, "config_problems": problems} if doc is not None else
                         {"running": running, "phase": None, "error": error}, indent=1))
        if doc is None:
            print(error, file=sys.stderr)
        return code
    if doc is None:
        print(error, file=sys.stderr)
        return code
    if running is False:
        daemon = doc.get("daemon")
        print(f"NOT RUNNING: no spark-supervisor holds {state_dir}/lock; what it last wrote "
              f"({daemon.get('updated', '?') if daemon else '?'}):")
    elif running is None:
        print(f"UNKNOWN: {error}; what the daemon last wrote:")
    elif age is not None and age > statefile.STATUS_STALE_S:
        print(f"STALE: the daemon runs but wrote this {_ago(str(doc['daemon']['updated']))} ago (it writes it at least every "
              f"{statefile.STATUS_REFRESH_S:.0f}s): it cannot write to {state_dir} (disk full? read-only?) or its "
              "loop is stuck; see `journalctl -u spark-supervisor`. What it last wrote:")
    try:
        _print_status(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a document from another version
        print(f"cannot show the status in {state_dir}: {type(e).__name__} {e}", file=sys.stderr)
        return ST_UNKNOWN
    return code


def _age_s(doc: StatusDoc | None) -> float | None:
    """Seconds since the daemon wrote ``doc`` (None: not said, or not a time)."""
    from datetime import datetime
    try:
        updated = datetime.fromisoformat(str(doc["daemon"]["updated"])) if doc is not None else None
    except (KeyError, TypeError, ValueError):
        return None
    return None if updated is None else round(max(0.0, time.time() - updated.timestamp()), 1)


def _print_status(doc: StatusDoc) -> None:
    docs = doc.get("deployments") or [doc]
    if len(docs) > 1:  # a line for the whole stack, then a block per deployment
        print(f"{doc.get('summary', '')}")
    for one in docs:
        if len(docs) > 1:
            print(f"\n== {one['deployment']['name']}" + ("" if one["deployment"].get("required", True)
                                                          else " (not required)"))
        _print_deployment(one)
    print(f"config: {doc['config']['path']} ({doc['config']['hash']}); updated {doc['daemon']['updated']}")
    reload = doc.get("reload")
    if not reload:
        return
    if reload.get("error"):
        print(f"RELOAD FAILED {reload.get('at', '')}: {reload['error']} (running on the previous config)")
    elif reload.get("staged"):
        print(f"reload staged {reload.get('at', '')}: {reload['staged']}")
    elif reload.get("proving"):
        print(f"reload proving {reload.get('at', '')}: {reload['proving']}")
    for note in reload.get("rolled_back") or ():
        print(f"ROLLED BACK {reload.get('at', '')}: {note} (the spec that served before runs again; the file is "
              "unchanged: a reload tries it again)")


def _print_deployment(doc: DeploymentDoc) -> None:
    dep = doc["deployment"]
    print(f"{doc['phase']} for {_ago(doc['since'])}" + (f": {doc['reason']}" if doc["reason"] else "")
          + (f"\n  {doc['changed']}" if doc.get("changed") else ""))  # what differs from the last good record
    if doc.get("progress"):
        print(f"  load: {doc['progress']}")
    lim = doc.get("load_limits")
    if lim and doc["phase"] == "LOADING":  # the limits this load runs under, and a cold start said as such
        if lim["cold"]:
            print(f"  {lim['cold']}")
        print(f"  deadline {lim['deadline']:.0f}s ({lim['deadline_why']}), stall limit {lim['stall']:.0f}s "
              f"({lim['stall_why']})")
    print(f"goal: {dep['served_model_name']} (TP {dep['tensor_parallel_size']}) on {', '.join(dep['nodes'])} "
          f"at {dep['endpoint']}")
    if dep.get("backend"):  # older daemons did not write it
        b = dep["backend"]
        print(f"backend: {b['name']}" + (f" across {b['nodes']} nodes" if b["nodes"] > 1 else "") + f": {b['evidence']}")
    for name, n in doc["nodes"].items():
        _print_node(name, n)
    ray = doc.get("ray")
    if ray:
        print(f"ray ({ray.get('via', 'dashboard')}): {'up' if ray['reachable'] else 'down'}, {ray['nodes_alive']} "
              f"nodes alive, {ray['gpus']} GPUs" + (f" ({ray['error']})" if ray.get("error") else ""))
    _print_serve(doc)
    _print_transports(doc)
    load = doc.get("load")
    if load and load.get("timeline"):
        steps = ", ".join(f"{x['milestone']} {x['seconds']:.0f}s" if x.get("seconds") is not None else x["milestone"]
                          for x in load["timeline"])
        print(f"serve log: vLLM {load.get('version') or '?'}, KV cache {load.get('kv_cache_tokens') or '?'} tokens; "
              f"{steps}")
    kv = doc.get("kv_cache")
    if kv and kv.get("warning"):
        print(f"WARNING {kv['warning']}")
    if doc.get("bringup"):
        print("bring-up: " + ", ".join(f"{k} {v:.1f}s" for k, v in doc["bringup"].items()))
    for what, u in (doc.get("unknown") or {}).items():
        print(f"unknown: {what} for {u['since_s']:.0f}s ({u['ticks']} ticks)")
    for problem in doc.get("state_problems") or ():
        print(f"state: {problem}")
    v = doc.get("verdict")
    if v:
        print(f"sanity: {'passed' if v['passed'] else 'FAILED'}: {v['why']} ({v['latency_s']}s)")
    print(f"failures in a row: {doc['failures']}" + (f", next try {doc['backoff_until']}" if doc["backoff_until"] else ""))
    rep = doc.get("repairs")
    if rep:
        print(f"repairs: {rep['in_window']}/{rep['budget']} in the last {rep['window_s'] / 3600:g}h")
    print("history:")
    for h in doc["history"][-8:]:
        print(f"  {h['at']} {h['phase']}" + (f": {h['reason']}" if h["reason"] else ""))

def _print_transports(doc: DeploymentDoc) -> None:
    """The network NCCL chose for each rank of the serve that runs."""
    for t in doc.get("transports") or ():
        rank = "rank ?" if t["rank"] is None else f"rank {t['rank']}"
        print(f"  nccl {rank}{' on ' + t['node'] if t['node'] else ''}: NET/{t['net']}"
              + (f" ({t['detail']})" if t["detail"] else ""))


def _print_serve(doc: DeploymentDoc) -> None:
    """The serve's lines: its process, its ranks on other nodes, and its engine's heartbeat."""
    serve = doc.get("serve")
    if not serve:
        return
    state = "running" if serve["running"] else f"exited {serve['exit_code']}"
    print(f"serve: pid {serve['pid']} {state} since {serve['started_at'] or '?'}")
    for node, r in (serve.get("ranks") or {}).items():
        what = ("no container" if r is None else f"unknown ({r['error']})" if r["error"] else
                f"pid {r['pid']} running" if r["running"] else f"pid {r['pid']} exited {r['exit_code']}")
        print(f"  rank on {node}: {what}")
    e = doc["liveness"].get("engine")
    if e and (e["read"] or e["error"]):
        print(f"  engine: {_engine(e)}")
    v = doc.get("performance")
    if v:
        print(f"  performance: {_perf(v)}")


def _perf(v: PerfDoc) -> str:
    """The performance verdict in words."""
    if v["error"]:
        return f"not measured at {v['measured']} ({v['error']})"
    held = {"best": f"best {v['best_tps']:.1f} for this spec", "baseline": "held to the baseline"}.get(
        v["reference"], "the first for this spec")
    agg = f", {v['aggregate_tps']:.1f} tok/s together" if v["aggregate_tps"] else ""
    said = f"REGRESSION: {v['regression']}" if v["regression"] else (
        f"{v['decode_tps']:.1f} tok/s decode, first token {v['ttft_s']:.2f}s{agg} ({held})")
    return f"{said}; measured {v['measured']}"


def _engine(e: EngineDoc) -> str:
    """The engine's heartbeat in words (its /metrics at the last tick)."""
    if not e["read"]:
        return f"heartbeat unknown ({e['error']})"
    load = f"{e['running']:g} running, {e['waiting']:g} waiting"
    if e["stalled_s"]:
        return f"{load}; STALLED: nothing moved for {e['still_s']:.0f}s (a deep probe tells a wedge from a long prefill)"
    return f"{load}; " + ("idle" if not e["running"] else f"working (last moved {e['still_s']:.0f}s ago)")


def _fabric(h: HostDoc) -> str:
    """A member's fabric in words: its interface, its RDMA ports, its boot."""
    link = h["link"]
    parts = [f"{link['name']} {link['operstate'] or '?'} mtu {link['mtu'] or '?'}"
             + (f" {link['speed_mbps'] / 1000:g} Gb/s" if link["speed_mbps"] else "") if link else "interface ?"]
    for p in h["rdma"]:
        rate = f" {p['rate_gbps']:g} Gb/s" if p["rate_gbps"] is not None else ""
        gid = f"GID index {p['gid_index']}" if p["gid_index"] is not None else "no RoCE v2 GID for its IP"
        parts.append(f"{p['device']}/{p['port']} {p['state'] or '?'}{rate}, {gid}, fw {p['firmware'] or '?'}")
    boot = h["boot_id"][:8] or "?"
    if h["boot_id_at_serving"] and h["boot_id_at_serving"] != h["boot_id"]:
        boot += f" (was {h['boot_id_at_serving'][:8]} at SERVING: REBOOTED)"
    return "; ".join(parts) + f"; boot {boot}"


def _print_node(name: str, n: NodeDoc) -> None:
    """One node's lines of a deployment's status: its engine, GPU, memory and containers, then its checks."""
    gpu, mem = n.get("gpu"), n.get("memory")
    gpu_name, driver = (gpu.get("name"), gpu.get("driver")) if gpu else (None, None)
    # null: a figure the node did not report (meminfo without MemFree or Cached); unknown, as a missing key is
    figures = (mem.get("free_mib"), mem.get("cached_mib"), mem.get("available_mib"), mem.get("total_mib")) if mem else (
        None, None, None, None)
    free, cached, available, total = ("?" if x is None else x for x in figures)
    cs = ", ".join(f"{c['name']} ({c['state']})" for c in n.get("containers", [])) or "none"
    print(f"node {name} [{n['role']}] {n['fabric_ip']}: "
          + (f"UNREACHABLE {n['error']}" if n.get("error") else
             f"docker {n.get('docker_version') or '?'}, {gpu_name or 'GPU ?'} "
             f"driver {driver or '?'}, memory MiB: free {free}, cached {cached}, available {available} of "
             f"{total}, owned: {cs}"))
    if n.get("gpu_lost"):
        print(f"  GPU ACCESS LOST: {n['gpu_lost']}")
    h = n.get("host")
    if h:
        print(f"  fabric: {_fabric(h)}")
    if n.get("image"):
        print(f"  image {n['image']['image']}: {n['image']['summary']}")
    if n.get("model"):
        print(f"  model {n['model']['model']}: {n['model']['summary']}")


def cmd_follow(state_dir: str) -> int:
    """A live progress bar of the daemon's status (until SERVING or FAILED, or Ctrl-C)."""
    import threading

    from ..state import statefile
    width = 30
    try:
        while True:
            try:
                doc = statefile.read(state_dir)
                phase, frac = str(doc.get("phase", "?")), float(doc.get("load_fraction") or 0.0)
                what = doc.get("progress") or doc.get("reason", "")
            except (OSError, ValueError, TypeError):
                phase, frac, what = "?", 0.0, "no status yet"
            bar = "#" * int(frac * width) + "." * (width - int(frac * width))
            line = f"{phase:<14} [{bar}] {int(frac * 100):3d}%  {what}"
            sys.stdout.write("\r" + line[:150].ljust(150))
            sys.stdout.flush()
            if phase in ("SERVING", "FAILED"):
                sys.stdout.write("\n")
                return 0 if phase == "SERVING" else 1
            threading.Event().wait(0.5)  # the display's refresh rate
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130
