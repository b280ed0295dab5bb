import shlex

from spark_supervisor import commands
from spark_supervisor.config import OWNER_LABEL
from tests.helpers import cfg

C = cfg()
DEP = C.deployment


def test_ray_head_binds_the_fabric_ip_with_its_own_env() -> None:
    spec = commands.ray_container(C, DEP, C.nodes[0])
    assert spec.name == "qwen-ray-spark-1"
    assert "--head" in spec.command and "--node-ip-address=192.168.200.12" in spec.command
    assert "--dashboard-host=192.168.200.12" in spec.command and "--block" in spec.command
    assert spec.environment["VLLM_HOST_IP"] == "192.168.200.12"
    assert spec.environment["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert spec.environment["RAY_memory_monitor_refresh_ms"] == "0"
    assert spec.labels[OWNER_LABEL] == "qwen"
    assert spec.options["network_mode"] == "host" and spec.options["gpus_all"]


def test_worker_joins_the_head_and_keeps_its_own_ip() -> None:
    spec = commands.ray_container(C, DEP, C.nodes[1])
    assert "--address=192.168.200.12:6379" in spec.command
    assert "--node-ip-address=192.168.200.13" in spec.command and "--head" not in spec.command
    assert spec.environment["VLLM_HOST_IP"] == "192.168.200.13"


def test_serve_argv_has_the_runbook_flags() -> None:
    argv = commands.serve_argv(DEP)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3.5-122B-A10B-FP8"]
    joined = " ".join(argv)
    assert "--tensor-parallel-size 2" in joined and "--gpu-memory-utilization 0.85" in joined
    assert "--distributed-executor-backend ray" in joined and "--served-model-name Qwen3.5" in joined
    env = commands.serve_env(C, DEP)
    assert env["VLLM_HOST_IP"] == "192.168.200.12" and '"SPREAD"' in env["VLLM_DISTRIBUTED_EXECUTOR_CONFIG"]


def test_the_serve_wrapper_takes_argv_as_positional_parameters() -> None:
    argv = commands.serve_launch(C, DEP, "abc")
    assert argv[:2] == ["sh", "-c"] and argv[2] == commands.SERVE_WRAPPER
    assert argv[4:7] == ["/tmp/spark-supervisor/qwen", "abc", "vllm"]


def test_ssh_quotes_each_remote_argument_once() -> None:
    argv = commands.ssh_argv("root@spark-2", ["systemctl", "stop", "a b; rm -rf /"], connect_timeout=5)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=5" in argv
    assert argv[-2] == "--" and shlex.split(argv[-1]) == ["systemctl", "stop", "a b; rm -rf /"]


def test_systemctl_names_units() -> None:
    assert commands.systemctl("stop", ["vllm-proxy", "x.socket"]) == ["systemctl", "stop", "vllm-proxy.service", "x.socket"]
