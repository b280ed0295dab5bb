"""The serve's logs outlive its containers, on the testbed: a deployment on both nodes with vLLM's mp backend
(a rank with its own log on each), a gang restart (the head's container removed), then `spark-supervisor
logs` shows the launch before it and the new one, on the head from its file system and on the worker over
SSH (proved by stopping the worker's sshd: the same read then fails, plainly), and follows both."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from spark_supervisor.world.servelogs import launches
from spark_testbed import testbed
from spark_testbed.harness import BIN, Supervisor, write_config
from spark_testbed.testbed import until

DEPLOYMENT: dict[str, Any] = {"serve": {"distributed_executor_backend": "mp"}}
PATCH: dict[str, Any] = {"healing": {"repair_budget": 50}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}
HEAD, WORKER = "testbed-vllm-spark-1", "testbed-vllm-spark-2"
LOGS = testbed.DIR / "serve-logs" / "testbed"  # etc/testbed.toml's log_host_dir, the deployment's directory


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def launch_of(out: subprocess.CompletedProcess[str]) -> str:
    """The start of the launch `logs` printed, from the line it writes on standard error."""
    m = re.search(r"\(launch (\S+), serve spec ", out.stderr)
    assert out.returncode == 0 and m, f"rc {out.returncode}: {out.stderr}"
    return m.group(1)


def started(st: dict[str, Any]) -> dict[str, str]:
    return {"spark-1": st["serve"]["started_at"], "spark-2": st["serve"]["ranks"]["spark-2"]["started_at"]}


def serving_since(d: Supervisor, t: float) -> dict[str, Any]:
    return d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > t
                  and not s["reason"].startswith("ObservationUnknown")
                  and (s["serve"].get("ranks") or {}).get("spark-2") is not None, 240, "SERVING")


def follow(config: Path, *args: str) -> None:
    """`logs -f` prints the current launch's last lines, keeps going, and ends at Ctrl-C with nothing left
    behind (a `tail -F` over SSH too: it ends when the session's input closes)."""
    # SIGINT at its default in the child, as at a terminal: a suite started in the background (a non-interactive
    # shell's `&`) ignores SIGINT, and a child would inherit that and never see the Ctrl-C sent below.
    with subprocess.Popen([str(BIN / "spark-supervisor"), "logs", "-f", "--lines", "3", "--config", str(config),
                           *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as p:
        lines: list[bytes] = []  # by "\n" only: tqdm's bars in a log are "\r"-separated within one line
        reader = threading.Thread(target=lambda: lines.extend(p.stdout or ()), daemon=True)
        reader.start()
        try:
            until(lambda: len(lines) >= 3, 30, f"`logs -f {' '.join(args)}` to print")
            assert p.poll() is None, "it went on following"
            p.send_signal(signal.SIGINT)
            assert p.wait(timeout=30) == 130
        finally:
            p.kill()
            reader.join(timeout=10)
    assert len(lines) == 3, lines
    path = f"{LOGS}/{args[-1] if args else 'spark-1'}/current"

    def tails() -> list[int]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if argv[:2] == ["tail", "-F"] and path in argv:
                found.append(proc.pid)
        return found
    until(lambda: not tails(), 30, f"no `tail -F {path}` left")


def test_logs_outlive_a_gang_restart_and_a_workers_are_read_over_ssh(supervisor: Callable[..., Supervisor],
                                                                     tmp_path: Path) -> None:
    config = write_config(tmp_path, PATCH, deployment=DEPLOYMENT)
    d = supervisor(config)
    first = started(serving_since(d, 0))

    head = cli("logs", "--config", str(config))
    assert launch_of(head) == first["spark-1"] and "Starting vLLM " in head.stdout, head.stdout[-2000:]
    worker = cli("logs", "testbed", "--node", "spark-2", "--config", str(config))
    assert launch_of(worker) == first["spark-2"]
    assert "headless multiproc executor" in worker.stdout, worker.stdout[-2000:]

    t = time.time()
    testbed.docker("spark-1", "rm", "-f", HEAD)  # the head's container, and the log inside it, gone
    d.wait(lambda _: any(e["kind"] == "gang" for e in d.repairs(t)), 60, "a gang repair")
    now = started(serving_since(d, t))

    for node in ("spark-1", "spark-2"):
        args = ["--node", node, "--config", str(config)]
        cur, prev = cli("logs", *args), cli("logs", "--previous", *args)
        assert launch_of(cur) == now[node]
        # The launch before the current one: the first, unless a relaunch within the repair came between.
        assert first[node] <= launch_of(prev) < now[node], (first, launch_of(prev), now)
        kept = {x.started_at: x.name for x in launches([p.name for p in (LOGS / node).iterdir()], node)}
        assert first[node] in kept, f"{node}: the first launch's log is gone: {sorted(kept)}"
        line = "Starting vLLM " if node == "spark-1" else "headless multiproc executor"
        assert line in (LOGS / node / kept[first[node]]).read_text(errors="replace") and line in cur.stdout

    follow(config)
    follow(config, "--node", "spark-2")

    testbed.stop_sshd()  # the worker's log is read over SSH, not from this (shared) file system
    out = cli("logs", "--node", "spark-2", "--config", str(config))
    assert out.returncode == 1 and "spark-2: SshUnreachable: " in out.stderr, out.stderr
