"""`pause` and `resume`: maintenance mode, through the daemon's control socket, or on disk when no daemon
holds the state directory (the daemon then starts paused). `teardown` pauses a running daemon first."""

from __future__ import annotations

import argparse
import getpass
import math
import os
import sys
import time

from . import control, statefile
from .model import Pause

# A pause is answered once the loop has taken it (a tick may be in the middle of an action).
_WAIT_S = 150.0


def parse_duration(text: str) -> float:
    """"30m", "1h30m", "90s", "2 hours", "1:30:00" -> seconds; a bare number is minutes. At most
    Pause.MAX_S: a longer pause is a typo, or a deployment left unsupervised."""
    from pytimeparse import parse
    text = text.strip()
    try:
        seconds = float(text) * 60 if text.replace(".", "", 1).isdigit() else parse(text)
    except (ValueError, OverflowError):
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"cannot read {text[:40]!r} as a duration: write e.g. 30m, 1h30m, 90s or 2h")
    if seconds > Pause.MAX_S:
        raise ValueError(f"{text[:40]!r} is longer than the longest pause, {Pause.MAX_S / 86400:g} days "
                         "(pause without --for to stay paused until `resume`)")
    return float(seconds)


def who() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def pause(state_dir: str, reason: str, seconds: float | None) -> tuple[bool, str]:
    """Pause the daemon (or, with none running, leave a pause for it to start under); (done, message)."""
    now = time.time()
    try:  # checked here as the daemon checks it: a pause it would refuse is not sent, nor saved
        p = Pause(by=who(), reason=reason, at=now, until=now + seconds if seconds else None)
    except ValueError as e:
        return False, f"cannot pause: {e}"
    try:
        answer = control.ask(state_dir, "pause", timeout=_WAIT_S, until=p.until, reason=reason, by=who())
    except control.NotAnswering as e:
        return False, str(e)
    except control.Refused as e:
        return False, f"the daemon refused the pause: {e}"
    if answer is not None:
        return True, answer
    try:
        statefile.write_pause(state_dir, p)
    except OSError as e:
        return False, f"cannot write the pause in {state_dir}: {e.strerror or e}; nothing was changed"
    return True, f"no daemon running; it will start paused {p.text()}"


def cmd_pause(args: argparse.Namespace) -> int:
    from .cli import _load
    try:
        seconds = parse_duration(args.duration) if args.duration else None
    except ValueError as e:
        print(f"spark-supervisor pause: {e}", file=sys.stderr)
        return 2
    done, message = pause(_load(args.config).supervisor.state_dir, args.reason, seconds)
    print(message, file=sys.stdout if done else sys.stderr)
    return 0 if done else 1


def cmd_resume(args: argparse.Namespace) -> int:
    from .cli import _load
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
