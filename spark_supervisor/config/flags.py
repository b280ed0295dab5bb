"""The serve's and Ray's own flags: extra_args may not set what the supervisor sets itself, read the way
each program's parser reads them; and the value of a flag the supervisor reads from extra_args."""

from __future__ import annotations

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



def flag_value(args: list[str], name: str) -> str | None:
    """The value of the first `name X` or `name=X` in an argument list, None when absent: the one reading of
    a flag the supervisor does not set but needs to know (Serve.revision, Ray.client_port)."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None
