"""vLLM stand-in for the testbed: runs where `vllm serve` would and speaks vLLM's wire formats.

It joins the real Ray cluster, reserves one GPU bundle per tensor-parallel rank in a placement group,
prints vLLM's startup lines (process tags, tqdm shard bars, milestones) while it "loads", refuses
connections until loaded, then answers /health, /version, /v1/models and /v1/chat/completions in the
reasoning format of the chosen vLLM version. When a Ray node of its placement group dies it prints
vLLM's engine-death lines and exits 1, like vLLM. Test knobs, all environment variables:

STANDIN_VLLM_VERSION   0.11.0 | 0.15.1 | 0.33.0 (default): log shape and reasoning field name
STANDIN_SHARDS         checkpoint shards (39)       STANDIN_SHARD_SECONDS  seconds per shard (0.1)
STANDIN_FAIL           "" | free-memory | exit | hang-completions | never-ready | missing-model | unsupported
STANDIN_PG_TIMEOUT     seconds before "Cannot provide a placement group" (60)
STANDIN_FAULT_FILE     a file read on every request: "hang-completions" (/health stays 200, completions
                       hang: a wedged collective) or "health-503" (EngineDeadError's /health)
STANDIN_GPU_STATES     comma-separated paths of the nodes' gpu.json (spark_testbed/nvidia_smi.py). As real vLLM
                       on unified memory (GB10) does on every rank, the start fails when a node's MemFree
                       (page cache counts as used) is below --gpu-memory-utilization x MemTotal. A file
                       without "meminfo" (or missing) is not checked.
STANDIN_KV_TOKENS      the KV cache the start reports, in tokens (409856); the GiB line scales with it
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spark_testbed.nvidia_smi import mem_figures

VERSION = os.environ.get("STANDIN_VLLM_VERSION", "0.33.0")
V = tuple(int(x) for x in VERSION.split(".")[:2])
OLD = V <= (0, 11)
SHARDS = int(os.environ.get("STANDIN_SHARDS", "39"))
SHARD_S = float(os.environ.get("STANDIN_SHARD_SECONDS", "0.1"))
FAIL = os.environ.get("STANDIN_FAIL", "")
PG_TIMEOUT = float(os.environ.get("STANDIN_PG_TIMEOUT", "60"))
KV_TOKENS = int(os.environ.get("STANDIN_KV_TOKENS", "409856"))
KV_GIB_PER_TOKEN = 37.52 / 409856  # the default pair: "Available KV cache memory: 37.52 GiB", 409,856 tokens
PID = os.getpid()
_stop = threading.Event()


def fault() -> str:
    """A fault switched on while running, by the tests (see STANDIN_FAULT_FILE)."""
    path = os.environ.get("STANDIN_FAULT_FILE", "")
    try:
        return open(path).read().strip() if path else ""
    except OSError:
        return ""


def log(msg: str, proc: str = "APIServer", level: str = "INFO", src: str = "api_server.py:1") -> None:
    tag = f"({proc} pid={PID}) "
    if OLD:  # 0.11 colours the process tag even off a TTY
        tag = f"\x1b[1;36m{tag}\x1b[0;0m"
    sys.stdout.write(f"{tag}{level} {time.strftime('%m-%d %H:%M:%S')} [{src}] {msg}\n")
    sys.stdout.flush()


def bar(desc: str, done: int, total: int, per_it: float, end: str) -> None:
    pct = int(100 * done / total)
    sys.stdout.write(f"{desc}: {pct:3d}% Completed | {done}/{total} [00:{int(done * per_it):02d}<00:00, "
                     f"{per_it:.2f}s/it]{end}")
    sys.stdout.flush()


def die(lines: list[str], code: int = 1) -> None:
    for line in lines:
        log(line, proc="EngineCore_DP0", level="ERROR", src="core.py:700")
    sys.stdout.flush()
    os._exit(code)


def interruptible(seconds: float) -> None:
    if _stop.wait(seconds):
        os._exit(0)


def join_ray(tp: int, strategy: str) -> tuple[Any, set[str]]:
    import ray
    from ray.util.placement_group import placement_group, placement_group_table

    log("Connecting to existing Ray cluster at address: auto...", proc="EngineCore_DP0", src="ray_utils.py:300")
    ray.init(address="auto", log_to_driver=False, logging_level="ERROR", include_dashboard=False)
    log("No current placement group found. Creating a new placement group.", proc="EngineCore_DP0",
        src="ray_utils.py:330")
    pg = placement_group([{"GPU": 1.0} for _ in range(tp)], strategy=strategy or "PACK")
    waited, step, t0 = 0.0, 10.0, time.monotonic()
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=1.0)
        if ready:
            break
        waited = time.monotonic() - t0
        if waited >= step:
            log(f"Waiting for creating a placement group of specs for {int(waited)} seconds. "
                f"specs={[{'GPU': 1.0}] * tp}. Check `ray status` and `ray list nodes` to see if you have "
                "enough resources, and make sure the IP addresses used by ray cluster are the same as "
                "VLLM_HOST_IP environment variable specified in each node if you are running on a "
                "multi-node.", proc="EngineCore_DP0", level="WARNING", src="ray_utils.py:360")
            step = step * 2 + 10
        if waited >= PG_TIMEOUT:
            die([f"ValueError: Cannot provide a placement group of placement_group_specs="
                 f"{[{'GPU': 1.0}] * tp} within {int(PG_TIMEOUT)} seconds. See `ray status` and "
                 "`ray list nodes` to make sure the cluster has enough resources."])
        if _stop.is_set():
            os._exit(0)
    nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
    return ray, nodes


def watch_nodes(ray: Any, nodes: set[str]) -> None:
    """vLLM never survives losing a node: the next collective fails and the engine dies."""
    while not _stop.wait(0.5):
        try:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        except Exception:  # the GCS itself went away with the head
            alive = set()
        lost = nodes - alive
        if lost:
            die([f"RayWorkerProc rank=1 died unexpectedly, node {sorted(lost)[0][:12]} is gone",
                 "EngineCore encountered a fatal error.",
                 "This might cause deadlock in distributed execution.",
                 "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause."])


def free_memory_short(utilization: float) -> str:
    """vLLM's start-up check on unified memory, against each node's state file: the error line, or ""."""
    for path in filter(None, (x.strip() for x in os.environ.get("STANDIN_GPU_STATES", "").split(","))):
        try:
            with open(path) as f:
                m = json.load(f).get("meminfo")
        except (OSError, ValueError):
            continue
        if not m:
            continue
        fig = mem_figures(m)
        free, total = fig["free_mib"] / 1024, fig["total_mib"] / 1024
        if free < utilization * total:
            return (f"ValueError: Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less "
                    f"than desired GPU memory utilization ({utilization}, {utilization * total:.2f} GiB). "
                    "Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    return ""


class Api(BaseHTTPRequestHandler):
    served: str = "model"
    root: str = "model"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt: str, *args: Any) -> None:
        log(f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} {self.path}" '
            f"{args[1] if len(args) > 1 else ''}", src="h11_impl.py:473")

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _empty(self, code: int) -> None:
        self.send_response(code)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path in ("/health", "/ping"):
            self._empty(503 if fault() == "health-503" else 200)
        elif self.path == "/version":
            self._json(200, {"version": VERSION})
        elif self.path == "/v1/models":
            if not self._authorized():
                return
            now = int(time.time())
            self._json(200, {"object": "list", "data": [{
                "id": self.served, "object": "model", "created": now, "owned_by": "vllm", "root": self.root,
                "parent": None, "max_model_len": 65536, "permission": [{
                    "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False}]}]})
        else:
            self._json(404, {"error": {"message": "Not Found", "type": "NotFoundError", "param": None, "code": 404}})

    def _authorized(self) -> bool:
        key = os.environ.get("VLLM_API_KEY") or API_KEY
        if key and self.headers.get("Authorization") != f"Bearer {key}":
            self._json(401, {"error": "Unauthorized"})
            return False
        return True

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self._empty(404)
            return
        if not self._authorized():
            return
        req = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        if req.get("model") != self.served:
            self._json(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                       "type": "NotFoundError", "param": "model", "code": 404}})
            return
        if FAIL == "hang-completions" or fault() == "hang-completions":
            _stop.wait()
            return
        if FAIL == "unsupported":  # the real 0.32 CPU build with head_dim=16, seen: the first request kills it
            log("RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2 kv_cache_idx=0",
                proc="Worker", level="ERROR", src="multiproc_executor.py:1063")
            log("EngineCore encountered a fatal error.", proc="EngineCore", level="ERROR", src="core.py:1512")
            log("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace "
                "(above) for the root cause.", level="ERROR", src="async_llm.py:906")
            self._json(500, {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for "
                                       "the root cause.", "type": "InternalServerError", "param": None,
                                       "code": 500}})
            threading.Timer(0.5, lambda: os._exit(1)).start()
            return
        max_tokens = int(req.get("max_tokens") or 16)
        thinking = ["Okay,", "the", "user", "wants", "me", "to", "reply", "with", "a", "single", "word.", "Let", "me", "think", "about", "what", "they", "expect", "here.", "They", "said", "to", "reply", "with", "the", "single", "word", "ready,", "so", "the", "answer", "should", "be", "exactly", "that", "word,", "without", "punctuation", "or", "any", "explanation", "around", "it.", "I", "should", "not", "add", "a", "greeting,", "and", "I", "should", "not", "repeat", "the", "question", "back", "to", "them", "either.", "So", "the", "final", "answer", "is", "simply", "the", "word", "they", "asked", "for,", "and", "nothing", "more", "than", "that"]
        finish = "length" if max_tokens < len(thinking) else "stop"
        reasoning = " ".join(thinking[:max_tokens])
        content = None if finish == "length" else "ready"
        msg: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                               "audio": None, "function_call": None}
        if V < (0, 16):
            msg["tool_calls"] = []
        if OLD:
            msg["reasoning_content"] = reasoning
        elif V < (0, 16):
            msg["reasoning"] = msg["reasoning_content"] = reasoning
        else:
            msg["reasoning"] = reasoning
        tokens = min(max_tokens, len(thinking)) + (0 if content is None else 1)
        self._json(200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": self.served, "choices": [{"index": 0, "message": msg, "logprobs": None,
                                               "finish_reason": finish, "stop_reason": None, "token_ids": None}],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": 12, "total_tokens": 12 + tokens, "completion_tokens": tokens,
                      "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": None, "kv_transfer_params": None})


API_KEY = ""


def main(argv: list[str] | None = None) -> int:
    global API_KEY
    p = argparse.ArgumentParser(prog="vllm")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model", nargs="?", default="")
    p.add_argument("--model", dest="model_flag", default="")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--distributed-executor-backend", default="")
    p.add_argument("--served-model-name", default="")
    p.add_argument("--api-key", default="")
    # What the supervisor and the tests pass; anything else is refused like the real server refuses it.
    for flag in ("--reasoning-parser", "--tool-call-parser", "--max-model-len", "--max-num-seqs", "--dtype"):
        p.add_argument(flag)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--enforce-eager", action="store_true")
    a = p.parse_args(argv)
    a.model = a.model or a.model_flag
    API_KEY = a.api_key
    signal.signal(signal.SIGTERM, lambda *_: _stop.set())
    served = a.served_model_name or a.model
    world = a.tensor_parallel_size * a.pipeline_parallel_size

    if OLD:
        log(f"vLLM API server version {VERSION}")
    elif V < (0, 32):
        log(f"vLLM server version {VERSION}, serving model {a.model}", src="utils.py:233")
    else:  # 0.32 (the real CPU build, seen): an ASCII-art banner with the version
        log(f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {VERSION}", src="api_utils.py:347")
        log(f"  █▄█▀ █     █     █     █  model   {a.model}", src="api_utils.py:347")
    log(f"non-default args: {{'model': '{a.model}', 'tensor_parallel_size': {a.tensor_parallel_size}}}")
    if FAIL == "exit":
        log("Error: the stand-in was told to exit at once", level="ERROR")
        return 1
    if FAIL == "missing-model" or (a.model.startswith("/") and not os.path.exists(a.model)):
        # As the real server does for a model path that is not there (seen on 0.32): it takes it for a hub id.
        sys.stdout.write("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                         f"'namespace/repo_name': '{a.model}'. Use `repo_type` argument if needed.\n")
        return 1
    if world > 1 and a.distributed_executor_backend != "ray":
        die([f"ValueError: World size ({world}) is larger than the number of available GPUs (1) in this node. "
             "If this is intentional and you are using: - ray, set '--distributed-executor-backend ray'."])
    log(f"Initializing a V1 LLM engine (v{VERSION}) with config: model='{a.model}', "
        f"tensor_parallel_size={a.tensor_parallel_size}", proc="EngineCore_DP0", src="core.py:77")
    if a.distributed_executor_backend == "ray":
        strategy = json.loads(os.environ.get("VLLM_DISTRIBUTED_EXECUTOR_CONFIG", "{}") or "{}").get(
            "placement_group_options", {}).get("strategy", "PACK")
        ray, nodes = join_ray(world, strategy)
        threading.Thread(target=watch_nodes, args=(ray, nodes), daemon=True).start()
    if FAIL == "free-memory":
        die(["ValueError: Free memory on device cuda:0 (20.13/119.70 GiB) on startup is less than desired "
             f"GPU memory utilization ({a.gpu_memory_utilization}, 101.75 GiB). Decrease GPU memory "
             "utilization or reduce GPU memory used by other processes.",
             "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    short = free_memory_short(a.gpu_memory_utilization)
    if short:
        die([short, "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    log("vLLM is using nccl==2.27.7", proc="RayWorkerProc", src="pynccl.py:70")
    log(f"Starting to load model {a.model}...", proc="RayWorkerProc", src="gpu_model_runner.py:2900")
    desc = "Loading safetensors checkpoint shards"
    bar(desc, 0, SHARDS, SHARD_S, "\r")
    for i in range(1, SHARDS + 1):
        interruptible(SHARD_S)
        bar(desc, i, SHARDS, SHARD_S, "\r" if i < SHARDS else "\n")
    log(f"Loading weights took {SHARDS * SHARD_S:.2f} seconds", proc="RayWorkerProc", src="default_loader.py:310")
    log(f"Model loading took 58.4213 GiB{'' if OLD else ' memory'} and {SHARDS * SHARD_S + 1:.6f} seconds",
        proc="RayWorkerProc", src="gpu_model_runner.py:2950")
    log(f"Available KV cache memory: {KV_TOKENS * KV_GIB_PER_TOKEN:.2f} GiB", proc="RayWorkerProc",
        src="gpu_worker.py:390")
    log(f"GPU KV cache size: {KV_TOKENS:,} tokens", proc="EngineCore_DP0", src="kv_cache_utils.py:1200")
    log(f"Maximum concurrency for 65,536 tokens per request: {KV_TOKENS / 65536:.2f}x", proc="EngineCore_DP0",
        src="kv_cache_utils.py:1204")
    if FAIL == "never-ready":
        _stop.wait()
        return 0
    gdesc = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    for i in range(0, 68, 17):
        bar(gdesc, min(i, 67), 67, 0.01, "\r")
    bar(gdesc, 67, 67, 0.01, "\n")
    log("Graph capturing finished in 1 secs, took 0.52 GiB", proc="RayWorkerProc", src="gpu_model_runner.py:3400")
    log(f"init engine (profile, create kv cache, warmup model) took {SHARDS * SHARD_S + 2:.2f} "
        f"{'seconds' if V < (0, 26) else 's'}", proc="EngineCore_DP0", src="core.py:240")
    log("Supported tasks: ['generate']")
    Api.served, Api.root = served, a.model
    server = ThreadingHTTPServer((a.host, a.port), Api)  # listening only now: refused until loaded
    server.daemon_threads = True
    if V < (0, 26):
        log(f"Starting vLLM API server 0 on http://{a.host}:{a.port}")
    else:
        log(f"Starting vLLM server on http://{a.host}:{a.port}")
    for line in (f"Started server process [{PID}]", "Waiting for application startup.",
                 "Application startup complete."):
        sys.stdout.write(f"(APIServer pid={PID}) INFO:     {line}\n")
    sys.stdout.flush()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _stop.wait()
    log("[shutdown] API server: shutdown triggered")
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
