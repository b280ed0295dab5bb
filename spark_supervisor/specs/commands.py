"""Pure builders for every command and container spec the supervisor runs.

Commands are argument lists. The only shell used is a fixed script (``SERVE_WRAPPER``) that receives
its inputs as positional parameters, never interpolated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..base import redaction
from ..config import Config, Deployment, Node, deployment_secrets, ray_hash
from ..config.identity import (
    PREFETCH_ROLE as PREFETCH_ROLE,  # the prefetch's role, also named where it is built
)
from ..config.identity import helper_labels, node_container_name, node_labels, prefetch_labels
from ..config.identity import prefetch_name as prefetch_name  # its name, also named where it is built
from ..model import ContainerSpec
from . import modelprobe, script


def cache_parent(dep: Deployment) -> str:
    """This deployment's compile caches on every node's disk (one directory per serve spec hash)."""
    return f"{dep.serve.cache_dir}/{dep.name}" if dep.serve.cache_dir else ""


def cache_env(dep: Deployment, spec_hash: str) -> dict[str, str]:
    """Where vLLM and the compilers under it write what can be reused by the next start of the same spec."""
    if not dep.serve.cache_dir:
        return {}
    root = f"{cache_parent(dep)}/{spec_hash}"
    # torch inductor writes its kernels, FX-graph cache and a precompiled header under
    # tempfile.gettempdir()/torchinductor_<user>, and TORCHINDUCTOR_CACHE_DIR does not move the header
    # (tests/fixtures/real_vllm/FINDINGS.md): the serve's TMPDIR is in the cache too (the wrapper makes it).
    return {"VLLM_CACHE_ROOT": root, "TMPDIR": f"{root}/tmp", "TRITON_CACHE_DIR": f"{root}/triton"}


def node_env(node: Node) -> dict[str, str]:
    """The per-node fabric environment; never copied from one node to another (sparkrun #135)."""
    env = {"VLLM_HOST_IP": node.fabric_ip, "RAY_NODE_IP_ADDRESS": node.fabric_ip}
    if node.fabric_interface:
        for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES",
                    "OMPI_MCA_btl_tcp_if_include"):
            env[key] = node.fabric_interface
    return env


def nccl_env(cfg: Config, dep: Deployment) -> dict[str, str]:
    """NCCL's INFO lines for INIT and NET in a serve across nodes ([deployments.fabric]): the transport each rank
    chose is read from them (logscan.transports). Lowest precedence: the deployment's own env wins."""
    f = dep.fabric
    if not f.nccl_debug or len(cfg.members(dep)) < 2:
        return {}
    return {"NCCL_DEBUG": f.nccl_debug, **({"NCCL_DEBUG_SUBSYS": f.nccl_debug_subsys} if f.nccl_debug_subsys else {})}


def node_container(cfg: Config, dep: Deployment, node: Node, *, dashboard: bool = True) -> ContainerSpec:
    """The container settings come from [deployments.ray] for both backends; with mp it only holds the
    serve (started in it like in a Ray head), so it runs `sleep infinity` under docker's init.

    ``dashboard``: the image's Ray has its dashboard (ray[default]); without it the head starts without
    one (asking for it fails the start) and its label says Ray is read through the GCS instead."""
    ray, head = dep.ray, cfg.serve_node(dep)
    if not dep.uses_ray:
        command = ["sleep", "infinity"]
    elif node.name == head.name:
        command = [*ray.command, "--block", "--head", f"--port={ray.port}"]
        command += ([f"--dashboard-host={node.fabric_ip}", f"--dashboard-port={ray.dashboard_port}",
                     "--include-dashboard=True"] if dashboard else ["--include-dashboard=False"])
    else:
        command = [*ray.command, "--block", f"--address={head.fabric_ip}:{ray.port}"]
    if dep.uses_ray:
        command += [f"--node-ip-address={node.fabric_ip}", f"--num-gpus={node.gpus}", "--disable-usage-stats",
                    *ray.extra_args]
    env = {**nccl_env(cfg, dep), **ray.env, **(ray.head_env if node.name == head.name else {}), **node_env(node),
           **node.env, "RAY_USAGE_STATS_ENABLED": "0"}
    volumes: dict[str, dict[str, str]] = {}
    for src, dst, mode in ray.mounts:
        volumes[src] = {"bind": dst, "mode": mode}
    if cache_parent(dep):
        volumes[cache_parent(dep)] = {"bind": cache_parent(dep), "mode": "rw"}
    if serve_log_parent(dep) and node.name in {n.name for n in serve_nodes(cfg, dep)}:
        volumes[serve_log_parent(dep)] = {"bind": serve_log_parent(dep), "mode": "rw"}
    options: dict[str, Any] = {
        "network_mode": "host", "shm_size": ray.shm_size, "init": ray.init, "privileged": ray.privileged,
        "volumes": volumes,
    }
    if ray.ipc_host:
        options["ipc_mode"] = "host"
    if ray.gpus:
        options["gpus_all"] = True
    if ray.ulimits:
        options["ulimits"] = dict(ray.ulimits)
    labels = node_labels(dep, node, head=node.name == head.name, spec_hash=ray_hash(cfg, dep), dashboard=dashboard)
    return ContainerSpec(node_container_name(dep, node), ray.image, command, env, labels, options)


DROP_CACHES = ["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"]
SYNC = ["sync"]
DROP_CACHES_SYSCTL = ["sysctl", "-w", "vm.drop_caches=3"]


def drop_caches(become: Sequence[str] = ()) -> list[list[str]]:
    """A worker's built-in page-cache drop, the commands in order. As root, one shell line. Through a
    privilege prefix ([[nodes]] become): `sync` as the user (sync(2) needs no privilege) and then only the
    write that does, as a program with fixed arguments, so that the sudoers rule names no shell
    (docs/privileges.md)."""
    if not become:
        return [DROP_CACHES]
    return [SYNC, [*become, *DROP_CACHES_SYSCTL]]


def drop_caches_container(image: str) -> ContainerSpec:
    """A short-lived container that drops the head's page cache for a daemon that may not write /proc/sys."""
    return ContainerSpec("", image, ["sh", "-c", "sync; echo 3 > /host-vm/drop_caches"], {},
                         helper_labels("drop-caches"),
                         {"cap_add": ["SYS_ADMIN"], "volumes": {"/proc/sys/vm": {"bind": "/host-vm", "mode": "rw"}},
                          "network_mode": "none"})


def multi_node_mp(cfg: Config, dep: Deployment) -> bool:
    """vLLM's own multi-node mode: a serve process (a rank) on every node, no Ray."""
    return not dep.uses_ray and len(cfg.members(dep)) > 1


def serve_nodes(cfg: Config, dep: Deployment) -> list[Node]:
    """The nodes a serve process runs on, the API's (rank 0, the head) first."""
    return cfg.members(dep) if multi_node_mp(cfg, dep) else [cfg.serve_node(dep)]


def rank_args(cfg: Config, dep: Deployment, node: Node) -> list[str]:
    """mp across nodes: which rank this node is and where rank 0 waits for the others (its fabric IP)."""
    if not multi_node_mp(cfg, dep):
        return []
    members = cfg.members(dep)
    rank = [n.name for n in members].index(node.name)
    args = ["--nnodes", str(len(members)), "--node-rank", str(rank), "--master-addr", members[0].fabric_ip,
            "--master-port", str(dep.serve.master_port)]
    return args + (["--headless"] if rank else [])


def serve_argv(dep: Deployment, ranks: list[str] | None = None) -> list[str]:
    s = dep.serve
    model = [s.model] if s.model_arg == "positional" else ["--model", s.model]
    argv = [*s.command, *model, "--host", s.host, "--port", str(s.port),
            "--tensor-parallel-size", str(s.tensor_parallel_size),
            "--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if dep.uses_ray or s.tensor_parallel_size * s.pipeline_parallel_size > 1:
        argv += ["--distributed-executor-backend", s.distributed_executor_backend]  # one GPU: vLLM's own choice
    if s.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.served_model_name:
        argv += ["--served-model-name", s.served_model_name]
    if s.reasoning_parser:
        argv += ["--reasoning-parser", s.reasoning_parser]
    if s.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
    # the API key goes through the environment: argv is public (ps)
    return argv + list(ranks or []) + list(s.extra_args)


def shown_argv(cfg: Config, dep: Deployment, argv: list[str]) -> list[str]:
    """An argv fit for a log line or status (secret flags by any prefix, secret NAME=value, known secrets)."""
    return redaction.argv(argv, deployment_secrets(cfg, dep))


def serve_env(cfg: Config, dep: Deployment, spec_hash: str = "", node: Node | None = None) -> dict[str, str]:
    node = node or cfg.serve_node(dep)
    env = {**nccl_env(cfg, dep), **dep.ray.env, **node_env(node), **node.env, **cache_env(dep, spec_hash),
           **dep.serve.env}
    if dep.uses_ray and dep.serve.placement_strategy:
        env.setdefault("VLLM_DISTRIBUTED_EXECUTOR_CONFIG",
                       json.dumps({"placement_group_options": {"strategy": dep.serve.placement_strategy}}))
    if dep.api_key.get_secret_value():
        env["VLLM_API_KEY"] = dep.api_key.get_secret_value()  # vLLM reads it when --api-key is absent; never on argv or in logs
    return env


def serve_dir(dep: Deployment) -> str:
    """The wrapper's state (pid, spec, started, exit) inside the container: a pid file must not outlive
    its container (its PID namespace), so this stays in the container even when the log does not."""
    return f"{dep.serve.log_dir}/{dep.name}"


def serve_log_parent(dep: Deployment) -> str:
    """This deployment's serve logs on the host, bind-mounted at the same path ("" = in the container)."""
    return f"{dep.serve.log_host_dir}/{dep.name}" if dep.serve.log_host_dir else ""


def serve_log_dir(dep: Deployment, node: Node) -> str:
    """One node's launches of the serve: a directory per node, so nodes sharing a file system never collide."""
    return f"{serve_log_parent(dep)}/{node.name}" if dep.serve.log_host_dir else ""


LOG_CHECK_S = 10  # how often the wrapper looks at the log's size (log_max_mib)

CACHE_MARK = ".spark-supervisor-cache"  # in <cache_dir>/<deployment> and in each spec's cache the wrapper made
SPEC_HASH_LEN = 12  # config.serve_hash: this many lowercase hex digits, the only names the prune removes
NOT_OURS_EXIT = 78  # sysexits' EX_CONFIG (75, EX_TEMPFAIL, is "a serve still runs"): the cache is not ours
NOT_OURS = "CacheDirNotOurs"  # the wrapper's line in the serve log: spark-serve: CacheDirNotOurs: <why>

# Shell functions shared by the scripts below: the serve a directory records is a pid AND its start time
# (field 22 of /proc/<pid>/stat), so a pid reused by another process since is never taken for it (nor
# signalled). A directory written by an earlier wrapper holds a pid alone: that serve leads its own session.
_RECORD = script.load("serve-record.sh")

# The compile caches: <cache_dir>/<deployment> (marked CACHE_MARK when the wrapper made it, or found it empty)
# holds one directory per spec hash. Only a directory the wrapper made (a spec-hash name, not a link, its own
# CACHE_MARK) is ever removed; anything else there is left alone. A directory not marked that holds anything
# but spec-hash directories (an earlier version's caches: kept, never pruned) was not made by us: the launch
# stops with NOT_OURS_EXIT and one line naming it, and nothing is deleted. The container is root: no link
# is followed (rm -rf removes a link, never what it points to).
_CACHE = script.load("serve-cache.sh").replace("HASH_GLOB", "?" * SPEC_HASH_LEN).replace(
    "NOT_OURS_EXIT", str(NOT_OURS_EXIT)).replace("NOT_OURS", NOT_OURS).replace("CACHE_MARK", CACHE_MARK)

# Runs the serve in the background inside the node's container and records, in directory $1:
# process (pid and start time) and pid, spec (hash), started (UTC), log (stdout+stderr) and, once it ends,
# exit (its exit code). $2 is the spec hash; $3 the deployment's compile-cache parent ("" for none), $4 how
# many spec caches to keep and $5 their size cap in MiB (the oldest go first; _CACHE); $6 the node's
# serve-log directory on the host ("" for none), $7 the node's name, $8 how many launches' logs to keep
# there, $9 a log's size cap in MiB and $10 how often (s) to look at it; the rest is the serve's argv.
# Nothing from config is interpolated into it. With a log directory the launch's log is
# <UTC start>-<node>-<spec>.log there (a second launch in the same second gets "_<n>" after the time, one
# more than the highest there), `log` in $1 and `current` beside it point to it, and only the newest $8
# launches stay (only files of that name: nothing else there is removed). A log past its cap is copied to
# <file>.1 and emptied in place (copytruncate: the serve writes with O_APPEND, so it goes on at the start;
# it never waits on a pipe or a logger that could die). A log directory that cannot be written falls back
# to `log` in $1: logging never stops a serve. It refuses to start while the serve it recorded still runs:
# two serves on one GPU wedge both, and the supervisor may have launched on a stale view (defence in depth
# behind the planner's own rule). The slot is claimed (the wrapper's own pid recorded) before the cache is
# pruned, so a look in between sees a serve starting, never "no serve"; the log is opened before it, so a
# refusal of the cache is in the launch's log. The serve runs in its own process group (setsid) so a stop
# reaches its engine core and workers too.
SERVE_WRAPPER = _RECORD + _CACHE + script.load("serve-wrapper.sh")

# Prints the state the wrapper recorded: "pid spec started running exit", then the log tail.
SERVE_STATE = _RECORD + script.load("serve-state.sh")

# Signals the serve's process group (TERM, then KILL after $2 seconds) and forgets it, keeping its log as
# log.prev (with a host log directory, both are links to the launches' files there). Only the serve it
# recorded (runs), or that serve's group once its leader is gone (`group`: a pid is not reused while a group
# bears its number); a pid that is some other process by now is never signalled.
SERVE_STOP = _RECORD + script.load("serve-stop.sh")


def serve_launch(cfg: Config, dep: Deployment, spec_hash: str, node: Node | None = None) -> list[str]:
    s, node = dep.serve, node or cfg.serve_node(dep)
    return ["sh", "-c", SERVE_WRAPPER, "spark-serve", serve_dir(dep), spec_hash, cache_parent(dep),
            str(s.cache_keep), str(int(s.cache_max_gib * 1024)), serve_log_dir(dep, node), node.name,
            str(s.log_keep), str(s.log_max_mib), str(LOG_CHECK_S), *serve_argv(dep, rank_args(cfg, dep, node))]


def serve_state(dep: Deployment, tail_bytes: int = 65536) -> list[str]:
    return ["sh", "-c", SERVE_STATE, "spark-serve", serve_dir(dep), str(tail_bytes)]


def serve_stop(dep: Deployment) -> list[str]:
    return ["sh", "-c", SERVE_STOP, "spark-serve", serve_dir(dep), str(int(dep.serve.stop_timeout))]


PROBE_SEP = "::spark-probe::"
# Several commands in one remote shell: a full observation of a worker costs one SSH session, not one per
# probe. $1 is PROBE_SEP; then each command's argument list, each ended by PROBE_SEP. Each runs with its
# own arguments as given (eval sees only "${N}" references, never a value) and is framed on stdout as
# "<sep> begin I", its output, a newline, "<sep> end I <exit code>" (parse_probes).
PROBES = script.load("probes.sh")


def probes_argv(argvs: list[list[str]]) -> list[str]:
    if any(PROBE_SEP in argv for argv in argvs):
        raise ValueError(f"an argument is {PROBE_SEP!r}")
    return ["sh", "-c", PROBES, "spark-probes", PROBE_SEP, *[x for argv in argvs for x in (*argv, PROBE_SEP)]]


def parse_probes(out: str, count: int) -> list[tuple[int, str] | None]:
    """PROBES' stdout -> (exit code, output) per command; None for one that did not run to its end."""
    got: list[tuple[int, str] | None] = [None] * count
    cur, buf = -1, list[str]()
    for line in out.split("\n"):
        if line.startswith(f"{PROBE_SEP} begin "):
            cur, buf = int(line.split()[2]), []
        elif line.startswith(f"{PROBE_SEP} end ") and cur >= 0:
            parts = line.split()
            if 0 <= cur < count and len(parts) == 4 and parts[3].lstrip("-").isdigit():
                got[cur] = (int(parts[3]), "\n".join(buf[:-1] if buf and not buf[-1] else buf))  # the framing's newline
            cur = -1
        elif cur >= 0:
            buf.append(line)
    return got


HOST_FACTS = script.load("host-facts.sh")


def host_facts(node: Node) -> list[str]:
    """The node's fabric and identity facts under its host_root (adapters.sysfs.parse_host_facts)."""
    return ["sh", "-c", HOST_FACTS, "host-facts", node.host_root]


def systemctl_show(units: list[str]) -> list[str]:
    return ["systemctl", "show", "--no-pager", "--property=Id,LoadState,ActiveState,UnitFileState",
            *[u if "." in u else f"{u}.service" for u in units]]


def systemctl(verb: str, units: list[str], become: Sequence[str] = ()) -> list[str]:
    """`systemctl <verb>` of [stale] units, behind the node's privilege prefix ([[nodes]] become). disable and mask
    reload systemd as they do: with --no-reload, systemd's own answer (`systemctl show`'s UnitFileState, what the
    stale check reads) stays "enabled" until a reload, and the unit is found stale again on every tick (seen under
    the real systemd test unit). They run before the deployment's containers exist on a start; the reload's cost
    to running non-privileged containers (NVIDIA/nvidia-container-toolkit#48) is met only by a unit re-enabled
    while serving."""
    return [*become, "systemctl", verb, *[u if "." in u else f"{u}.service" for u in units]]


# What an image holds, run in a short-lived container of it with the node container's environment and
# mounts: $1 the Ray command ("" for mp), $2 the serve command, $3 the Python probe (IMAGE_PROBE_PY), run
# with the interpreter of each command's script (the `#!` line), so a Ray and a vLLM in different venvs
# are each asked in their own. Prints key=value lines (parse_image_probe). A serve command that is not a
# Python script (or has no package metadata) is asked `--version`.
IMAGE_PROBE = script.load("image-probe.sh")

IMAGE_PROBE_PY = script.load("image-probe.py")


def _probe_options(base: ContainerSpec) -> dict[str, Any]:
    """A probe container's options: the node container's mounts, each read-only (a probe reads; nothing it runs,
    the image's own code included, may write into the model, the caches or the logs), and its init."""
    volumes = {src: {**v, "mode": "ro"} for src, v in (base.options.get("volumes") or {}).items()}
    return {**({"volumes": volumes} if volumes else {}), **({"init": base.options["init"]} if "init" in base.options
                                                            else {})}


def image_probe(cfg: Config, dep: Deployment, node: Node) -> ContainerSpec:
    """The image check of one node, as a short-lived container of the deployment's image."""
    base = node_container(cfg, dep, node)
    ray_cmd = dep.ray.command[0] if dep.uses_ray else ""
    options = _probe_options(base)
    return ContainerSpec("", base.image, ["sh", "-c", IMAGE_PROBE, "spark-image-probe", ray_cmd,
                                          dep.serve.command[0], IMAGE_PROBE_PY],
                         {**base.environment, **dep.serve.env}, helper_labels("image-check", node=node),
                         {**options, "network_mode": "none"})


# The image check and then the model check in one container: $1-$5 the image probe's `sh -c` arguments, the
# rest the model probe's. Its exit code is said between the two, on a line of its own (split_checks).
CHECKS = 'sh -c "$1" "$2" "$3" "$4" "$5"; c=$?; echo; echo "spark-checks: image exit $c"; shift 5; exec sh -c "$@"'
CHECKS_MARK = "spark-checks: image exit "


def checks_probe(cfg: Config, dep: Deployment, node: Node) -> ContainerSpec:
    """The image check and the model check of one node in one short-lived container (both due: a first start,
    a new image), with the mounts and environment both have: one container's start saved, about 0.8 s over
    SSH. Its output is read with split_checks."""
    image, model = image_probe(cfg, dep, node), model_probe(cfg, dep, node)
    return replace(model, command=["sh", "-c", CHECKS, "spark-checks", *image.command[2:],
                                               *model.command[2:]])


def split_checks(code: int, out: str) -> tuple[int, str, str]:
    """checks_probe's (exit code, output) -> (the image probe's exit code, its output, the model probe's
    output; the container's exit code is the model probe's). No mark: the image probe did not end (its code
    the container's, or -1)."""
    m = re.search(rf"^{re.escape(CHECKS_MARK)}(-?\d+)$", out, re.M)
    if m is None:
        return code or -1, out, ""
    return int(m.group(1)), out[:m.start()], out[m.end() + 1:]


SERVE_ARGS_PY = script.load("serve-args.py")


def serve_args_probe(cfg: Config, dep: Deployment, node: Node) -> ContainerSpec:
    """The serve's arguments (rank ``node``'s, the model as ``--model``) through the image's own vLLM argument
    parser (SERVE_ARGS_PY), as a short-lived container of the image with the node container's mounts and
    environment and no network: what a change is proven with before it replaces what serves."""
    base = node_container(cfg, dep, node)
    options = _probe_options(base)
    argv = serve_argv(dep, rank_args(cfg, dep, node))[len(dep.serve.command):]
    if dep.serve.model_arg == "positional":
        argv = ["--model", *argv]  # make_arg_parser takes the model as --model (`vllm serve` adds the positional)
    return ContainerSpec("", base.image, ["sh", "-c", modelprobe.RUN_PY, "spark-serve-args", dep.serve.command[0],
                                          SERVE_ARGS_PY, *argv],
                         {**base.environment, **dep.serve.env}, helper_labels("serve-args-check", node=node),
                         {**options, "network_mode": "none"})


def model_probe(cfg: Config, dep: Deployment, node: Node) -> ContainerSpec:
    """The model check of one node (modelprobe.PROBE_PY), as a short-lived container of the image with the
    node container's mounts and environment: the paths vLLM will see."""
    base = node_container(cfg, dep, node)
    options = _probe_options(base)
    return ContainerSpec("", base.image, ["sh", "-c", modelprobe.RUN_PY, "spark-model-probe", dep.serve.command[0],
                                          modelprobe.PROBE_PY, *modelprobe.probe_args(dep)],
                         {**base.environment, **dep.serve.env}, helper_labels("model-check", node=node),
                         {**options, "network_mode": "none"})


def model_prefetch(cfg: Config, dep: Deployment, node: Node) -> ContainerSpec:
    """The prefetch of one node (modelprobe.PREFETCH_PY): a detached container of the image with the node
    container's mounts, environment and network (the hub), labelled as ours so a teardown removes it."""
    base = node_container(cfg, dep, node)
    options = {k: v for k, v in base.options.items() if k in ("volumes", "init")}
    m = dep.model
    return ContainerSpec(prefetch_name(dep, node), base.image,
                         ["sh", "-c", modelprobe.RUN_PY, "spark-model-prefetch", dep.serve.command[0],
                          modelprobe.PREFETCH_PY, *modelprobe.probe_args(dep), m.prefetch_from,
                          f"{m.prefetch_timeout:g}", str(modelprobe.PREFETCH_KEEP_S), modelprobe.PROGRESS],
                         {**base.environment, **dep.serve.env},
                         prefetch_labels(dep, node),
                         {**options, "network_mode": "host"})


# Ray's node table without its dashboard: `ray list nodes` needs the dashboard and `ray status` prints
# no IPs (docs/wire-formats.md 4.1), so ask the GCS the way `ray status` does, with the interpreter of the
# image's own `ray` script. $1 the Ray command, $2 the Python below, $3 the GCS address, $4 the timeout.
# Prints the dashboard's /api/v0/nodes envelope, so one parser reads both.
RAY_NODES = script.load("ray-nodes.sh")

RAY_NODES_PY = script.load("ray-nodes.py")


def ray_nodes(dep: Deployment, gcs: str, timeout: float) -> list[str]:
    """Ray's node table read through the GCS at ``gcs`` (host:port: DeploymentView.gcs), in the head container."""
    return ["sh", "-c", RAY_NODES, "spark-ray-nodes", dep.ray.command[0], RAY_NODES_PY, gcs, f"{timeout:g}"]
