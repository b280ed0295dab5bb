"""What the operator sees, on the testbed: status (human, JSON, follow), metrics, logscan, diagnose, preflight."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spark_testbed import testbed
from spark_testbed.harness import BIN, OWNED, Supervisor, write_config


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin, check=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def serving(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, int]]:
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    tmp = tmp_path_factory.mktemp("operator")
    port = free_port()
    # The testbed's load (39 shards of 0.01 s) is over before `--follow` could draw it: this one takes 4 s.
    d = Supervisor(write_config(tmp, {"metrics": {"listen": f"127.0.0.1:{port}"}},
                                deployment={"serve": {"env": {"STANDIN_SHARD_SECONDS": "0.1"}}}), tmp)
    follow = subprocess.run([str(BIN / "spark-supervisor"), "status", "--follow", "--config", str(d.config)],
                            capture_output=True, text=True, timeout=180, check=False)
    d.follow = follow  # type: ignore[attr-defined]
    d.wait_phase("SERVING", 60)
    yield d, port
    d.stop(signal.SIGTERM)
    testbed.clean_containers()


def test_status_follow_draws_progress_until_serving(serving: tuple[Supervisor, int]) -> None:
    follow = serving[0].follow  # type: ignore[attr-defined]
    assert follow.returncode == 0
    frames = follow.stdout.split("\r")
    assert any("LOADING" in f and "shards, ETA" in f and "[#" in f for f in frames), frames[-5:]
    assert "SERVING" in frames[-1] and "100%" in frames[-1]


def test_status_tells_the_whole_truth(serving: tuple[Supervisor, int]) -> None:
    d, _ = serving
    out = cli("status", "--config", str(d.config))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("SERVING for ")
    for expected in ("goal: Qwen3.5-122B-A10B-FP8 (TP 2) on spark-1, spark-2 at http://127.0.0.2:8000",
                     "node spark-1 [head] 127.0.0.2: docker 20.10", "NVIDIA GB10 driver 580.95.05",
                     "owned: testbed-ray-spark-1 (running)", "ray (dashboard): up, 2 nodes alive, 2.0 GPUs",
                     "image spark-testbed/hostfs:latest: ray ", "(with dashboard, Python ", "vllm 0.33.0",
                     "sanity: passed: content is null but reasoning is filled and finish_reason=length",
                     "repairs: 0/3 in the last 6h", "history:", f"config: {d.config}"):
        assert expected in text, expected
    doc = json.loads(cli("status", "--json", "--config", str(d.config)).stdout)
    assert doc["schema"] == 1 and doc["phase"] == "SERVING"
    assert doc["nodes"]["spark-2"]["containers"] == [{"name": OWNED["spark-2"], "state": "running",
                                                     "image": "spark-testbed/hostfs:latest"}]
    assert doc["load_fraction"] == 1.0
    d.wait(lambda s: s["liveness"]["health"]["last"] == "success", 30, "a /health probe recorded")


def test_metrics(serving: tuple[Supervisor, int]) -> None:
    _, port = serving
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    d = 'deployment="testbed"'  # every metric of a deployment carries its name
    for line in (f'spark_supervisor_phase{{{d},phase="SERVING"}} 1.0', f"spark_supervisor_ray_nodes_alive{{{d}}} 2.0",
                 f"spark_supervisor_ray_gpus{{{d}}} 2.0", f"spark_supervisor_load_progress_ratio{{{d}}} 1.0",
                 f'spark_supervisor_probe_results_total{{{d},probe="sanity",result="success"}} 1.0'):
        assert line in text, line
    assert f"spark_supervisor_time_to_ready_seconds{{{d}}} " in text


def test_logscan_reads_the_real_serve_log(serving: tuple[Supervisor, int]) -> None:
    log = testbed.docker("spark-1", "exec", OWNED["spark-1"], "cat", "/tmp/spark-supervisor/testbed/log").stdout
    out = cli("logscan", "-", stdin=log.decode())
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith("reached: ready (startup complete), vLLM 0.33.0")
    doc = json.loads(cli("logscan", "--json", "-", stdin=log.decode()).stdout)
    assert doc["shards"] == {"done": 39, "total": 39} and doc["failure"] is None
    assert [s["milestone"] for s in doc["timeline"]][:2] == ["api", "engine"]


def test_diagnose_and_preflight_when_healthy(serving: tuple[Supervisor, int]) -> None:
    d, _ = serving
    out = cli("diagnose", "--config", str(d.config))
    assert out.returncode == 0, out.stdout
    assert "spark-1 (head, 127.0.0.2): OK (serve API answers)" in out.stdout
    assert "spark-2 (worker, 127.0.0.3): OK (container answers)" in out.stdout
    out = cli("check", "--preflight", "--config", str(d.config))
    assert out.returncode == 0 and "preflight: OK" in out.stdout, out.stdout


def test_diagnose_names_the_first_layer_that_does_not_answer(serving: tuple[Supervisor, int]) -> None:
    d, _ = serving
    pidfile = testbed.DIR / "spark-2" / "dockerd.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    testbed.until(lambda: not testbed._alive(pidfile), 30, "dockerd to stop")
    try:
        out = cli("diagnose", "--config", str(d.config))
        assert out.returncode == 1
        assert "spark-2 (worker, 127.0.0.3): deepest answering: SSH; first failing: Docker engine" in out.stdout
        assert "hint: Docker does not answer: `systemctl status docker` on spark-2" in out.stdout
        testbed.stop_sshd(sessions=True)
        out = cli("diagnose", "--config", str(d.config), timeout=60)
        assert "spark-2 (worker, 127.0.0.3): deepest answering: none; first failing: SSH" in out.stdout
    finally:
        testbed.start_sshd()
        testbed.start_dockerd("spark-2")
    d.wait_phase("SERVING", 180)


def test_preflight_names_a_wrong_interface(tmp_path: Path, tb: dict[str, str]) -> None:
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace('fabric_ip = "127.0.0.3"\nfabric_interface = "lo"',
                                           'fabric_ip = "127.0.0.3"\nfabric_interface = "eth-nope"'))
    assert "eth-nope" in cfg.read_text()
    out = cli("check", "--preflight", "--config", str(cfg))
    assert out.returncode == 1
    assert "preflight: spark-2: fabric interface eth-nope does not exist" in out.stdout
