"""`copy-model`: the deployment's model from the head to a member, verified (spark_supervisor.world.modelcopy,
imported when it runs: this module is standard library only, the parser stays fast)."""

from __future__ import annotations

import argparse
import json
import sys

from .base import _load


def cmd_copy_model(args: argparse.Namespace) -> int:
    from ..report import journal
    from ..world.modelcopy import CopyProblem, Options, copy, deployment
    cfg = _load(args.config)
    journal.setup()
    journal.register_config(cfg)
    opts = Options(dry_run=args.dry_run, via=args.via, sha256=not args.no_sha256, resend=args.resend,
                   min_rate=args.min_rate * 1e6, stall_s=args.stall)
    # The plan and the progress on standard error when the result is JSON on standard output.
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)
    try:
        result = copy(cfg, deployment(cfg, args.deployment), args.to, opts, say)
    except CopyProblem as e:
        print(f"spark-supervisor copy-model: {e}", file=sys.stderr)
        return e.code
    if args.json:
        print(json.dumps(result, indent=1))
    return 1 if result.get("differences") or result.get("model_check", "complete") != "complete" else 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("deployment", nargs="?", default=None, help="the deployment (default: the only one)")
    p.add_argument("--to", required=True, metavar="NODE", help="the member to copy to (not the head: it is the source)")
    p.add_argument("--dry-run", action="store_true", help="show what would be sent, and whether it would be refused; "
                   "send nothing")
    p.add_argument("--via", choices=("fabric", "ssh"), default="fabric",
                   help="fabric (default): ssh to the node's fabric_ip, with its ssh target's user, port, keys and "
                        "host key; ssh: the ssh target as configured (the management network)")
    p.add_argument("--no-sha256", action="store_true", help="check what arrived by size only (the sha256 of each "
                   "file the hub names reads it back once more)")
    p.add_argument("--resend", action="store_true", help="send every file, also those of the head's size already there")
    p.add_argument("--min-rate", type=_positive, default=50.0, metavar="MB/S",
                   help="the slowest average rate accepted: the copy's deadline is 120 s + its bytes at this rate "
                        "(default: 50)")
    p.add_argument("--stall", type=_positive, default=120.0, metavar="SECONDS",
                   help="stop when no byte has moved for this long (default: 120)")


def _positive(v: str) -> float:
    try:
        n = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {v!r}") from None
    if not n > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {v}")
    return n
