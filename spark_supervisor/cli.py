"""Composition root: parse arguments, wire the real adapters, run a command.

Heavy modules (docker, httpx) are imported only by the commands that need them, so `status` and
`check` answer fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

DEFAULT_CONFIG = os.environ.get("SPARK_SUPERVISOR_CONFIG", "/etc/spark-supervisor/spark-supervisor.toml")
EXIT_CONFIG = 2  # `check` and the other commands: the config is unusable
EX_CONFIG = 78  # `run`: sysexits' EX_CONFIG; the unit's RestartPreventExitStatus=78 stops the restart loop


def _load(path: str, code: int = EXIT_CONFIG) -> Any:
    from . import config
    try:
        return config.load(path)
    except config.ConfigError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        raise SystemExit(code) from None


def cmd_check(args: argparse.Namespace) -> int:
    whole = _load(args.config)
    from .config import ray_hash, serve_hash
    for dep in whole.deployments:
        print(f"{args.config}: OK: deployment {dep.name!r} ({dep.serve.name}, TP {dep.serve.tensor_parallel_size}) "
              f"on {', '.join(n.name for n in whole.members(dep))}; ray {ray_hash(whole, dep)} "
              f"serve {serve_hash(whole, dep)}" + ("" if dep.required else " (not required)")
              + (f", after {', '.join(dep.after)}" if dep.after else ""))
    if not args.preflight:
        return 0
    several = len(whole.deployments) > 1
    found = sum(_preflight(whole.view(dep), f"{dep.name}: " if several else "") for dep in whole.deployments)
    print("preflight: OK" if not found else f"preflight: {found} problem(s)")
    return 1 if found else 0


def _preflight(cfg: Any, prefix: str) -> int:
    """One deployment's preflight, printed; returns the number of problems."""
    dep = cfg.deployment
    from .observe import Observer, World
    from .preflight import preflight
    world = World(cfg)
    try:
        obs = Observer(world).observe(full=True)
    finally:
        world.close()
    problems = [f"{o.name}: unreachable: {o.error}" for o in obs.nodes.values() if o.error]
    problems += preflight(cfg, obs)
    problems += _check_images(cfg, [n for n in cfg.members(dep) if not obs.nodes[n.name].error])
    if obs.ray is not None and obs.ray.reachable:
        fabric = {n.fabric_ip for n in cfg.members(dep)}
        problems += [f"Ray node {n.node_id[:12]} registered with {n.ip}, not a fabric IP"
                     for n in obs.ray.alive if n.ip not in fabric]
    for p in problems:
        print(f"preflight: {prefix}{p}")
    return len(problems)


def _check_images(cfg: Any, nodes: list[Any]) -> list[str]:
    """The image check the daemon runs before a first start, on every reachable node; prints what each holds."""
    import structlog

    from .act import ActionFailed, Actor
    from .model import CheckImage, ImageReport
    from .observe import World
    from .preflight import image_problem
    dep = cfg.deployment
    world = World(cfg)
    problems, reports = [], {}
    try:
        actor = Actor(world, structlog.get_logger())
        for node in nodes:
            try:
                r = actor.run(CheckImage(node.name))
            except ActionFailed as e:
                problems.append(f"{node.name}: image check failed: {e.reason}")
                continue
            assert isinstance(r, ImageReport)
            reports[node.name] = r
            print(f"image {dep.ray.image} on {node.name}: {r.summary(dep.uses_ray)}"
                  + ("" if r.dashboard or not dep.uses_ray else " (Ray will be read through its GCS)"))
    finally:
        world.close()
    found = image_problem(cfg, dep, reports)
    return problems + ([f"{found[0]}: {found[1]}"] if found else [])


def cmd_diagnose(args: argparse.Namespace) -> int:
    from .diagnose import diagnose, render
    from .observe import World
    whole = _load(args.config)
    ok = True
    for dep in whole.deployments:
        world = World(whole.view(dep))
        try:
            diags = diagnose(world)
            if len(whole.deployments) > 1:
                print(f"== {dep.name}")
            print(render(diags, world))
        finally:
            world.close()
        ok = ok and all(d.first_failing is None for d in diags)
    return 0 if ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    from . import logs
    cfg = _load(args.config, EX_CONFIG)
    logs.setup()
    from .daemon import AlreadyRunning, Daemon, lock_state_dir
    try:
        fd = lock_state_dir(cfg.supervisor.state_dir)
    except (AlreadyRunning, OSError) as e:
        print(f"spark-supervisor: {e}", file=sys.stderr)
        return 1
    try:
        return Daemon(args.config, cfg, log=logs.get()).run()
    finally:
        os.ftruncate(fd, 0)  # no PID left behind for anyone to signal


def cmd_plan(args: argparse.Namespace) -> int:
    from .model import Phase, Status, describe
    from .observe import Observer, World
    from .plan import plan
    whole = _load(args.config)
    outs = []
    for dep in whole.deployments:
        cfg = whole.view(dep)
        world = World(cfg)
        try:
            obs = Observer(world).observe(full=True)
        finally:
            world.close()
        decision = plan(obs, Status(phase=Phase.DETECTING), cfg, obs.at)
        actions = [describe(a) for a in decision.actions]
        outs.append({"deployment": dep.name, "phase": decision.phase.value, "reason": decision.reason,
                     "failure": decision.failure, "actions": actions})
        if not args.json:
            print(f"{dep.name}: {decision.phase.value}: {decision.reason or '-'}")
            for a in actions:
                rest = ", ".join(f"{k}={v}" for k, v in a.items() if k != "action")
                print(f"  would {a['action']}({rest})")
            if not decision.actions:
                print("  no action")
    if args.json:
        print(json.dumps(outs[0] if len(outs) == 1 else outs, indent=1))
    return 0


def cmd_teardown(args: argparse.Namespace) -> int:
    from . import logs
    from .act import ActionFailed
    from .backend import teardown
    from .observe import World
    whole = _load(args.config)
    logs.setup()
    removed, failed = [], False
    for dep in whole.deployments:  # each on its own: one that cannot be reached does not stop the others
        world = World(whole.view(dep))
        try:
            removed += teardown(world, logs.get())
        except ActionFailed as e:
            print(f"{dep.name}: {e.reason}", file=sys.stderr)
            failed = True
        finally:
            world.close()
    print(f"removed {len(removed)} containers: {', '.join(removed) or '-'}")
    return 1 if failed else 0


def _ago(iso: str) -> str:
    from datetime import datetime
    if not iso:
        return "?"
    s = max(0, int(time.time() - datetime.fromisoformat(iso).timestamp()))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def cmd_status(args: argparse.Namespace) -> int:
    from . import statefile
    state_dir = args.state_dir
    if not state_dir:
        cfg = _load(args.config)
        state_dir = cfg.supervisor.state_dir
    if args.follow:  # before the first status exists too: the daemon may only be starting
        return cmd_follow(state_dir)
    try:
        doc = statefile.read(state_dir)
    except FileNotFoundError:
        print(f"no status in {state_dir}: is spark-supervisor running?", file=sys.stderr)
        return 3
    except (OSError, ValueError) as e:
        print(f"cannot read the status in {state_dir}: {e}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    docs = doc.get("deployments") or [doc]
    if len(docs) > 1:  # a line for the whole stack, then a block per deployment
        print(f"{doc.get('summary', '')}")
    for one in docs:
        if len(docs) > 1:
            print(f"\n== {one['deployment']['name']}" + ("" if one["deployment"].get("required", True)
                                                          else " (not required)"))
        _print_deployment(one)
    print(f"config: {doc['config']['path']} ({doc['config']['hash']}); updated {doc['daemon']['updated']}")
    return 0


def _print_deployment(doc: dict[str, Any]) -> None:
    dep = doc["deployment"]
    print(f"{doc['phase']} for {_ago(doc['since'])}" + (f": {doc['reason']}" if doc["reason"] else ""))
    if doc.get("progress"):
        print(f"  load: {doc['progress']}")
    print(f"goal: {dep['served_model_name']} (TP {dep['tensor_parallel_size']}) on {', '.join(dep['nodes'])} "
          f"at {dep['endpoint']}")
    for name, n in doc["nodes"].items():
        gpu = n.get("gpu") or {}
        mem = n.get("memory") or {}
        cs = ", ".join(f"{c['name']} ({c['state']})" for c in n.get("containers", [])) or "none"
        print(f"node {name} [{n['role']}] {n['fabric_ip']}: "
              + (f"UNREACHABLE {n['error']}" if n.get("error") else
                 f"docker {n.get('docker_version') or '?'}, {gpu.get('name') or 'GPU ?'} "
                 f"driver {gpu.get('driver') or '?'}, memory MiB: free {mem.get('free_mib', '?')}, cached "
                 f"{mem.get('cached_mib', '?')}, available {mem.get('available_mib', '?')} of "
                 f"{mem.get('total_mib', '?')}, owned: {cs}"))
        if n.get("image"):
            print(f"  image {n['image']['image']}: {n['image']['summary']}")
    ray = doc.get("ray")
    if ray:
        print(f"ray ({ray.get('via', 'dashboard')}): {'up' if ray['reachable'] else 'down'}, {ray['nodes_alive']} "
              f"nodes alive, {ray['gpus']} GPUs" + (f" ({ray['error']})" if ray.get("error") else ""))
    serve = doc.get("serve")
    if serve:
        state = "running" if serve["running"] else f"exited {serve['exit_code']}"
        print(f"serve: pid {serve['pid']} {state} since {serve['started_at'] or '?'}")
        for node, r in (serve.get("ranks") or {}).items():
            what = ("no container" if r is None else f"unknown ({r['error']})" if r["error"] else
                    f"pid {r['pid']} running" if r["running"] else f"pid {r['pid']} exited {r['exit_code']}")
            print(f"  rank on {node}: {what}")
    load = doc.get("load") or {}
    if load.get("timeline"):
        steps = ", ".join(f"{x['milestone']} {x['seconds']:.0f}s" if x.get("seconds") is not None else x["milestone"]
                          for x in load["timeline"])
        print(f"serve log: vLLM {load.get('version') or '?'}, KV cache {load.get('kv_cache_tokens') or '?'} tokens; "
              f"{steps}")
    kv = doc.get("kv_cache") or {}
    if kv.get("warning"):
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
    rep = doc.get("repairs") or {}
    if rep:
        print(f"repairs: {rep['in_window']}/{rep['budget']} in the last {rep['window_s'] / 3600:g}h")
    print("history:")
    for h in doc["history"][-8:]:
        print(f"  {h['at']} {h['phase']}" + (f": {h['reason']}" if h["reason"] else ""))


def cmd_reset(args: argparse.Namespace) -> int:
    """Re-arm FAILED and forget the repair budget: through the daemon's control socket, or on disk when
    no daemon holds the state directory (never by signalling a PID read from a file)."""
    from . import control, statefile
    cfg = _load(args.config)
    state_dir = cfg.supervisor.state_dir
    try:
        print(control.request(state_dir, "reset"))
        return 0
    except control.Unavailable as e:
        if control.daemon_holds_lock(state_dir):
            print(f"a spark-supervisor holds {state_dir}/lock but its control socket does not answer ({e}); "
                  "nothing was changed", file=sys.stderr)
            return 1
    from .config import deployment_dir
    for dep in cfg.deployments:
        log = statefile.RepairLog(deployment_dir(state_dir, dep.name))
        log.clear()
        if log.problem:
            print(log.problem, file=sys.stderr)
            return 1
    print(f"no daemon running; cleared the repair budgets in {state_dir}")
    return 0


def cmd_logscan(args: argparse.Namespace) -> int:
    """Any vLLM serve log: how far the load got, how long each step took, and why it failed."""
    import dataclasses

    from . import logscan
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file, errors="replace").read()
    except OSError as e:
        print(f"cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 2
    p = logscan.scan(text)
    steps = logscan.timeline(text)
    if args.json:
        print(json.dumps({"milestone": p.milestone, "progress": p.summary(), "ready": p.ready, "version": p.version,
                          "shards": {"done": p.shards_done, "total": p.shards_total},
                          "seconds_per_shard": p.seconds_per_shard, "eta_s": p.eta_s,
                          "timeline": [dataclasses.asdict(s) for s in steps],
                          "failure": dataclasses.asdict(p.failure) if p.failure else None}, indent=1))
    else:
        print(f"reached: {p.milestone or 'nothing recognisable'} ({p.summary()})"
              + (f", vLLM {p.version}" if p.version else ""))
        for st in steps:
            took = f"{st.seconds:.0f}s" if st.seconds is not None else ""
            print(f"  {st.milestone:<16} {st.at or '?':<15} {took}")
        if p.failure:
            f = p.failure
            print(f"failure: {f.reason} ({'deterministic: retrying will not help' if f.deterministic else 'transient'})")
            print(f"  line: {f.line}")
            print(f"  hint: {f.hint}")
    return 1 if p.failure else 0


def cmd_follow(state_dir: str) -> int:
    """A live progress bar of the daemon's status (until SERVING or FAILED, or Ctrl-C)."""
    import threading

    from . import statefile
    width = 30
    try:
        while True:
            try:
                doc = statefile.read(state_dir)
            except (OSError, ValueError):
                doc = {"phase": "?", "reason": "no status yet", "progress": "", "fraction": 0.0}
            frac = float(doc.get("load_fraction") or 0.0)
            bar = "#" * int(frac * width) + "." * (width - int(frac * width))
            line = f"{doc['phase']:<14} [{bar}] {int(frac * 100):3d}%  {doc.get('progress') or doc.get('reason', '')}"
            sys.stdout.write("\r" + line[:150].ljust(150))
            sys.stdout.flush()
            if doc["phase"] in ("SERVING", "FAILED"):
                sys.stdout.write("\n")
                return 0 if doc["phase"] == "SERVING" else 1
            threading.Event().wait(0.5)  # the display's refresh rate
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark-supervisor", description=__doc__.splitlines()[0] if __doc__ else "")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, fn: Any, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help)
        sp.add_argument("--config", "-c", default=DEFAULT_CONFIG, help=f"config file (default {DEFAULT_CONFIG})")
        sp.set_defaults(fn=fn)
        return sp

    add("run", cmd_run, "run the supervisor in the foreground (what the systemd unit runs)")
    add("check", cmd_check, "validate the config: exit 0, or 2 with one line per problem").add_argument(
        "--preflight", action="store_true", help="also check the fabric on every node (exit 1 on a problem)")
    add("diagnose", cmd_diagnose, "per node, the deepest layer that answers and the first that does not")
    add("plan", cmd_plan, "observe once and print what would be done; change nothing").add_argument(
        "--json", action="store_true")
    add("teardown", cmd_teardown, "remove what the supervisor owns, on every node")
    add("reset", cmd_reset, "re-arm after FAILED and forget the repair budget")
    st = add("status", cmd_status, "what the daemon last wrote: phase, nodes, Ray, serve, history")
    st.add_argument("--json", action="store_true")
    st.add_argument("--state-dir", default="", help="read the status from here instead of the config's")
    st.add_argument("--follow", "-f", action="store_true", help="a live progress bar until SERVING or FAILED")
    ls = sub.add_parser("logscan", help="read a vLLM serve log: phase reached, timings, failure and hint")
    ls.add_argument("file", help="the log file, or - for standard input")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(fn=cmd_logscan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
