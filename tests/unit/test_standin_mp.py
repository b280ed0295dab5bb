"""The vLLM stand-in's mp multi-node mode (`--nnodes N --node-rank R --master-addr A --master-port P`,
`--headless` on R > 0), run for real: rank 0 waits on A:P for the headless ranks (torch's TCPStore), a
rank's death takes the other down with vLLM's engine-death lines, and the torch failures print torch's
lines. No sleeps: every wait is on a condition with a deadline."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_supervisor import logscan
from tests.standin_process import StandinProcess, free_port

TIMEOUT = 5  # STANDIN_FOLLOWER_TIMEOUT for the runs that must not time out


class Ranks:
    """ranks(rank, nnodes=2, timeout=...) -> a stand-in rank on 127.0.0.1, its head at port `master`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.master = free_port()
        self.started: list[StandinProcess] = []

    def __call__(self, rank: int, nnodes: int = 2, timeout: float = TIMEOUT, tp: int | None = None,
                 port: int | None = None, extra: tuple[str, ...] = ()) -> StandinProcess:
        args = ["--model", "tiny-qwen3", "--tensor-parallel-size", str(tp or nnodes), "--nnodes", str(nnodes),
                "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port or self.master),
                *(["--headless"] if rank else []), *extra]
        s = StandinProcess(self.tmp_path, args, {"STANDIN_FOLLOWER_TIMEOUT": str(timeout)})
        self.started.append(s)
        return s


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Ranks]:
    """All the ranks started are killed at the end."""
    start = Ranks(tmp_path)
    yield start
    for s in start.started:
        s.close()


def _refused(port: int) -> bool:
    with socket.socket() as c:
        return c.connect_ex(("127.0.0.1", port)) != 0


def _loaded(s: StandinProcess) -> None:
    s.until(lambda: "Model loading took" in s.text() or s.proc.poll() is not None, "the headless rank's load")
    assert "Model loading took" in s.text()


def test_head_and_headless_rank_serve_and_only_the_head_has_an_api(ranks: Ranks) -> None:
    head, follower = ranks(0), ranks(1)
    head.started()
    code, body = head.request("GET", "/v1/models")
    assert code == 200 and b"tiny-qwen3" in body
    _loaded(follower)
    text = follower.text()
    assert (f"[serve.py:216] Launching vLLM (v0.33.0) headless multiproc executor, with head node address "
            f"127.0.0.1:{ranks.master} for torch.distributed process group.") in text
    assert "Loading safetensors checkpoint shards: 100% Completed | 3/3" in text
    assert "(Worker_TP1 pid=" in text and "world_size=2 rank=1" in text
    assert follower.proc.poll() is None and _refused(follower.port)
    assert "Starting vLLM server" not in text and "Application startup complete." not in text


def test_a_taken_master_port_is_torchs_eaddrinuse(ranks: Ranks) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ranks.master))
        taken.listen()
        head = ranks(0)
        assert head.exited() == 1
    text = head.text()
    assert (f"torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            f"address. port: {ranks.master}, useIpv6: false, code: -98, name: EADDRINUSE, message: address "
            "already in use") in text
    f = logscan.classify(text)
    assert f is not None and f.reason == "MasterPortInUse" and "EADDRINUSE" in f.line
    assert "Application startup complete." not in text


@pytest.mark.parametrize("nnodes, joining, joined", [(2, 0, "1/2"), (3, 1, "2/3")])
def test_followers_that_never_come_are_torchs_store_timeout(ranks: Ranks, nnodes: int, joining: int, joined: str) -> None:
    t0 = time.monotonic()
    head = ranks(0, nnodes=nnodes, timeout=1)
    followers = [ranks(r, nnodes=nnodes, timeout=1) for r in range(1, 1 + joining)]
    assert head.exited() == 1
    assert time.monotonic() - t0 < 1 + 5
    text = head.text()
    assert (f"torch.distributed.DistStoreError: Timed out after 2 seconds waiting for clients. {joined} clients "
            "joined.") in text
    assert "Starting to load model" not in text and _refused(head.port)
    for f in followers:  # the one that joined loses rank 0 before the group ever formed
        assert f.exited() == 1
        assert "Connection closed by peer [127.0.0.1]" in f.text()


def test_a_headless_rank_that_cannot_reach_the_head_gives_up_with_torchs_client_error(ranks: Ranks) -> None:
    follower = ranks(1, timeout=1)
    assert follower.exited() == 1
    text = follower.text()
    assert (f"The client socket has failed to connect to [127.0.0.1]:{ranks.master} (errno: 111 - Connection "
            "refused).") in text
    assert (f"torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to "
            f"connect to (127.0.0.1, {ranks.master}).") in text


def test_a_killed_headless_rank_kills_the_head_with_engine_death_lines(ranks: Ranks) -> None:
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    follower.proc.kill()
    assert head.exited() == 1
    text = head.text()
    assert "Worker proc Worker_TP1 died unexpectedly, shutting down executor." in text
    assert "EngineDeadError: EngineCore encountered an issue." in text
    f = logscan.classify(text)
    assert f is not None and f.reason == "EngineDied" and "Connection closed by peer" in f.line


def test_a_killed_head_kills_the_headless_rank_with_engine_death_lines(ranks: Ranks) -> None:
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    head.proc.kill()
    assert follower.exited() == 1
    text = follower.text()
    assert f"Connection closed by peer [127.0.0.1]:{ranks.master}" in text
    assert "Worker proc Worker_TP1 died unexpectedly, shutting down executor." in text
    f = logscan.classify(text)
    assert f is not None and f.reason == "EngineDied"


def test_sigterm_to_the_head_stops_the_headless_ranks_too(ranks: Ranks) -> None:
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    head.proc.terminate()
    assert head.exited() == 0
    assert follower.exited() == 0
    assert "ERROR" not in follower.text() and "ERROR" not in head.text()


def test_sigterm_to_a_headless_rank_is_quiet_and_the_head_dies_of_it(ranks: Ranks) -> None:
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    follower.proc.terminate()
    assert follower.exited() == 0
    assert "ERROR" not in follower.text()
    assert head.exited() == 1 and "EngineDeadError" in head.text()


def test_sigterm_while_the_head_waits_for_followers_is_a_quiet_exit(ranks: Ranks) -> None:
    head = ranks(0, timeout=30)
    head.until(lambda: "world_size=2 rank=0" in head.text(), "the head's rendezvous")
    head.proc.terminate()
    assert head.exited() == 0 and "ERROR" not in head.text()


@pytest.mark.parametrize("extra, tp, line", [
    ((), 4, "World size (4) is larger than the number of available GPUs (1) in this node."),
    (("--distributed-executor-backend", "ray"), 2, "can only be set when distributed executor backend is mp"),
])
def test_multi_node_refusals(ranks: Ranks, extra: tuple[str, ...], tp: int, line: str) -> None:
    head = ranks(0, tp=tp, extra=extra)
    assert head.exited() == 1 and line in head.text()


def test_version_prints_the_bare_version() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}, "STANDIN_VLLM_VERSION": "0.15.1"}
    r = subprocess.run([sys.executable, "-m", "spark_testbed.vllm_standin", "--version"], capture_output=True,
                       text=True, env=env, timeout=30)
    assert (r.returncode, r.stdout) == (0, "0.15.1\n")
