"""`copy-model`, judged: what a node's model directory holds (specs.modelcopy.LIST's listing), what a copy
from the head must send, how long it may take, and whether what arrived is the head's. Pure.

What is checked: every file's size, after the links are followed, against the head's; and, for each file that
on the head is a link into a hub cache's ``blobs/`` under a 64-hex name, its sha256 against that name (the hub
names a Git LFS file's blob by its content's sha256: the weights). Not checked by content: small files the hub
keeps in Git (config, tokenizer; their blob is named by a Git SHA-1) and the files of a plain directory (no
name to check against): by size only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .modelcheck import size_text

SHA256 = re.compile(r"[0-9a-f]{64}")
MIN_RATE = 50e6  # bytes/s: the slowest a copy may average before its deadline (a disk or a 1 GbE link)
FIXED_S = 120.0  # connection, the listing, the renames: what does not scale with the bytes
HASH_RATE = 200e6  # bytes/s: the slowest sha256sum may read back (one core of a GB10 does several times that)


@dataclass(frozen=True)
class Entry:
    """One entry of a directory, links followed: kind "f" a file, "d" a directory, "l" a dangling link."""

    kind: str
    size: int
    link: str = ""  # where it links to ("": not a link)

    @property
    def sha256(self) -> str:
        """The content's sha256 when it is a link to a hub blob named by one, else ""."""
        parent, _, name = self.link.rpartition("/")
        return name if SHA256.fullmatch(name) and parent.rpartition("/")[2] == "blobs" else ""


class ListingError(ValueError):
    """The listing is not what LIST prints."""


def parse_listing(out: str) -> dict[str, Entry]:
    """LIST's NUL-separated output: each path under the directory and its entry."""
    fields = out.split("\0")
    if fields and fields[-1] == "":
        fields.pop()
    found: dict[str, tuple[str, int]] = {}
    links: dict[str, str] = {}
    i = 0
    while i < len(fields):
        tag = fields[i]
        try:
            if tag == "F":
                kind, path, size = fields[i + 1], fields[i + 2], int(fields[i + 3])
                found[path] = (kind, size)
                i += 4
            elif tag == "L":
                links[fields[i + 1]] = fields[i + 2]
                i += 3
            else:
                raise ListingError(f"unexpected field {tag[:40]!r}")
        except (IndexError, ValueError) as e:
            raise ListingError(f"unreadable listing near {tag[:40]!r}: {e}") from None
    return {p: Entry(k, s, links.get(p, "")) for p, (k, s) in found.items()}


@dataclass(frozen=True)
class CopyPlan:
    """What a copy sends: each file the target lacks or has otherwise (why), and what it leaves alone."""

    send: tuple[str, ...] = ()
    why: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0
    same: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # on the target only: left there
    hashed: tuple[str, ...] = ()  # of those sent, the ones whose sha256 the head's cache names
    problems: tuple[str, ...] = ()  # the head's own copy is not whole: nothing is sent


def plan(head: dict[str, Entry], target: dict[str, Entry], *, resend: bool = False) -> CopyPlan:
    """The files to send: absent on the target, a dangling link there, another size, or (same size) a link to
    another blob; with ``resend`` every file. A file of the same size is kept otherwise: its content is
    checked when it is sent, not before (hashing 120 GiB on both nodes to find one bad byte costs more than
    the copy)."""
    problems = [f"{p} (a dangling link on the head)" for p, e in head.items() if e.kind == "l"]
    files = {p: e for p, e in head.items() if e.kind == "f"}
    if not files:
        problems.append("no files on the head")
    send: list[str] = []
    why: dict[str, str] = {}
    for p, e in sorted(files.items()):
        t = target.get(p)
        if resend:
            reason = "sent again (--resend)"
        elif t is None:
            reason = "absent"
        elif t.kind == "l":
            reason = "a dangling link"
        elif t.kind != "f":
            reason = "a directory" if t.kind == "d" else f"not a file ({t.kind})"
        elif t.size != e.size:
            reason = f"{size_text(t.size)}, head {size_text(e.size)}" if size_text(t.size) != size_text(e.size) \
                else f"{t.size:,} B, head {e.size:,} B"
        elif e.sha256 and t.sha256 and t.sha256 != e.sha256:
            reason = "another blob, same size"
        else:
            continue
        send.append(p)
        why[p] = reason
    same = tuple(p for p in sorted(files) if p not in why)
    extra = tuple(sorted(p for p, e in target.items() if e.kind == "f" and p not in head))
    return CopyPlan(send=() if problems else tuple(send), why=why, nbytes=sum(files[p].size for p in send),
                    same=same, extra=extra, hashed=tuple(p for p in send if files[p].sha256),
                    problems=tuple(problems))


def deadline_s(nbytes: int, min_rate: float = MIN_RATE) -> float:
    """The whole stream's limit: what does not scale, and the bytes at the slowest rate accepted."""
    return FIXED_S + nbytes / min_rate


def hash_deadline_s(nbytes: int) -> float:
    return FIXED_S + nbytes / HASH_RATE


def parse_hashes(out: str) -> dict[str, str]:
    """sha256sum's lines: name -> hex."""
    found: dict[str, str] = {}
    for line in out.splitlines():
        digest, sep, name = line.partition("  ")
        if sep and SHA256.fullmatch(digest):
            found[name] = digest
    return found


def verify(plan: CopyPlan, head: dict[str, Entry], got: dict[str, Entry], hashes: dict[str, str] | None) -> list[str]:
    """What arrived in the partial directory, against the head: each file sent whole (its size) and, where the
    head's cache names it, its sha256 (``hashes`` None: not asked). Empty: it may be renamed into place."""
    bad: list[str] = []
    for p in plan.send:
        want, t = head[p], got.get(p)
        if t is None or t.kind != "f":
            bad.append(f"{p} did not arrive")
        elif t.size != want.size:
            bad.append(f"{p} {t.size:,} B, head {want.size:,} B")
        elif hashes is not None and want.sha256 and hashes.get(p) != want.sha256:
            bad.append(f"{p} sha256 {hashes.get(p, 'not read')[:16]}…, the hub's {want.sha256[:16]}…")
    return bad


def duration_text(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def rate_text(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:,.0f} MB/s" if seconds > 0 else "-"
