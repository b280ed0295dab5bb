"""Which TCP sockets listen on a node, and which process holds each: `ss -Hltnp`, or the kernel's own tables
where there is no ss. Pure parsing; the command runs through NodeShell."""

from __future__ import annotations

import ipaddress
import re

from ..model import Listener
from . import AdapterError
from .shell import Result, printable

# TCP listeners with their processes (iproute2's ss, as root it names them); without ss the kernel's tables
# (no process). A constant script: nothing from the config is in it.
LISTENING = ["sh", "-c", "if command -v ss >/dev/null 2>&1 && ss -Hltnp 2>/dev/null; then exit 0; fi; "
             "cat /proc/net/tcp || exit 1; cat /proc/net/tcp6 2>/dev/null; exit 0"]
_SS_USER = re.compile(r'\("((?:[^"\\]|\\.)*)",pid=(\d+)')


def _hex_addr(h: str) -> str:
    raw = bytes.fromhex(h)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))  # four host-order 32-bit words
    a = ipaddress.IPv6Address(words)
    return str(a.ipv4_mapped) if a.ipv4_mapped else str(a)


def _records(out: str) -> list[str]:
    """One line a socket. In ss's listing every socket's line starts with its state, LISTEN; a line that does
    not continues the one before: a process name may hold a newline (anyone sets theirs), and ss prints it raw."""
    lines = out.splitlines()
    if not lines or not lines[0].startswith("LISTEN"):
        return lines
    records: list[str] = []
    for line in lines:
        if line.startswith("LISTEN") or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    return records


def parse_listening(out: str) -> tuple[Listener, ...]:
    """`ss -Hltnp` lines or /proc/net/tcp{,6} tables -> the listening sockets. A line that cannot be read
    makes the whole reading unusable (AdapterError): a listener missed would read as a free port."""
    found: list[Listener] = []
    for line in _records(out):
        f = line.split()
        if not f or f[0] == "sl":
            continue
        try:
            if f[0] == "LISTEN":
                host, _, port = f[3].rpartition(":")
                host = host.strip("[]").split("%", 1)[0]
                m = _SS_USER.search(line)
                found.append(Listener(host if host != "*" else "*", int(port), printable(m.group(1)) if m else "",
                                      int(m.group(2)) if m else None))
            elif f[0].endswith(":") and len(f) > 3:
                if f[3] != "0A":  # TCP_LISTEN
                    continue
                host, port = f[1].split(":")
                found.append(Listener(_hex_addr(host), int(port, 16)))
            else:
                raise ValueError(line[:80])
        except (ValueError, IndexError) as e:
            raise AdapterError("ListeningUnreadable", f"{type(e).__name__}: {e}"[:200]) from None
    return tuple(found)


def read_listening(r: Result) -> tuple[Listener, ...]:
    if r.rc != 0:
        raise AdapterError("ListeningFailed", (r.err.strip() or f"exit {r.rc}")[-200:])
    return parse_listening(r.out)
