"""Load and validate the TOML config; derive spec hashes.

Every problem is reported as ``<file>: <key>: <message>`` so an operator can fix it without guessing, and
nothing but a ``ConfigError`` ever leaves ``load()``/``parse()``, whatever file the OS hands us.
String values may reference environment variables as ``${NAME}`` (``$$`` for a literal ``$``).
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import ipaddress
import json
import os
import re
import shlex
import stat
import tomllib
import typing
import unicodedata
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from . import files
from .redaction import secret_env

OWNER_LABEL = "spark-supervisor.owner"
HASH_LABEL = "spark-supervisor.spec-hash"
NODE_LABEL = "spark-supervisor.node"
ROLE_LABEL = "spark-supervisor.role"
RAY_STATE_LABEL = "spark-supervisor.ray-state"  # on a Ray head: "dashboard" (REST) or "gcs" (no dashboard)
# On every short-lived container the daemon creates (value: its role), so that no daemon, nor a concurrent
# `check --preflight`, takes another's for stale.
HELPER_LABEL = "spark-supervisor.helper"
LABEL_PREFIX = "spark-supervisor."

# Set per node from nodes[].fabric_ip / fabric_interface (commands.node_env); never shared between nodes.
FABRIC_ENV = ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
              "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "OMPI_MCA_btl_tcp_if_include")
API_KEY_ENV = "VLLM_API_KEY"  # how the serve receives the key (never on its command line)
MAX_CONFIG_BYTES = 1 << 20
MAX_KEY_BYTES = 4096


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ----------------------------------------------------------------------------------------------------
# Problems found by a model validator are raised as one ValueError whose lines are "@key@ message":
# an absolute key, or one starting with "." or "[" relative to the model that raised it.
def _raise(problems: list[tuple[str, str]]) -> None:
    if problems:
        raise ValueError("\n".join(f"@{k}@ {m}" for k, m in problems))


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


def _split_args(value: Any) -> Any:
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


# ----------------------------------------------------------------------------------------------------
_UNIT_CHARS = re.compile(r"[A-Za-z0-9_:.\\@-]{1,255}")
_UNIT_TYPES = {"service", "socket", "timer", "path", "target", "mount", "automount", "swap", "slice", "scope",
               "device"}
_STALE_UNIT_TYPES = {"service", "socket", "timer", "path"}
# Units the host (or we) need: stopping, disabling or masking them would cut the branch we sit on.
_HOST_UNITS = {
    "spark-supervisor", "docker", "containerd", "ssh", "sshd", "dbus", "dbus-broker", "polkit", "networking",
    "network", "network-online", "wpa_supplicant", "nvidia-persistenced", "nvidia-fabricmanager",
    "nvidia-dcgm", "cron", "crond", "rsyslog", "syslog", "chrony", "chronyd", "ntp", "ntpd", "auditd",
    "getty", "serial-getty", "autovt", "container-getty", "console-getty", "user", "user-runtime-dir",
    "init", "emergency", "rescue", "multipathd", "iscsid", "udisks2", "snapd", "apparmor", "ufw",
    "firewalld", "nftables", "iptables", "netfilter-persistent", "openibd", "rdma", "rdma-ndd",
}
_HOST_UNIT_PREFIXES = ("systemd-", "networkmanager", "spark-supervisor", "lvm2-", "dm-event")


def _unit_name(v: str) -> str:
    if not _UNIT_CHARS.fullmatch(v) or v[0] in "-.@" or v.count("@") > 1:
        raise ValueError(f"{_q(v)} is not a systemd unit name (letters, digits, ':', '_', '.', '-', '@', "
                         "not starting with '-' or '.'; no globs)")
    base, dot, kind = v.rpartition(".")
    if not dot:
        base, kind = v, "service"
    elif kind not in _UNIT_TYPES:
        raise ValueError(f"{_q(v)} has no unit type: write {_q(v + '.service')}")
    if kind not in _STALE_UNIT_TYPES:
        raise ValueError(f"{_q(v)}: only .service, .socket, .timer and .path units can be stopped as stale")
    template = base.partition("@")[0].lower()
    if template in _HOST_UNITS or template.startswith(_HOST_UNIT_PREFIXES):
        raise ValueError(f"{_q(v)} would stop a unit the host or the supervisor needs: list only the old "
                         "stack's units")
    return v


_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")


def _container_name(v: str) -> str:
    if v.startswith("/") and _DOCKER_NAME.fullmatch(v[1:]):
        raise ValueError(f"{_q(v)}: write the container name without the leading '/'")
    if not _DOCKER_NAME.fullmatch(v):
        raise ValueError(f"{_q(v)} is not a Docker container name ([A-Za-z0-9][A-Za-z0-9_.-]+)")
    return v


# Labels that unrelated containers carry too: put there by the engine, by compose or an orchestrator for
# every container they run, or inherited from a base image (OCI's annotations, NVIDIA's, Red Hat's, the
# old label-schema). A stale rule on one of them would force-remove whatever the operator runs.
_ENGINE_LABELS = ("com.docker.", "io.kubernetes.", "io.cri-containerd.", "io.containerd.", "desktop.docker.io",
                  "io.podman.", "io.buildah.", "io.x-k8s.", "io.portainer.")
_IMAGE_LABELS = ("org.opencontainers.", "org.label-schema.", "com.nvidia.", "io.k8s.", "io.openshift.",
                 "com.redhat.", "org.nvidia.", "com.canonical.", "com.ubuntu.")
_IMAGE_KEYS = {"maintainer", "vendor", "version", "description", "license", "name", "summary", "release",
               "architecture", "build-date", "url", "vcs-ref", "vcs-type", "vcs-url", "authors", "author",
               "distribution-scope", "org", "com", "io"}
# Compose labels that name one stack: with a value they select that stack's containers only.
_COMPOSE_NAMING = ("com.docker.compose.project", "com.docker.compose.service")


def _label(v: str) -> str:
    key, eq, value = v.partition("=")
    if not key.strip():
        raise ValueError(f"{_q(v)} has an empty label key: write key or key=value")
    if not _no_space(key) or not key.isascii():
        raise ValueError(f"{_q(v)}: a label key is ASCII without whitespace")
    low = key.lower()
    if low.startswith(LABEL_PREFIX):
        raise ValueError(f"{_q(key)} is in the supervisor's own label namespace ({LABEL_PREFIX}*): name a label "
                         "of the old stack's containers")
    broad = "every container of the old stack's kind carries it, and so do unrelated ones"
    if low in _COMPOSE_NAMING:
        if not value:
            raise ValueError(f"{_q(v)} without a value matches every compose container: write "
                             f"{_q(key + '=<the old project>')}")
    elif low.startswith(_ENGINE_LABELS):
        raise ValueError(f"{_q(key)} is set by the engine or an orchestrator on containers it runs ({broad}): "
                         "name a label of the old stack itself, e.g. com.docker.compose.project=<name>")
    elif low.startswith(_IMAGE_LABELS) or low in _IMAGE_KEYS:
        raise ValueError(f"{_q(key)} comes from base images ({broad}, whatever its value): name a label of the "
                         "old stack itself")
    elif not value and "." not in low:
        raise ValueError(f"{_q(key)} without a value and without a namespace could be on any container: write "
                         "key=value, or a key in the old stack's own namespace (e.g. com.example.vllm)")
    if eq and not value.strip():
        raise ValueError(f"{_q(v)} has an empty value: write key=value, or the key alone")
    return v


# Images that have nothing to do with an old vLLM stack, from the registries and namespaces an operator
# meets: a pattern matching two of them would remove (force, on every node) any container the operator
# runs. A container whose image lost its tag is listed by the image's ID (a digest, or its short hex
# form): a pattern that can match one matches anybody's.
_UNRELATED_IMAGES = ("a", "zz/unlikely-name:1", "registry.example.com/x/y:tag", "registry.example.com/p/q:2",
                     "busybox:latest", "example/web:latest", "library/postgres:16", "nvcr.io/nvidia/pytorch:25.01-py3",
                     "nvcr.io/nvidia/tritonserver:25.01-py3", "ghcr.io/example/app@sha256:" + "0" * 64,
                     "ghcr.io/other/tool:2", "docker.io/library/redis:7", "docker.io/grafana/grafana:11",
                     "quay.io/prometheus/node-exporter:v1", "quay.io/coreos/etcd:3", "localhost:5000/app:1",
                     "localhost:5000/db:2", "nvidia/cuda:12.8.0-base-ubuntu24.04", "nvidia/k8s-device-plugin:v0.17")
_IMAGE_IDS = ("sha256:" + "0123456789abcdef" * 4, "sha256:" + "f" * 64, "0123456789ab", "deadbeef0042",
              "a1b2c3d4e5f6")
_WILDCARDS = re.compile(r"\[[^]]*\]|[*?]")


def _image_pattern(v: str) -> str:
    if not v.strip():
        raise ValueError("an empty pattern: give the old stack's image, e.g. \"vllm/vllm-openai*\"")
    eg = "name the old stack's images, e.g. \"vllm/vllm-openai*\""
    ids = [i for i in _IMAGE_IDS if fnmatch.fnmatch(i, v)]
    if ids or v.lower().startswith("sha256"):
        raise ValueError(f"{_q(v)} is too broad: it can match an image ID ({_q(ids[0] if ids else _IMAGE_IDS[0])}), "
                         f"and a container whose image lost its tag is listed by ID, whoever runs it; {eg}")
    hits = [i for i in _UNRELATED_IMAGES if fnmatch.fnmatch(i, v)]
    if len(hits) >= 2:
        raise ValueError(f"{_q(v)} is too broad: it also matches unrelated images such as {_q(hits[0])} and "
                         f"{_q(hits[1])}; {eg}")
    comps = v.split("/")
    if (len(comps) >= 2 and ("." in comps[0] or ":" in comps[0] or comps[0] == "localhost")
            and not re.split(r"[:@]", _WILDCARDS.sub("", comps[-1]))[0]):
        raise ValueError(f"{_q(v)} is too broad: every image of the registry or namespace {_q('/'.join(comps[:-1]))}; "
                         f"{eg}")
    if len(re.sub(r"[/:.@-]", "", _WILDCARDS.sub("", v))) < 3:
        raise ValueError(f"{_q(v)} is too broad: it is (nearly) all wildcards; {eg}")
    return v


_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")
_VOLUME_MODES = {"ro", "rw", "z", "Z"}


def _volume(v: str) -> str:
    parts = v.split(":")
    eg = ' e.g. "/root/.cache/huggingface:/root/.cache/huggingface:ro"'
    if len(parts) not in (2, 3):
        raise ValueError(f"{_q(v)} is not src:dst[:mode] (no other ':' allowed),{eg}")
    src, dst = parts[0], parts[1]
    if not (src.startswith("/") or _VOLUME_NAME.fullmatch(src)):
        raise ValueError(f"{_q(v)}: the source {_q(src)} is neither an absolute path nor a volume name,{eg}")
    if not dst.startswith("/"):
        raise ValueError(f"{_q(v)}: the destination {_q(dst)} is not an absolute path in the container,{eg}")
    if not dst.strip("/"):
        raise ValueError(f"{_q(v)}: the destination '/' would replace the container's root filesystem")
    if src.startswith("/") and os.path.normpath(src) in ("/", "//") and "ro" not in (parts[2:] or [""])[0].split(","):
        raise ValueError(f"{_q(v)} mounts the host's root read-write into a root container: mount what it needs, "
                         "or add :ro")
    if len(parts) == 3:
        modes = parts[2].split(",")
        if (any(m not in _VOLUME_MODES for m in modes) or len(set(modes)) != len(modes)
                or {"ro", "rw"} <= set(modes) or {"z", "Z"} <= set(modes)):
            raise ValueError(f"{_q(v)}: the mode {_q(parts[2])} is not ro, rw, z, Z or a comma list of them")
    return v


_SIZE = re.compile(r"(?P<n>[0-9]+(?:\.[0-9]+)?)(?P<unit>[bkmgBKMG][bB]?)?")


def _docker_size(v: str) -> str:
    m = _SIZE.fullmatch(v)
    if not m or float(m.group("n")) == 0:
        raise ValueError(f"{_q(v)} is not a Docker size: digits with an optional b, k, m or g suffix, e.g. "
                         "\"10.24g\"")
    return v


_ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss",
            "rtprio", "rttime", "sigpending", "stack")


def _ulimit_name(v: str) -> str:
    if v not in _ULIMITS:
        raise ValueError(f"unknown ulimit {_q(v)}: use one of {', '.join(_ULIMITS)}")
    return v


# The kernel's own ceilings (fs.nr_open, PID_MAX_LIMIT, nice 0..40, RT priority 0..99): past them the
# container cannot start, and a value near them is a typo.
_ULIMIT_MAX = {"nofile": 1073741816, "nproc": 4194304, "nice": 40, "rtprio": 99, "sigpending": 1 << 31,
               "locks": 1 << 31, "msgqueue": 1 << 40}


def _ulimit_value(v: int) -> int:
    if not -1 <= v <= 2**63 - 1:
        raise ValueError(f"{v} is not a ulimit value: -1 (unlimited) or a number >= 0")
    return v


def _image(v: str) -> str:
    if not v or not _no_space(v):
        raise ValueError(f"{_q(v)} is not an image reference: e.g. \"vllm/vllm-openai:latest\"")
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
    return v


# Flags the supervisor sets itself, and the key to set instead (None: always set, just remove it).
_SERVE_FLAGS: dict[str, str | None] = {
    "--model": "deployments.serve.model",
    "--host": "deployments.serve.host", "--port": "deployments.serve.port",
    "--tensor-parallel-size": "deployments.serve.tensor_parallel_size",
    "-tp": "deployments.serve.tensor_parallel_size",
    "--pipeline-parallel-size": "deployments.serve.pipeline_parallel_size",
    "-pp": "deployments.serve.pipeline_parallel_size",
    "--gpu-memory-utilization": "deployments.serve.gpu_memory_utilization",
    "--distributed-executor-backend": "deployments.serve.distributed_executor_backend",
    "--served-model-name": "deployments.serve.served_model_name",
    "--reasoning-parser": "deployments.serve.reasoning_parser",
    "--tool-call-parser": "deployments.serve.tool_call_parser",
    # Refused in extra_args (it would put the key on argv); the key goes through VLLM_API_KEY instead.
    "--api-key": "deployments.readiness.api_key_file or api_key_env",
    # mp across nodes: each node's rank and the rendezvous (commands.rank_args)
    "--nnodes": "deployments.nodes", "-n": "deployments.nodes", "--node-rank": "deployments.nodes",
    "-r": "deployments.nodes", "--headless": None, "--master-addr": "the head's nodes[].fabric_ip",
    "--master-port": "deployments.serve.master_port",
    # vLLM reads further flags from this file, past every check here
    "--config": "the flags themselves in deployments.serve.extra_args",
}
_RAY_FLAGS: dict[str, str | None] = {
    "--address": "the head's nodes[].fabric_ip and deployments.ray.port", "--head": "nodes[].role",
    "--block": None, "--node-ip-address": "nodes[].fabric_ip", "--num-gpus": "nodes[].gpus",
    "--port": "deployments.ray.port", "--dashboard-host": "the head's nodes[].fabric_ip",
    "--dashboard-port": "deployments.ray.dashboard_port", "--include-dashboard": None,
    "--disable-usage-stats": None,
}


def _argparse_flag(arg: str, table: dict[str, str | None]) -> str:
    """The flag of ``table`` that argparse (allow_abbrev, vLLM's `_` for `-`) would read ``arg`` as, or ""
    when it reads none of them. A `--x` naming a unique prefix of a flag is that flag; one that is a prefix
    of an own flag and of others is ambiguous, which is refused too (it names ours by one more letter). A
    short flag takes its value attached (`-n2`, `-tp=2`)."""
    flag = arg.split("=", 1)[0]
    if flag.startswith("--"):
        flag = flag.replace("_", "-")
        if flag in table:
            return flag
        if len(flag) >= 5:
            return next((f for f in table if f.startswith("--") and f.startswith(flag)), "")
        return ""
    shorts = [f for f in table if not f.startswith("--")]
    if flag in shorts:
        return flag
    return next((f for f in shorts if (len(flag) >= 2 and f.startswith(flag)) or (len(f) == 2 and flag.startswith(f))),
                "")


def _exact_flag(arg: str, table: dict[str, str | None]) -> str:
    flag = arg.split("=", 1)[0]
    if flag.startswith("--"):
        flag = flag.replace("_", "-")
    return flag if flag in table else ""


def _own_flags(args: list[str], table: dict[str, str | None], *, prefixes: bool) -> list[tuple[str, str]]:
    """Extra args that set a flag the supervisor sets, read as the program's parser reads them (vLLM's
    argparse takes prefixes; Ray's click does not)."""
    out = []
    for i, a in enumerate(args):
        if not a.startswith("-") or a == "-" or a == "--":
            continue
        flag = (_argparse_flag if prefixes else _exact_flag)(a, table)
        if flag:
            instead = table[flag]
            named = a.split("=", 1)[0]
            what = flag if named.replace("_", "-") == flag else f"{named} (read as {flag})"
            out.append((f".extra_args[{i}]", f"{what} is set by the supervisor: "
                        + (f"set {instead} instead" if instead else "remove it")))
    return out


# ----------------------------------------------------------------------------------------------------
class Node(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    role: Literal["head", "worker"]
    fabric_ip: Annotated[str, AfterValidator(_fabric_ip)]
    fabric_interface: Annotated[str, AfterValidator(_ifname)] = ""
    ssh: Annotated[str, AfterValidator(_ssh_target)] = ""
    docker: Annotated[str, AfterValidator(_docker_url)] = "local"
    nvidia_smi: Argv = ["nvidia-smi"]
    meminfo: Argv = ["cat", "/proc/meminfo"]
    ip: Argv = ["ip", "-o", "addr", "show"]
    oob: OptionalArgv = []  # optional out-of-band check for `diagnose`, run on the head (e.g. a hypervisor's `pct exec`)
    # How to sync and drop this node's page cache ([memory] page_cache = "drop"). Empty: the built-in way
    # (a worker: `sync; echo 3 > /proc/sys/vm/drop_caches` over SSH; the head: the same in a short-lived
    # container through its Docker engine, so the unit keeps ProtectKernelTunables).
    drop_caches: OptionalArgv = []
    gpus: Annotated[int, Field(ge=0, le=64)] = 1
    env: dict[EnvName, str] = {}

    @property
    def remote(self) -> bool:
        return bool(self.ssh)


class Stale(_Strict):
    units: list[Annotated[str, AfterValidator(_unit_name)]] = [
        "vllm-proxy", "vllm-embeddings", "vllm-reranker", "vllm-cluster"]
    disable: bool = False
    mask: bool = False
    containers: list[Annotated[str, AfterValidator(_container_name)]] = ["vllm_node", "reranker", "vllm_embeddings"]
    container_labels: list[Annotated[str, AfterValidator(_label)]] = []
    image_patterns: list[Annotated[str, AfterValidator(_image_pattern)]] = []
    allowed_gpu_processes: list[str] = ["Xorg", "gnome-shell"]
    residual_mib: Annotated[int, Field(ge=0, le=1 << 20)] = 512
    memory_free_timeout: Sec3600 = 120

    def allows(self, process: str) -> bool:
        """A GPU process that may stay (its program's name starts with one in allowed_gpu_processes)."""
        base = os.path.basename(process)
        return any(base.startswith(a) for a in self.allowed_gpu_processes)


class Ray(_Strict):
    image: Annotated[str, AfterValidator(_image)] = "vllm/vllm-openai:latest"
    port: Port = 6379
    dashboard_port: Port = 8265
    command: Argv = ["ray", "start"]
    extra_args: list[str] = []
    shm_size: Annotated[str, AfterValidator(_docker_size)] = "10.24g"
    gpus: bool = True
    privileged: bool = False
    ipc_host: bool = True
    init: bool = True
    volumes: list[Annotated[str, AfterValidator(_volume)]] = []
    ulimits: dict[Annotated[str, AfterValidator(_ulimit_name)], Annotated[int, AfterValidator(_ulimit_value)]] = {}
    env: dict[SharedEnvName, str] = {"RAY_memory_monitor_refresh_ms": "0"}
    head_env: dict[SharedEnvName, str] = {}
    join_timeout: Sec3600 = 180
    image_pull: Literal["never", "if-missing"] = "never"
    pull_timeout: SecDay = 1800  # deadline for one image pull

    _split = field_validator("extra_args", mode="before", json_schema_input_type=str | list[str])(_split_args)

    @model_validator(mode="after")
    def _checks(self) -> Ray:
        problems = _own_flags(self.extra_args, _RAY_FLAGS, prefixes=False)
        for name, value in self.ulimits.items():
            if name in _ULIMIT_MAX and value > _ULIMIT_MAX[name]:
                problems.append((f".ulimits.{name}", f"{value} is past the kernel's limit {_ULIMIT_MAX[name]} for "
                                 f"{name}: a typo? (-1 is unlimited)"))
        # Docker takes one mount per source (the spec is keyed by it) and one per destination; the very
        # same entry twice is harmless (the testbed's Python may live under /usr).
        by_src: dict[str, str] = {}
        by_dst: dict[str, str] = {}
        for i, v in enumerate(self.volumes):
            src, dst, *_ = v.split(":")
            norm = v if len(v.split(":")) == 3 else v + ":rw"
            dst = dst.rstrip("/")
            if by_src.get(src, norm) != norm:
                problems.append((f".volumes[{i}]", f"source {_q(src)} is mounted again differently "
                                 f"({_q(by_src[src])}): one mount per source"))
            elif by_dst.get(dst, src) != src:
                problems.append((f".volumes[{i}]", f"destination {_q(dst)} is also the mount of {_q(by_dst[dst])}: "
                                 "one mount per destination"))
            by_src.setdefault(src, norm)
            by_dst.setdefault(dst, src)
        _raise(problems)
        return self


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_MEDIA_FLAG = "--allowed-local-media-path"


class Serve(_Strict):
    model: str
    served_model_name: str = ""
    command: Argv = ["vllm", "serve"]
    # How the command takes the model: `vllm serve MODEL` ("positional"), or `--model MODEL` ("flag", as
    # `python -m vllm.entrypoints.openai.api_server` does).
    model_arg: Literal["positional", "flag"] = "positional"
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    pipeline_parallel_size: Annotated[int, Field(ge=1)] = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.85
    host: Annotated[str, AfterValidator(_bind_ip)] = "0.0.0.0"
    port: Port = 8000
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    # "ray": Ray containers on every node, the serve in the head's. "mp": no Ray; one container per node
    # with the serve in each (several nodes: vLLM's own multi-node mode, rank 0 on the head with the API,
    # `--headless` ranks on the others, rendezvous at the head's fabric IP on master_port).
    distributed_executor_backend: Literal["ray", "mp"] = "ray"
    master_port: Port = 29501
    placement_strategy: Literal["SPREAD", "PACK", ""] = "SPREAD"
    extra_args: list[str] = []
    env: dict[SharedEnvName, str] = {}
    log_dir: AbsPath = "/tmp/spark-supervisor"
    stop_timeout: Sec600 = 30
    # vLLM's compile cache (torch.compile, CUDA graphs' kernels) kept on each node's disk across serve and
    # gang restarts and reboots: <cache_dir>/<deployment>/<serve spec hash>, bind-mounted at the same path.
    # A new spec hash starts a new cache; the oldest beyond cache_keep or cache_max_gib are removed. "" = off.
    cache_dir: str = "/var/lib/spark-supervisor/vllm-cache"
    cache_keep: Annotated[int, Field(ge=1, le=20)] = 3
    cache_max_gib: Annotated[float, Field(gt=0, le=10_000)] = 64
    # The serve's log on each serve node's disk, so that it outlives the container: one file per launch,
    # <log_host_dir>/<deployment>/<node>/<UTC start>-<node>-<spec hash>.log (bind-mounted at the same path),
    # the newest log_keep launches kept per node; a file past log_max_mib is copied to <file>.1 and emptied.
    # "" = inside the container only (lost with it). `spark-supervisor logs` reads them.
    log_host_dir: str = "/var/log/spark-supervisor/serve"
    log_keep: Annotated[int, Field(ge=1, le=100)] = 5
    log_max_mib: Annotated[int, Field(ge=1, le=100_000)] = 100

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        if v and (not v.startswith("/") or v.rstrip("/") == "" or ":" in v):
            raise ValueError(f"{_q(v)} must be an absolute directory other than / (or \"\" for no cache)")
        if v and (why := _system_dir(v)):
            raise ValueError(f"{why} (the cache's prune deletes entries under <cache_dir>/<deployment>)")
        return os.path.normpath(v) if v else v

    @field_validator("log_host_dir")
    @classmethod
    def _log_host_dir(cls, v: str) -> str:
        if v and (not v.startswith("/") or v.rstrip("/") == "" or ":" in v or not _no_space(v)):
            raise ValueError(f"{_q(v)} must be an absolute directory other than /, without ':' or whitespace, "
                             "e.g. \"/var/log/spark-supervisor/serve\" (or \"\" to keep the log in the container)")
        if v and (why := _system_dir(v)):
            raise ValueError(f"{why} (old serve logs under <log_host_dir>/<deployment> are deleted)")
        return os.path.normpath(v) if v else v

    _split = field_validator("extra_args", mode="before", json_schema_input_type=str | list[str])(_split_args)

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("empty: give the model to serve, e.g. \"Qwen/Qwen3.5-122B-A10B-FP8\" or a path")
        if v != v.strip():
            raise ValueError(f"{_q(v)} has leading or trailing whitespace: remove it")
        if not v.startswith("/") and (v.startswith((".", "~")) or ("/" in v and not _HUB_ID.fullmatch(v))
                                      or v.split("/")[0] in (".", "..") or ".." in v.split("/")):
            raise ValueError(f"{_q(v)} is a relative path (resolved in the container's working directory, not yours): "
                             "give the model's absolute path as the container sees it, or a hub id such as "
                             "\"Qwen/Qwen3.5-122B-A10B-FP8\"")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, v: str) -> str:
        if not _no_space(v):
            raise ValueError(f"{_q(v)} contains whitespace or control characters: clients send this name in "
                             "requests; use e.g. \"Qwen3.5-122B-A10B-FP8\"")
        if not v.isascii():
            raise ValueError(f"{_q(v)} has non-ASCII characters (a look-alike of another name?): clients send "
                             "this name in requests; use ASCII, e.g. \"Qwen3.5-122B-A10B-FP8\"")
        return v

    @model_validator(mode="after")
    def _checks(self) -> Serve:
        problems = _own_flags(self.extra_args, _SERVE_FLAGS, prefixes=True)
        for i, a in enumerate(self.extra_args):
            flag, eq, value = a.partition("=")
            flag = flag.replace("_", "-")
            if len(flag) >= len("--allowed-l") and _MEDIA_FLAG.startswith(flag):
                if not eq:
                    value = self.extra_args[i + 1] if i + 1 < len(self.extra_args) else ""
                if value.startswith("/") and (os.path.normpath(value) in ("/", "//") or _system_dir(value)):
                    problems.append((f".extra_args[{i}]", f"{_MEDIA_FLAG} {_q(value)} lets any client read files "
                                     "there through the API: give the directory of the media only"))
        _raise(problems)
        return self

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class Readiness(_Strict):
    endpoint: Annotated[str, AfterValidator(_endpoint)] = ""
    poll_interval: Sec600 = 5
    deadline: SecWeek = 1200
    stall_timeout: SecWeek = 900  # no load progress (shard, milestone) this long: a stall, repaired
    request_timeout: Sec3600 = 60
    # What a real request is: a chat completion (an LLM), one embedding (an embeddings model: it cannot
    # chat) or a rerank of two documents (a reranker). Readiness and the periodic deep probe both send it.
    probe: Literal["chat", "embeddings", "rerank"] = "chat"
    sanity_prompt: str = "Reply with the single word: ready"
    sanity_max_tokens: Annotated[int, Field(ge=1, le=4096)] = 32
    api_key_file: OptionalAbsPath = ""  # a file holding the serve's API key, read at load
    api_key_env: Annotated[str, AfterValidator(_opt_env_name)] = ""  # or an environment variable holding it

    # The resolved key: set by parse(), never dumped, never in repr, compared by ==.
    _api_key: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _checks(self) -> Readiness:
        if self.api_key_file and self.api_key_env:
            _raise([(".api_key_env", "set either api_key_file or api_key_env, not both")])
        return self


class ModelFiles(_Strict):
    """[deployments.model]: the model checked on every node before a start (modelcheck), and optionally
    fetched where it is missing, in the image: copied from prefetch_from (a directory the image sees through
    deployments.ray.volumes) or downloaded from the hub ("")."""

    check: bool = True
    prefetch: bool = False
    prefetch_from: OptionalAbsPath = ""
    prefetch_timeout: SecDay = 21600

    @model_validator(mode="after")
    def _checks(self) -> ModelFiles:
        if self.prefetch_from and not self.prefetch:
            _raise([(".prefetch_from", "is only used with prefetch = true: set it, or remove prefetch_from")])
        if self.prefetch and not self.check:
            _raise([(".prefetch", "needs check = true (the check finds the nodes to fill)")])
        return self


class Deployment(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")] = "llm"
    nodes: list[str] = []
    ray: Ray = Field(default_factory=Ray)
    serve: Serve
    readiness: Readiness = Field(default_factory=Readiness)  # a fresh one each: it holds the resolved key
    # Start only once these deployments answer (their memory profiling is over: vLLM sizes its share
    # against the memory free at that moment, so servers sharing a GPU must start one after the other).
    after: list[str] = []
    # READY=1 and "SERVING" wait for every required deployment; the others are reported, not waited for.
    required: bool = True
    model: ModelFiles = Field(default_factory=ModelFiles)

    @model_validator(mode="after")
    def _model_source(self) -> Deployment:
        src = self.model.prefetch_from.rstrip("/")
        dsts = [v.split(":")[1].rstrip("/") for v in self.ray.volumes]
        if src and not any(src == d or src.startswith(d + "/") or d == "" for d in dsts):
            _raise([(".model.prefetch_from", f"{_q(src)} is on none of deployments.ray.volumes' destinations, so the "
                     f"image cannot see it: add a volume, e.g. \"{src}:{src}:ro\"")])
        return self

    @property
    def api_key(self) -> str:
        """The serve's API key from readiness.api_key_file / api_key_env, or "" when none."""
        return self.readiness._api_key

    @property
    def uses_ray(self) -> bool:
        return self.serve.distributed_executor_backend == "ray"


class Supervisor(_Strict):
    state_dir: AbsPath = "/var/lib/spark-supervisor"
    interval: Sec3600 = 5
    transition_interval: Sec600 = 1
    full_observe_interval: SecDay = 60
    io_timeout: Sec600 = 20
    ssh_connect_timeout: Sec120 = 5
    backoff_base: Sec3600 = 5
    backoff_max: SecDay = 300
    ready_when: Literal["serving", "started"] = "serving"
    # No progress this long while starting: stop extending systemd's timeout. Above readiness.stall_timeout
    # (900): a quiet torch.compile must not get the daemon killed before the stall is even judged.
    start_stall_timeout: SecDay = 1200
    on_stop: Literal["leave", "teardown"] = "leave"

    @model_validator(mode="after")
    def _checks(self) -> Supervisor:
        problems = []
        if os.path.normpath(self.state_dir) == "/":
            problems.append((".state_dir", "must not be '/': use e.g. /var/lib/spark-supervisor"))
        elif why := _system_dir(self.state_dir):
            problems.append((".state_dir", why))
        if self.backoff_max < self.backoff_base:
            problems.append((".backoff_max", f"{self.backoff_max:g} is less than backoff_base "
                             f"{self.backoff_base:g}: the cap must be at least the first delay"))
        _raise(problems)
        return self


class Healing(_Strict):
    health_failure_threshold: Annotated[int, Field(ge=1, le=100)] = 2  # consecutive /health failures before a repair
    deep_probe_interval: SecDay = 60  # a tiny real completion: /health stays 200 when workers are wedged
    deep_probe_timeout: Sec3600 = 30
    deep_failure_threshold: Annotated[int, Field(ge=1, le=100)] = 2
    quick_check_interval: Sec60 = 1  # Ray nodes and /health between ticks while serving
    repair_budget: Annotated[int, Field(ge=0, le=100)] = 3
    repair_window: SecMonth = 6 * 3600
    node_patience: SecDay = 300  # an unreachable peer: wait this long before tearing down the rest
    unknown_patience: SecDay = 60  # an observation "unknown" this long: DEGRADED (never destructive)

    @model_validator(mode="after")
    def _checks(self) -> Healing:
        if self.deep_probe_timeout >= self.deep_probe_interval:
            _raise([(".deep_probe_timeout", f"{self.deep_probe_timeout:g} s is not less than deep_probe_interval "
                     f"{self.deep_probe_interval:g} s: probes would overlap; lower it or raise the interval")])
        return self


class Retry(_Strict):
    """How a transient adapter error (engine, SSH, HTTP hiccup) is retried, in tenacity's terms."""

    stop_after_attempt: Annotated[int, Field(ge=1, le=10)] = 3
    stop_after_delay: Sec600 = 10
    wait_initial: Sec60 = 0.2
    wait_max: Sec60 = 2

    @model_validator(mode="after")
    def _checks(self) -> Retry:
        if self.wait_max < self.wait_initial:
            _raise([(".wait_max", f"{self.wait_max:g} is less than wait_initial {self.wait_initial:g}")])
        return self


class Metrics(_Strict):
    listen: str = ""  # "127.0.0.1:9464" to serve Prometheus metrics; empty: off

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v and not re.match(r"^[^:\s]*:\d{1,5}$", v):
            raise ValueError(f"expected host:port, e.g. \"127.0.0.1:9464\", got {v!r}")
        if v:
            _port(int(v.rpartition(":")[2]))
        return v

    @property
    def port(self) -> int:
        """The port of ``listen``, 0 when metrics are off."""
        return int(self.listen.rpartition(":")[2]) if self.listen else 0


class Alerts(_Strict):
    """Where the daemon tells someone outside: a webhook (a small JSON document POSTed) and/or a command
    (argv; the same document on its standard input). Sent from a background thread, retried, rate limited."""

    webhook: str = ""  # http(s)://... ; may carry a token in its path, so it is never logged whole
    command: OptionalArgv = []
    events: list[Literal["failed", "degraded", "repair", "recovered", "paused", "resumed"]] = [
        "failed", "degraded", "repair", "recovered"]
    min_interval: SecDay = 300  # the same event of the same deployment at most this often (the rest are counted)
    timeout: Sec60 = 5  # each POST or command
    attempts: Annotated[int, Field(ge=1, le=10)] = 3

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^\s/]+(/\S*)?$", v):
            raise ValueError(f"expected an http:// or https:// URL, e.g. \"http://127.0.0.1:9099/hook\", got "
                             f"{_q(v[:80])}")
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.webhook or self.command)


class Memory(_Strict):
    """GB10's unified memory: vLLM's start-up check reads MemFree (page cache counts as used)."""

    page_cache: Literal["drop", "never"] = "drop"  # drop it when it is what stands between MemFree and the need
    kv_cache_regression: Annotated[float, Field(gt=0, lt=1)] = 0.2  # a start this far below the best: a warning
    # Deployments sharing a node: their gpu_memory_utilization add up to at most 1 minus this (the
    # allowed GPU processes, Xorg and gnome-shell, and the CUDA contexts live in it).
    share_margin: Annotated[float, Field(ge=0, lt=1)] = 0.05


def deployment_dir(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "deployments", name)


def _after_cycle(deps: list[Deployment]) -> list[str]:
    """A circle in the deployments' ``after`` order, as names (empty: none)."""
    after = {d.name: d.after for d in deps}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> list[str]:
        if state.get(name) == 1:
            return [*path[path.index(name):], name]
        if state.get(name) == 2 or name not in after:
            return []
        state[name] = 1
        for a in after[name]:
            found = visit(a, [*path, name])
            if found:
                return found
        state[name] = 2
        return []

    for d in deps:
        found = visit(d.name, [])
        if found:
            return found
    return []


def _engine(node: Node) -> str:
    """The Docker engine a node's URL reaches, the same string for the same engine."""
    url = node.docker
    if url == "local":
        url = "unix:///var/run/docker.sock"
    if url.startswith("unix://"):
        path = os.path.normpath(url[len("unix://"):])
        return "unix://" + ("/run" + path[len("/var/run"):] if _inside(path, "/var/run") else path)
    m = (_SSH_URL if url.startswith("ssh://") else _TCP_URL).fullmatch(url)
    if not m:
        return url
    host = "localhost" if _loopback(m.group("host")) else m.group("host").lower()
    return f"{url[:3]}://{host}:{m.group('port') or ('22' if url.startswith('ssh') else '2375')}"


def _machine_keys(i: int, n: Node) -> list[tuple[str, str]]:
    """(key, what) naming the machine a node is: two nodes sharing one are one machine."""
    keys = [(f"nodes[{i}].docker", "engine " + _engine(n))]
    if n.ssh:
        host = n.ssh.rpartition("@")[2].lower()
        keys.append((f"nodes[{i}].ssh", "host " + ("localhost" if _loopback(host) else host)))
    elif n.role == "head":  # the daemon's own machine
        keys.append((f"nodes[{i}].ssh", "host localhost"))
    if n.docker.startswith(("ssh://", "tcp://")):
        m = (_SSH_URL if n.docker.startswith("ssh://") else _TCP_URL).fullmatch(n.docker)
        if m:
            host = m.group("host").lower()
            keys.append((f"nodes[{i}].docker", "host " + ("localhost" if _loopback(host) else host)))
    keys.append((f"nodes[{i}].fabric_ip", "host " + n.fabric_ip))
    return keys


def _same_machine(nodes: list[Node]) -> list[tuple[str, str]]:
    """Two nodes that are one machine (the same engine, SSH host or address): the planner would see one
    node's containers as the other's and restart the deployment on every tick."""
    out: list[tuple[str, str]] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, n in enumerate(nodes):
        clashed = False
        for key, what in _machine_keys(i, n):
            j, other_key = seen.setdefault(what, (i, key))
            if j != i and not clashed and not (what.startswith("host ") and key.endswith("fabric_ip")
                                               and other_key.endswith("fabric_ip")):  # said by "duplicate fabric IP"
                out.append((key, f"{nodes[i].name} and {nodes[j].name} ({other_key}) are the same machine: both reach "
                                 f"{what}; each node needs its own engine and SSH target"))
                clashed = True
    return out


def _host_dirs(cfg: Config) -> list[tuple[str, str]]:
    """A compile cache is pruned: it must be nobody else's directory on any node it is used on."""
    out: list[tuple[str, str]] = []
    for d, dep in enumerate(cfg.deployments):
        cache = dep.serve.cache_dir
        if not cache:
            continue
        key = f"deployments[{d}].serve.cache_dir"
        mine = {n.name for n in cfg.members(dep)}
        for e, other in enumerate(cfg.deployments):
            logs = other.serve.log_host_dir
            if logs and _overlap(cache, logs):
                out.append((key, f"{_q(cache)} overlaps deployments[{e}].serve.log_host_dir {_q(logs)}: the cache's "
                                 "prune and the logs' would delete each other's files; give each its own directory"))
            if not mine & {n.name for n in cfg.members(other)}:
                continue
            for v, vol in enumerate(other.ray.volumes):
                src = vol.split(":")[0]
                # "/" (read-only: read-write is refused) holds everything: the host, not a data directory
                if src.startswith("/") and os.path.normpath(src) not in ("/", "//") and _overlap(cache, os.path.normpath(src)):
                    out.append((key, f"{_q(cache)} overlaps the volume source {_q(src)} "
                                     f"(deployments[{e}].ray.volumes[{v}]): the cache's prune would delete what is "
                                     "mounted there (models, data); give the cache a directory of its own"))
        state = os.path.normpath(cfg.supervisor.state_dir)
        if _inside(state, cache) or _inside(cache, os.path.join(state, "deployments")):
            out.append((key, f"{_q(cache)} overlaps supervisor.state_dir {_q(state)}'s own files: give the cache a "
                             "directory of its own"))
    return out


# Ray's own listeners on every node it runs on (ray start's defaults): the GCS, the dashboard, the client
# server and the dashboard agent. Ours (ray.port, dashboard_port) are checked among the deployment's ports.
_RAY_PORTS = {6379: "Ray's GCS", 8265: "Ray's dashboard", 10001: "Ray's client server",
              52365: "Ray's dashboard agent"}


def _ports_and_endpoints(cfg: Config) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    ray_nodes = {n.name for dep in cfg.deployments if dep.uses_ray for n in cfg.members(dep)}
    serves: dict[tuple[str, int], int] = {}  # (address, port) -> the deployment serving there
    for d, dep in enumerate(cfg.deployments):
        members = cfg.members(dep)
        if not members:
            continue
        head = members[0]
        mine = [(f"deployments[{d}].serve.port", dep.serve.port)]
        if not dep.uses_ray and len(members) > 1:
            mine.append((f"deployments[{d}].serve.master_port", dep.serve.master_port))
        for key, port in mine:
            if port in _RAY_PORTS and ray_nodes & {n.name for n in members}:
                out.append((key, f"port {port} is {_RAY_PORTS[port]} on {sorted(ray_nodes & {n.name for n in members})[0]}: "
                                 "give it a port Ray does not take"))
        for ip in {head.fabric_ip, dep.serve.host}:
            serves[(ip, dep.serve.port)] = d
    if cfg.metrics.listen and cfg.metrics.port in _RAY_PORTS and any(n.role == "head" and n.name in ray_nodes
                                                                      for n in cfg.nodes):
        out.append(("metrics.listen", f"port {cfg.metrics.port} is {_RAY_PORTS[cfg.metrics.port]} on the head: give "
                                      "the metrics a port Ray does not take"))
    for d, dep in enumerate(cfg.deployments):
        u = urlsplit(dep.readiness.endpoint) if dep.readiness.endpoint else None
        if u is None:
            continue
        key = f"deployments[{d}].readiness.endpoint"
        if u.username is not None or u.password is not None:
            out.append((key, "carries user:password@, and the endpoint is shown in status.json (world-readable): "
                             "give the API key in api_key_file or api_key_env instead"))
        port = u.port or (443 if u.scheme == "https" else 80)
        other = next((e for (ip, p), e in serves.items() if p == port and e != d
                      and (ip == u.hostname or ip == "0.0.0.0")
                      and (ip != "0.0.0.0" or u.hostname in {n.fabric_ip for n in cfg.members(cfg.deployments[e])})),
                     None)
        if other is not None:
            out.append((key, f"{u.hostname}:{port} is deployments[{other}] ({cfg.deployments[other].name})'s serve, "
                             "not this deployment's: probe this deployment's own port"))
    return out


def _program_problem(program: str) -> str:
    if not program.startswith("/"):
        return ""  # a name looked up on PATH where it runs
    try:
        st = os.stat(program)
    except OSError as e:
        return f"{_q(program)}: {e.strerror or type(e).__name__}: give the program's absolute path"
    if not stat.S_ISREG(st.st_mode):
        return f"{_q(program)} is not a regular file: give the program's absolute path"
    if not os.access(program, os.X_OK):
        return f"{_q(program)} is not executable: chmod +x it, or give the program's absolute path"
    return ""


def _local_programs(cfg: Config) -> list[tuple[str, str]]:
    """Programs run here, on the daemon's machine: each must be an executable file, or it raises on every
    tick instead of observing."""
    out: list[tuple[str, str]] = []
    for i, n in enumerate(cfg.nodes):
        argvs = {"oob": n.oob}
        if not n.remote:
            argvs.update(nvidia_smi=n.nvidia_smi, meminfo=n.meminfo, ip=n.ip, drop_caches=n.drop_caches)
        for name, argv in argvs.items():
            if argv and "/" in argv[0] and not argv[0].startswith("/"):
                out.append((f"nodes[{i}].{name}[0]", f"{_q(argv[0])} is a relative path: give an absolute path or a "
                                                     "name on PATH (the daemon's working directory is not yours)"))
            elif argv and (why := _program_problem(argv[0])):
                out.append((f"nodes[{i}].{name}[0]", why))
    if cfg.alerts.command:
        program = cfg.alerts.command[0]
        if not program.startswith("/"):
            out.append(("alerts.command[0]", f"{_q(program)} is not an absolute path: the daemon's PATH and working "
                                             "directory are not yours; give e.g. \"/usr/local/bin/page-oncall\""))
        elif why := _program_problem(program):
            out.append(("alerts.command[0]", why))
    return out


class Config(_Strict):
    supervisor: Supervisor = Supervisor()
    healing: Healing = Healing()
    retry: Retry = Retry()
    memory: Memory = Memory()
    metrics: Metrics = Metrics()
    alerts: Alerts = Alerts()
    nodes: list[Node]
    stale: Stale = Stale()
    deployments: list[Deployment]
    _owners: frozenset[str] = PrivateAttr(default=frozenset())
    # What `check` reports but accepts: "<file>: <key>: <why>" lines, set by parse().
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        problems: list[tuple[str, str]] = []
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if name in names[:i]:
                problems.append((f"nodes[{i}].name", f"duplicate node {name!r}"))
        ips = [n.fabric_ip for n in self.nodes]
        for i, ip in enumerate(ips):
            if ip in ips[:i]:
                problems.append((f"nodes[{i}].fabric_ip", f"duplicate fabric IP {ip}"))
        heads = [i for i, n in enumerate(self.nodes) if n.role == "head"]
        if not heads:
            problems.append(("nodes", "no node has role = \"head\""))
        for i in heads[1:]:
            problems.append((f"nodes[{i}].role", "more than one head node"))
        for i, n in enumerate(self.nodes):
            if n.role == "worker" and not n.ssh:
                problems.append((f"nodes[{i}].ssh", "a worker needs an SSH target, e.g. \"root@spark-2\""))
            if n.role == "worker" and n.docker == "local":
                problems.append((f"nodes[{i}].docker", "a worker's engine is remote, e.g. \"ssh://root@spark-2\""))
        deps = [dep.name for dep in self.deployments]
        if not self.deployments:
            problems.append(("deployments", "no deployment: add a [[deployments]] table"))
        for d, dep in enumerate(self.deployments):
            if dep.name in deps[:d]:
                problems.append((f"deployments[{d}].name", f"duplicate deployment {dep.name!r}: each needs its own name "
                                 "(it names its containers and owns them)"))
            for j, a in enumerate(dep.after):
                if a not in deps or a == dep.name:
                    problems.append((f"deployments[{d}].after[{j}]", f"{a!r} is not another deployment "
                                     f"(deployments: {', '.join(deps)})"))
        cycle = _after_cycle(self.deployments)
        if cycle:
            problems.append(("deployments", f"the start order goes round in a circle: {' -> '.join(cycle)}"))
        own_containers: dict[str, str] = {}
        listening: dict[tuple[str, int], str] = {}  # (host node, port) -> the key that takes it
        shares: dict[str, list[tuple[str, float]]] = {}
        for d, dep in enumerate(self.deployments):
            for j, nn in enumerate(dep.nodes):
                if nn not in names:
                    problems.append((f"deployments[{d}].nodes[{j}]", f"unknown node {nn!r}"))
                elif nn in dep.nodes[:j]:
                    problems.append((f"deployments[{d}].nodes[{j}]", f"{nn!r} is listed twice: list each node once"))
            members = self.members(dep)
            gpus = sum(n.gpus for n in members)
            want = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
            if not members:
                pass  # unknown nodes: said above
            elif gpus == 0:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 "its nodes have no GPUs: set nodes[].gpus"))
            elif want > gpus:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 f"TP x PP = {want} is larger than the {gpus} GPUs configured on its nodes: make "
                                 f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or add GPUs "
                                 "(nodes[].gpus, deployments.nodes)"))
            elif want < gpus:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 f"TP x PP = {want} is smaller than the {gpus} GPUs configured on its nodes "
                                 f"({gpus - want} would sit idle or fail placement): make "
                                 f"tensor_parallel_size x pipeline_parallel_size equal {gpus}, or list fewer "
                                 "GPUs (nodes[].gpus, deployments.nodes)"))
            if not members:
                continue
            # Everything below listens on its node's host network: one port each, across deployments too.
            host = members[0].name
            ports = ([(f"deployments[{d}].ray.port", dep.ray.port),
                      (f"deployments[{d}].ray.dashboard_port", dep.ray.dashboard_port)] if dep.uses_ray else [])
            ports.append((f"deployments[{d}].serve.port", dep.serve.port))
            if not dep.uses_ray and len(members) > 1:
                ports.append((f"deployments[{d}].serve.master_port", dep.serve.master_port))
            for key, port in ports:
                other = listening.setdefault((host, port), key)
                if other != key:
                    problems.append((key, f"port {port} is also {other} on {host}: they share the node's host "
                                          "network; give each its own port"))
            for n in members:
                own_containers[f"{dep.name}-ray-{n.name}"] = n.name
                own_containers[f"{dep.name}-vllm-{n.name}"] = n.name
                shares.setdefault(n.name, []).append((dep.name, dep.serve.gpu_memory_utilization))
        if self.metrics.listen and heads:  # the daemon's own, on the head
            clash = listening.get((self.nodes[heads[0]].name, self.metrics.port))
            if clash:
                problems.append(("metrics.listen", f"port {self.metrics.port} is also {clash} on "
                                 f"{self.nodes[heads[0]].name}: give the metrics their own port"))
        limit = 1 - self.memory.share_margin
        for node, taken in shares.items():
            total = sum(u for _, u in taken)
            if len(taken) > 1 and total > limit + 1e-9:
                d = next(i for i, dep in enumerate(self.deployments) if dep.name == taken[-1][0])
                problems.append((f"deployments[{d}].serve.gpu_memory_utilization",
                                 f"the deployments on {node} ask for {total:.2f} of its GPU memory "
                                 f"({', '.join(f'{n} {u:g}' for n, u in taken)}), more than {limit:.2f} "
                                 f"(1 - memory.share_margin): vLLM would refuse the last to start; lower them"))
        for i, c in enumerate(self.stale.containers):
            if c in own_containers:
                problems.append((f"stale.containers[{i}]", f"{c!r} is the supervisor's own Ray container on "
                                                           f"{own_containers[c]}: remove it from the list"))
        problems += _same_machine(self.nodes)
        problems += _host_dirs(self)
        problems += _ports_and_endpoints(self)
        problems += _local_programs(self)
        _raise(problems)
        return self

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    def view(self, dep: Deployment) -> Config:
        """One deployment's own config: its nodes only, its own state directory under ours (repair log, bests,
        status), and the names of every configured deployment (``owners``: their containers are nobody's
        orphans). The reconcile machinery runs on a view, one per deployment."""
        sup = self.supervisor.model_copy(update={"state_dir": deployment_dir(self.supervisor.state_dir, dep.name)})
        v = self.model_copy(update={"deployments": [dep], "nodes": self.members(dep), "supervisor": sup})
        v._owners = frozenset(d.name for d in self.deployments)
        return v

    @property
    def owners(self) -> frozenset[str]:
        """Every configured deployment's name: a container labelled with one of them is owned."""
        return self._owners or frozenset(d.name for d in self.deployments)

    @property
    def deployment(self) -> Deployment:
        return self.deployments[0]

    def members(self, dep: Deployment) -> list[Node]:
        """The deployment's nodes, head first (Ray needs the head up before workers join)."""
        nodes = [n for n in self.nodes if not dep.nodes or n.name in dep.nodes]
        return sorted(nodes, key=lambda n: n.role != "head")

    def serve_node(self, dep: Deployment) -> Node:
        """Where the serve process runs: the head of its nodes."""
        return self.members(dep)[0]

    def endpoint(self, dep: Deployment) -> str:
        return dep.readiness.endpoint or f"http://{self.serve_node(dep).fabric_ip}:{dep.serve.port}"


# ----------------------------------------------------------------------------------------------------
_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def _part(k: str) -> str:
    """One key of a path, quoted the TOML way when it is not a bare key."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _q(k)


def _join(path: str, k: str) -> str:
    return f"{path}.{_part(k)}" if path else _part(k)


def _expand(value: Any, path: str, problems: list[str], env: dict[str, str]) -> Any:
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$$":
                return "$"
            name = m.group(1)
            if name not in env:
                problems.append(f"{path}: environment variable {name} is not set")
                return ""
            return env[name]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, _join(path, str(k)), problems, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", problems, env) for i, v in enumerate(value)]
    return value


def _control(s: str) -> str:
    """The first control character of ``s`` other than tab, or invisible format character (bidi overrides,
    zero-width joiners: text that reads otherwise than it is), as U+XXXX, or ""."""
    for c in s:
        if c != "\t" and unicodedata.category(c) in ("Cc", "Cf"):
            return f"U+{ord(c):04X}"
    return ""


def _kind(code: str) -> str:
    return "invisible format" if unicodedata.category(chr(int(code[2:], 16))) == "Cf" else "control"


def _controls(value: Any, path: str, problems: list[str]) -> None:
    if isinstance(value, str):
        if c := _control(value):
            problems.append(f"{path or '(top level)'}: contains the {_kind(c)} character {c}: remove it (tab "
                            "is the only control character allowed)")
    elif isinstance(value, dict):
        for k, v in value.items():
            if c := _control(str(k)):
                problems.append(f"{_join(path, str(k))}: the key contains the {_kind(c)} character {c}: rename it")
            else:
                _controls(v, _join(path, str(k)), problems)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _controls(v, f"{path}[{i}]", problems)


def _key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]" or part.startswith(("function-", "tagged-union")):
            continue
        else:
            out = _join(out, part)
    return out or "(top level)"


def _inner_model(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in typing.get_args(ann):
        if m := _inner_model(a):
            return m
    return None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys allowed where ``loc`` points (for "did you mean"), or []."""
    model: type[BaseModel] | None = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return []
        model = _inner_model(model.model_fields[part].annotation)
    return list(model.model_fields) if model else []


# Keys that existed once: say what replaced them instead of "unknown key".
_REMOVED = {
    ("readiness", "api_key"): "removed: a key written in the config ends up on command lines and in the "
                              "journal; put it in a root-only file and set api_key_file = \"/etc/spark-supervisor/"
                              "api-key\", or set api_key_env to the name of an environment variable of the "
                              "supervisor",
}


def _format(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors(include_url=False, include_input=False):
        msg = e["msg"].removeprefix("Value error, ")
        loc = e["loc"]
        key = _key(loc)
        if e["type"] == "extra_forbidden":
            strs = tuple(p for p in loc if isinstance(p, str))
            msg = (_REMOVED.get((strs[-2], strs[-1])) if len(strs) >= 2 else None) or "unknown key"
            if msg == "unknown key" and strs:
                close = difflib.get_close_matches(strs[-1], _fields_at(loc), n=1, cutoff=0.75)
                if close:
                    msg += f" (did you mean {close[0]!r}?)"
        elif e["type"] == "finite_number":
            msg = "nan and inf are not allowed: give a finite number"
        elif e["type"] == "missing":
            msg = "required key is missing"
        for part in msg.split("\n"):
            m = re.match(r"@(.*?)@ (.*)", part)
            if not m:
                lines.append(f"{key}: {part}")
            elif m.group(1).startswith((".", "[")):
                lines.append(f"{(key if key != '(top level)' else '') + m.group(1)}: {m.group(2)}".lstrip("."))
            else:
                lines.append(f"{m.group(1)}: {m.group(2)}")
    return lines


_SPECIAL_TREES = ("/dev", "/proc", "/sys")


def _special_link(path: str) -> str:
    """The first step of ``path``'s resolution into /dev, /proc or /sys (e.g. /dev/stdin, a link to
    /proc/self/fd/0), or "": those are never a config or a key, whatever they point at now."""
    todo, done, hops = [c for c in os.path.abspath(path).split("/") if c], "/", 0
    while todo:
        part = todo.pop(0)
        nxt = os.path.normpath(os.path.join(done, part))
        if any(_inside(nxt, t) for t in _SPECIAL_TREES):
            return os.path.join(nxt, *todo)
        try:
            target = os.readlink(nxt)
        except OSError:
            done = nxt
            continue
        hops += 1
        if hops > 40:
            return ""  # a loop: the open reports it
        base = "/" if target.startswith("/") else done
        todo = [c for c in target.split("/") if c] + todo
        done = base
    return ""


def _read(path: Path, limit: int) -> tuple[bytes, str]:
    """The bytes of a small regular file, or a problem saying why not (never raises, never blocks)."""
    try:
        if special := _special_link(str(path)):
            return b"", f"is not a regular file (it leads to {special}): give the path of a file"
        if os.path.isdir(path):
            return b"", "is a directory: give the path of a file"
        return files.read_bytes(path, limit), ""
    except files.Refused as e:
        return b"", e.why
    except OSError as e:
        return b"", e.strerror or type(e).__name__
    except ValueError as e:  # e.g. a NUL in the path
        return b"", str(e)


def _key_file_mode(path: str) -> str:
    """Why a key file is not private to the daemon ("" when it is)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or type(e).__name__
    if st.st_uid != os.geteuid():
        return (f"is owned by uid {st.st_uid}, not by the supervisor (uid {os.geteuid()}): chown it to "
                f"{'root' if os.geteuid() == 0 else 'the supervisor'} and chmod 600")
    if st.st_mode & 0o077:
        return (f"has mode {stat.S_IMODE(st.st_mode):04o}: anyone but its owner could read or change the key; "
                "chmod 600 it")
    return ""


def _resolve_key(r: Readiness, env: dict[str, str]) -> tuple[str, str, str]:
    """(key, problem, field) for one readiness table; the key itself never goes into a problem."""
    if r.api_key_file:
        raw, why = _read(Path(r.api_key_file), MAX_KEY_BYTES)
        if why:
            return "", (f"cannot read {r.api_key_file}: {why}: it must be a file holding the API key, readable "
                        "by the supervisor (root)"), "api_key_file"
        try:
            key = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            return "", f"{r.api_key_file} is not UTF-8 text: put the API key in it as one line", "api_key_file"
        where, fld = r.api_key_file, "api_key_file"
    elif r.api_key_env:
        key, where, fld = env.get(r.api_key_env, "").strip(), f"environment variable {r.api_key_env}", "api_key_env"
        if r.api_key_env not in env:
            return "", (f"environment variable {r.api_key_env} is not set for the supervisor (for the unit: "
                        "Environment= or EnvironmentFile= in a drop-in)"), fld
    else:
        return "", "", ""
    if not key:
        return "", f"{where} is empty: put the API key in it", fld
    if not re.fullmatch(r"[\x21-\x7e]+", key):
        return "", (f"the key in {where} must be one line of printable ASCII without spaces (it is sent in an "
                    "HTTP header)"), fld
    return key, "", fld


def _source(path: str | Path) -> str:
    """The file as named in problems: quoted when its name would break the one-line format."""
    s = str(path)
    return _q(s) if _control(s) else s


def _env_tables(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(key, table) of every env table in the file as written."""
    out: list[tuple[str, dict[str, Any]]] = []

    def add(key: str, t: Any) -> None:
        if isinstance(t, dict):
            out.append((key, t))
    for i, n in enumerate(data.get("nodes") or []):
        if isinstance(n, dict):
            add(f"nodes[{i}].env", n.get("env"))
    for d, dep in enumerate(data.get("deployments") or []):
        if isinstance(dep, dict):
            for table, name in (("ray", "env"), ("ray", "head_env"), ("serve", "env")):
                if isinstance(dep.get(table), dict):
                    add(f"deployments[{d}].{table}.{name}", dep[table].get(name))
    return out


def _warnings(raw: dict[str, Any], cfg: Config) -> list[str]:
    """What the config may well mean but should not be: reported by `check`, accepted."""
    out = []
    for key, table in _env_tables(raw):
        for name, value in table.items():
            k = _join(key, str(name))
            secret = secret_env(str(name)) and "TOKENIZER" not in str(name).upper()
            if secret and isinstance(value, str) and value and "${" not in value:
                out.append(f"{k}: a secret written in the config file (readable by whoever reads the config, "
                           f"kept in backups): put it in the unit's EnvironmentFile= (mode 600) and write "
                           f"\"${{{name}}}\" here")
            elif str(name).upper() in _SEARCH_PATH_ENV:
                out.append(f"{k}: {name} changes where every process in the container loads code from: "
                           "prefer building it into the image")
    for d, dep in enumerate(cfg.deployments):
        if dep.readiness.api_key_file and (why := _key_file_mode(dep.readiness.api_key_file)):
            out.append(f"deployments[{d}].readiness.api_key_file: {dep.readiness.api_key_file} {why}")
        for i, a in enumerate(dep.serve.extra_args):
            flag = a.split("=", 1)[0].replace("_", "-")
            if flag.startswith("--") and len(flag) >= 5 and "--hf-token".startswith(flag):
                out.append(f"deployments[{d}].serve.extra_args[{i}]: a token on the command line is seen by every "
                           "user in `ps`: set HF_TOKEN through the unit's EnvironmentFile= and serve.env instead")
    return out


def _parse(data: Any, source: str, env: dict[str, str]) -> Config:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: (top level): expected a table of keys, got {type(data).__name__}"])
    if not data:
        raise ConfigError([f"{source}: (top level): the config is empty: it needs at least [[nodes]] and "
                           "[[deployments]] (see etc/spark-supervisor.toml)"])
    problems: list[str] = []
    raw = data
    data = _expand(data, "", problems, env)
    _controls(data, "", problems)  # as written, or brought in by an environment variable
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError([f"{source}: {p}" for p in _format(e)]) from None
    for d, dep in enumerate(cfg.deployments):
        key, why, fld = _resolve_key(dep.readiness, env)
        if why:
            problems.append(f"{source}: deployments[{d}].readiness.{fld}: {why}")
        dep.readiness._api_key = key
    if problems:
        raise ConfigError(problems)
    cfg._warnings = tuple(f"{source}: {w}" for w in _warnings(raw, cfg))
    return cfg


def parse(data: dict[str, Any], source: str, env: dict[str, str] | None = None) -> Config:
    """Validate a config already read; raises ConfigError only."""
    try:
        source = _source(source)
        return _parse(data, source, dict(os.environ) if env is None else env)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError([f"{source}: (top level): nested too deeply to be a config"]) from None
    except Exception as e:  # a bug here must still read as a config problem, never as a traceback
        raise ConfigError([f"{source}: (top level): cannot check this config ({type(e).__name__}); "
                           "please report it"]) from None


def load(path: str | Path, env: dict[str, str] | None = None) -> Config:
    """Read and validate a config file; raises ConfigError only, whatever the file is."""
    src = _source(path)
    try:
        p = Path(path)
        raw, why = _read(p, MAX_CONFIG_BYTES)
        if why:
            raise ConfigError([f"{src}: cannot read: {why}"])
        try:
            text = raw.decode("utf-8").removeprefix("\ufeff")
        except UnicodeDecodeError as e:
            raise ConfigError([f"{src}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}): is this "
                               "the config file? save it as UTF-8"]) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError([f"{src}: not valid TOML: {e}"]) from None
        return parse(data, src, env)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError([f"{src}: not valid TOML: nested too deeply"]) from None
    except Exception as e:
        raise ConfigError([f"{src}: cannot load ({type(e).__name__}); please report it"]) from None


# ----------------------------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def ray_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the Ray containers: changing it replaces the whole deployment."""
    nodes = [n.model_dump(exclude={"nvidia_smi", "meminfo", "ip", "oob"}) for n in cfg.members(dep)]
    return _digest({"nodes": nodes,
                    "ray": dep.ray.model_dump(exclude={"join_timeout", "image_pull", "pull_timeout"}),
                    "backend": dep.serve.distributed_executor_backend, "cache_dir": dep.serve.cache_dir,
                    "log_host_dir": dep.serve.log_host_dir})  # both are mounts


def serve_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the serve: changing it restarts the serve (and Ray, if ray_hash changed too)."""
    spec: dict[str, Any] = {"ray": ray_hash(cfg, dep), "serve": dep.serve.model_dump(exclude={"stop_timeout", "cache_keep", "cache_max_gib",
                                                                                      "log_keep", "log_max_mib"})}
    if dep.api_key:  # a new key relaunches the serve; only a digest of it is hashed
        spec["api_key_sha256"] = hashlib.sha256(dep.api_key.encode()).hexdigest()
    return _digest(spec)


def file_hash(path: str | Path) -> str:
    raw, why = _read(Path(path), MAX_CONFIG_BYTES)
    return "" if why else hashlib.sha256(raw).hexdigest()[:12]
