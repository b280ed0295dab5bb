"""Two records compared field by field (``diff``), and what a bad verdict says of them (``what_changed``):
the few facts that break a serve that worked, the users' reports say (a kernel update, a firmware reset, a
re-pulled image), named first. Pure.

A field unknown on either side is not a change (it was not read, nothing can be said of it); it is counted
apart. The outcome of a serve (how long each phase took, the record's own time) is not compared: only what
it ran on and what it came up with."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass
from typing import Any

from .build import UNKNOWN

# Not compared: the record's own bookkeeping, the decisions that led to it, the timings and measured figures.
_NOT_COMPARED = ("schema", "deployment", "at", "wall", "verdict", "good", "reason", "changed", "serve_id",
                 "decisions", "results.bringup_s", "results.load_s", "results.load_read", "results.performance")
_COMPARED = ("results.performance.verdict",)  # but for the verdict itself (ok, regression)
# What a bad verdict names first, in this order, by the path under a member (or at the top): label, pattern.
HINTED = (("kernel", "host.kernel"), ("driver", "gpu.driver"), ("firmware", "fabric.rdma.*.firmware"),
          ("image", "image.id"), ("vLLM", "image.vllm"), ("MTU", "fabric.mtu"), ("GID index", "fabric.rdma.*.gid_index"),
          ("model revision", "model.revision"))
SHOWN = 3  # items a hint names, then "and N more"
LEAD = "since the last good serve"
ABSENT = "(absent)"  # a field one record has and the other not


@dataclass(frozen=True)
class Change:
    path: str  # "nodes.spark-2.host.kernel", "model.revision"
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.path}: {self.old} → {self.new}"


def flatten(rec: dict[str, Any]) -> dict[str, str]:
    """path -> the value as text (an argv as a command line, other lists joined); the members as "members"."""
    out: dict[str, str] = {"members": ", ".join(rec.get("nodes") or {})}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            out[prefix] = shlex.join(map(str, value)) if prefix.endswith("argv") else ", ".join(map(str, value))
        else:
            out[prefix] = str(value) if value is not None else UNKNOWN
    walk("", rec)
    return out


def compared(path: str) -> bool:
    """Whether a field is of what the serve ran on or came up with (not of the record's bookkeeping)."""
    return path in _COMPARED or not any(path == p or path.startswith(p + ".") for p in _NOT_COMPARED)


def diff(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[Change], int]:
    """The fields that differ, in the newer record's order (then those only in the older), and how many were
    not compared because one side did not know them. A field on one side only is a change from or to
    ABSENT (a variable set since), but for a member on one side only: that is one change, of "members"."""
    a, b = flatten(old), flatten(new)
    both = set(old.get("nodes") or {}) & set(new.get("nodes") or {})
    changes, unknown = [], 0
    for path in [*b, *(p for p in a if p not in b)]:
        member = _member(path)
        if not compared(path) or (member and member not in both):
            continue
        was, now = _value(a, path), _value(b, path)
        if was == now:
            continue
        if UNKNOWN in (was, now):
            unknown += 1
        else:
            changes.append(Change(path, was, now))
    return changes, unknown


def _value(flat: dict[str, str], path: str) -> str:
    """A field's value; one a record lacks is UNKNOWN when a table above it was (its RDMA ports, when the
    host was not read), else ABSENT."""
    if path in flat:
        return flat[path]
    parts = path.split(".")
    return UNKNOWN if any(flat.get(".".join(parts[:i])) == UNKNOWN for i in range(1, len(parts))) else ABSENT


def _member(path: str) -> str:
    """The member a path is of ("" none): nodes.<member>.… and serve.fabric_env.<member>.…"""
    for head in ("nodes.", "serve.fabric_env."):
        if path.startswith(head) and path.count(".") > head.count("."):
            return path[len(head):].split(".", 1)[0]
    return ""


def short(value: str, cut: int = 60) -> str:
    """An image ID or digest cut to its first 12 hex digits; a value longer than ``cut`` cut (0: never)."""
    value = re.sub(r"sha256:([0-9a-f]{12})[0-9a-f]{52}", r"sha256:\1…", value)
    return value if not cut or len(value) <= cut else value[:cut - 1] + "…"


def _items(changes: list[Change], members: set[str]) -> list[str]:
    """The changes in a few words, the hinted fields first: one item per field and old → new, naming the
    members it is on unless it is all of them."""
    grouped: dict[tuple[int, str, str, str], list[str]] = {}
    for c in changes:
        node = _member(c.path) if c.path.startswith("nodes.") else ""
        leaf = c.path.split(".", 2)[2] if node else c.path
        rank, label = next(((i, lab) for i, (lab, pat) in enumerate(HINTED) if fnmatch.fnmatchcase(leaf, pat)),
                           (len(HINTED), leaf))
        grouped.setdefault((rank, label, c.old, c.new), []).append(node)
    out = []
    for (_, label, old, new), nodes in sorted(grouped.items(), key=lambda kv: kv[0][0]):
        on = "" if not any(nodes) or set(nodes) >= members else f" on {', '.join(sorted(set(nodes)))}"
        out.append(f"{label} {short(old)} → {short(new)}{on}")
    return out


def what_changed(last_good: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """A bad verdict's hint: what differs from the last good record, at most SHOWN items then "and N more";
    "" when there is no good record to compare with."""
    if last_good is None:
        return ""
    changes, _ = diff(last_good, now)
    items = _items(changes, set(now.get("nodes") or {}))
    if not items:
        return f"{LEAD} ({last_good.get('at', '?')}): nothing it records changed"
    more = f"; and {len(items) - SHOWN} more (spark-supervisor record --diff)" if len(items) > SHOWN else ""
    return f"{LEAD}: {'; '.join(items[:SHOWN])}{more}"
