"""`pause` and `resume` (maintenance mode) and `restart`: the commands; what pause and resume do is
spark_supervisor.maintenance's, imported when one runs."""

from __future__ import annotations

import argparse
import sys

from .base import _load


def cmd_pause(args: argparse.Namespace) -> int:
    from ..maintenance import parse_duration, pause
    try:
        seconds = parse_duration(args.duration) if args.duration else None
    except ValueError as e:
        print(f"spark-supervisor pause: {e}", file=sys.stderr)
        return 2
    done, message = pause(_load(args.config).supervisor.state_dir, args.reason, seconds)
    print(message, file=sys.stdout if done else sys.stderr)
    return 0 if done else 1


def cmd_restart(args: argparse.Namespace) -> int:
    """Ask the running daemon to relaunch (a start, not a repair: the budget is not charged)."""
    from .. import control
    from ..maintenance import _WAIT_S, who
    state_dir = _load(args.config).supervisor.state_dir
    try:
        answer = control.ask(state_dir, "restart", timeout=_WAIT_S, by=who(), deployment=args.deployment,
                             serve_only=args.serve_only)
    except control.NotAnswering as e:
        print(e, file=sys.stderr)
        return 1
    except control.Refused as e:
        print(f"the daemon refused the restart: {e}", file=sys.stderr)
        return 1
    if answer is None:
        print("no daemon running: nothing to restart (start the service)", file=sys.stderr)
        return 1
    print(answer)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from .. import control, statefile
    from ..maintenance import _WAIT_S, who
    state_dir = _load(args.config).supervisor.state_dir
    try:
        answer = control.ask(state_dir, "resume", timeout=_WAIT_S, by=who())
    except control.NotAnswering as e:
        print(e, file=sys.stderr)
        return 1
    except control.Refused as e:
        print(f"the daemon refused the resume: {e}", file=sys.stderr)
        return 1
    if answer is not None:
        print(answer)
        return 0
    try:
        statefile.write_pause(state_dir, None)
    except OSError as e:
        print(f"cannot remove the pause in {state_dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    print("no daemon running; it will start unpaused")
    return 0
