"""Spec hashes: what shapes a deployment's Ray containers and its serve, and the config file's own hash."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from .labels import MAX_CONFIG_BYTES
from .loader import _read
from .root import Config
from .schema import Deployment


def _digest(obj: object) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


# The fields that do not shape the containers: how the daemon reaches and reads a node, how long it waits. A field
# added to Node or Ray must be listed here unless it changes what runs: otherwise every deployment that serves
# hashes differently after an upgrade and is replaced (tests/unit/test_config.py holds the hashes to a release's).
_NOT_CONTAINERS: dict[str, set[str]] = {
    "node": {"nvidia_smi", "meminfo", "ip", "oob", "host_root", "become", "known_hosts", "identity_file"},
    "ray": {"join_timeout", "image_pull", "pull_timeout", "pull_min_free_gib", "nvidia_smi"},
}


def ray_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the Ray containers: changing it replaces the whole deployment."""
    nodes = [n.model_dump(exclude=_NOT_CONTAINERS["node"]) for n in cfg.members(dep)]
    return _digest({"nodes": nodes, "ray": dep.ray.model_dump(exclude=_NOT_CONTAINERS["ray"]),
                    "backend": dep.serve.distributed_executor_backend, "cache_dir": dep.serve.cache_dir,
                    "log_host_dir": dep.serve.log_host_dir})  # both are mounts


def image_check_key(cfg: Config, dep: Deployment) -> str:
    """What an image check depends on beside the image's ID: what the containers are made of (ray_hash) and what
    the check looks for in them -- the serve's command and the environment it runs with. A serve.command changed
    alone is a new check: the one kept for the old command would pass a command the image lacks."""
    return _digest({"ray": ray_hash(cfg, dep), "command": dep.serve.command[0], "env": dep.serve.env})


def serve_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the serve: changing it restarts the serve (and Ray, if ray_hash changed too)."""
    spec: dict[str, Any] = {"ray": ray_hash(cfg, dep), "serve": dep.serve.model_dump(exclude={"stop_timeout", "cache_keep", "cache_max_gib",
                                                                                      "log_keep", "log_max_mib"})}
    key = dep.api_key.get_secret_value()
    if key:  # a new key relaunches the serve; only a digest of it is hashed
        spec["api_key_sha256"] = hashlib.sha256(key.encode()).hexdigest()
    return _digest(spec)


def file_hash(path: str | Path) -> str:
    raw, why = _read(Path(path), MAX_CONFIG_BYTES)
    return "" if why else hashlib.sha256(raw).hexdigest()[:12]
