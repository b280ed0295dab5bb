"""The real-vLLM deployments on the testbed, shared by the tests and `make bench`: one mp deployment on the
head node, and the real pair (vLLM's mp multi-node mode, a rank on each of spark-1 and spark-2)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from . import harness, realvllm, testbed

NAME = "real"
HOME = "real-vllm-spark-1"
PORT = 8100


def real_deployment(name: str = NAME, *, ip: str = "127.0.0.2", port: int = PORT, model: str = "tiny-qwen3",
                    extra: list[str] | None = None, eager: bool = True, serve: dict[str, Any] | None = None,
                    pooling: bool = False, model_check: bool = True) -> dict[str, Any]:
    """The real server as one mp deployment in a container (the hostfs image with its venv mounted).
    pooling: the tiny model converted to an embeddings model, probed with one real embedding.
    model_check=False: no model check before the start, so that vLLM itself meets a missing model."""
    env = testbed.env()
    tbdir, py = env["SPARK_TESTBED_DIR"], env["SPARK_TESTBED_PYTHON"]
    vllm_env = realvllm.serve_env(base={}, mode="fast" if eager else "compile")
    vllm_env.update(HOME="/tmp", PATH="/usr/bin:/bin")
    args = ["--max-model-len", "512", "--max-num-seqs", "4", "--dtype", "bfloat16",
            *(["--enforce-eager"] if eager else []), *(["--runner", "pooling", "--convert", "embed"] if pooling else []),
            *(extra or [])]
    return {
        "name": name,
        "ray": {"image": testbed.HOSTFS, "shm_size": "1g", "ipc_host": False,
                "volumes": sorted({"/usr:/usr:ro", f"{py}:{py}:ro", f"{realvllm.VENV}:{realvllm.VENV}:ro",
                                   f"{realvllm.MODELS}:{realvllm.MODELS}:ro"}),
                "env": vllm_env},
        "serve": {"model": str(realvllm.MODELS / model), "served_model_name": "tiny-qwen3",
                  "command": [str(realvllm.venv_python()), "-m", "vllm.entrypoints.openai.api_server"],
                  "model_arg": "flag", "distributed_executor_backend": "mp", "host": ip,
                  "port": port, "gpu_memory_utilization": 0.2 if pooling else 0.5,
                  "cache_dir": f"{tbdir}/vllm-cache", "log_host_dir": f"{tbdir}/serve-logs", "extra_args": args,
                  "stop_timeout": 20,
                  **({} if pooling else {"reasoning_parser": "qwen3"}), **(serve or {})},
        "readiness": {"poll_interval": 1, "deadline": 400, "request_timeout": 60, "sanity_max_tokens": 16,
                      "endpoint": f"http://{ip}:{port}", **({"probe": "embeddings"} if pooling else {})},
        **({} if model_check else {"model": {"check": False}}),
        # The verdict's stream short: the CPU build decodes ~10 tokens/s here, and a measurement holds the tick.
        "performance": {"max_tokens": 32},
    }


def real_config(tmp_path: Path, *, model: str = "tiny-qwen3", extra: list[str] | None = None, eager: bool = True,
                serve: dict[str, Any] | None = None, model_check: bool = True) -> Path:
    env = testbed.env()
    tbdir, src = env["SPARK_TESTBED_DIR"], env["SPARK_TESTBED_SRC"]
    smi = [f"{src}/.venv/bin/spark-testbed-nvidia-smi", "--state", f"{tbdir}/spark-1/gpu.json"]
    d: dict[str, Any] = {
        "supervisor": {"state_dir": str(tmp_path / "state"), "interval": 2, "transition_interval": 0.5,
                       "backoff_base": 1, "backoff_max": 10},
        "nodes": [{"name": "spark-1", "role": "head", "fabric_ip": "127.0.0.2", "fabric_interface": "lo",
                   "docker": f"unix://{tbdir}/spark-1/docker.sock", "nvidia_smi": smi, "meminfo": [*smi, "--meminfo"],
                   "host_root": f"{tbdir}/spark-1/host"}],
        "healing": {"deep_probe_interval": 20, "deep_probe_timeout": 15, "quick_check_interval": 0.5},
        "stale": {"units": [], "memory_free_timeout": 20},
        "deployments": [real_deployment(model=model, extra=extra, eager=eager, serve=serve, model_check=model_check)],
    }
    path = tmp_path / "real.toml"
    path.write_text(tomli_w.dumps(d))
    return path


PAIR = "pair"
PAIR_HOMES = {n: f"{PAIR}-vllm-{n}" for n in testbed.NODES}  # the serve container of each rank


def real_pair_config(tmp_path: Path, *, extra: list[str] | None = None) -> Path:
    """The real server as a tensor-parallel-2 mp deployment across the testbed's two nodes: rank 0 (the API)
    in spark-1's container, rank 1 `--headless` in spark-2's (its engine reached over SSH), the follower
    joining rank 0 on the fabric IPs. Started as `vllm serve MODEL` through the testbed's launcher (the CPU
    build's own `vllm` script fails; see vllm_launcher.py). On vLLM >= 0.20 each rank needs its own cores
    (`nobind` crashes both ranks): each node's env binds its rank's OMP threads to one core."""
    d = tomllib.loads(harness.write_config(tmp_path).read_text())
    cores = os.cpu_count() or 1
    for i, node in enumerate(d["nodes"]):
        node.setdefault("env", {})["VLLM_CPU_OMP_THREADS_BIND"] = str(i % cores)
    dep = real_deployment(PAIR, extra=extra, serve={
        "command": [str(realvllm.venv_python()), str(realvllm.LAUNCHER), "serve"], "model_arg": "positional",
        "tensor_parallel_size": 2})
    dep["nodes"] = list(testbed.NODES)
    dep["ray"]["volumes"] = sorted({*dep["ray"]["volumes"], f"{realvllm.LAUNCHER.parent}:{realvllm.LAUNCHER.parent}:ro"})
    # Two ranks load on two cores: slower than one server alone, and slower still on a busy machine.
    dep["readiness"]["deadline"] = 900
    d["deployments"] = [dep]
    d["healing"] = {"deep_probe_interval": 20, "deep_probe_timeout": 15, "quick_check_interval": 0.5,
                    "node_patience": 60}
    path = tmp_path / "pair.toml"
    path.write_text(tomli_w.dumps(d))
    return path
