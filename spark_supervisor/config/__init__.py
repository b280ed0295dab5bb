"""Load and validate the TOML config; derive spec hashes.

Every problem is reported as ``<file>: <key>: <message>`` so an operator can fix it without guessing, and
nothing but a ``ConfigError`` ever leaves ``load()``/``parse()``, whatever file the OS hands us.
String values may reference environment variables as ``${NAME}`` (``$$`` for a literal ``$``).

The package, in import order (each module imports only those before it):
labels (names and limits) <- fields, container_fields, flags (one field each) <- schema (the tables of what
runs), settings (the supervisor's own) <- checks (the rules across tables) <- root (Config) <- loader (parse,
load) <- hashes (spec hashes).
Every name used outside the package is imported from here.
"""

from .hashes import file_hash, image_check_key, ray_hash, serve_hash
from .labels import (
    API_KEY_ENV,
    FABRIC_ENV,
    HASH_LABEL,
    HELPER_LABEL,
    LABEL_PREFIX,
    MAX_CONFIG_BYTES,
    MAX_KEY_BYTES,
    NODE_LABEL,
    OWNER_LABEL,
    RAY_STATE_LABEL,
    ROLE_LABEL,
)
from .loader import ConfigError, load, parse
from .root import Config, deployment_dir, deployment_secrets, known_secrets
from .schema import Deployment, Fabric, ModelFiles, Node, Performance, Ray, Readiness, Serve, Stale
from .settings import Alerts, Healing, Memory, Metrics, Retry, Supervisor

__all__ = [
    "API_KEY_ENV", "FABRIC_ENV", "HASH_LABEL", "HELPER_LABEL", "LABEL_PREFIX", "MAX_CONFIG_BYTES", "MAX_KEY_BYTES",
    "NODE_LABEL", "OWNER_LABEL", "RAY_STATE_LABEL", "ROLE_LABEL", "Alerts", "Config", "ConfigError",
    "Deployment", "Fabric", "Healing", "Memory", "Metrics", "ModelFiles", "Node", "Performance", "Ray", "Readiness", "Retry", "Serve",
    "Stale", "Supervisor", "deployment_dir", "deployment_secrets", "file_hash", "image_check_key", "known_secrets", "load", "parse",
    "ray_hash",
    "serve_hash",
]
