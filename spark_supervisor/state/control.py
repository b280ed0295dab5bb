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
import time
from collections.abc import Callable
from pathlib import Path

from ..base import files
from . import names

SOCKET = names.SOCKET
# Each command's arguments and the types each may have ("by", who asks, is every command's). A request with
# another argument, or one of another type ("serve_only": "false" is not false), is refused, never guessed at.
ARGUMENTS: dict[str, dict[str, tuple[type, ...]]] = {
    "reset": {}, "ping": {}, "resume": {},
    "pause": {"reason": (str,), "until": (int, float, type(None))},
    "restart": {"deployment": (str,), "serve_only": (bool,)},
}
COMMANDS = tuple(ARGUMENTS)


class Unavailable(Exception):
    """No daemon answered: the request did not reach one (nothing was changed by it)."""


class NoAnswer(Unavailable):
    """The request was sent but no answer came: it may have been carried out."""


class Refused(Exception):
    """The daemon answered with an error: it did not carry out the request (its message says why)."""


class ControlServer:
    """Each connection in its own short-lived thread (at most MAX_CONNECTIONS at once; more are answered
    "busy"), its request line read within READ_DEADLINE_S in all (not per read) and at most MAX_LINE bytes:
    a client that dribbles bytes or never sends a line blocks no one but itself."""

    MAX_CONNECTIONS = 8
    READ_DEADLINE_S = 2.0
    SEND_TIMEOUT_S = 2.0
    MAX_LINE = 4096

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
        self.sock.listen(16)
        self._slots = threading.BoundedSemaphore(self.MAX_CONNECTIONS)
        self.thread = threading.Thread(target=self._serve, daemon=True, name="control")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                _reply(conn, {"ok": False, "message": f"busy: {self.MAX_CONNECTIONS} requests under way; try again"},
                       0.2)
                conn.close()
                continue
            try:
                threading.Thread(target=self._one, args=(conn,), daemon=True, name="control-request").start()
            except RuntimeError:  # no thread to be had: answered as busy, the server goes on
                self._slots.release()
                conn.close()

    def _one(self, conn: socket.socket) -> None:
        try:
            with conn:
                try:
                    command, args = parse_request(self._read_line(conn))
                    if command in COMMANDS:
                        args["by"] = _peer(conn, str(args.get("by") or ""))
                        reply = {"ok": True, "message": self.on_request(command, args)}
                    else:
                        reply = {"ok": False, "message": f"unknown command {command[:20]!r}; known: "
                                 f"{', '.join(COMMANDS)}"}
                except (TimeoutError, ValueError) as e:
                    reply = {"ok": False, "message": str(e)}
                except OSError:
                    return  # the client went away
                except Exception as e:  # a bug: answered, and the server goes on
                    reply = {"ok": False, "message": f"the daemon failed on this request ({type(e).__name__}: {e})"}
                _reply(conn, reply, self.SEND_TIMEOUT_S)
        finally:
            self._slots.release()

    def _read_line(self, conn: socket.socket) -> str:
        deadline = time.monotonic() + self.READ_DEADLINE_S
        got = b""
        while b"\n" not in got:
            if len(got) > self.MAX_LINE:
                raise ValueError(f"a request line is at most {self.MAX_LINE} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete request line within {self.READ_DEADLINE_S:g}s")
            conn.settimeout(left)
            try:
                chunk = conn.recv(self.MAX_LINE + 1 - len(got))
            except TimeoutError:
                raise TimeoutError(f"no complete request line within {self.READ_DEADLINE_S:g}s") from None
            if not chunk:
                break
            got += chunk
        line = got.split(b"\n", 1)[0]
        if len(line) > self.MAX_LINE:
            raise ValueError(f"a request line is at most {self.MAX_LINE} bytes")
        return line.decode("utf-8", errors="replace").strip()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def _reply(conn: socket.socket, reply: dict[str, object], timeout: float) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(timeout)
        conn.sendall((json.dumps(reply) + "\n").encode())


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
    known = {**ARGUMENTS.get(command, {}), "by": (str,)}
    for key, value in doc.items():
        kinds = known.get(key)
        if kinds is None:
            raise ValueError(f"{command[:20]!r} takes no argument {key[:40]!r} (it takes: {', '.join(sorted(known))})")
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
            raise ValueError(f"{command}'s {key!r} must be {names}, not {type(value).__name__} ({str(value)[:20]!r})")
    return command, doc


def _peer(conn: socket.socket, claimed: str) -> str:
    """Who is on the other end: the user the kernel says (and the one sudo says, when given), and the pid."""
    claimed = claimed[:64]
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
    """Send one command (with its arguments) to the running daemon and return its answer. Unavailable when
    none could be reached (nothing was sent), NoAnswer when it was sent but no answer came (it may have been
    carried out), Refused when the daemon answered with an error."""
    path = Path(state_dir) / SOCKET
    line = json.dumps({"command": command, **args}) if args else command
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(str(path))
        except PermissionError:
            raise Denied(f"permission denied on {path}: only the daemon's own user may ask it (run this as that "
                         "user: sudo); nothing was changed") from None
        except OSError as e:
            raise Unavailable(f"{path}: {e.strerror or e}") from None
        try:
            s.sendall(f"{line}\n".encode())
            text = s.makefile("r", encoding="utf-8", errors="replace").readline(1 << 20)
        except OSError as e:
            raise NoAnswer(f"{path}: {e.strerror or e}") from None
    try:
        reply = json.loads(text)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise NoAnswer(f"{path}: {'no answer' if not text else 'an answer that is not a JSON object'}")
    if not reply.get("ok"):
        raise Refused(str(reply.get("message") or "refused, without a reason"))
    return str(reply.get("message", ""))


class NotAnswering(Exception):
    """A daemon holds the state directory but its control socket does not answer: change nothing."""


class Denied(NotAnswering):
    """The caller may not use the control socket (not the daemon's user): nothing was sent, nothing changed."""


def ask(state_dir: str, command: str, timeout: float = 5.0, **args: object) -> str | None:
    """The running daemon's answer; None when no daemon runs (the caller may then act on disk).
    Refused when it answered with an error; NotAnswering when one holds the state directory but no answer
    came (saying whether the request may have been carried out)."""
    try:
        return request(state_dir, command, timeout, **args)
    except Unavailable as e:
        try:
            held = daemon_holds_lock(state_dir)
        except OSError as lock_error:
            raise NotAnswering(f"cannot tell whether a spark-supervisor holds {state_dir}/lock ({lock_error}) and "
                               f"its control socket does not answer ({e}); nothing was changed here") from None
        if held and isinstance(e, NoAnswer):
            raise NotAnswering(f"the {command} was sent to the spark-supervisor holding {state_dir}/lock but no "
                               f"answer came ({e}): it may have been carried out; see `spark-supervisor status`") from None
        if held:
            raise NotAnswering(f"a spark-supervisor holds {state_dir}/lock but its control socket does not "
                               f"answer ({e}); nothing was changed") from None
    return None


def daemon_holds_lock(state_dir: str) -> bool:
    """True while a daemon holds the state directory's lock (it is released only when the process ends).
    OSError (files.Refused) when the lock is a link or not a regular file."""
    try:
        fd = files.open_regular(os.path.join(state_dir, names.LOCK), follow_links=False)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: a daemon starting now is not turned away
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
