"""`logs`: the serve's log of a launch on a node; what it reads and how is spark_supervisor.world.servelogs',
imported when it runs (this module is standard library only: the parser stays fast)."""

from __future__ import annotations

import argparse
import sys

from .base import _load


def cmd_logs(args: argparse.Namespace) -> int:
    from ..world.servelogs import Problem, resolve, show
    cfg = _load(args.config)
    try:
        dep, node = resolve(cfg, args.deployment, args.node)
        return show(cfg, dep, node, previous=args.previous, follow=args.follow, lines=args.lines)
    except Problem as e:
        print(f"spark-supervisor logs: {e}", file=sys.stderr)
        return e.code


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("deployment", nargs="?", default=None, help="the deployment (default: the only one)")
    p.add_argument("--follow", "-f", action="store_true",
                   help="keep printing as the log grows, across new launches (until Ctrl-C)")
    p.add_argument("--previous", "-p", action="store_true", help="the launch before the current one")
    p.add_argument("--node", default=None, metavar="NODE", help="a node the serve runs on (default: the head, "
                   "rank 0; with the mp backend every node of the deployment runs a rank)")
    p.add_argument("--lines", "-n", type=_positive, default=None, metavar="N", help="only the last N lines")


def _positive(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n
