"""The config's tables of what runs, one model each ([[nodes]], [stale], [[deployments]] with its ray, serve,
readiness, model and performance tables), each checking itself; the supervisor's own are in ``settings``."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, PrivateAttr, SecretStr, field_validator, model_validator

from .container_fields import (
    _ULIMIT_MAX,
    Volume,
    _container_name,
    _docker_size,
    _image,
    _image_pattern,
    _label,
    _ulimit_name,
    _ulimit_value,
    _unit_name,
    _volume,
    parse_volume,
)
from .fields import (
    AbsPath,
    Argv,
    EnvName,
    MinuteToWeek,
    OptionalAbsPath,
    OptionalArgv,
    Port,
    Sec600,
    Sec3600,
    SecDay,
    SecWeek,
    SharedEnvName,
    _bind_ip,
    _docker_url,
    _endpoint,
    _fabric_ip,
    _ifname,
    _no_space,
    _opt_env_name,
    _q,
    _raise,
    _split_args,
    _ssh_target,
    _Strict,
    _system_dir,
)
from .flags import _RAY_FLAGS, _SERVE_FLAGS, _own_flags, flag_value


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
    # Where this node's /sys, /proc and /etc are read for its fabric and identity facts (scripts/host-facts.sh):
    # "/" on a real host; a tree of its own per node where the hardware is a stand-in (the testbed).
    host_root: AbsPath = "/"
    # A node reached as a normal user (docs/privileges.md): the argument list put before exactly the commands
    # that need root there, `systemctl stop|disable|mask` of [stale] units and the built-in page-cache drop,
    # e.g. ["sudo", "-n"]. Nothing else goes through it: Docker is reached through the docker group.
    become: list[str] = []
    # The host keys this node's SSH trusts and the key it logs in with, used by ssh and by an ssh:// Docker
    # engine alike. "": the running user's own (~/.ssh/known_hosts; ssh's config or its default keys).
    known_hosts: OptionalAbsPath = ""
    identity_file: OptionalAbsPath = ""

    @field_validator("become")
    @classmethod
    def _become(cls, v: list[str]) -> list[str]:
        if not v:
            return v
        if any(not a.strip() for a in v):
            raise ValueError(f"{v!r} has an empty argument: give the program and its options, e.g. [\"sudo\", \"-n\"]")
        if not _no_space(v[0]):
            raise ValueError(f"{_q(v[0])} is one argument with spaces: give each as its own element, "
                             "e.g. [\"sudo\", \"-n\"]")
        if os.path.basename(v[0]) == "sudo" and not any(a in ("-n", "--non-interactive") for a in v[1:]):
            raise ValueError(f"{v!r}: sudo without -n asks for a password, which no one is there to type (the "
                             "command fails or hangs until its timeout): add \"-n\" and a NOPASSWD rule "
                             "(docs/privileges.md)")
        return v

    @field_validator("known_hosts", "identity_file")
    @classmethod
    def _ssh_file(cls, v: str) -> str:
        if not _no_space(v):
            raise ValueError(f"{_q(v)} contains whitespace (ssh reads a known_hosts option as a list of files): "
                             "use a path without spaces")
        return v

    @model_validator(mode="after")
    def _ssh_files_need_ssh(self) -> Node:
        if (self.known_hosts or self.identity_file) and not (self.ssh or self.docker.startswith("ssh://")):
            key = ".known_hosts" if self.known_hosts else ".identity_file"
            _raise([(key, "is used only to reach a node over SSH, and this node has no ssh and no ssh:// "
                     "docker: remove it, or set ssh")])
        return self

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


RAY_CLIENT_PORT = 10001  # `ray start --head` serves Ray Client here unless --ray-client-server-port says otherwise


class Ray(_Strict):
    # Required (Deployment._image_given): no image is right for every owner. The Ray backend needs Ray in it and
    # vLLM's own images after 0.19.1 (and NVIDIA's NGC one) have none; etc/vllm-ray.Dockerfile builds one. A default
    # would also be an upgrade hazard: a config that relied on it would name another image after an upgrade, and
    # the deployment serving on the old one would be replaced.
    image: Annotated[str, AfterValidator(_image)] = ""
    port: Port = 6379
    dashboard_port: Port = 8265
    command: Argv = ["ray", "start"]
    extra_args: list[str] = []
    shm_size: Annotated[str, AfterValidator(_docker_size)] = "10.24g"
    gpus: bool = True
    # Asked inside each running container of the deployment on a full observation: after a host
    # `systemctl daemon-reload` the containers lose their GPU devices while the host's nvidia-smi still works
    # (NVIDIA/nvidia-container-toolkit #48), and NVML's "Unknown Error" is seen only in here. [] asks nothing.
    nvidia_smi: OptionalArgv = ["nvidia-smi", "-L"]
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
    # A pull starts only with this much free on the engine's disk (its DockerRootDir): a vLLM image is ~20 GB,
    # and a disk filled by a pull takes the serving containers' logs and caches down with it. 0: no check.
    pull_min_free_gib: Annotated[float, Field(ge=0, le=10000)] = 40

    _split = field_validator("extra_args", mode="before", json_schema_input_type=str | list[str])(_split_args)

    @property
    def mounts(self) -> tuple[Volume, ...]:
        """The volumes, each read once (config.container_fields.parse_volume)."""
        return tuple(parse_volume(v) for v in self.volumes)

    @property
    def client_port(self) -> int:
        """Where the head's Ray serves Ray Client: --ray-client-server-port in extra_args, else Ray's default."""
        port = flag_value(self.extra_args, "--ray-client-server-port")
        return int(port) if port is not None and port.isdigit() else RAY_CLIENT_PORT

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
        for i, (src, dst, mode) in enumerate(self.mounts):
            norm = f"{src}:{dst}:{mode}"
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

    @property
    def revision(self) -> str:
        """The model's --revision in extra_args ("" when none): which snapshot of a hub model vLLM loads."""
        return flag_value(self.extra_args, "--revision") or ""

    @property
    def download_dir(self) -> str:
        """--download-dir in extra_args ("" when none): the hub cache vLLM looks in instead of the default."""
        return flag_value(self.extra_args, "--download-dir") or ""


class Readiness(_Strict):
    endpoint: Annotated[str, AfterValidator(_endpoint)] = ""
    poll_interval: Sec600 = 5
    # The cold budget: a load that has not moved since it was first seen is stopped then. Past it, a load that
    # moves is left to stall_timeout, up to three budgets (a first load on GB10 pays torch.compile and CUDA-graph
    # capture on top of the weights: 20-36 min reported). Learned deadlines never exceed it.
    deadline: SecWeek = 3600
    stall_timeout: SecWeek = 900  # no load progress (shard, milestone) this long: a stall, repaired
    # Deadlines learned from history (reconcile.loadtimes): after learn_after good loads of the same key (images,
    # driver, nodes, model, serve spec), a load's deadline is max(deadline_floor, p95 of their durations x
    # deadline_margin) and its stall limit max(stall_floor, p95 of their longest silences x the margin), never
    # above deadline and stall_timeout: those stay the cold budget (a first load after a change gets them).
    learn_deadlines: bool = True
    # At least a minute each: a learned limit below it would take a slow tick or one cold shard for a stall.
    deadline_floor: MinuteToWeek = 300
    stall_floor: MinuteToWeek = 120
    deadline_margin: Annotated[float, Field(ge=1, le=20)] = 3.0
    learn_after: Annotated[int, Field(ge=1, le=20)] = 3
    request_timeout: Sec3600 = 60
    # What a real request is: a chat completion (an LLM), one embedding (an embeddings model: it cannot
    # chat) or a rerank of two documents (a reranker). Readiness and the periodic deep probe both send it.
    probe: Literal["chat", "embeddings", "rerank"] = "chat"
    sanity_prompt: str = "Reply with the single word: ready"
    sanity_max_tokens: Annotated[int, Field(ge=1, le=4096)] = 32
    api_key_file: OptionalAbsPath = ""  # a file holding the serve's API key, read at load
    api_key_env: Annotated[str, AfterValidator(_opt_env_name)] = ""  # or an environment variable holding it

    # The resolved key: set by parse(), never dumped, never in repr, compared by ==.
    _api_key: SecretStr = PrivateAttr(default=SecretStr(""))

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


class Performance(_Strict):
    """[deployments.performance]: the performance verdict (perf). After every start that reaches SERVING, one
    stream of a fixed prompt with ``max_tokens`` generated in full (the model's own end ignored) gives the
    time to first token and the decode speed; ``streams`` > 1 adds their aggregate. A decode speed more than
    ``regression`` below the best for its key (image IDs, model, serve spec, nodes), or below ``baseline``
    when set, is DEGRADED ThroughputRegression: never a repair by itself. Measured again every ``interval``
    only when the engine is idle (its /metrics: nothing running or waiting)."""

    check: bool = True
    prompt: str = "Count from one to one hundred in words, separated by commas."
    max_tokens: Annotated[int, Field(ge=8, le=4096)] = 128
    streams: Annotated[int, Field(ge=1, le=32)] = 1
    regression: Annotated[float, Field(gt=0, lt=1)] = 0.25
    baseline: Annotated[float, Field(ge=0)] = 0.0  # decode tokens/s the operator expects (0: the best seen)
    interval: Annotated[float, Field(ge=0, le=7 * 86400)] = 6 * 3600  # 0: only after a start
    timeout: Sec3600 = 300


class Fabric(_Strict):
    """[deployments.fabric]: what is checked below vLLM (fabric.py). A multi-node serve runs with NCCL's INFO
    lines for INIT and NET (unless its env sets them), so the transport each rank chose is read from its log:
    sockets where the fabric is RDMA is DEGRADED FabricFallback. Before a (re)start a link down, MTUs unequal
    between members, a rate below ``min_rate_gbps`` or NCCL_IB_GID_INDEX no longer holding the fabric IPv4
    hold the start with the reason; while serving they are DEGRADED, never a repair."""

    check: bool = True
    nccl_debug: Annotated[str, Field(pattern=r"^(|VERSION|WARN|INFO|TRACE)$")] = "INFO"  # "": leave NCCL's default
    nccl_debug_subsys: Annotated[str, Field(pattern=r"^[A-Z,^]*$")] = "INIT,NET"
    min_rate_gbps: Annotated[float, Field(ge=0, le=100000)] = 0.0  # 0: no floor


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
    performance: Performance = Field(default_factory=Performance)
    fabric: Fabric = Field(default_factory=Fabric)

    @model_validator(mode="after")
    def _image_given(self) -> Deployment:
        if not self.ray.image:
            _raise([(".ray.image", "required: the image every node runs, e.g. \"spark-vllm-ray:latest\" built with "
                     "etc/vllm-ray.Dockerfile (vLLM's own images after 0.19.1 have no Ray; for the mp backend a vLLM "
                     "image such as \"vllm/vllm-openai:v0.19.1\" will do)")])
        return self

    @model_validator(mode="after")
    def _model_source(self) -> Deployment:
        src = self.model.prefetch_from.rstrip("/")
        dsts = [m.dst.rstrip("/") for m in self.ray.mounts]
        if src and not any(src == d or src.startswith(d + "/") or d == "" for d in dsts):
            _raise([(".model.prefetch_from", f"{_q(src)} is on none of deployments.ray.volumes' destinations, so the "
                     f"image cannot see it: add a volume, e.g. \"{src}:{src}:ro\"")])
        return self

    @property
    def api_key(self) -> SecretStr:
        """The serve's API key from readiness.api_key_file / api_key_env (empty when none): a SecretStr, so
        that no repr, log line or status shows it; its value is read only where it is handed on."""
        return self.readiness._api_key

    @property
    def uses_ray(self) -> bool:
        return self.serve.distributed_executor_backend == "ray"
