"""`spark-supervisor report --capture`: a tar.gz of exactly what the daemon's parsers read on each node
(world/capture.py reads it), each file redacted with its format kept (pseudonyms.py), and a manifest
(manifest.json: node, deployment, format, the parser that reads it, the command, its exit code, when, its size,
whether it was cut, whether it parsed back after redaction, the supervisor's version). An owner sends it; each
file becomes a contract fixture (tests/fixtures/formats/, read by tests/unit/test_capture_contract.py)."""

from __future__ import annotations

import json
import os
import re
import secrets as tokens
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from ... import version
from ...base import redaction
from ...config import Config, known_secrets
from ...world import capture
from .bundle import deliver
from .pseudonyms import Pseudonyms

MANIFEST = "manifest.json"
_NCCL_HOST = re.compile(r"([\w.-]+):\d+:\d+ \[\d+\] NCCL INFO")  # "<host>:<pid>:<tid> [<dev>] NCCL INFO"


def _target_host(target: str) -> tuple[str, str]:
    """(user, host) of an SSH target or a Docker URL (ssh://user@host:port, tcp://host:port, user@host)."""
    rest = target.partition("://")[2] if "://" in target else target
    rest = rest.split("/", 1)[0]
    user, _, host = rest.rpartition("@")
    if host.startswith("["):
        return user, host[1:].partition("]")[0]
    return user, host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def pseudonyms(cfg: Config, found: Iterable[capture.Captured], key: bytes) -> Pseudonyms:
    """The bundle's pseudonyms, seeded with every name the config and the captured files give a node."""
    hosts, users = [], []
    for node in cfg.nodes:
        hosts.append(node.name)
        for target in (node.ssh, node.docker):
            if target and target != "local" and not target.startswith("unix:"):  # a local engine names no host
                user, host = _target_host(target)
                hosts.append(host)
                users.append(user)
    for c in found:
        text = c.data.decode(errors="replace")
        if c.format == "host-facts":
            hosts += [ln.partition(":")[2] for ln in text.splitlines() if ln.startswith("hostname:")]
        elif c.format == "nccl":
            hosts += _NCCL_HOST.findall(text)
        elif c.format == "ray-nodes":
            hosts += re.findall(r'"node_name":\s*"([^"]+)"', text)
    return Pseudonyms(key, hosts, [u for u in users if u])


def collect(cfg: Config, found: list[capture.Captured], key: bytes) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The bundle's members (name, redacted content) and the manifest in them; what could not be captured."""
    p = pseudonyms(cfg, found, key)
    secrets = known_secrets(cfg, os.environ)
    members: list[tuple[str, bytes]] = []
    entries: list[dict[str, object]] = []
    problems: list[str] = []
    for c in sorted(found, key=lambda c: (c.deployment, c.node, c.format)):
        node = p.text(c.node)
        where = f"{c.deployment}/{node}" if c.deployment else node
        name = f"{where}/{capture.FORMATS[c.format].file}"
        data = redaction.scrub(p.text(c.data.decode("utf-8", errors="backslashreplace")), secrets).encode()
        entry = capture.manifest_entry(c, name)
        entry.update(node=node, command=[redaction.scrub(p.text(a), secrets) for a in c.command],
                     error=redaction.scrub(p.text(c.error), secrets), bytes=len(data))
        if c.error or c.rc != 0:
            problems.append(f"{where}: {c.format}: {entry['error'] or ('not read' if c.rc is None else f'exit {c.rc}')}")
        if c.data:
            try:
                capture.read_back(c.format, data)
                entry["parses"] = True
            except Exception as e:  # any parser's complaint is the manifest's to say, never the bundle's end
                entry["parses"], entry["parse_error"] = False, p.text(f"{type(e).__name__}: {e}")[:300]
            members.append((name, data))
        entries.append(entry)
    doc = {"supervisor": version(), "made": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "files": entries}
    members.insert(0, (MANIFEST, json.dumps(doc, indent=1).encode()))
    return members, problems


README = """spark-supervisor report --capture, {stamp}: exactly what the supervisor's parsers read on each node, one
file each, with manifest.json saying which node, command, exit code, time and parser (docs/operator-guide.md,
"Send us your Spark's formats"). Redacted with the format kept: IPv4/IPv6 addresses and RoCE GIDs (prefix-
preserving), MAC addresses, UUIDs, the machine ID, the GPU serial, hostnames, SSH users and /home/<user> are
replaced by pseudonyms, the same value by the same pseudonym throughout this bundle; known secrets removed.
"""


def write(cfg: Config, out: str, now: float, key: bytes | None = None) -> tuple[Path, list[str], int, list[str]]:
    """Capture and write the bundle (at ``out``, or in <state_dir>/reports/); its path, members, size and what
    could not be captured."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    members, problems = collect(cfg, capture.capture(cfg), key or tokens.token_bytes(32))
    members.insert(0, ("README.txt", (README.format(stamp=stamp) + "".join(f"not captured: {x}\n" for x in problems))
                       .encode()))
    return (*deliver(cfg, out, f"spark-supervisor-capture-{stamp}", members, now), problems)
