"""`record` (a deployment's record, or what changed since the last good one) and `report` (the support bundle):
read from the state directory, so they work with no daemon running. What they read and how is
spark_supervisor.report.record's, imported when they run (this module is standard library only: the parser stays
fast)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .base import _load
from .logs import _positive


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("deployment", nargs="?", default=None, help="the deployment (default: the only one)")
    p.add_argument("--diff", nargs="?", const=1, default=None, type=_positive, metavar="N",
                   help="what differs, field by field, from the last good record before it (N: the N-th)")


def cmd_record(args: argparse.Namespace) -> int:
    from ..config.view import views
    from ..report.record.diff import diff
    from ..report.record.text import render, render_diff
    from ..state import records
    all_views = views(_load(args.config))
    name = args.deployment or (next(iter(all_views)) if len(all_views) == 1 else "")
    if name not in all_views:
        print(f"spark-supervisor record: {'no deployment ' + repr(name) + ' in the config' if name else 'name one'} "
              f"(deployments: {', '.join(all_views)})", file=sys.stderr)
        return 2
    view = all_views[name]
    last = records.latest(view.state_dir, name)
    for problem in last.problems:
        print(f"warning: {problem}", file=sys.stderr)
    current, h = last.current, last.history
    if current is None:
        print(f"{name}: no record yet in {view.state_dir} (one is made when it reaches SERVING)", file=sys.stderr)
        return 1
    where = ("its facts then: not a good serve" if last.bad
             else f"record {len(h.records)} of {len(h.records)} in {view.state_dir}/{records.HISTORY}")
    if args.diff is None:
        print(json.dumps(current, indent=1) if args.json else render(current, where))
        return 0
    good = last.good
    if len(good) < args.diff:
        print(f"{name}: {len(good)} good record{'' if len(good) == 1 else 's'} before it: none to compare with "
              f"(--diff {args.diff})", file=sys.stderr)
        return 1
    old = good[args.diff - 1]
    changes, unknown = diff(old, current)
    if args.json:
        doc: dict[str, Any] = {"deployment": name, "from": old.get("at"), "to": current.get("at"),
                               "verdict": current.get("verdict"), "unknown": unknown,
                               "changes": [{"path": c.path, "old": c.old, "new": c.new} for c in changes]}
        print(json.dumps(doc, indent=1))
    else:
        print(render_diff(changes, unknown, old, current))
    return 0


def add_capture(p: argparse.ArgumentParser) -> None:
    """`report --capture`: the formats our parsers read, from every node (docs/operator-guide.md)."""
    p.add_argument("--capture", action="store_true",
                   help="instead: capture exactly what the supervisor's parsers read on every node (nvidia-smi -q -x, "
                        "the host facts, ip -o addr, /proc/meminfo, the serve log's start and NCCL lines, Ray's node "
                        "list), redacted with the format kept, with a manifest (default: "
                        "<state_dir>/reports/spark-supervisor-capture-<UTC time>.tar.gz)")


def _capture(args: argparse.Namespace) -> int:
    from ..report.record import capture
    cfg = _load(args.config)
    try:
        path, members, size, problems = capture.write(cfg, args.out, time.time())
    except OSError as e:
        print(f"spark-supervisor report: cannot write {args.out or 'the capture'}: {e.strerror or e}", file=sys.stderr)
        return 1
    for p in problems:
        print(f"not captured: {p}", file=sys.stderr)
    print(f"wrote {'the capture to standard output' if args.out == '-' else path} ({len(members)} files, "
          f"{size / 1024:.0f} KiB; addresses, names and serials replaced, the formats kept): send it to have "
          "each file become a test fixture", file=sys.stderr if args.out == "-" else sys.stdout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    if getattr(args, "capture", False):
        return _capture(args)
    from ..report.record import bundle
    cfg = _load(args.config)
    try:
        path, members, size = bundle.write(cfg, args.config, args.out, time.time())
    except OSError as e:
        print(f"spark-supervisor report: cannot write {args.out or 'the bundle'}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {'the bundle to standard output' if args.out == '-' else path} ({len(members)} files, "
          f"{size / 1024:.0f} KiB; secrets removed): attach it to a report", file=sys.stderr if args.out == "-" else sys.stdout)
    return 0

