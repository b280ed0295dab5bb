"""A record as a person reads it (`spark-supervisor record`): grouped, aligned, short; a value the members
share said once, one that differs said per member. And a diff as `path: old → new` lines. Pure."""

from __future__ import annotations

import shlex
from typing import Any

from .diff import Change, short

WIDTH = 22  # the label column


def _line(label: str, value: str, indent: int = 2) -> str:
    return f"{' ' * indent}{label:<{WIDTH - indent}} {value}"


def _said(value: object, sep: str = " ") -> str:
    """A value in a few words: a table as "key value, ..." (``sep`` between them), a list joined ("-": empty)."""
    if isinstance(value, dict):
        return ", ".join(f"{k}{sep}{_said(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return short(str(value), 0)


def _facts(facts: dict[str, Any]) -> dict[str, str]:
    """One member's facts as "section.label" -> words; a table in it (the fabric's RDMA ports) a line each."""
    out: dict[str, str] = {}
    for part, body in facts.items():
        for key, value in (body.items() if isinstance(body, dict) else [("", body)]):
            for sub, said in (value.items() if isinstance(value, dict) else [("", value)]):
                out[f"{part}.{key} {sub}".rstrip()] = _said(said)
    return out


def _members(nodes: dict[str, Any], image: str) -> list[str]:
    """The members' facts, section by section, a value they share said once, one that differs per member."""
    per = {name: _facts(facts) for name, facts in nodes.items() if isinstance(facts, dict)}
    out = [_line("members", " · ".join(per), 0)]
    section = ""
    for path in dict.fromkeys(p for f in per.values() for p in f):
        part, _, label = path.partition(".")
        if part != section:
            section = part
            out.append(_line(part, image, 0) if part == "image" else part)
        values = {name: f.get(path, "unknown") for name, f in per.items()}
        said = (next(iter(values.values())) if len(set(values.values())) == 1
                else " · ".join(f"{v} ({name})" for name, v in values.items()))
        out.append(_line(label, said))
    return out


def _section(name: str, body: dict[str, Any]) -> list[str]:
    """A part of the record; a table of tables a line each (the fabric's variables per member, as NAME=value),
    the argv as a command line."""
    out = [name]
    for key, value in body.items():
        if isinstance(value, dict) and any(isinstance(v, dict) for v in value.values()):
            out += [_line(f"{key} {k}", _said(v, "=" if key.endswith("env") else " ")) for k, v in value.items()]
        elif key == "argv" and isinstance(value, list):
            out.append(_line(key, shlex.join(map(str, value))))
        else:
            out.append(_line(key, _said(value)))
    return out


def render(rec: dict[str, Any], where: str = "") -> str:
    """The record for a person."""
    lines = [f"{rec.get('deployment')}: {rec.get('verdict')} at {rec.get('at')}" + (f" ({where})" if where else "")]
    for key in ("reason", "changed"):
        if rec.get(key):
            lines.append(_line(key, str(rec[key]), 0))
    lines += _members(rec.get("nodes") or {}, str(rec.get("image", "")))
    for name in ("model", "serve", "results"):
        if isinstance(rec.get(name), dict):
            lines += _section(name, rec[name])
    decided = [d for d in rec.get("decisions") or [] if isinstance(d, dict)]
    lines.append("decisions since the record before" + ("" if decided else ": none"))
    lines += [f"  {d.get('at')} {d.get('what')}: {d.get('reason')}" for d in decided]
    return "\n".join(lines)


def render_diff(changes: list[Change], unknown: int, old: dict[str, Any], new: dict[str, Any]) -> str:
    """`path: old → new` per field, or "no change"."""
    lines = [f"{new.get('deployment')}: {new.get('verdict')} at {new.get('at')} against the good record of {old.get('at')}"]
    lines += [f"{c.path}: {short(c.old, 0)} → {short(c.new, 0)}" for c in changes] or ["no change"]
    if unknown:
        lines.append(f"({unknown} field{'' if unknown == 1 else 's'} unknown on one side, not compared)")
    return "\n".join(lines)
