# PYTHON_ARGCOMPLETE_OK  (argcomplete's marker: this entry point answers completion requests)
"""Composition root: parse arguments, wire the real adapters, run a command.

Heavy modules (docker, httpx, argcomplete) are imported only by the commands that need them, so `status`
and `check` answer fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

SYSTEM_CONFIG = "/etc/spark-supervisor/spark-supervisor.toml"
DEFAULT_CONFIG = os.environ.get("SPARK_SUPERVISOR_CONFIG", SYSTEM_CONFIG)
EXIT_CONFIG = 2  # `check` and the other commands: the config is unusable
EX_CONFIG = 78  # `run`: sysexits' EX_CONFIG; the unit's RestartPreventExitStatus=78 stops the restart loop

# `status` exit codes, as `systemctl status` and LSB init scripts' `status` give them (3 and 4 are LSB's;
# 150-199 are LSB's range for the application), so that scripts and monitoring can trust them.
ST_SERVING = 0  # every required deployment SERVING
ST_FAILED = 1  # a required deployment FAILED (given up: needs `reset` or a fix)
ST_NOT_RUNNING = 3  # no daemon holds the state directory's lock
ST_UNKNOWN = 4  # the status cannot be read (or the config naming the state directory cannot)
ST_DEGRADED = 150  # degraded or on its way: DEGRADED, BACKOFF and every start-up or repair phase
ST_PAUSED = 151  # maintenance (`pause`): observing, acting on nothing
TRANSITIONAL = frozenset({"DEGRADED", "BACKOFF", "DETECTING", "CLEANING", "WAITING", "STARTING_RAY",
                          "STARTING_VLLM", "LOADING", "VERIFYING", "STOPPING"})
STATUS_CODES = (
    (ST_SERVING, "every required deployment is SERVING"),
    (ST_FAILED, "a required deployment is FAILED"),
    (ST_NOT_RUNNING, "no daemon is running (a status file it left is still shown, marked as such)"),
    (ST_UNKNOWN, "the status cannot be read"),
    (ST_DEGRADED, "degraded or on its way: DEGRADED, BACKOFF, DETECTING, WAITING, CLEANING, STARTING_*, "
                  "LOADING, VERIFYING, STOPPING"),
    (ST_PAUSED, "PAUSED (maintenance)"),
)
STATUS_NOTE = ("Only the required deployments count (all of them when none is required). With --json the "
               "status document is printed in every case, with \"running\": true, false, or null when it "
               "cannot be told.")
EXIT_NOTE = ("0 done; 1 a check or a command failed; 2 the config is unusable (78 for `run`, so that systemd "
             "does not restart it). `status` exits as `systemctl status` and LSB init scripts do:")
ENVIRONMENT = (("SPARK_SUPERVISOR_CONFIG", f"the config file when no --config is given (else {SYSTEM_CONFIG})"),)


def _wrapped(text: str, indent: str = "", first: str = "") -> str:
    import textwrap
    return textwrap.fill(text, 100, initial_indent=first or indent, subsequent_indent=indent,
                         break_on_hyphens=False)


def _status_epilog(head: str = "exit status (as `systemctl status` and LSB init scripts):") -> str:
    return "\n".join([_wrapped(head)]
                     + [_wrapped(text, " " * 7, f"  {code:<4} ") for code, text in STATUS_CODES]
                     + [_wrapped(STATUS_NOTE)])


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
    for w in whole.warnings:  # what may be meant, but should not be: said, and check still passes
        print(f"warning: {w}", file=sys.stderr)
    from .config import ray_hash, serve_hash
    for dep in whole.deployments:
        print(f"{args.config}: OK: deployment {dep.name!r} ({dep.serve.name}, TP {dep.serve.tensor_parallel_size}) "
              f"on {', '.join(n.name for n in whole.members(dep))}; ray {ray_hash(whole, dep)} "
              f"serve {serve_hash(whole, dep)}" + ("" if dep.required else " (not required)")
              + (f", after {', '.join(dep.after)}" if dep.after else ""))
    if not args.preflight:
        return 0
    from .statefile import check_state_dir
    # As the daemon judges it when it starts (the unit runs it as root; a preflight may run as its operator).
    unfit = check_state_dir(whole.supervisor.state_dir, {os.geteuid(), 0})
    for p in unfit:
        print(f"preflight: supervisor.state_dir: {p}")
    several = len(whole.deployments) > 1
    found = len(unfit) + sum(_preflight(whole.view(dep), f"{dep.name}: " if several else "") for dep in whole.deployments)
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
    logs.register_config(cfg)  # whatever a log line holds later, the config's secrets are redacted in it
    for w in cfg.warnings:
        logs.get().warning("config.warning", problem=w)
    from .daemon import AlreadyRunning, Daemon, StateDirUnfit, lock_state_dir
    try:
        fd = lock_state_dir(cfg.supervisor.state_dir)
    except StateDirUnfit as e:  # a restart would find it the same: fix it, then start
        print(f"spark-supervisor: supervisor.state_dir: {e}", file=sys.stderr)
        return EX_CONFIG
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
    from . import control, maintenance
    state_dir = whole.supervisor.state_dir
    if control.daemon_holds_lock(state_dir):  # or it would repair what is being removed, and burn its budget
        done, message = maintenance.pause(state_dir, "teardown", None)
        if not done:
            print(f"{message}; not tearing down under a daemon that would repair it", file=sys.stderr)
            return 1
        print(f"{message}\n(`spark-supervisor resume` brings the deployments back)")
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


def status_code(doc: dict[str, Any] | None, running: bool | None) -> int:
    """`status`'s exit code for a status document (None: none could be read) and whether a daemon holds
    the state directory (None: cannot be told)."""
    if running is False:
        return ST_NOT_RUNNING
    if running is None or not isinstance(doc, dict):
        return ST_UNKNOWN
    docs = [d for d in (doc.get("deployments") or [doc]) if isinstance(d, dict)]
    required = [d for d in docs if (d.get("deployment") or {}).get("required", True)] or docs
    phases = [d.get("phase") for d in required]
    if not phases or any(p not in TRANSITIONAL | {"SERVING", "FAILED", "PAUSED"} for p in phases):
        return ST_UNKNOWN  # a document this version cannot judge is not "serving"
    if "FAILED" in phases:
        return ST_FAILED
    if all(p == "SERVING" for p in phases):
        return ST_SERVING
    return ST_PAUSED if "PAUSED" in phases else ST_DEGRADED


def cmd_status(args: argparse.Namespace) -> int:
    from . import control, statefile
    state_dir = args.state_dir
    if not state_dir:
        try:
            state_dir = _load(args.config, ST_UNKNOWN).supervisor.state_dir
        except SystemExit:
            if args.json:
                print(json.dumps({"running": None, "phase": None,
                                  "error": f"{args.config}: cannot read the config (see standard error)"}))
            raise
    if args.follow:  # before the first status exists too: the daemon may only be starting
        return cmd_follow(state_dir)
    running: bool | None
    try:
        running = control.daemon_holds_lock(state_dir)
    except OSError as e:
        running, error = None, f"cannot tell whether a daemon holds {state_dir}/lock: {e.strerror or e}"
    doc: dict[str, Any] | None = None
    try:
        doc = statefile.read(state_dir)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        error = (f"no status in {state_dir}: is spark-supervisor running?" if not running else
                 f"no status in {state_dir} yet: the daemon is starting")
        doc = None
    except (OSError, ValueError) as e:
        error = f"cannot read the status in {state_dir}: {getattr(e, 'strerror', None) or e}"
        doc = None
    code = status_code(doc, running)
    if args.json:
        print(json.dumps({**doc, "running": running} if doc is not None else
                         {"running": running, "phase": None, "error": error}, indent=1))
        if doc is None:
            print(error, file=sys.stderr)
        return code
    if doc is None:
        print(error, file=sys.stderr)
        return code
    if running is False:
        print(f"NOT RUNNING: no spark-supervisor holds {state_dir}/lock; what it last wrote "
              f"({(doc.get('daemon') or {}).get('updated', '?')}):")
    elif running is None:
        print(f"UNKNOWN: {error}; what the daemon last wrote:")
    try:
        _print_status(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # a document from another version
        print(f"cannot show the status in {state_dir}: {type(e).__name__} {e}", file=sys.stderr)
        return ST_UNKNOWN
    return code


def _print_status(doc: dict[str, Any]) -> None:
    docs = doc.get("deployments") or [doc]
    if len(docs) > 1:  # a line for the whole stack, then a block per deployment
        print(f"{doc.get('summary', '')}")
    for one in docs:
        if len(docs) > 1:
            print(f"\n== {one['deployment']['name']}" + ("" if one["deployment"].get("required", True)
                                                          else " (not required)"))
        _print_deployment(one)
    print(f"config: {doc['config']['path']} ({doc['config']['hash']}); updated {doc['daemon']['updated']}")
    reload = doc.get("reload") or {}
    if reload.get("error"):
        print(f"RELOAD FAILED {reload.get('at', '')}: {reload['error']} (running on the previous config)")
    elif reload.get("staged"):
        print(f"reload staged {reload.get('at', '')}: {reload['staged']}")


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
        if n.get("model"):
            print(f"  model {n['model']['model']}: {n['model']['summary']}")
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
        answer = control.ask(state_dir, "reset")
    except control.NotAnswering as e:
        print(e, file=sys.stderr)
        return 1
    if answer is not None:
        print(answer)
        return 0
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

    from . import files, logscan
    limit = 1 << 30  # a serve log of a few days is a few hundred MiB
    try:  # a named file must be a regular one (a FIFO or device would wait or never end); `-` reads a pipe
        raw = sys.stdin.buffer.read(limit + 1) if args.file == "-" else files.read_bytes(args.file, limit)
    except OSError as e:
        print(f"cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    if len(raw) > limit:
        print(f"cannot read {args.file}: more than {limit} bytes", file=sys.stderr)
        return 2
    text = raw.decode("utf-8", errors="replace")
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


def _maintenance(name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        from . import maintenance
        return int(getattr(maintenance, name)(args))
    return run


def cmd_version(args: argparse.Namespace) -> int:
    from . import version
    if args.json:
        print(json.dumps({"version": version(), "python": sys.version.split()[0], "executable": sys.executable}))
    else:
        print(f"spark-supervisor {version()} (Python {sys.version.split()[0]}, {sys.executable})")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    import argcomplete
    print(argcomplete.shellcode(["spark-supervisor"], shell=args.shell), end="")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .config import Config
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **Config.model_json_schema(),
              "title": "spark-supervisor configuration"}
    print(json.dumps(schema, indent=1))
    return 0


class _Version(argparse.Action):
    """--version, with the version looked up only when asked for (it reads the installed metadata)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from . import version
        print(f"spark-supervisor {version()}")
        parser.exit()


DESCRIPTION = """Keeps multi-node vLLM deployments serving: observes every node's Docker engine, Ray and
the served model, plans, and repairs what is wrong, within a repair budget."""


def _epilog() -> str:
    return "\n".join(["environment:"] + [_wrapped(text, " " * 27, f"  {name:<25}") for name, text in ENVIRONMENT]
                     + ["", _status_epilog("exit status: " + EXIT_NOTE)])


def parser() -> argparse.ArgumentParser:
    # Global options go before or after the subcommand: the top-level parser holds the default, and each
    # subcommand a copy whose default is SUPPRESS, so a value given after the subcommand wins and none
    # given there leaves the top-level one.
    config_help = f"config file (default: $SPARK_SUPERVISOR_CONFIG, else {SYSTEM_CONFIG})"
    json_help = "one JSON document instead of text"
    p = argparse.ArgumentParser(prog="spark-supervisor", description=DESCRIPTION, epilog=_epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version, help="print the version and exit")
    p.add_argument("--config", "-c", default=DEFAULT_CONFIG, metavar="FILE", help=config_help)
    json_global = p.add_argument("--json", action="store_true", help=json_help)
    config_opt = argparse.ArgumentParser(add_help=False)
    config_opt.add_argument("--config", "-c", default=argparse.SUPPRESS, metavar="FILE", help=config_help)
    json_opt = argparse.ArgumentParser(add_help=False)
    json_opt.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)
    sub = p.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Any, help: str, *, config: bool = True, json: bool = False,
            **kw: Any) -> argparse.ArgumentParser:
        """A subcommand; `json`: it has a JSON output (--json)."""
        parents = ([config_opt] if config else []) + ([json_opt] if json else [])
        sp = sub.add_parser(name, help=help, description=kw.pop("description", help[:1].upper() + help[1:] + "."),
                            parents=parents, **kw)
        sp.set_defaults(fn=fn, json_ok=json)
        return sp

    add("run", cmd_run, "run the supervisor in the foreground (what the systemd unit runs)")
    add("check", cmd_check, "validate the config: exit 0, or 2 with one line per problem").add_argument(
        "--preflight", action="store_true", help="also check the fabric on every node (exit 1 on a problem)")
    add("diagnose", cmd_diagnose, "per node, the deepest layer that answers and the first that does not")
    add("plan", cmd_plan, "observe once and print what would be done; change nothing", json=True)
    add("teardown", cmd_teardown, "remove what the supervisor owns, on every node")
    add("reset", cmd_reset, "re-arm after FAILED and forget the repair budget")
    st = add("status", cmd_status, "what the daemon last wrote: phase, nodes, Ray, serve, history", json=True,
             epilog=_status_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    st.add_argument("--state-dir", default="", help="read the status from here instead of the config's")
    st.add_argument("--follow", "-f", action="store_true", help="a live progress bar until SERVING or FAILED")
    pa = add("pause", _maintenance("cmd_pause"), "maintenance: keep observing and reporting, act on nothing, "
             "spend no repair budget")
    pa.add_argument("--for", dest="duration", default="", metavar="DURATION",
                    help="resume by itself after this long (30m, 1h30m, 90s; a bare number is minutes)")
    pa.add_argument("--reason", default="", help="shown in status and STATUS=")
    add("resume", _maintenance("cmd_resume"), "leave maintenance mode: detect afresh and reconcile")
    from .servelogs import add_arguments, cmd_logs  # stdlib only at import: the parser stays fast
    add_arguments(add("logs", cmd_logs, "the serve's log of the current launch (or the previous) on a node"))
    ls = add("logscan", cmd_logscan, "read a vLLM serve log: phase reached, timings, failure and hint",
             config=False, json=True)
    ls.add_argument("file", help="the log file, or - for standard input")
    add("version", cmd_version, "print the version, the Python and where it runs from", config=False, json=True)
    add("completion", cmd_completion, "print the shell completion script", config=False,
        epilog='bash: eval "$(spark-supervisor completion bash)" in ~/.bashrc, or the output saved as '
        "/usr/local/share/bash-completion/completions/spark-supervisor (`make install` does); zsh: the same "
        "line in ~/.zshrc (after compinit)").add_argument("shell", choices=("bash", "zsh", "fish", "tcsh"),
                                         help="the shell (bash, zsh, fish or tcsh)")
    add("schema", cmd_schema, "print the config file's JSON Schema (for editors that validate TOML)",
        config=False).set_defaults(json_ok=True)  # JSON in any case
    json_global.help = f"{json_help} ({', '.join(n for n, sp in sub.choices.items() if sp.get_default('json_ok'))})"
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (argcomplete's protocol): answer, exit
        import argcomplete
        argcomplete.autocomplete(p)
    args = p.parse_args(argv)
    if args.json and not args.json_ok:
        p.error(f"--json: `{args.command}` has no JSON output")
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # here, where a closed pipe can be caught, not at the interpreter's exit
        return code
    except BrokenPipeError:  # `check | head -1`: the reader has what it wants; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
