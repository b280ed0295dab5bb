"""`pause` and `resume`: maintenance mode, through the daemon's control socket, or on disk when no daemon
holds the state directory (the daemon then starts paused). `teardown` pauses a running daemon first."""

from __future__ import annotations

import getpass
import math
import os
import time

from ..model import Pause
from . import control, statefile

# A pause is answered once the loop has taken it (a tick may be in the middle of an action).
_WAIT_S = 150.0


def parse_duration(text: str) -> float:
    """"30m", "1h30m", "90s", "2 hours", "1:30:00" -> seconds; a bare number is minutes. At most
    Pause.MAX_S: a longer pause is a typo, or a deployment left unsupervised."""
    # pytimeparse.parse, named by its own module (the package does not re-export it for mypy --strict)
    from pytimeparse.timeparse import timeparse as parse
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
