"""Where a deployment's records are kept, in its state directory: ``records.jsonl``, the records made at
SERVING, one JSON object a line, oldest first, bounded by count (KEEP) and bytes (MAX_BYTES), written whole
and atomically (statefile.atomic_write) with the oldest dropped; and ``record-bad.json``, the facts as they
were when it last went FAILED or DEGRADED, with what changed (kept apart, so that a deployment failing over
and over never pushes its good records out).

Read back bounded (only the file's last MAX_BYTES), refusing anything but a regular file; a line that is not
a record of this deployment (damaged, cut, another's) is skipped with a problem said, never a crash, and the
file holding it is set aside (statefile.set_aside) at the next write."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base import files
from . import names, statefile

SCHEMA = 1  # the records this store reads; report.record.build writes this one
HISTORY = names.RECORDS
BAD = names.RECORD_BAD
KEEP = 50  # records kept
MAX_BYTES = 2 << 20  # the history file, at most
MAX_RECORD = 256 << 10  # one record, at most (a record is a few KiB)


@dataclass
class History:
    records: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    problems: list[str] = field(default_factory=list)

    @property
    def newest(self) -> dict[str, Any] | None:
        return self.records[-1] if self.records else None

    def good(self, before: int | None = None) -> list[dict[str, Any]]:
        """The good records (reached SERVING, no throughput regression), newest first; ``before``: only those
        older than the record at that index."""
        return [r for r in reversed(self.records[:before]) if r.get("good") is True]


def problem(rec: object, deployment: str) -> str:
    """Why ``rec`` is not a record of ``deployment`` ("": it is one)."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    if rec.get("schema") != SCHEMA:
        return f"schema {rec.get('schema')!r}, not {SCHEMA}"
    if rec.get("deployment") != deployment:
        return f"of deployment {rec.get('deployment')!r}"
    if not isinstance(rec.get("nodes"), dict) or not isinstance(rec.get("at"), str):
        return "no nodes or time"
    if not isinstance(rec.get("decisions", []), list):
        return "its decisions are not a list"
    wall = rec.get("wall")
    return "" if isinstance(wall, int | float) and not isinstance(wall, bool) else "no time"


def read(state_dir: str, deployment: str) -> History:
    """The history of ``deployment`` in ``state_dir`` (empty when there is none yet)."""
    path = Path(state_dir) / HISTORY
    try:
        data = files.read_tail(path, MAX_BYTES + 1)
    except FileNotFoundError:
        return History()
    except OSError as e:
        return History(problems=[f"{path}: {e}"])
    out = History()
    if len(data) > MAX_BYTES:  # written bigger by someone else: its last MAX_BYTES, from a whole line
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        out.problems.append(f"{path} is larger than {MAX_BYTES} bytes: only its end was read")
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line) if len(line) <= MAX_RECORD else None
            why = problem(rec, deployment) if rec is not None else f"longer than {MAX_RECORD} bytes"
        except ValueError as e:
            rec, why = None, f"not JSON ({e})"
        except RecursionError:  # nested deeper than the parser goes: no record of ours is
            rec, why = None, "nested too deeply to be a record"
        if why or not isinstance(rec, dict):
            out.problems.append(f"{path} line {n}: skipped: {why}")
        else:
            out.records.append(rec)
    return out


def _write(state_dir: str, h: History, wall: float) -> None:
    """The history written whole, bounded: the oldest records dropped first. A file that held lines that were
    not records is set aside first (kept for a look)."""
    path = Path(state_dir) / HISTORY
    if h.problems and path.exists():
        statefile.set_aside(path, "not all records", wall, "its records are kept in a new file")
    lines = [json.dumps(r, separators=(",", ":"), sort_keys=False) for r in h.records][-KEEP:]
    while len(lines) > 1 and sum(len(x) + 1 for x in lines) > MAX_BYTES:
        lines.pop(0)
    statefile.atomic_write(path, "".join(f"{x}\n" for x in lines), 0o600)


def append(state_dir: str, rec: dict[str, Any], wall: float) -> History:
    """Add a record (ValueError: bigger than MAX_RECORD; OSError: not written); the history as written."""
    if len(json.dumps(rec)) > MAX_RECORD:
        raise ValueError(f"a record of {len(json.dumps(rec))} bytes, over {MAX_RECORD}")
    h = read(state_dir, str(rec["deployment"]))
    h.records.append(rec)
    _write(state_dir, h, wall)
    h.records = h.records[-KEEP:]
    return h


def amend(state_dir: str, deployment: str, serve_id: str, update: dict[str, Any], wall: float) -> bool:
    """Update the newest record, when it is of ``serve_id`` (a figure measured after the record was made);
    True when written."""
    h = read(state_dir, deployment)
    rec = h.newest
    if rec is None or not serve_id or rec.get("serve_id") != serve_id:
        return False
    h.records[-1] = {**rec, **update}
    _write(state_dir, h, wall)
    return True


def write_bad(state_dir: str, rec: dict[str, Any]) -> None:
    statefile.atomic_write(Path(state_dir) / BAD, json.dumps(rec, indent=1), 0o600)


def read_bad(state_dir: str, deployment: str) -> tuple[dict[str, Any] | None, str]:
    """The facts at the last bad verdict (None: none), and what was wrong with the file."""
    path = Path(state_dir) / BAD
    try:
        rec = json.loads(files.read_bytes(path, MAX_RECORD, follow_links=False))
    except FileNotFoundError:
        return None, ""
    except (OSError, ValueError) as e:
        return None, f"{path}: skipped: {e}"
    why = problem(rec, deployment)
    return (None, f"{path}: skipped: {why}") if why else (rec, "")


@dataclass
class Latest:
    """What `record` shows: the facts at the last bad verdict when newer than the last record (what runs, or
    failed to, now), else the last record; and the good records before it, newest first."""

    history: History
    current: dict[str, Any] | None
    bad: bool  # current is the facts at the last bad verdict
    problems: list[str]

    @property
    def good(self) -> list[dict[str, Any]]:
        return self.history.good(None if self.bad else len(self.history.records) - 1)


def latest(state_dir: str, deployment: str) -> Latest:
    h = read(state_dir, deployment)
    bad, why = read_bad(state_dir, deployment)
    newer = bad is not None and (h.newest is None or bad["wall"] > h.newest["wall"])
    return Latest(h, bad if newer else h.newest, newer, [*h.problems, *([why] if why else [])])
