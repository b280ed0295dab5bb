"""Load and validate the TOML config; derive spec hashes.

Every problem is reported as ``<file>: <key>: <message>`` so an operator can fix it without guessing.
String values may reference environment variables as ``${NAME}`` (``$$`` for a literal ``$``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

OWNER_LABEL = "spark-supervisor.owner"
HASH_LABEL = "spark-supervisor.spec-hash"
NODE_LABEL = "spark-supervisor.node"
ROLE_LABEL = "spark-supervisor.role"


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Seconds = Annotated[float, Field(gt=0)]
Argv = list[str]


def _split_args(value: Any) -> Any:
    # Extra args may be written as one string (split once, here) or as a list.
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise ValueError(f"cannot split into arguments: {e}") from None
    return value


class Node(_Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    role: Literal["head", "worker"]
    fabric_ip: str
    fabric_interface: str = ""
    ssh: str = ""
    docker: str = "local"
    nvidia_smi: Argv = ["nvidia-smi"]
    meminfo: Argv = ["cat", "/proc/meminfo"]
    ip: Argv = ["ip", "-o", "addr", "show"]
    oob: Argv = []  # optional out-of-band check for `diagnose`, run on the head (e.g. a hypervisor's `pct exec`)
    gpus: Annotated[int, Field(ge=0)] = 1
    env: dict[str, str] = {}

    @field_validator("fabric_ip")
    @classmethod
    def _ip(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError(f"not an IP address: {v!r}") from None
        return v

    @field_validator("docker")
    @classmethod
    def _docker(cls, v: str) -> str:
        if v != "local" and not re.match(r"^(unix|ssh|tcp)://", v):
            raise ValueError(f"expected 'local', unix://, ssh:// or tcp://, got {v!r}")
        return v

    @property
    def remote(self) -> bool:
        return bool(self.ssh)


class Stale(_Strict):
    units: list[str] = ["vllm-proxy", "vllm-embeddings", "vllm-reranker", "vllm-cluster"]
    disable: bool = False
    mask: bool = False
    containers: list[str] = ["vllm_node", "reranker", "vllm_embeddings"]
    container_labels: list[str] = []
    image_patterns: list[str] = []
    allowed_gpu_processes: list[str] = ["Xorg", "gnome-shell"]
    residual_mib: Annotated[int, Field(ge=0)] = 512
    memory_free_timeout: Seconds = 120


class Ray(_Strict):
    image: str = "vllm/vllm-openai:latest"
    port: int = 6379
    dashboard_port: int = 8265
    command: Argv = ["ray", "start"]
    extra_args: Argv = []
    shm_size: str = "10.24g"
    gpus: bool = True
    privileged: bool = False
    ipc_host: bool = True
    init: bool = True
    volumes: list[str] = []
    ulimits: dict[str, int] = {}
    env: dict[str, str] = {"RAY_memory_monitor_refresh_ms": "0"}
    head_env: dict[str, str] = {}
    join_timeout: Seconds = 180
    image_pull: Literal["never", "if-missing"] = "never"

    _split = field_validator("extra_args", mode="before")(_split_args)


class Serve(_Strict):
    model: str
    served_model_name: str = ""
    command: Argv = ["vllm", "serve"]
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    pipeline_parallel_size: Annotated[int, Field(ge=1)] = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.85
    host: str = "0.0.0.0"
    port: int = 8000
    reasoning_parser: str = ""
    tool_call_parser: str = ""
    distributed_executor_backend: Literal["ray"] = "ray"
    placement_strategy: Literal["SPREAD", "PACK", ""] = "SPREAD"
    extra_args: Argv = []
    env: dict[str, str] = {}
    log_dir: str = "/tmp/spark-supervisor"
    stop_timeout: Seconds = 30

    _split = field_validator("extra_args", mode="before")(_split_args)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class Readiness(_Strict):
    endpoint: str = ""
    poll_interval: Seconds = 5
    deadline: Seconds = 1200
    stall_timeout: Seconds = 900  # no load progress (shard, milestone) this long: a stall, repaired
    request_timeout: Seconds = 60
    sanity_prompt: str = "Reply with the single word: ready"
    sanity_max_tokens: Annotated[int, Field(ge=1)] = 32
    api_key: str = ""


class Deployment(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")] = "llm"
    nodes: list[str] = []
    ray: Ray = Ray()
    serve: Serve
    readiness: Readiness = Readiness()


class Supervisor(_Strict):
    state_dir: str = "/var/lib/spark-supervisor"
    interval: Seconds = 5
    transition_interval: Seconds = 1
    full_observe_interval: Seconds = 60
    io_timeout: Seconds = 20
    ssh_connect_timeout: Seconds = 5
    backoff_base: Seconds = 5
    backoff_max: Seconds = 300
    ready_when: Literal["serving", "started"] = "serving"
    start_stall_timeout: Seconds = 600  # no progress this long while starting: stop extending systemd's timeout
    on_stop: Literal["leave", "teardown"] = "leave"


class Healing(_Strict):
    health_failure_threshold: Annotated[int, Field(ge=1)] = 2  # consecutive /health failures before a repair
    deep_probe_interval: Seconds = 60  # a tiny real completion: /health stays 200 when workers are wedged
    deep_probe_timeout: Seconds = 30
    deep_failure_threshold: Annotated[int, Field(ge=1)] = 2
    quick_check_interval: Seconds = 1  # Ray nodes and /health between ticks while serving
    repair_budget: Annotated[int, Field(ge=0)] = 3
    repair_window: Seconds = 6 * 3600
    node_patience: Seconds = 300  # an unreachable peer: wait this long before tearing down the rest


class Metrics(_Strict):
    listen: str = ""  # "127.0.0.1:9464" to serve Prometheus metrics; empty: off

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v and not re.match(r"^[^:\s]*:\d{1,5}$", v):
            raise ValueError(f"expected host:port, got {v!r}")
        return v


class Config(_Strict):
    supervisor: Supervisor = Supervisor()
    healing: Healing = Healing()
    metrics: Metrics = Metrics()
    nodes: list[Node]
    stale: Stale = Stale()
    deployments: list[Deployment]

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
        if len(self.deployments) != 1:
            problems.append(("deployments", f"exactly one deployment is supported, got {len(self.deployments)}"))
        for d, dep in enumerate(self.deployments):
            for j, nn in enumerate(dep.nodes):
                if nn not in names:
                    problems.append((f"deployments[{d}].nodes[{j}]", f"unknown node {nn!r}"))
            members = [n for n in self.nodes if not dep.nodes or n.name in dep.nodes]
            gpus = sum(n.gpus for n in members)
            want = dep.serve.tensor_parallel_size * dep.serve.pipeline_parallel_size
            if want > gpus:
                problems.append((f"deployments[{d}].serve.tensor_parallel_size",
                                 f"TP x PP = {want} is larger than the {gpus} GPUs configured on its nodes"))
            if dep.nodes and not any(n.role == "head" for n in members):
                problems.append((f"deployments[{d}].nodes", "must include the head node"))
        if problems:
            raise ValueError("\n".join(f"@{k}@ {m}" for k, m in problems))
        return self

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def deployment(self) -> Deployment:
        return self.deployments[0]

    def members(self, dep: Deployment) -> list[Node]:
        """The deployment's nodes, head first (Ray needs the head up before workers join)."""
        nodes = [n for n in self.nodes if not dep.nodes or n.name in dep.nodes]
        return sorted(nodes, key=lambda n: n.role != "head")

    def endpoint(self, dep: Deployment) -> str:
        return dep.readiness.endpoint or f"http://{self.head.fabric_ip}:{dep.serve.port}"


# ----------------------------------------------------------------------------------------------------
_VAR = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)\})")


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
        return {k: _expand(v, f"{path}.{k}" if path else k, problems, env) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", problems, env) for i, v in enumerate(value)]
    return value


def _key(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith(("function-", "tagged-union")):
            out += ("." if out else "") + part
    return out or "(top level)"


def _format(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        key = _key(e["loc"])
        for part in msg.split("\n"):
            m = re.match(r"@(.*?)@ (.*)", part)
            lines.append(f"{m.group(1)}: {m.group(2)}" if m else f"{key}: {part}")
    return lines


def parse(data: dict[str, Any], source: str, env: dict[str, str] | None = None) -> Config:
    problems: list[str] = []
    data = _expand(data, "", problems, dict(os.environ) if env is None else env)
    if problems:
        raise ConfigError([f"{source}: {p}" for p in problems])
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError([f"{source}: {p}" for p in _format(e)]) from None


def load(path: str | Path, env: dict[str, str] | None = None) -> Config:
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror}"]) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    return parse(data, str(path), env)


# ----------------------------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def ray_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the Ray containers: changing it replaces the whole deployment."""
    nodes = [n.model_dump(exclude={"nvidia_smi", "meminfo", "ip", "oob"}) for n in cfg.members(dep)]
    return _digest({"nodes": nodes, "ray": dep.ray.model_dump(exclude={"join_timeout", "image_pull"})})


def serve_hash(cfg: Config, dep: Deployment) -> str:
    """What shapes the serve: changing it restarts the serve (and Ray, if ray_hash changed too)."""
    return _digest({"ray": ray_hash(cfg, dep), "serve": dep.serve.model_dump(exclude={"stop_timeout"})})


def file_hash(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return ""
