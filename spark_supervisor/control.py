"""The daemon's control socket (``<state_dir>/control.sock``, mode 0600): how `reset` and other commands
reach the running daemon. A socket in the daemon's own state directory cannot reach another process,
as a PID read from a file can after the daemon is gone and its PID reused.

Protocol: one request line (a command word, or a JSON object {"command": ..., ...arguments}), one JSON
reply line. The server thread only records the request and wakes the loop (as a signal handler would);
the loop carries it out between ticks. Who asked is read from the socket (SO_PEERCRED), not taken from
the request: a pause records it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path

SOCKET = "control.sock"
COMMANDS = ("reset", "ping", "pause", "resume")


class Unavailable(Exception):
    pass


class ControlServer:
    def __init__(self, state_dir: str, on_request: Callable[[str, dict[str, object]], str]):
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
                    line = conn.makefile("r", encoding="utf-8", errors="replace").readline(4096).strip()
                    command, args = parse_request(line)
                    if command in COMMANDS:
                        args["by"] = _peer(conn, str(args.get("by") or ""))
                        reply = {"ok": True, "message": self.on_request(command, args)}
                    else:
                        reply = {"ok": False, "message": f"unknown command {command[:20]!r}; known: "
                                 f"{', '.join(COMMANDS)}"}
                except (TimeoutError, ValueError) as e:
                    reply = {"ok": False, "message": str(e)}
                except OSError:
                    continue
                try:
                    conn.sendall((json.dumps(reply) + "\n").encode())
                except OSError:
                    continue

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def parse_request(line: str) -> tuple[str, dict[str, object]]:
    """A request line: a bare command word, or a JSON object with "command" and its arguments."""
    if not line.startswith("{"):
        return line, {}
    try:
        doc = json.loads(line)
    except ValueError:
        raise ValueError("a request that starts with '{' must be one JSON object") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("command"), str):
        raise ValueError('a JSON request needs "command"')
    command = doc.pop("command")
    return command, doc


def _peer(conn: socket.socket, claimed: str) -> str:
    """Who is on the other end: the user the kernel says (and the one sudo says, when given), and the pid."""
    try:
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = f"uid {uid}"
    except OSError:
        return claimed or "?"
    who = f"{claimed} (as {user})" if claimed and claimed != user else user
    return f"{who}, pid {pid}"


def request(state_dir: str, command: str, timeout: float = 5.0, **args: object) -> str:
    """Send one command (with its arguments) to the running daemon; Unavailable when none answers."""
    path = Path(state_dir) / SOCKET
    line = json.dumps({"command": command, **args}) if args else command
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(path))
            s.sendall(f"{line}\n".encode())
            reply = json.loads(s.makefile("r").readline() or "{}")
    except (OSError, ValueError) as e:
        raise Unavailable(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if not reply.get("ok"):
        raise Unavailable(str(reply.get("message") or "no reply"))
    return str(reply.get("message", ""))


class NotAnswering(Exception):
    """A daemon holds the state directory but its control socket does not answer: change nothing."""


def ask(state_dir: str, command: str, timeout: float = 5.0, **args: object) -> str | None:
    """The running daemon's answer; None when no daemon runs (the caller may then act on disk)."""
    try:
        return request(state_dir, command, timeout, **args)
    except Unavailable as e:
        if daemon_holds_lock(state_dir):
            raise NotAnswering(f"a spark-supervisor holds {state_dir}/lock but its control socket does not "
                               f"answer ({e}); nothing was changed") from None
    return None


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
