"""The commands that read the config and reach the nodes: `check` (and its preflight), `diagnose`, `run`,
`plan`, `teardown`, `reset` and `apply --dry-run`. Each imports what it needs when it runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from .base import EX_CONFIG, _load

if TYPE_CHECKING:
    from ..config import Node
    from ..config.view import DeploymentView
    from ..world.observe import World


def cmd_check(args: argparse.Namespace) -> int:
    from ..config.view import views
    whole = _load(args.config)
    for w in whole.warnings:  # what may be meant, but should not be: said, and check still passes
        print(f"warning: {w}", file=sys.stderr)
    from ..config import ray_hash, serve_hash
    for dep in whole.deployments:
        print(f"{args.config}: OK: deployment {dep.name!r} ({dep.serve.name}, TP {dep.serve.tensor_parallel_size}) "
              f"on {', '.join(n.name for n in whole.members(dep))}; ray {ray_hash(whole, dep)} "
              f"serve {serve_hash(whole, dep)}" + ("" if dep.required else " (not required)")
              + (f", after {', '.join(dep.after)}" if dep.after else ""))
    if not args.preflight:
        return 0
    from ..state.statefile import check_state_dir
    # As the daemon judges it when it starts (the unit runs it as root; a preflight may run as its operator).
    unfit = check_state_dir(whole.supervisor.state_dir, {os.geteuid(), 0})
    for p in unfit:
        print(f"preflight: supervisor.state_dir: {p}")
    several = len(whole.deployments) > 1
    dry = bool(getattr(args, "dry", False))  # discover's: no pull, nothing written
    found = len(unfit) + sum(_preflight(v, f"{name}: " if several else "", dry=dry) for name, v in views(whole).items())
    print("preflight: OK" if not found else f"preflight: {found} problem(s)")
    return 1 if found else 0


def _preflight(view: DeploymentView, prefix: str, *, dry: bool = False) -> int:
    """One deployment's preflight, printed; returns the number of problems."""
    from ..judge import fabric
    from ..judge.preflight import preflight
    from ..judge.qualify import stack_memory_problems
    from ..world.observe import Observer, World
    problems = _access(view, prefix)  # first: an unknown host key also shows as unreachable below
    world = World(view)
    try:
        obs = Observer(world).observe(full=True)
    finally:
        world.close()
    problems += [f"{o.name}: unreachable: {o.error}" for o in obs.nodes.values() if o.error]
    problems += preflight(view, obs) + stack_memory_problems(view, obs)
    hosts = {o.name: o.host for o in obs.nodes.values() if o.host is not None}
    found = fabric.findings(view, hosts, {o.name: o.gpu_lost for o in obs.nodes.values() if o.gpu_lost})
    for w in found.warnings:  # a warning: serving works, other tools confuse the nodes
        print(f"warning: {prefix}{w}", file=sys.stderr)
    problems += [found.held] if found.held else []  # as the daemon would hold its start: one reason
    problems += _check_images(view, [n for n in view.members if not obs.nodes[n.name].error], dry=dry)
    if obs.ray is not None and obs.ray.reachable:
        ips = {n.fabric_ip for n in view.members}
        problems += [f"Ray node {n.node_id[:12]} registered with {n.ip}, not a fabric IP"
                     for n in obs.ray.alive if n.ip not in ips]
    for p in problems:
        print(f"preflight: {prefix}{p}")
    return len(problems)


def _access(view: DeploymentView, prefix: str) -> list[str]:
    """Host keys on both SSH paths and the privilege for what needs root, on every member (world.access):
    the problems returned, each check that could not be judged shown as unknown (not counted)."""
    from ..world import access
    sup = view.cfg.supervisor
    found = access.check_access(view.cfg, view.members, timeout=sup.io_timeout, connect_timeout=sup.ssh_connect_timeout)
    for f in found:
        if f.unknown:
            print(f"preflight: {prefix}{access.shown(f)} (not counted)")
    return [access.shown(f) for f in access.problems(found)]


def _check_images(view: DeploymentView, nodes: list[Node], *, dry: bool = False) -> list[str]:
    """The image check the daemon runs before a first start, on every reachable node; prints what each holds."""
    import structlog

    from ..judge.preflight import image_problem
    from ..model import CheckImage, ImageReport
    from ..world.act import ActionFailed, Actor
    from ..world.observe import World
    dep = view.dep
    world = World(view)
    problems, reports = [], {}
    try:
        # The operator's check keeps what it found for the daemon's next start (images.json); discover's (dry)
        # changes nothing anywhere: no pull, no state written.
        actor = Actor(world, structlog.get_logger(), dry=dry)
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
    found = image_problem(view.cfg, dep, reports)
    return problems + ([f"{found[0]}: {found[1]}"] if found else [])


def cmd_diagnose(args: argparse.Namespace) -> int:
    from ..config.view import views
    from ..world.diagnose import below, diagnose, render
    from ..world.observe import World
    whole = _load(args.config)
    ok = True
    for name, view in views(whole).items():
        world = World(view)
        try:
            diags = diagnose(world)
            if len(whole.deployments) > 1:
                print(f"== {name}")
            print(render(diags, world, below(world)))
        finally:
            world.close()
        ok = ok and all(d.first_failing is None for d in diags)
    return 0 if ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    from ..report import journal
    cfg = _load(args.config, EX_CONFIG)
    journal.setup()
    journal.register_config(cfg)  # whatever a log line holds later, the config's secrets are redacted in it
    for w in cfg.warnings:
        journal.get().warning("config.warning", problem=w)
    from ..loop.daemon import AlreadyRunning, Daemon, StateDirUnfit, lock_state_dir
    try:
        fd = lock_state_dir(cfg.supervisor.state_dir)
    except StateDirUnfit as e:  # a restart would find it the same: fix it, then start
        print(f"spark-supervisor: supervisor.state_dir: {e}", file=sys.stderr)
        return EX_CONFIG
    except (AlreadyRunning, OSError) as e:
        print(f"spark-supervisor: {e}", file=sys.stderr)
        return 1
    try:
        return Daemon(args.config, cfg, log=journal.get()).run()
    finally:
        os.ftruncate(fd, 0)  # no PID left behind for anyone to signal


def cmd_plan(args: argparse.Namespace) -> int:
    from ..config.view import views
    from ..model import Phase, Status, describe
    from ..plan import plan
    from ..world.observe import Observer, World
    whole = _load(args.config)
    outs = []
    for view in views(whole).values():
        dep = view.dep
        world = World(view)
        try:
            obs = Observer(world).observe(full=True)
        finally:
            world.close()
        decision = plan(obs, Status(phase=Phase.DETECTING), view, obs.at)
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
    from ..change.rollback import forget_kept
    from ..config.view import DeploymentView
    from ..report import journal
    from ..world.act import ActionFailed
    from ..world.backend import teardown
    from ..world.observe import World
    whole = _load(args.config)
    from ..state import control, maintenance
    state_dir = whole.supervisor.state_dir
    if control.daemon_holds_lock(state_dir):  # or it would repair what is being removed, and burn its budget
        done, message = maintenance.pause(state_dir, "teardown", None)
        if not done:
            print(f"{message}; not tearing down under a daemon that would repair it", file=sys.stderr)
            return 1
        print(f"{message}\n(`spark-supervisor resume` brings the deployments back)")
    journal.setup()
    removed, failed = [], False
    for dep in whole.deployments:  # each on its own: one that cannot be reached does not stop the others
        view = DeploymentView.build(whole, dep)
        world = World(view)
        try:
            removed += teardown(world, journal.get())
            if why := forget_kept(view.state_dir):  # torn down: its next start is a first one, from its tags
                print(f"{dep.name}: {why}", file=sys.stderr)
        except ActionFailed as e:
            print(f"{dep.name}: {e.reason}", file=sys.stderr)
            failed = True
        finally:
            world.close()
    print(f"removed {len(removed)} containers: {', '.join(removed) or '-'}")
    return 1 if failed else 0

def cmd_reset(args: argparse.Namespace) -> int:
    """Re-arm FAILED and forget the repair budget: through the daemon's control socket, or on disk when
    no daemon holds the state directory (never by signalling a PID read from a file)."""
    from ..state import control, statefile
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
    from ..config import deployment_dir
    for dep in cfg.deployments:
        log = statefile.RepairLog(deployment_dir(state_dir, dep.name))
        log.clear()
        if log.problem:
            print(log.problem, file=sys.stderr)
            return 1
    print(f"no daemon running; cleared the repair budgets in {state_dir}")
    return 0


def _images_there(world: World, view: DeploymentView) -> tuple[str, list[str]]:
    """The dry run's look at each member's engine (read-only): the verdict, and what a reload would pull first."""
    from ..adapters import AdapterError
    image, would, lacking = view.dep.ray.image, [], []
    try:
        for n in view.members:
            try:
                if not world.nodes[n.name].docker.image_id(image):
                    lacking.append(n.name)
            except AdapterError as e:
                would.append(f"look up {image} on {n.name}: {e}")
    finally:
        world.close()
    if lacking and view.dep.ray.image_pull == "never":
        return f'REFUSED: ImageMissing: {image} is not on {", ".join(lacking)} and image_pull = "never"', would
    would += [f"pull {image} on {n} (size unknown)" for n in lacking]
    return "not proven (--prove proves it in probe containers)", would


def cmd_apply(args: argparse.Namespace) -> int:
    """What a reload to FILE would do to each deployment (changes.diff), and what it would pull. A dry run changes
    nothing anywhere: the images are only looked up on each member. With --prove, each change that stops a
    deployment is also proven as the daemon proves it, in short-lived probe containers of what is already on the
    nodes (the mounts read-only, no network): still no pull, no prefetch, no removal, no state file; what a reload
    would pull or fetch first is said instead."""
    import structlog

    from ..change.classify import diff
    from ..config import Config
    from ..config.view import views as views_of
    from ..world.backend import RealBackend
    from ..world.observe import World
    old: Config = _load(args.config)
    new: Config = _load(args.file)
    found, settings = diff(old, new)
    views = views_of(new)
    refused, rows = 0, []
    if new.supervisor.state_dir != old.supervisor.state_dir:
        refused += 1
        rows.append({"deployment": "(supervisor)", "change": "refused", "differs": ["supervisor.state_dir"],
                     "verdict": "REFUSED: supervisor.state_dir cannot change on reload (restart the service)",
                     "would": []})
    for c in found:
        verdict, would = "", []
        view = views.get(c.name)
        if c.stops and view is not None:
            if args.prove:
                backend = RealBackend(view, structlog.get_logger(), dry=True)
                try:
                    why = backend.prove()
                    would = list(backend.actor.would)
                finally:
                    backend.close()
                if why is None:
                    verdict = "proven: it can start on every member" + (" once fetched" if would else "")
                elif any(w.startswith("pull ") for w in would):
                    verdict = f"not proven here: {why.detail}"
                else:
                    refused += 1
                    verdict = f"REFUSED: {why}"
            else:
                verdict, would = _images_there(World(view), view)
                refused += verdict.startswith("REFUSED")
        rows.append({"deployment": c.name, "change": c.change.value, "differs": list(c.differs),
                     "verdict": verdict, "would": would})
    if args.json:
        print(json.dumps({"from": args.config, "to": args.file, "deployments": rows, "settings": list(settings),
                          "refused": refused}, indent=1))
    else:
        print(f"a reload from {args.config} to {args.file} would (nothing is changed now):")
        for r in rows:
            print(f"  {r['deployment']}: {r['change']}" + (f" ({', '.join(r['differs'])} differ)" if r["differs"]
                                                          and r["change"] != "unchanged" else "")
                  + (f": {r['verdict']}" if r["verdict"] else ""))
            for w in r["would"]:
                print(f"    first: {w}")
        if settings:
            print(f"  settings: {', '.join(settings)} (applied in place)")
    return 1 if refused else 0
