"""`pause` and `resume` (maintenance mode): the commands; what they do is spark_supervisor.maintenance's,
imported when one runs."""

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
