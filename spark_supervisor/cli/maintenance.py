"""`pause` and `resume` (maintenance mode) and `restart`: the commands; what pause and resume do is
spark_supervisor.state.maintenance's, imported when one runs."""

from __future__ import annotations

import argparse
import sys

from .base import state_dir_of


def cmd_pause(args: argparse.Namespace) -> int:
    from ..state.maintenance import parse_duration, pause
    try:
        seconds = parse_duration(args.duration) if args.duration else None
    except ValueError as e:
        print(f"spark-supervisor pause: {e}", file=sys.stderr)
        return 2
    done, message = pause(state_dir_of(args.config)[0], args.reason, seconds)
    print(message, file=sys.stdout if done else sys.stderr)
    return 0 if done else 1


def _ask(state_dir: str, command: str, **args: object) -> tuple[bool, str | None]:
    """The running daemon asked through its control socket, with who asks: (asked, its answer; None when no
    daemon runs). Not asked: why is printed."""
    from ..state import control
    from ..state.maintenance import _WAIT_S, who
    try:
        return True, control.ask(state_dir, command, timeout=_WAIT_S, by=who(), **args)
    except control.NotAnswering as e:
        print(e, file=sys.stderr)
    except control.Refused as e:
        print(f"the daemon refused the {command}: {e}", file=sys.stderr)
    return False, None


def cmd_restart(args: argparse.Namespace) -> int:
    """Ask the running daemon to relaunch (a start, not a repair: the budget is not charged)."""
    ok, answer = _ask(state_dir_of(args.config)[0], "restart", deployment=args.deployment,
                      serve_only=args.serve_only)
    if not ok:
        return 1
    if answer is None:
        print("no daemon running: nothing to restart (start the service)", file=sys.stderr)
        return 1
    print(answer)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from ..state import statefile
    state_dir = state_dir_of(args.config)[0]
    ok, answer = _ask(state_dir, "resume")
    if not ok:
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
