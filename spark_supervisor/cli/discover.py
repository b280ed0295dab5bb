"""`discover`: read the head and the workers, write the config of the deployment they can serve (every value
annotated with where it came from, the [stale] candidates commented out), qualify it as `check --preflight`
does, and print what is left to do, in order. Changes nothing on any node (docs/discovery.md)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from .base import EXIT_CONFIG

if TYPE_CHECKING:
    from ..judge.discovery import NodeReading
    from ..world.discover import Target


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", default="local", metavar="[NAME=]local",
                   help="the head: this machine, where the daemon will run (NAME: its node name; default: the "
                        "--base file's head, else this host's short name)")
    p.add_argument("--worker", action="append", default=[], metavar="[NAME=]TARGET",
                   help="a worker reached over SSH as TARGET (user@host or a Host of ssh_config; its Docker engine "
                        "as ssh://TARGET); repeat for each (NAME default: the --base node with that ssh, else the host)")
    p.add_argument("--models-dir", default="", metavar="DIR",
                   help="also look for models in DIR on every node (a directory per model, as the seed's /models); "
                        "the Hugging Face caches are always looked in")
    p.add_argument("--base", default="", metavar="FILE",
                   help="a partial config whose keys are kept as written (${VAR}s too) and whose [[nodes]] entries, by "
                        "name, apply to the nodes for reading and in the output: a port, a privilege prefix, a "
                        "stand-in's argv")
    p.add_argument("--out", "-o", default="spark-supervisor.toml", metavar="FILE",
                   help="where to write the config (default: ./spark-supervisor.toml; - for standard output, "
                        "without the qualification)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("--no-check", action="store_true", help="write the config, skip the qualification")


def _split(spec: str) -> tuple[str, str]:
    name, eq, target = spec.partition("=")
    return (name, target) if eq else ("", spec)


def _targets(args: argparse.Namespace, base: dict[str, object]) -> list[Target]:
    from ..world.discover import Target
    nodes = [n for n in base.get("nodes", []) or [] if isinstance(n, dict)]  # type: ignore[attr-defined]
    name, head = _split(args.head)
    if head != "local":
        raise SystemExit(f"--head {args.head}: the head is the machine the daemon runs on: give local (or NAME=local)")
    name = name or next((str(n["name"]) for n in nodes if n.get("role") == "head"), "") \
        or socket.gethostname().split(".")[0]
    out = [Target(name, "head", "local")]
    for spec in args.worker:
        name, target = _split(spec)
        name = name or next((str(n["name"]) for n in nodes if n.get("ssh") == target), "") or target.rpartition("@")[2]
        out.append(Target(name, "worker", target))
    if len({t.name for t in out}) != len(out):
        raise SystemExit(f"two nodes with one name: {', '.join(t.name for t in out)} (give NAME=TARGET)")
    return out


def _shown(r: NodeReading) -> list[str]:
    from ..judge.discovery import oom_killers
    if r.error:
        return [f"{r.name} ({r.target}): NOT READ: {r.error}"]
    h = r.host
    gpu = f"{r.gpu.name} driver {r.gpu.driver}" if r.gpu else "no GPU read"
    mem = f"{r.memory.total_mib} MiB, {r.memory.available_mib} MiB available" if r.memory else "memory not read"
    lines = [f"{r.name} ({r.target}): {h.hostname if h else '?'}, {(h.dgx if h and h.dgx not in ('', 'none') else '')}"
             f"{h.os if h else ''}; {gpu}; {mem}",
             f"  docker {r.docker_version or '?'}, runtimes {', '.join(r.runtimes) or '?'} (default "
             f"{r.default_runtime or '?'}), CDI {', '.join(r.cdi_dirs) or 'none'}"]
    for i in r.images:
        lines.append(f"  image {i.tag}: " + (i.report.summary() if i.report else f"not checked: {i.error or '-'}"))
    for m in r.models:
        lines.append(f"  model {m.model} ({m.where}): " + (m.report.summary() if m.report else f"not checked: {m.error}"))
    if oom := oom_killers(r):
        lines.append(f"  OOM killers: {', '.join(oom)}")
    lines += [f"  could not read: {e}" for e in r.errors]
    return lines


def cmd_discover(args: argparse.Namespace) -> int:
    from ..config import ConfigError, parse
    from ..config.labels import MAX_CONFIG_BYTES
    from ..config.loader import _read
    from ..judge import discovery_config as dc
    from ..judge.discovery import choose_image, complete_models, fabrics, stale_candidates
    from ..world.discover import read_nodes
    base: dict[str, object] = {}
    if args.base:
        raw, why = _read(Path(args.base), MAX_CONFIG_BYTES)
        if why:
            print(f"--base {args.base}: {why}", file=sys.stderr)
            return EXIT_CONFIG
        try:
            base = tomllib.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            print(f"--base {args.base}: {e}", file=sys.stderr)
            return EXIT_CONFIG
    if args.out != "-" and os.path.exists(args.out) and not args.force:
        print(f"{args.out} exists: give another --out, or --force to replace it", file=sys.stderr)
        return EXIT_CONFIG
    targets = _targets(args, base)
    try:
        readings = read_nodes(base, targets, args.models_dir)
    except ConfigError as e:
        print("\n".join(["the nodes and --base do not make a config:", *e.problems]), file=sys.stderr)
        return EXIT_CONFIG
    deps = base.get("deployments")
    first = deps[0] if isinstance(deps, list) and deps and isinstance(deps[0], dict) else {}
    serve, ray_t = dict(first.get("serve") or {}), dict(first.get("ray") or {})
    ray = serve.get("distributed_executor_backend", "ray") == "ray"
    ports = (int(serve.get("port", 8000)), int(ray_t.get("port", 6379)), int(ray_t.get("dashboard_port", 8265)))
    image, image_why = choose_image(readings, ray, str(ray_t.get("image", "")))
    found = dc.Found(readings, next(iter(fabrics(readings)), None), image, image_why, complete_models(readings),
                     [c for r in readings for c in stale_candidates(r, ports)], args.models_dir)
    doc, notes = dc.build(found, base)
    head = ["Written by `spark-supervisor discover` from what the nodes said of themselves; each value says where",
            "it came from" + (f" (\"from --base\": {args.base})" if args.base else "")
            + ". Read it, then `spark-supervisor check --preflight` (discover ran it once)."]
    text = dc.render(doc, notes, head)
    try:  # what was written must load; a problem is said here, and by the check below
        parse(tomllib.loads(text), args.out)
    except ConfigError as e:
        print("\n".join(["warning: the written config does not load yet:", *e.problems]), file=sys.stderr)
    for r in readings:
        print("\n".join(_shown(r)), file=sys.stderr if args.out == "-" else sys.stdout)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}" + (f" (fabric {found.fabric.network})" if found.fabric else " (no shared fabric found)"))
    code = 0
    if not args.no_check:
        from .ops import cmd_check
        print(f"\n== qualification (spark-supervisor check --preflight --config {args.out})")
        try:
            code = cmd_check(argparse.Namespace(config=args.out, preflight=True, dry=True))
        except SystemExit as e:  # the config does not load: its problems are printed
            code = int(e.code) if isinstance(e.code, int) else EXIT_CONFIG
    steps = dc.todo(found, ray)
    if code:
        steps.append("fix what the qualification named above, then `spark-supervisor check --preflight`")
    steps += [f"install it: sudo install -m 644 {args.out} /etc/spark-supervisor/spark-supervisor.toml",
              "start it: sudo systemctl enable --now --no-block spark-supervisor; watch: spark-supervisor status -f"]
    print("\n== left to do, in order")
    print("\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1)))
    return 1 if code else 0
