import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_supervisor.adapters.shell import ssh_argv
from spark_supervisor.config import HELPER_LABEL, OWNER_LABEL
from spark_supervisor.specs import commands
from spark_testbed.testbed import until
from tests.helpers import cfg, data, recorded_serve_pid

C = cfg()
DEP = C.deployment


def test_ray_head_binds_the_fabric_ip_with_its_own_env() -> None:
    spec = commands.node_container(C, DEP, C.nodes[0])
    assert spec.name == "qwen-ray-spark-1"
    assert "--head" in spec.command and "--node-ip-address=192.168.200.12" in spec.command
    assert "--dashboard-host=192.168.200.12" in spec.command and "--block" in spec.command
    assert spec.environment["VLLM_HOST_IP"] == "192.168.200.12"
    assert spec.environment["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
    assert spec.environment["RAY_memory_monitor_refresh_ms"] == "0"
    assert spec.labels[OWNER_LABEL] == "qwen"
    assert spec.options["network_mode"] == "host" and spec.options["gpus_all"]


def test_worker_joins_the_head_and_keeps_its_own_ip() -> None:
    spec = commands.node_container(C, DEP, C.nodes[1])
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
    assert argv[4:15] == ["/tmp/spark-supervisor/qwen", "abc", "/var/lib/spark-supervisor/vllm-cache/qwen", "3",
                          str(64 * 1024), "/var/log/spark-supervisor/serve/qwen/spark-1", "spark-1", "5", "100",
                          "10", "vllm"]


def test_ssh_quotes_each_remote_argument_once() -> None:
    argv = ssh_argv("root@spark-2", ["systemctl", "stop", "a b; rm -rf /"], connect_timeout=5)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and "ConnectTimeout=5" in argv
    assert argv[-2] == "--" and shlex.split(argv[-1]) == ["systemctl", "stop", "a b; rm -rf /"]


def test_systemctl_names_units() -> None:
    assert commands.systemctl("stop", ["vllm-proxy", "x.socket"]) == ["systemctl", "stop", "vllm-proxy.service", "x.socket"]


def _sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False, **kw)


def _wait(cond: Callable[[], object], what: str) -> None:
    until(cond, 10, what, every=0.02)


def test_the_wrapper_records_the_serve_refuses_a_second_one_and_stop_ends_its_process_group(tmp_path: Path) -> None:
    d = str(tmp_path / "serve")
    cache = tmp_path / "cache"
    wrapper = ["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", d, "0123456789ab", str(cache), "2", "1000", "", "n", "5", "1", "1"]
    first = subprocess.Popen([*wrapper, "sh", "-c", "echo started; sleep 60 & sleep 60"])
    try:
        # The wrapper claims the slot with its own pid, then with the serve's once it has forked it: the
        # serve may write its log before that second claim, so wait for the serve's pid as well.
        _wait(lambda: recorded_serve_pid(d) not in ("", str(first.pid)) and os.path.exists(f"{d}/log")
              and "started" in Path(d, "log").read_text(), "the serve's pid and log")
        state = _sh(["sh", "-c", commands.SERVE_STATE, "spark-serve", d, "1000"]).stdout
        head, _, log = state.partition("\n")
        mark, pid, spec, _started, running = head.split()[:5]
        assert (mark, spec, running, log) == ("serve-state", "0123456789ab", "1", "started\n")
        second = _sh([*wrapper, "sh", "-c", "echo second"])
        assert second.returncode == 75 and "still runs" in second.stderr
        assert Path(d, "pid").read_text().strip() == pid  # untouched
        assert _sh(["sh", "-c", commands.SERVE_STOP, "spark-serve", d, "5"]).returncode == 0
        first.wait(timeout=10)
        # The whole group is gone, not just its leader (zombies wait for a reaper this sandbox may lack).
        _wait(lambda: set(_sh(["ps", "-o", "stat=", "-g", pid]).stdout.split()) <= {"Z"}, "the group ended")
        assert not os.path.exists(f"{d}/pid") and os.path.exists(f"{d}/log.prev")
        assert (cache / "0123456789ab").is_dir()
    finally:
        first.kill()


def test_the_wrapper_keeps_the_newest_spec_caches(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / commands.CACHE_MARK).touch()
    for i, name in enumerate(["aaaaaaaaaaa1", "aaaaaaaaaaa2", "aaaaaaaaaaa3"]):
        (cache / name).mkdir()
        (cache / name / commands.CACHE_MARK).touch()
        os.utime(cache / name / commands.CACHE_MARK, (1000 + i, 1000 + i))
    d = str(tmp_path / "serve")
    r = _sh(["sh", "-c", commands.SERVE_WRAPPER, "spark-serve", d, "bbbbbbbbbbbb", str(cache), "2", "1000", "", "n", "5",
             "1", "1", "true"])
    assert r.returncode == 0
    assert sorted(p.name for p in cache.iterdir()) == [commands.CACHE_MARK, "aaaaaaaaaaa3", "bbbbbbbbbbbb"]


def test_the_api_key_reaches_vllm_through_its_environment_never_argv(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-secret-123\n")
    key.chmod(0o600)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(key)}
    c = cfg(d)
    dep = c.deployment
    assert commands.serve_env(c, dep)["VLLM_API_KEY"] == "sk-secret-123"
    assert not any("sk-secret" in a for a in commands.serve_launch(c, dep, "h"))


def test_a_single_node_mp_deployment_has_no_ray() -> None:
    d = data()
    d["deployments"][0]["nodes"] = ["spark-1"]
    d["deployments"][0]["serve"].update(tensor_parallel_size=1, distributed_executor_backend="mp")
    c = cfg(d)
    dep = c.deployment
    spec = commands.node_container(c, dep, c.nodes[0])
    assert spec.name == "qwen-vllm-spark-1" and spec.command == ["sleep", "infinity"]
    assert spec.labels["spark-supervisor.role"] == "serve"
    assert "--distributed-executor-backend" not in commands.serve_argv(dep)
    assert "VLLM_DISTRIBUTED_EXECUTOR_CONFIG" not in commands.serve_env(c, dep, "h")
    assert commands.serve_env(c, dep, "h")["VLLM_CACHE_ROOT"] == "/var/lib/spark-supervisor/vllm-cache/qwen/h"
    assert spec.options["volumes"]["/var/lib/spark-supervisor/vllm-cache/qwen"]["mode"] == "rw"


def test_several_probes_run_in_one_shell_each_with_its_own_arguments_and_exit_code() -> None:
    argvs = [["printf", "a b\n"], ["sh", "-c", "echo err >&2; exit 3"], ["echo", "it's \"q\" $HOME `x` ;|&"],
             ["cat", "/nonexistent"], ["printf", "no newline"]]
    r = _sh(commands.probes_argv(argvs))
    assert commands.parse_probes(r.stdout, 5) == [(0, "a b"), (3, ""), (0, "it's \"q\" $HOME `x` ;|&"), (1, ""),
                                                  (0, "no newline")]
    assert commands.parse_probes("::spark-probe:: begin 0\npartial\n", 1) == [None]  # cut off: did not end


def test_every_helper_container_says_it_is_a_spark_supervisor_helper_and_its_role() -> None:
    node = C.nodes[0]
    helpers = {"image-check": commands.image_probe(C, DEP, node), "model-check": commands.model_probe(C, DEP, node),
               commands.PREFETCH_ROLE: commands.model_prefetch(C, DEP, node),
               "drop-caches": commands.drop_caches_container("img")}
    for role, spec in helpers.items():
        assert spec.labels[HELPER_LABEL] == role and spec.labels["spark-supervisor.role"] == role
    for role in ("image-check", "model-check", commands.PREFETCH_ROLE):
        assert helpers[role].labels["spark-supervisor.node"] == node.name
    # The owner label only where the planner tells the container from a node container by its role.
    assert helpers[commands.PREFETCH_ROLE].labels[OWNER_LABEL] == DEP.name
    assert not any(OWNER_LABEL in helpers[r].labels for r in ("image-check", "model-check", "drop-caches"))
