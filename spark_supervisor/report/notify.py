"""systemd notify: READY, STATUS, WATCHDOG, RELOADING, STOPPING, EXTEND_TIMEOUT_USEC.

A no-op without NOTIFY_SOCKET. sdnotify encodes Latin-1 and drops what it cannot encode, so STATUS
is reduced to printable ASCII here. NOTIFY_SOCKET is removed from the environment so that nothing
the daemon starts can notify on its behalf.
"""

from __future__ import annotations

import os
import re
import time

import sdnotify

_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")


def ascii_status(text: str) -> str:
    return _UNPRINTABLE.sub("?", text.replace("\n", " "))[:200]


def monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class Notifier:
    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._n = sdnotify.SystemdNotifier(debug=False) if self.enabled else None
        os.environ.pop("NOTIFY_SOCKET", None)
        usec = os.environ.get("WATCHDOG_USEC", "")
        pid = os.environ.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and ours and self.enabled else 0.0
        self._last_watchdog = 0.0

    def send(self, *fields: str) -> None:
        if self._n is not None:
            self._n.notify("\n".join(fields))

    def status(self, text: str) -> None:
        self.send(f"STATUS={ascii_status(text)}")

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={ascii_status(status)}")

    def reloading(self) -> None:
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={ascii_status(status)}")

    def extend_timeout(self, seconds: float) -> None:
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def watchdog(self, now: float) -> None:
        """Called from the main loop only: a hung loop must stop the pings."""
        if self.watchdog_interval and now - self._last_watchdog >= self.watchdog_interval:
            self._last_watchdog = now
            self.send("WATCHDOG=1")
