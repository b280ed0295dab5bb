"""The config's building blocks: the strict base of every table, how a model validator reports problems,
bounded durations, ports, argv lists, host paths, environment variable names, and the host and network
fields (IPv4 addresses, interface names, SSH targets, Docker engine URLs, HTTP endpoints)."""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shlex
import unicodedata
from typing import Annotated, NamedTuple
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .labels import API_KEY_ENV, FABRIC_ENV


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Problems(ValueError):
    """What a model validator found, as (key, message) pairs: an absolute key, or one starting with "." or
    "[" relative to the model that raised it. A ValueError, so pydantic reports it, keeping it whole in its
    error's ctx["error"], where the loader reads the pairs (config.loader._format)."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("\n".join(f"{k}: {m}" for k, m in problems))
        self.problems = tuple(problems)


def _raise(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise Problems(problems)


def _q(v: str) -> str:
    """A value quoted for a message: always one line, whatever it holds."""
    return json.dumps(v)


def _upper(limit: float, unit: str = "s") -> AfterValidator:
    def check(v: float) -> float:
        if v > limit:
            raise ValueError(f"{v:g} {unit} is more than the {limit:g} {unit} limit: a typo? (the unit is "
                             f"{'seconds' if unit == 's' else unit})")
        return v
    return AfterValidator(check)


Seconds = Annotated[float, Field(gt=0)]
# Upper bounds where a typo (milliseconds for seconds, a zero too many) would hurt.
Sec60 = Annotated[float, Field(gt=0), _upper(60)]
Sec120 = Annotated[float, Field(gt=0), _upper(120)]
Sec600 = Annotated[float, Field(gt=0), _upper(600)]
Sec3600 = Annotated[float, Field(gt=0), _upper(3600)]
SecDay = Annotated[float, Field(gt=0), _upper(86400)]
SecWeek = Annotated[float, Field(gt=0), _upper(7 * 86400)]
SecMonth = Annotated[float, Field(gt=0), _upper(30 * 86400)]
MinuteToWeek = Annotated[float, Field(ge=60), _upper(7 * 86400)]  # a floor under learned limits: not seconds


def _port(v: int) -> int:
    if not 1 <= v <= 65535:
        raise ValueError(f"port {v} is out of range 1..65535")
    return v


Port = Annotated[int, AfterValidator(_port)]


def _argv(v: list[str]) -> list[str]:
    if not v:
        raise ValueError("an empty command: give the program and its arguments as a list, or remove the key "
                         "to use the default")
    if not v[0].strip():
        raise ValueError("the program name (first element) is empty")
    return v


def _opt_argv(v: list[str]) -> list[str]:
    return _argv(v) if v else v


Argv = Annotated[list[str], AfterValidator(_argv)]
OptionalArgv = Annotated[list[str], AfterValidator(_opt_argv)]


def _split_args(value: object) -> object:
    # Extra args may be written as one string (split once, here) or as a list.
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise ValueError(f"cannot split into arguments: {e}") from None
    return value


def _abs_path(v: str) -> str:
    if not v.startswith("/"):
        raise ValueError(f"{_q(v)} is a relative path: give an absolute path (the daemon's working "
                         "directory is not yours)")
    return v


def _opt_abs_path(v: str) -> str:
    return _abs_path(v) if v else v


AbsPath = Annotated[str, AfterValidator(_abs_path)]
OptionalAbsPath = Annotated[str, AfterValidator(_opt_abs_path)]

# Host directories the supervisor never writes into as its own (a prune there deletes the operator's data,
# a state file there sits among the system's): each of these itself, anything at all under the trees the
# OS owns, and the direct children of the trees that hold everybody's data (/var/lib, /usr/local, /home/x).
_OS_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys")
_SHARED_TREES = ("/home", "/media", "/mnt", "/opt", "/root", "/run", "/snap", "/srv", "/tmp", "/usr", "/var",
                 "/var/lib", "/var/cache", "/var/log", "/usr/local", "/usr/local/share", "/usr/share")


def _inside(path: str, tree: str) -> bool:
    """``path`` is ``tree`` or below it (both normalised absolute paths)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _overlap(a: str, b: str) -> bool:
    return _inside(a, b) or _inside(b, a)


def _system_dir(v: str) -> str:
    """Why an absolute host directory is not one the supervisor may own ("" when it may)."""
    if ".." in v.split("/"):
        return f"{_q(v)} contains '..': give the directory itself"
    p = os.path.normpath(v)
    if p.count("/") <= 1 and p != "/" and p not in _SHARED_TREES + _OS_TREES:
        return f"{_q(p)} is a top-level directory, shared with whatever else lives there: use a directory of its own below it"
    if p == "/" or any(_inside(p, t) for t in _OS_TREES):
        return f"{_q(p)} is a system directory: use a directory of its own, e.g. under /var/lib"
    if p in _SHARED_TREES or os.path.dirname(p) in ("/home", "/root"):
        return (f"{_q(p)} is a system or shared directory (other software keeps its data there): use a directory "
                "of its own below it, e.g. /var/lib/spark-supervisor/...")
    return ""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name(v: str) -> str:
    if not _ENV_NAME.fullmatch(v):
        raise ValueError(f"{_q(v)} is not a valid environment variable name: use letters, digits and '_', "
                         "not starting with a digit")
    if v == API_KEY_ENV:
        raise ValueError(f"{API_KEY_ENV} is set by the supervisor from readiness.api_key_file or "
                         "readiness.api_key_env: remove it here")
    if v.upper() in _LOADER_ENV:
        raise ValueError(f"{v} makes every process in the container load or run other code first: remove it "
                         "(build what it loads into the image)")
    return v


# Variables that make the dynamic loader or an interpreter run other code first, in every process of the
# container (privileged, root): never from the config.
_LOADER_ENV = {"LD_PRELOAD", "LD_AUDIT", "LD_DEBUG_OUTPUT", "LD_PROFILE", "PYTHONSTARTUP", "PYTHONHOME",
               "PYTHONINSPECT", "PYTHONEXECUTABLE", "BASH_ENV", "ENV", "PERL5OPT", "NODE_OPTIONS",
               "RUBYOPT", "GCONV_PATH", "MALLOC_CONF"}
# Ones a user may mean (an image's libraries, a plugin directory): a warning.
_SEARCH_PATH_ENV = {"LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONUSERBASE"}


def _shared_env_name(v: str) -> str:
    _env_name(v)
    if v in FABRIC_ENV:
        raise ValueError(f"{v} is per node (set from nodes[].fabric_ip / fabric_interface): here it would be "
                         "copied to every node; remove it (a per-node override goes in nodes[].env)")
    return v


EnvName = Annotated[str, AfterValidator(_env_name)]
SharedEnvName = Annotated[str, AfterValidator(_shared_env_name)]


def _opt_env_name(v: str) -> str:
    if v and not _ENV_NAME.fullmatch(v):
        raise ValueError(f"{_q(v)} is not a valid environment variable name")
    return v


# ----------------------------------------------------------------------------------------------------
# Hosts and the network: addresses, interfaces, SSH targets, Docker engine URLs, HTTP endpoints.
def _ipv4(v: str, *, instead: str, unspecified_ok: bool) -> str:
    """An IPv4 address a node can have (IPv4 only, end to end); ``instead`` says what to write."""
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        raise ValueError(f"not an IP address: {v!r}: use {instead}") from None
    if ip.version == 6:
        raise ValueError(f"IPv6 is not supported: use {instead}")
    if ip.is_unspecified and not unspecified_ok:
        raise ValueError(f"{v} is not a node's address: use {instead}")
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255") or ip.is_reserved:
        raise ValueError(f"{v} is a multicast, broadcast or reserved address: use {instead}")
    return v


def _fabric_ip(v: str) -> str:
    return _ipv4(v, instead="this node's own IPv4 address on the fabric", unspecified_ok=False)


def _bind_ip(v: str) -> str:
    return _ipv4(v, instead="0.0.0.0 or one of the head's IPv4 addresses", unspecified_ok=True)


def _ifname(v: str) -> str:
    # The kernel's own rule (dev_valid_name): at most IFNAMSIZ-1 bytes, no '/', ':' or whitespace.
    if v and (len(v.encode()) > 15 or v in (".", "..") or any(c in "/:" or c.isspace() for c in v)):
        raise ValueError(f"{_q(v)} is not a Linux interface name (at most 15 characters, no '/', ':' or "
                         "whitespace): give the fabric interface as `ip link` shows it, e.g. \"enp1s0f1np1\"")
    return v


class Listen(NamedTuple):
    """[metrics] listen, read: the address to bind (127.0.0.1 when the string names none) and the port."""

    host: str
    port: int


@functools.lru_cache(maxsize=64)
def parse_listen(v: str) -> Listen:
    """A host:port string (its digits already matched by the validator) read once: every reader asks this."""
    host, _, port = v.rpartition(":")
    return Listen(host.strip("[]") or "127.0.0.1", int(port))


def _no_space(v: str) -> bool:
    return not any(c.isspace() or unicodedata.category(c) == "Cc" for c in v)


def _ssh_target(v: str) -> str:
    if v.startswith("-"):
        raise ValueError(f"{_q(v)} begins with '-': ssh would read it as an option; give user@host or a Host "
                         "from ssh_config")
    if not _no_space(v):
        raise ValueError(f"{_q(v)} contains whitespace: give user@host or a Host from ssh_config")
    if not v.isascii():
        raise ValueError(f"{_q(v)} has non-ASCII characters (a look-alike of another host?): give user@host in ASCII")
    if ":" in v:
        raise ValueError(f"{_q(v)}: ssh takes no :port here (it would look up a host named {_q(v.rpartition('@')[2])}): "
                         "give a Host from ssh_config with its Port, e.g. \"spark-2\"")
    return v


_SSH_URL = re.compile(r"ssh://(?:(?P<user>[^@/\s]+)@)?(?P<host>[^@/:\s]+)(?::(?P<port>\d{1,5}))?/?")
_TCP_URL = re.compile(r"tcp://(?P<host>[^@/:\s]+)(?::(?P<port>\d{1,5}))?/?")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _docker_url(v: str) -> str:
    if v == "local":
        return v
    if not v.isascii():
        raise ValueError(f"{_q(v)} has non-ASCII characters (a look-alike of another host?): write it in ASCII")
    if not re.match(r"^(unix|ssh|tcp)://", v):
        raise ValueError(f"expected 'local', unix://, ssh:// or tcp://, got {v!r}")
    if v.startswith("unix://"):
        if not v[len("unix://"):].startswith("/"):
            raise ValueError(f"{_q(v)}: unix:// needs an absolute socket path, e.g. unix:///var/run/docker.sock")
        return v
    if v.startswith("ssh://"):
        m = _SSH_URL.fullmatch(v)
        if not m:
            raise ValueError(f"{_q(v)} is not ssh://[user@]host[:port]")
        if any((m.group(g) or "").startswith("-") for g in ("user", "host")):
            raise ValueError(f"{_q(v)}: the user or host begins with '-': ssh would read it as an option")
    else:
        m = _TCP_URL.fullmatch(v)
        if not m:
            raise ValueError(f"{_q(v)} is not tcp://host:port")
        if not _loopback(m.group("host")):
            raise ValueError(f"{_q(v)}: a plain tcp:// engine is unauthenticated root access to that host: use "
                             "ssh://root@host (tcp:// only to a loopback address)")
    if m.group("port") and not 1 <= int(m.group("port")) <= 65535:
        raise ValueError(f"{_q(v)}: port {m.group('port')} is out of range 1..65535")
    return v



def _endpoint(v: str) -> str:
    if not v:
        return v
    bad = ValueError(f"expected an http:// or https:// URL with a host, e.g. \"http://192.168.200.12:8000\", "
                     f"got {v!r}")
    if not _no_space(v):
        raise bad
    try:
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise bad
        port = u.port
    except ValueError:
        raise bad from None
    if port is not None and not 1 <= port <= 65535:
        raise bad
    try:  # what the socket layer does to a host name (IDNA): one it cannot encode fails every request
        u.hostname.encode("idna")
    except UnicodeError:
        raise ValueError(f"{_q(v)}: {u.hostname!r} is not a host name (an empty label, or one over 63 "
                         "characters?)") from None
    return v

