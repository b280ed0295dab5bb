"""The daemon's state directory and its files: the status file (its document is statusdoc's), the repair
log, the pause, the small JSON records; every write atomic, every read bounded and refusing special files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import tenacity

from ..base import files
from ..model import Pause
from ..model.document import StatusDoc
from . import names

FILE = names.STATUS
STATUS_REFRESH_S = 30.0  # the daemon writes its status at least this often, changed or not (loop.reporting)
STATUS_STALE_S = 4 * STATUS_REFRESH_S  # older than this from a running daemon: it cannot write it, or is stuck


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds") if wall else ""


def atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write, fsync, rename, fsync the directory: after a crash or power cut the file is the old one or
    the new one, never half of either. Nothing planted is followed: the directory is opened without
    following a link and must be the daemon's own, the temporary file is created there anew, and the rename
    replaces whatever has the name (a link is replaced, not written through)."""
    make_dirs(path.parent)
    dfd = _open_own_dir(path.parent)
    try:
        tmp = f".{path.name}.{secrets.token_hex(6)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.rename(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        os.fsync(dfd)
    finally:
        os.close(dfd)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """Create the missing directories of ``path`` with ``mode`` whatever the umask (a group-writable
    state directory would be refused by the daemon itself)."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, mode)
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)


def _open_own_dir(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise files.Refused(str(path), "is a symbolic link or not a directory: the state directory "
                                "must be the daemon's own") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise files.Refused(str(path), _dir_problem(st, {os.geteuid()}) or "is not the daemon's own")
    return fd


STATE_FILES = names.REGULAR


def _dir_problem(st: os.stat_result, owners: set[int]) -> str:
    if st.st_uid not in owners:
        return f"is owned by uid {st.st_uid}, not by the daemon's user (uid {', '.join(map(str, sorted(owners)))})"
    if st.st_mode & 0o022:
        return f"is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod go-w it"
    return ""


def check_state_dir(path: str, owners: set[int] | None = None) -> list[str]:
    """Why ``path`` cannot be the daemon's state directory (nothing: it can): it must be the daemon's own
    (owned by ``owners``, by default this process's effective user; not writable by group or others; not
    a symbolic link), its state files regular files, and no one else able to replace it (every directory
    above it owned by root or the daemon's user, and not writable by others unless sticky, as /tmp is).
    A directory that does not exist yet is judged by where the daemon would create it."""
    owners = {os.geteuid()} if owners is None else owners
    p = Path(os.path.abspath(path))
    problems: list[str] = []
    here = p
    while not os.path.lexists(here):  # created by the daemon below its nearest existing ancestor
        here = here.parent
    if here == p:
        problems += _check_own_dir(p, owners)
        subs = p / "deployments"
        if not problems and os.path.lexists(subs):
            problems += _check_own_dir(subs, owners)
            if not problems:
                for d in sorted(subs.iterdir()):
                    problems += _check_own_dir(d, owners)
        here = p.parent
    for anc in (here, *here.parents):
        try:
            st = os.stat(anc)
        except OSError as e:
            problems.append(f"{anc}: cannot be examined: {e.strerror}")
            continue
        if not stat.S_ISDIR(st.st_mode):
            problems.append(f"{anc}: is not a directory")
        elif st.st_uid not in owners | {0}:
            problems.append(f"{anc}: is owned by uid {st.st_uid}, who could replace the state directory {p} below it")
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problems.append(f"{anc}: is writable by its group or by others (mode {stat.S_IMODE(st.st_mode):04o}): "
                            f"they could replace the state directory {p} below it")
    return problems


def _check_own_dir(d: Path, owners: set[int]) -> list[str]:
    st = os.lstat(d)
    if stat.S_ISLNK(st.st_mode):
        return [f"{d}: is a symbolic link (to {os.readlink(d)}): the state directory must be the daemon's own "
                "directory, not a link"]
    if not stat.S_ISDIR(st.st_mode):
        return [f"{d}: is not a directory"]
    if why := _dir_problem(st, owners):
        return [f"{d}: {why}"]
    out = []
    for name in STATE_FILES:
        with contextlib.suppress(FileNotFoundError):
            f = os.lstat(d / name)
            if not stat.S_ISREG(f.st_mode):
                out.append(f"{d / name}: is {files._kind(f.st_mode)}, not a regular file: remove it")
    return out


# A state write that fails (disk full, read-only remount) is retried a few times at once, then shown.
_write_retry = tenacity.retry(retry=tenacity.retry_if_exception_type(OSError), stop=tenacity.stop_after_attempt(3),
                              wait=tenacity.wait_random_exponential(multiplier=0.05, max=0.5), reraise=True)


def write(state_dir: str, doc: StatusDoc) -> None:
    """Atomically replace the status file (readers never see half a document). Compact: json's C encoder
    (an indent takes the pure-Python one, ten times the CPU); `status --json` prints it indented."""
    _write_retry(atomic_write)(Path(state_dir) / FILE, json.dumps(doc, separators=(",", ":")))


# The biggest state file read: a status document with several deployments' histories is far smaller.
MAX_STATE_BYTES = 16 << 20


def read_state(path: Path) -> bytes:
    """A state file's bytes: a regular file (no link, FIFO or device), at most MAX_STATE_BYTES."""
    return files.read_bytes(path, MAX_STATE_BYTES, follow_links=False)


def read_json(state_dir: str, name: str) -> dict[str, Any]:
    """A small state document; {} when missing or not a JSON object (it is only a record of bests)."""
    try:
        doc = json.loads(read_state(Path(state_dir) / name))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_json(state_dir: str, name: str, doc: Mapping[str, object]) -> None:
    _write_retry(atomic_write)(Path(state_dir) / name, json.dumps(doc, indent=1))


# What the checks of each node found, in one file: its image's (by the image's ID and the spec's key, while
# both stay the same) and its model's (by the model's key: when its last check found it complete).
NODES = names.NODES
_nodes_lock = threading.Lock()  # the nodes are checked at once


def read_node(state_dir: str, node: str) -> dict[str, Any]:
    """A node's entry in the findings file ({}: none, or not an object)."""
    entry = read_json(state_dir, NODES).get(node)
    return entry if isinstance(entry, dict) else {}


def edit_node(state_dir: str, node: str, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A node's findings made ``edit(what the file holds now)``, read and written under one lock, so that what
    one writer did not touch is kept (the image's check and the model's are written apart, and the change's
    proof keeps findings of its own); not written when nothing changed. OSError when it cannot be written."""
    with _nodes_lock:
        doc = read_json(state_dir, NODES)
        entry = doc.get(node)
        was: dict[str, Any] = entry if isinstance(entry, dict) else {}
        now = edit(dict(was))
        if now != was:
            write_json(state_dir, NODES, {**doc, node: now})


def update_node(state_dir: str, node: str, **fields: object) -> None:
    """Some fields of a node's findings replaced, the others kept (edit_node)."""
    edit_node(state_dir, node, lambda was: {**was, **fields})


PAUSE = names.PAUSE


def load_pause(state_dir: str, wall: float | None = None) -> tuple[Pause | None, str]:
    """The saved pause (None: none), and what was wrong with the file: one that cannot be read or is not a
    valid pause (a time that is not finite, a deadline too far) is moved aside, as repairs.json is."""
    path = Path(state_dir) / PAUSE
    try:
        raw = read_state(path)
    except FileNotFoundError:
        return None, ""
    except OSError as e:
        return None, set_aside(path, f"unreadable ({e})", wall, "no pause is kept")
    try:
        pause = Pause.from_json(json.loads(raw))
    except ValueError:
        pause = None
    if pause is None:
        return None, set_aside(path, "not a valid pause {by, reason, at, until}", wall, "no pause is kept")
    return pause, ""


def read_pause(state_dir: str) -> Pause | None:
    return load_pause(state_dir)[0]


def write_pause(state_dir: str, pause: Pause | None) -> None:
    """Keep (or, with None, forget) the pause; OSError when it cannot."""
    if pause is not None:
        write_json(state_dir, PAUSE, pause.to_json())
        return
    try:
        (Path(state_dir) / PAUSE).unlink()
    except FileNotFoundError:
        pass


def read(state_dir: str) -> StatusDoc:
    """The status file's document; ValueError when it is not a JSON object. Its keys are the writer's as far
    as that daemon's version had them: a reader still guards against a document from another version."""
    doc = json.loads(read_state(Path(state_dir) / FILE))
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return cast(StatusDoc, doc)


def set_aside(path: Path, why: str, wall: float | None, then: str) -> str:
    """Move a state file that cannot be used to ``<name>.bad-<time>`` (kept for a look, never read
    again); the problem, in words."""
    stamp = datetime.fromtimestamp(wall if wall is not None else time.time(), UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.bad-{stamp}")
    try:
        os.replace(path, aside)
        return f"{path} was {why}; moved aside to {aside.name}, {then}"
    except OSError as e:
        return f"{path} is {why} and cannot be moved aside ({e.strerror}); ignored, {then}"


def _valid_entries(raw: object) -> list[dict[str, Any]] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for e in raw:
        if not isinstance(e, dict) or not isinstance(e.get("at"), int | float) or isinstance(e.get("at"), bool):
            return None
        if not math.isfinite(e["at"]):
            return None
        out.append(e)
    return out


class RepairLog:
    """Repairs with their wall-clock times, persisted so the budget survives restarts and reboots.

    A file of the wrong shape is moved aside (``repairs.json.bad-<time>``) and the log starts empty;
    ``problem`` says so until the next successful write. A failed write keeps the entries in memory,
    is retried on the next change, and stays in ``problem`` (shown in status) until it succeeds."""

    FILE = names.REPAIRS

    def __init__(self, state_dir: str, wall: float | None = None):
        self.path = Path(state_dir) / self.FILE
        self.problem = ""
        self.entries: list[dict[str, Any]] = []
        try:
            text = read_state(self.path).decode()
        except FileNotFoundError:
            return
        except (OSError, UnicodeDecodeError) as e:
            self.problem = set_aside(self.path, f"unreadable ({e})", wall, "the repair budget starts empty")
            return
        try:
            entries = _valid_entries(json.loads(text))
        except ValueError:
            entries = None
        if entries is None:
            self.problem = set_aside(self.path, "not a list of {at, kind, reason} entries", wall,
                                     "the repair budget starts empty")
        else:
            self.entries = entries

    def recent(self, now_wall: float, window: float) -> list[dict[str, Any]]:
        # Entries from the future (a clock set back) are not counted: they would block repairs for hours.
        return [e for e in self.entries if 0 <= now_wall - float(e["at"]) < window]

    def add(self, now_wall: float, kind: str, reason: str) -> None:
        self.entries = [*self.entries[-99:], {"at": now_wall, "when": iso(now_wall), "kind": kind, "reason": reason}]
        self._save()

    def clear(self) -> None:
        self.entries = []
        self._save()

    def _save(self) -> None:
        try:
            _write_retry(atomic_write)(self.path, json.dumps(self.entries, indent=1))
            self.problem = ""
        except OSError as e:
            self.problem = f"cannot write {self.path}: {e.strerror or e}; the repair budget lives in memory only"
