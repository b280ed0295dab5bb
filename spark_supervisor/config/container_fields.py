"""Fields about containers and units: what may be stopped as the old stack's (systemd units, container
names, labels, image patterns) and what shapes a container (volumes, sizes, ulimits, image references)."""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from typing import NamedTuple

from .fields import _no_space, _q
from .labels import LABEL_PREFIX

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


class Volume(NamedTuple):
    """One of deployments.ray.volumes, read: the host's source (a path or a volume name), the container's
    destination, and the mode ("rw" when none was given)."""

    src: str
    dst: str
    mode: str


@functools.lru_cache(maxsize=512)
def parse_volume(v: str) -> Volume:
    """A volume string (already accepted by its validator) read once: every reader asks this."""
    src, dst, *mode = v.split(":")
    return Volume(src, dst, mode[0] if mode else "rw")


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

