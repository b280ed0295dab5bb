"""Identifying values out of a captured format, its format kept (`report --capture`): every value is replaced by
a pseudonym of the same shape, the same value by the same pseudonym everywhere in one bundle, so what the
parsers read still parses and still agrees across files (a fabric IP in `ip -o addr`, in its RoCE GID and in
NCCL's lines stays one address). The pseudonyms come from a keyed hash with a key drawn for each bundle and
never written: nothing in a bundle leads back to the values.

Replaced: IPv4 addresses (prefix-preserving: two addresses that share their first n bits still do, so subnets,
masks and which node is on which fabric survive; the last octet, the host number, is kept; 0.0.0.0, 127.0.0.1
and netmasks are kept), IPv6 addresses and
RoCE GIDs (an IPv4-mapped one through its IPv4; a link-local one keeps fe80::/64 and loses its interface ID,
which is the MAC; ::1 and :: kept), MAC addresses, UUIDs (the GPU's, the boot ID), the machine ID, the GPU's
serial number, the hostnames and users given (node names, SSH and Docker targets, what the nodes call
themselves) and the user of each /home/<user> path."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable

_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?!\.?\d)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])")
# A RoCE GID as sysfs writes it (all eight groups), after a "path:" in the host facts' lines
_GID = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{4}:){7}[0-9A-Fa-f]{4}(?![\w:.])")
_ADDRESS = re.compile(rf"(?P<gid>{_GID.pattern})|(?P<v6>{_IPV6.pattern})|(?P<v4>{_IPV4.pattern})")
_MAC = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![\w:])")
_UUID = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}(?![0-9A-Fa-f])")
_MACHINE_ID = re.compile(r"(machine-id:)([0-9A-Fa-f]{32})\b")
_SERIAL = re.compile(r"(<serial>)([^<]*)(</serial>)")
_HOME = re.compile(r"(/home/)([^/\s\"'<>]+)")


class Pseudonyms:
    """One bundle's replacements (``key``: its secret, never written)."""

    def __init__(self, key: bytes, hosts: Iterable[str] = (), users: Iterable[str] = ()):
        self.key = key
        self._seen: dict[tuple[str, str], str] = {}
        self.names: dict[str, str] = {}
        for kind, found in (("host", hosts), ("user", users)):
            for name in dict.fromkeys(n for n in found if _worth(n)):  # numbered in the order given
                self._name(kind, name)
        self._refresh()

    def _hash(self, what: str, value: str) -> bytes:
        return hmac.new(self.key, f"{what}\0{value}".encode(), hashlib.sha256).digest()

    def _name(self, kind: str, name: str) -> str:
        if name not in self.names:
            n = sum(1 for v in self.names.values() if v.startswith(kind)) + 1
            short, dot, _ = name.partition(".")
            self.names[name] = f"{kind}-{n}" + (".example" if dot else "")
            if dot and _worth(short):
                self._name(kind, short)
        return self.names[name]

    def add_hosts(self, hosts: Iterable[str]) -> None:
        for h in hosts:
            if _worth(h):
                self._name("host", h)
        self._refresh()

    def _refresh(self) -> None:
        names = sorted(self.names, key=len, reverse=True)  # the longest first: an FQDN before its first label
        self._names = re.compile("|".join(rf"(?<![\w.]){re.escape(n)}(?!\w)" for n in names)) if names else None

    def _bits(self, value: int, width: int, keep_low: int = 0) -> int:
        """Prefix-preserving: bit i is flipped by a hash of the bits before it (the low ``keep_low`` kept)."""
        out = 0
        for i in range(width - keep_low):
            prefix = value >> (width - i)
            flip = self._hash(f"bits{width}/{i}", str(prefix))[0] & 1
            out = (out << 1) | (((value >> (width - 1 - i)) & 1) ^ flip)
        return (out << keep_low) | (value & ((1 << keep_low) - 1))

    def ipv4(self, text: str) -> str:
        try:
            a = ipaddress.IPv4Address(text)
        except ValueError:
            return text
        v = int(a)
        inverted = ~v & 0xFFFFFFFF
        if text == "127.0.0.1" or (inverted & (inverted + 1)) == 0:  # loopback's own, or a netmask (0 and all ones)
            return text
        return str(ipaddress.IPv4Address(self._bits(v, 32, keep_low=8)))  # the host number kept: .255 stays .255

    def ipv6(self, text: str) -> str:
        try:
            a = ipaddress.IPv6Address(text)
        except ValueError:
            return text
        if a.is_loopback or a.is_unspecified:
            return text
        if a.ipv4_mapped is not None:
            new = ipaddress.IPv6Address(f"::ffff:{self.ipv4(str(a.ipv4_mapped))}")
        elif a.is_link_local:  # the prefix kept, the interface ID (the MAC's) replaced
            low = int.from_bytes(self._hash("iid", str(int(a) & ((1 << 64) - 1)))[:8], "big")  # as a GID too
            new = ipaddress.IPv6Address((int(a) >> 64 << 64) | low)
        else:
            new = ipaddress.IPv6Address(self._bits(int(a), 128))
        if re.fullmatch(r"(?:[0-9A-Fa-f]{4}:){7}[0-9A-Fa-f]{4}", text):  # a GID as sysfs writes it: all groups
            out = new.exploded
        elif a.ipv4_mapped is not None:  # written as it was: ::ffff:c0a8:c80d (the dotted form is not matched here)
            out = f"::ffff:{int(new) >> 16 & 0xFFFF:x}:{int(new) & 0xFFFF:x}"
        else:
            out = new.compressed
        return out.upper() if text.isupper() else out

    def _hex(self, what: str, value: str) -> str:
        """Hex of the same length and case, the same separators kept."""
        h = self._hash(what, value.lower()).hex() * 4
        it = iter(h)
        out = "".join(next(it) if c in "0123456789abcdefABCDEF" else c for c in value)
        return out.upper() if value.isupper() else out

    def _serial(self, value: str) -> str:
        if not value.strip() or value.strip() in ("N/A", "[N/A]"):
            return value
        digits = str(int.from_bytes(self._hash("serial", value), "big"))
        return "".join(digits[i % len(digits)] if c.isalnum() else c for i, c in enumerate(value))

    def text(self, s: str) -> str:
        """``s`` with every identifying value replaced by its pseudonym."""
        if self._names is not None:
            s = self._names.sub(lambda m: self.names[m.group(0)], s)
        s = _HOME.sub(lambda m: m.group(1) + (m.group(2) if m.group(2) in self.names.values()
                                               else self._name("user", m.group(2))), s)
        s = _SERIAL.sub(lambda m: m.group(1) + self._serial(m.group(2)) + m.group(3), s)
        s = _MACHINE_ID.sub(lambda m: m.group(1) + self._hex("machine-id", m.group(2)), s)
        s = _UUID.sub(lambda m: self._hex("uuid", m.group(0)), s)
        s = _MAC.sub(lambda m: self._mac(m.group(0)), s)
        # One pass for every address: a pseudonym is never read again as an address to replace.
        return _ADDRESS.sub(lambda m: self.ipv4(m.group(0)) if m.group("v4") else self.ipv6(m.group(0)), s)

    def _mac(self, value: str) -> str:
        b = bytearray(self._hash("mac", value.lower())[:6])
        b[0] = (b[0] & 0xFC) | 0x02  # unicast, locally administered: it looks like a MAC and is no one's
        out = ":".join(f"{x:02x}" for x in b)
        return out.upper() if value.isupper() else out


def _worth(name: str) -> bool:
    """A name worth replacing: not empty, not an address (those have their own pseudonyms), not a word that
    is everywhere in a log (root, localhost)."""
    if len(name) < 2 or name in ("root", "localhost", "localhost.localdomain"):
        return False
    try:
        ipaddress.ip_address(name)
        return False
    except ValueError:
        return True
