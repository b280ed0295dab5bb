"""Issue 19, the config part: what `check` refuses (or warns about) because the daemon would otherwise hurt
the host it guards. Every refusal is one `<file>: <key>: <why>` line."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor import config
from tests.helpers import CONFIG_SRC as SRC
from tests.helpers import config_problems as problems
from tests.helpers import data, with_image

S = "deployments[0].serve"
R = "deployments[0].ray"
Q = "deployments[0].readiness"


def refused(d: dict[str, Any], key: str, fragment: str) -> None:
    found = problems(d)
    assert any(p.startswith(f"{SRC}: {key}: ") and fragment in p for p in found), found
    assert all("\n" not in p for p in found)


def serve(d: dict[str, Any]) -> dict[str, Any]:
    return d["deployments"][0]["serve"]  # type: ignore[no-any-return]


def ray(d: dict[str, Any]) -> dict[str, Any]:
    return d["deployments"][0].setdefault("ray", {})  # type: ignore[no-any-return]


def with_(table: Callable[[dict[str, Any]], dict[str, Any]], **patch: Any) -> dict[str, Any]:
    d = data()
    table(d).update(patch)
    return d


# ------------------------------------------------------------------------------ 2. the cache directory
@pytest.mark.parametrize("cache", ["/", "/models", "/data/", "/var", "/var/lib", "/usr/local", "/etc/vllm",
                                   "/home/alice", "/root/.cache", "/opt", "/srv", "/boot/x", "/proc/1",
                                   "/var/lib/spark-supervisor/../../lib", "/tmp"])
def test_a_cache_dir_that_is_a_system_or_top_level_directory_is_refused(cache: str) -> None:
    refused(with_(serve, cache_dir=cache), f"{S}.cache_dir", "")


@pytest.mark.parametrize("cache, volume", [
    ("/models", "/models:/models:ro"),  # the 122B model's directory
    ("/srv/models/cache", "/srv/models:/models"),  # inside a volume source
    ("/srv/data", "/srv/data/hf:/root/.cache/huggingface"),  # containing one
    ("/srv/data", "/srv/data/:/data"),
])
def test_a_cache_dir_overlapping_a_volume_source_is_refused(cache: str, volume: str) -> None:
    d = with_(serve, cache_dir=cache)
    ray(d)["volumes"] = [volume]
    refused(d, f"{S}.cache_dir", "")


def test_a_cache_dir_overlapping_another_deployments_volume_on_the_same_node_is_refused() -> None:
    d = data()
    other = {"name": "emb", "nodes": ["spark-1"], "ray": {"volumes": ["/srv/models:/models:ro"]},
             "serve": {"model": "BAAI/bge-m3", "distributed_executor_backend": "mp", "port": 8001,
                       "gpu_memory_utilization": 0.05}}
    d["deployments"].append(other)
    serve(d)["cache_dir"] = "/srv/models/vllm-cache"
    serve(d)["gpu_memory_utilization"] = 0.5
    refused(d, f"{S}.cache_dir", "deployments[1].ray.volumes[0]")


@pytest.mark.parametrize("cache, logs", [("/srv/x", "/srv/x"), ("/srv/x", "/srv/x/logs"), ("/srv/x/c", "/srv/x")])
def test_a_cache_dir_overlapping_the_serve_logs_is_refused(cache: str, logs: str) -> None:
    refused(with_(serve, cache_dir=cache, log_host_dir=logs), f"{S}.cache_dir", "log_host_dir")


def test_a_cache_dir_holding_the_state_dir_is_refused() -> None:
    d = with_(serve, cache_dir="/srv/sup")
    d["supervisor"]["state_dir"] = "/srv/sup/state"
    refused(d, f"{S}.cache_dir", "supervisor.state_dir")


def test_the_default_cache_beside_the_default_state_and_a_private_cache_are_fine() -> None:
    d = data()
    d["supervisor"]["state_dir"] = "/var/lib/spark-supervisor"
    config.parse(with_image(d), SRC, env={})
    d = with_(serve, cache_dir="/srv/vllm-cache")
    ray(d)["volumes"] = ["/srv/models:/models:ro"]
    config.parse(with_image(d), SRC, env={})


@pytest.mark.parametrize("key, table", [("state_dir", "supervisor"), ("log_host_dir", "serve")])
@pytest.mark.parametrize("path", ["/etc", "/var/log", "/usr", "/home/bob", "/srv/a/../../etc/x", "/data"])
def test_state_dir_and_log_host_dir_that_are_system_directories_are_refused(key: str, table: str, path: str) -> None:
    d = data()
    (d["supervisor"] if table == "supervisor" else serve(d))[key] = path
    refused(d, "supervisor.state_dir" if table == "supervisor" else f"{S}.{key}", "")


# ------------------------------------------------------------------------------ 3. special files
def test_a_fifo_as_the_config_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    out: list[Any] = []

    def load() -> None:
        try:
            config.load(fifo, env={})
        except config.ConfigError as e:
            out.append(e.problems)
    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():  # unblock the reader before failing
        with open(fifo, "wb"):
            pass
        t.join(5)
        pytest.fail("config.load blocked on a FIFO")
    assert out and out[0] == [f"{fifo}: cannot read: is a FIFO, not a regular file"]
    assert config.file_hash(fifo) == ""


@pytest.mark.parametrize("name", ["/dev/stdin", "/proc/self/fd/0", "/dev/fd/0"])
def test_links_to_standard_input_are_refused_whatever_it_is(tmp_path: Path, name: str) -> None:
    real = tmp_path / "real.toml"
    real.write_text("[supervisor]\n")
    with open(real, "rb") as f:
        saved = os.dup(0)
        os.dup2(f.fileno(), 0)  # standard input is a regular file: still not a config
        try:
            with pytest.raises(config.ConfigError) as e:
                config.load(name, env={})
        finally:
            os.dup2(saved, 0)
            os.close(saved)
    assert e.value.problems == [f"{name}: cannot read: is not a regular file (it leads to "
                                f"{e.value.problems[0].split('leads to ')[1].split(')')[0]}): give the path of a file"]
    link = tmp_path / "link.toml"
    link.symlink_to("/dev/stdin")
    assert "it leads to /dev/stdin" in problems_of_load(link)[0]


def problems_of_load(path: Path) -> list[str]:
    with pytest.raises(config.ConfigError) as e:
        config.load(path, env={})
    return e.value.problems


def test_an_api_key_file_that_is_a_fifo_or_a_device_link_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo)
    link = tmp_path / "key2"
    link.symlink_to("/dev/zero")
    for f, fragment in ((fifo, "is a FIFO, not a regular file"), (link, "it leads to /dev/zero")):
        d = data()
        d["deployments"][0]["readiness"] = {"api_key_file": str(f)}
        refused(d, f"{Q}.api_key_file", fragment)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_an_api_key_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    """Issue 42 (LOW): a key others can read is no key: refused (it was only a warning)."""
    f = tmp_path / "key"
    f.write_text("k3y-value\n")
    f.chmod(mode)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(f)}
    refused(d, f"{Q}.api_key_file", f"has mode {mode:04o}: anyone but its owner could read or change the key; "
                                    "chmod 600 it")
    f.chmod(0o600)
    c = config.parse(with_image(d), SRC, env={})
    assert not c.warnings and c.deployment.api_key.get_secret_value() == "k3y-value"


def test_trust_remote_code_and_a_password_in_the_webhook_are_warned_of() -> None:
    d = data()
    serve(d)["extra_args"] = ["--max-model-len", "8192", "--trust-remote-code"]
    d["alerts"] = {"webhook": "https://alice:s3cret@hooks.example.com/x"}
    warnings = config.parse(with_image(d), SRC, env={}).warnings
    assert any(f"{SRC}: deployments[0].serve.extra_args[2]: --trust-remote-code runs the model repository's own "
               "Python" in w for w in warnings), warnings
    assert any(f"{SRC}: alerts.webhook: a user and password in the URL" in w for w in warnings), warnings
    d["alerts"] = {"webhook": "${HOOK}"}
    serve(d)["extra_args"] = []
    assert not config.parse(with_image(d), SRC, env={"HOOK": "https://alice:s3cret@hooks.example.com/x"}).warnings


# ------------------------------------------------------------------------------ 7. flags vLLM reads
@pytest.mark.parametrize("args, flag", [
    ("--api-ke K", "--api-key"), ("--api-k=K", "--api-key"), ("--api_key K", "--api-key"),
    ("--tensor-parallel 2", "--tensor-parallel-size"), ("--tensor_parallel_size=2", "--tensor-parallel-size"),
    ("--gpu-mem 0.9", "--gpu-memory-utilization"), ("--served-model n", "--served-model-name"),
    ("--config /etc/x.yaml", "--config"), ("--config=/x.yaml", "--config"), ("--conf /x.yaml", "--config"),
    ("--nnodes 2", "--nnodes"), ("-n 2", "-n"), ("-n2", "-n"), ("--node-rank 1", "--node-rank"), ("-r 1", "-r"),
    ("--headless", "--headless"), ("--master-addr 1.2.3.4", "--master-addr"), ("--master-p 1", "--master-port"),
    ("-t 2", "-tp"), ("-tp=2", "-tp"), ("-p 2", "-pp"), ("--model x", "--model"), ("--mod x", "--model"),
    ("--host=1.2.3.4", "--host"), ("--hos 1.2.3.4", "--host"),
])
def test_serve_extra_args_are_judged_the_way_vllms_argparse_reads_them(args: str, flag: str) -> None:
    found = problems(with_(serve, extra_args=f"--max-model-len 4096 {args}"))
    assert len(found) == 1 and found[0].startswith(f"{SRC}: {S}.extra_args[2]: ") and flag in found[0], found


@pytest.mark.parametrize("args", ["--max-model-len 4096", "--config-format mistral", "--model-impl vllm",
                                  "--api-server-count 2", "--hf-config-path /x", "--port-range x",
                                  "--data-parallel-size 2", "-q fp8", "-O3", "--tokenizer-mode auto"])
def test_other_serve_flags_stay_allowed(args: str) -> None:
    config.parse(with_image(with_(serve, extra_args=args)), SRC, env={})


@pytest.mark.parametrize("args, ok", [("--disable-usage-stats", False), ("--port=7000", False),
                                      ("--num-gpu 2", True),  # click takes no prefixes: Ray refuses it itself
                                      ("--object-store-memory 1", True)])
def test_ray_extra_args_stay_exact(args: str, ok: bool) -> None:
    d = data()
    ray(d)["extra_args"] = args
    if ok:
        config.parse(with_image(d), SRC, env={})
    else:
        refused(d, f"{R}.extra_args[0]", "is set by the supervisor")


# ------------------------------------------------------------------------------ 8. broad cleanup rules
@pytest.mark.parametrize("label", [
    "com.docker.compose.project", "com.docker.compose.service", "com.docker.compose.version=2.29.1",
    "com.docker.compose.oneoff=False", "org.opencontainers.image.vendor", "org.opencontainers.image.vendor=NVIDIA",
    "org.opencontainers.image.version=24.04", "com.nvidia.volumes.needed=nvidia_driver", "maintainer",
    "maintainer=NVIDIA CORPORATION <cudatools@nvidia.com>", "io.kubernetes.pod.name", "com.docker.desktop.x=1",
    "org.label-schema.schema-version=1.0", "version", "vendor=x", "io.k8s.description", "anything",
    "SPARK-SUPERVISOR.owner", "spark-supervisor.role=serve", "com.example.old=",
])
def test_labels_every_container_of_some_class_carries_are_refused(label: str) -> None:
    d = data()
    d["stale"]["container_labels"] = [label]
    refused(d, "stale.container_labels[0]", "")


@pytest.mark.parametrize("pattern", [
    "sha256:*", "sha256*", "SHA256:*", "*", "**", "?*", "*?", "[a-z]*", "*[0-9]*", "*:*", "*/*", "*e*",
    "nvcr.io/*", "nvcr.io/nvidia/*", "docker.io/*", "ghcr.io/*/*", "quay.io/*", "localhost:5000/*",
    "registry.corp.example:5000/*", "my.registry/team/*:*", "*:latest", "*.io/*", "0*", "[0-9a-f]*", "*ab",
])
def test_image_patterns_that_match_ids_or_whole_registries_are_refused(pattern: str) -> None:
    d = data()
    d["stale"]["image_patterns"] = [pattern]
    refused(d, "stale.image_patterns[0]", "is too broad")


@pytest.mark.parametrize("rule", [
    {"image_patterns": ["vllm/vllm-openai*", "nvcr.io/nvidia/vllm*", "*vllm*", "vllm/*", "old/stack:1.2"]},
    {"container_labels": ["com.docker.compose.project=vllm", "com.docker.compose.service=vllm-head",
                          "com.example.stack", "stack=vllm-old"]},
])
def test_narrow_cleanup_rules_stay_allowed(rule: dict[str, Any]) -> None:
    d = data()
    d["stale"].update(rule)
    config.parse(with_image(d), SRC, env={})


# ------------------------------------------------------------------------------ 10. a worker that is the head
@pytest.mark.parametrize("worker, key", [
    ({"docker": "unix:///var/run/docker.sock"}, "nodes[1].docker"),  # the head's local engine
    ({"docker": "unix:///run/docker.sock"}, "nodes[1].docker"),
    ({"docker": "ssh://root@localhost"}, "nodes[1].docker"),
    ({"ssh": "root@127.0.0.1", "docker": "ssh://root@127.0.0.1"}, "nodes[1].ssh"),
    ({"ssh": "root@192.168.200.12", "docker": "ssh://root@spark-2"}, "nodes[1].ssh"),  # the head's fabric IP
    ({"docker": "ssh://root@192.168.200.12:22"}, "nodes[1].docker"),
])
def test_a_worker_that_is_the_head_is_refused_naming_both(worker: dict[str, str], key: str) -> None:
    d = data()
    d["nodes"][1].update(worker)
    found = problems(d)
    assert any(p.startswith(f"{SRC}: {key}: ") and "spark-2 and spark-1" in p and "same machine" in p
               for p in found), found


def test_two_workers_sharing_an_engine_or_ssh_host_are_refused() -> None:
    d = data()
    third = {**d["nodes"][1], "name": "spark-3", "fabric_ip": "192.168.200.14"}
    d["nodes"].append(third)
    serve(d)["tensor_parallel_size"] = 3
    found = problems(d)
    assert any(p.startswith(f"{SRC}: nodes[2].docker: ") and "spark-3 and spark-2" in p for p in found), found
    third.update(ssh="root@spark-3", docker="ssh://admin@SPARK-2:22")  # same engine, another user
    assert any("nodes[2].docker" in p and "spark-3 and spark-2" in p for p in problems(d))
    third.update(docker="ssh://root@spark-3", ssh="admin@spark-2")
    assert any("nodes[2].ssh" in p and "spark-3 and spark-2" in p for p in problems(d))


def test_the_testbed_shape_is_not_one_machine() -> None:
    d = data()
    d["nodes"][0].update(fabric_ip="127.0.0.2", docker="unix:///var/lib/tb/spark-1/docker.sock")
    d["nodes"][1].update(fabric_ip="127.0.0.3", ssh="spark-2", docker="ssh://spark-2:2222")
    config.parse(with_image(d), SRC, env={})


# ------------------------------------------------------------------------------ LOW: observation programs
def test_an_observation_program_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    prog = tmp_path / "smi"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o644)
    for key in ("nvidia_smi", "meminfo", "ip", "drop_caches", "oob"):
        d = data()
        d["nodes"][0][key] = [str(prog), "-x"]
        refused(d, f"nodes[0].{key}[0]", "is not executable")
        d["nodes"][0][key] = [str(tmp_path)]
        refused(d, f"nodes[0].{key}[0]", "is not a regular file")
        d["nodes"][0][key] = [str(tmp_path / "missing")]
        refused(d, f"nodes[0].{key}[0]", "No such file or directory")
        d["nodes"][0][key] = ["bin/smi"]
        refused(d, f"nodes[0].{key}[0]", "is a relative path")
    prog.chmod(0o755)
    d = data()
    d["nodes"][0]["nvidia_smi"] = [str(prog)]
    d["nodes"][1]["nvidia_smi"] = ["/opt/only/on/the/worker"]  # run over SSH there
    config.parse(with_image(d), SRC, env={})


def test_the_alert_command_is_an_absolute_executable() -> None:
    for command, fragment in ((["page-oncall"], "is not an absolute path"), (["./page"], "is not an absolute path"),
                              (["/nonexistent/page"], "No such file or directory"), (["/etc"], "not a regular file")):
        refused(data(alerts={"command": command}), "alerts.command[0]", fragment)
    config.parse(with_image(data(alerts={"command": ["/bin/true"]})), SRC, env={})


# ------------------------------------------------------------------------------ the config classes
CLASSES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("model-dot", lambda d: serve(d).update(model="./models/qwen"), f"{S}.model", "is a relative path"),
    ("model-dir", lambda d: serve(d).update(model="models/qwen/x"), f"{S}.model", "is a relative path"),
    ("model-up", lambda d: serve(d).update(model="../qwen"), f"{S}.model", "is a relative path"),
    ("model-home", lambda d: serve(d).update(model="~/models/q"), f"{S}.model", "is a relative path"),
    ("model-org-up", lambda d: serve(d).update(model="Qwen/.."), f"{S}.model", "is a relative path"),
    ("root-rw", lambda d: ray(d).update(volumes=["/:/host"]), f"{R}.volumes[0]", "host's root read-write"),
    ("root-rw-explicit", lambda d: ray(d).update(volumes=["//:/host:rw,z"]), f"{R}.volumes[0]", "read-write"),
    ("media-root", lambda d: serve(d).update(extra_args="--allowed-local-media-path /"), f"{S}.extra_args[0]",
     "lets any client read files"),
    ("media-etc-eq", lambda d: serve(d).update(extra_args=["--allowed_local_media_path=/etc"]), f"{S}.extra_args[0]",
     "lets any client read"),
    ("ld-preload", lambda d: serve(d).update(env={"LD_PRELOAD": "/x.so"}), f"{S}.env.LD_PRELOAD", "other code"),
    ("ld-audit-node", lambda d: d["nodes"][1].update(env={"LD_AUDIT": "/x.so"}), "nodes[1].env.LD_AUDIT", "other code"),
    ("pythonstartup", lambda d: ray(d).update(head_env={"PYTHONSTARTUP": "/x.py"}), f"{R}.head_env.PYTHONSTARTUP",
     "other code"),
    ("bash-env", lambda d: ray(d).update(env={"BASH_ENV": "/x"}), f"{R}.env.BASH_ENV", "other code"),
    ("serve-port-ray-gcs", lambda d: serve(d).update(port=6379), f"{S}.port", ""),
    ("serve-port-ray-client", lambda d: serve(d).update(port=10001), f"{S}.port", "Ray's client server"),
    ("serve-port-ray-agent", lambda d: serve(d).update(port=52365), f"{S}.port", "Ray's dashboard agent"),
    ("metrics-ray-dashboard", lambda d: d.update(metrics={"listen": "127.0.0.1:8265"}), "metrics.listen", ""),
    ("metrics-ray-client", lambda d: d.update(metrics={"listen": "127.0.0.1:10001"}), "metrics.listen",
     "Ray's client server"),
    ("endpoint-credentials", lambda d: d["deployments"][0].update(
        readiness={"endpoint": "http://user:pw@192.168.200.12:8000"}), f"{Q}.endpoint", "user:password@"),
    ("node-twice", lambda d: d["deployments"][0].update(nodes=["spark-1", "spark-2", "spark-1"]),
     "deployments[0].nodes[2]", "listed twice"),
    ("bidi-served-name", lambda d: serve(d).update(served_model_name="Qwen\u202e3"), f"{S}.served_model_name",
     "invisible format character U+202E"),
    ("zero-width-model", lambda d: serve(d).update(model="Qwen/Qwen\u200b3"), f"{S}.model", "U+200B"),
    ("bidi-key", lambda d: serve(d).update(env={"A\u2066": "x"}), f'{S}.env."A\\u2066"', "format character U+2066"),
    ("lookalike-served-name", lambda d: serve(d).update(served_model_name="Qwеn3"), f"{S}.served_model_name",
     "non-ASCII"),
    ("lookalike-ssh", lambda d: d["nodes"][1].update(ssh="root@spаrk-2"), "nodes[1].ssh", "non-ASCII"),
    ("lookalike-docker", lambda d: d["nodes"][1].update(docker="ssh://root@spаrk-2"), "nodes[1].docker", "non-ASCII"),
    ("lookalike-label", lambda d: d["stale"].update(container_labels=["cоm.example.x"]), "stale.container_labels[0]",
     "ASCII"),
    ("repair-budget", lambda d: d.update(healing={"repair_budget": 100000}), "healing.repair_budget", "less than"),
    ("residual", lambda d: d["stale"].update(residual_mib=10**9), "stale.residual_mib", "less than"),
    ("ulimit-nofile", lambda d: ray(d).update(ulimits={"nofile": 10**12}), f"{R}.ulimits.nofile", "kernel's limit"),
    ("ulimit-nproc", lambda d: ray(d).update(ulimits={"nproc": 10**9}), f"{R}.ulimits.nproc", "kernel's limit"),
    ("ssh-port", lambda d: d["nodes"][1].update(ssh="root@spark-2:2222"), "nodes[1].ssh", "ssh takes no :port"),
]


@pytest.mark.parametrize("case", CLASSES, ids=[c[0] for c in CLASSES])
def test_each_config_class_is_refused_naming_file_and_key(case: tuple[str, Any, str, str]) -> None:
    _, mutate, key, fragment = case
    d = data()
    mutate(d)
    refused(d, key, fragment)


def test_an_endpoint_on_another_deployments_port_is_refused() -> None:
    d = data()
    d["deployments"].append({"name": "emb", "nodes": ["spark-1"], "serve": {
        "model": "BAAI/bge-m3", "distributed_executor_backend": "mp", "port": 8001, "gpu_memory_utilization": 0.05}})
    serve(d)["gpu_memory_utilization"] = 0.5
    d["deployments"][0]["readiness"] = {"endpoint": "http://192.168.200.12:8001"}
    refused(d, f"{Q}.endpoint", "is deployments[1] (emb)'s serve")
    d["deployments"][0]["readiness"] = {"endpoint": "http://192.168.200.12:8000"}
    config.parse(with_image(d), SRC, env={})


@pytest.mark.parametrize("model", ["Qwen/Qwen3.5-122B-A10B-FP8", "BAAI/bge-reranker-v2-m3", "gpt2", "/models/qwen",
                                   "facebook/opt-125m", "Qwen/Qwen3-0.6B"])
def test_hub_ids_and_absolute_paths_are_models(model: str) -> None:
    config.parse(with_image(with_(serve, model=model)), SRC, env={})


def test_a_read_only_host_root_and_a_media_directory_are_fine() -> None:
    d = with_(serve, extra_args="--allowed-local-media-path /srv/media")
    ray(d)["volumes"] = ["/:/host:ro"]
    config.parse(with_image(d), SRC, env={})


# ------------------------------------------------------------------------------ warnings
def test_literal_secrets_and_search_paths_are_warnings_expanded_ones_are_not() -> None:
    d = data()
    serve(d)["env"] = {"HF_TOKEN": "hf_abc", "PYTHONPATH": "/opt/plugins", "TOKENIZERS_PARALLELISM": "false"}
    d["nodes"][1]["env"] = {"WANDB_API_KEY": "${KEY}"}
    serve(d)["extra_args"] = "--hf-token hf_abc"
    c = config.parse(with_image(d), SRC, env={"KEY": "from-the-environment"})
    assert len(c.warnings) == 3, c.warnings
    assert any(w.startswith(f"{SRC}: {S}.env.HF_TOKEN: ") and "EnvironmentFile=" in w and "${HF_TOKEN}" in w
               for w in c.warnings)
    assert any(w.startswith(f"{SRC}: {S}.env.PYTHONPATH: ") for w in c.warnings)
    assert any(w.startswith(f"{SRC}: {S}.extra_args[0]: ") and "ps" in w for w in c.warnings)
    assert not any("hf_abc" in w for w in c.warnings)
    assert config.parse(data(), SRC, env={}).warnings == ()


def test_warnings_do_not_change_what_the_config_is() -> None:
    d = data()
    serve(d)["env"] = {"HF_TOKEN": "hf_abc"}
    a = config.parse(with_image(d), SRC, env={})
    assert a.warnings and a.view(a.deployment).deployment == a.deployment
    assert stat.S_IMODE(0o600) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file away")
def test_an_api_key_file_owned_by_someone_else_is_a_warning(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("k3y-value\n")
    f.chmod(0o600)
    os.chown(f, 65534, 65534)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(f)}
    (w,) = config.parse(with_image(d), SRC, env={}).warnings
    assert w.startswith(f"{SRC}: {Q}.api_key_file: ") and "is owned by uid 65534" in w
