"""The daemon's control socket (``<state_dir>/control.sock``, mode 0600): how `reset` and other commands
reach the running daemon. A socket in the daemon's own state directory cannot reach another process,
as a PID read from a file can after the daemon is gone and its PID reused.

Protocol: one request line (a command word), one JSON reply line. The server thread only records the
request and wakes the loop (as a signal handler would); the loop carries it out between ticks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

SOCKET = "control.sock"
COMMANDS = ("reset", "ping")


class Unavailable(Exception):
    pass


class ControlServer:
    def __init__(self, state_dir: str, on_request: Callable[[str], str]):
        self.path = Path(state_dir) / SOCKET
        self.on_request = on_request
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by a daemon that died; we hold the state dir's lock
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        self.sock.listen(4)
        self.thread = threading.Thread(target=self._serve, daemon=True, name="control")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    conn.settimeout(2)
                    line = conn.makefile("r", encoding="ascii", errors="replace").readline(64).strip()
                    if line in COMMANDS:
                        reply = {"ok": True, "message": self.on_request(line)}
                    else:
                        reply = {"ok": False, "message": f"unknown command {line[:20]!r}; known: {', '.join(COMMANDS)}"}
                    conn.sendall((json.dumps(reply) + "\n").encode())
                except OSError:
                    continue

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def request(state_dir: str, command: str, timeout: float = 5.0) -> str:
    """Send one command to the running daemon; Unavailable when none answers."""
    path = Path(state_dir) / SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(f"{command}\n".encode())
            reply = json.loads(s.makefile("r").readline() or "{}")
    except (OSError, ValueError) as e:
        raise Unavailable(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if not reply.get("ok"):
        raise Unavailable(str(reply.get("message") or "no reply"))
    return str(reply.get("message", ""))


def daemon_holds_lock(state_dir: str) -> bool:
    """True while a daemon holds the state directory's lock (it is released only when the process ends)."""
    try:
        fd = os.open(os.path.join(state_dir, "lock"), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: a daemon starting now is not turned away
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
