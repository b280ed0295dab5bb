"""`make chaos`: random faults from the fault matrix against a serving deployment on the testbed, for a
bounded time (loopback only), then a table: detection and recovery times, repairs, invariant violations.

    spark-testbed-chaos [--seconds 600] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from . import testbed
from .harness import OWNED, Supervisor, invariant_violations, write_config
from .testbed import until

FAULT_FILE = testbed.DIR / "serve-fault"
PATCH: dict[str, Any] = {"healing": {"repair_budget": 1000}, "supervisor": {"backoff_base": 0.5, "backoff_max": 2}}


class Run:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.config = write_config(workdir, PATCH)
        self.daemon = Supervisor(self.config, workdir, "daemon-0")
        self.generation = 0

    def restart_daemon(self) -> None:
        self.daemon.proc.kill()
        self.daemon.stop(signal.SIGKILL)
        self.generation += 1
        self.daemon = Supervisor(self.config, self.workdir, f"daemon-{self.generation}")


def _serve_kill() -> None:
    testbed.docker("spark-1", "exec", OWNED["spark-1"], "sh", "-c", "kill -9 $(cat /tmp/spark-supervisor/testbed/pid)",
                   check=False)


def _engine_restart() -> None:
    pidfile = testbed.DIR / "spark-2" / "dockerd.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    until(lambda: not testbed._alive(pidfile), 30, "dockerd to stop")
    testbed.start_dockerd("spark-2")


FAULTS: dict[str, Callable[[Run], None]] = {
    "serve killed": lambda r: _serve_kill(),
    "serve wedged": lambda r: FAULT_FILE.write_text("hang-completions"),
    "worker Ray container removed": lambda r: testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"], check=False),
    "head Ray container removed": lambda r: testbed.docker("spark-1", "rm", "-f", OWNED["spark-1"], check=False),
    "all owned containers removed": lambda r: [testbed.docker(n, "rm", "-f", c, check=False) for n, c in OWNED.items()],
    "worker SSH down 10s": lambda r: testbed.stop_sshd(sessions=True),
    "worker Docker engine restarted": lambda r: _engine_restart(),
    "stale container started": lambda r: testbed.docker("spark-1", "run", "-d", "--name", "reranker", "--network", "host",
                                                        testbed.BUSYBOX, "sleep", "100000", check=False),
    "daemon SIGKILLed": lambda r: r.restart_daemon(),
}


def _at(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def one(run: Run, name: str) -> dict[str, Any]:
    before = len(run.daemon.events())
    gen = run.generation
    t = time.time()
    FAULTS[name](run)
    d = run.daemon
    seen = before if run.generation == gen else 0

    def reaction() -> dict[str, Any] | None:
        for e in d.events()[seen:]:
            if e.get("event") in ("repair.started", "phase.changed", "daemon.started") and _at(e) >= t - 0.01:
                return e
        return None
    detected = until(reaction, 120, f"a reaction to {name}", every=0.1)
    assert isinstance(detected, dict)
    if name == "worker SSH down 10s":
        until(lambda: time.time() - t >= 10, 15, "10 s", every=0.2)
        testbed.start_sshd()
    if name == "serve wedged":
        until(lambda: any(e.get("event") == "repair.started" for e in d.events()[seen:]), 120, "the repair")
        FAULT_FILE.unlink(missing_ok=True)
    d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > t, 300,
           f"SERVING after {name}")
    recovered = time.time() - t
    repairs = [e["kind"] for e in d.events()[seen:] if e.get("event") == "repair.started"]
    return {"fault": name, "detect_s": _at(detected) - t, "recover_s": recovered, "repairs": repairs,
            "violations": invariant_violations()}


def table(rows: list[dict[str, Any]], budget_used: int, seconds: float) -> str:
    out = [f"chaos: {len(rows)} faults in {seconds:.0f} s, budget used {budget_used} repairs", "",
           "| fault | n | detect median | detect worst | back to SERVING median | worst | repairs |",
           "|---|---|---|---|---|---|---|"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["fault"], []).append(r)
    for name, rs in sorted(by.items()):
        det = [r["detect_s"] for r in rs]
        rec = [r["recover_s"] for r in rs]
        kinds = Counter(k for r in rs for k in r["repairs"])
        out.append(f"| {name} | {len(rs)} | {statistics.median(det):.1f} s | {max(det):.1f} s | "
                   f"{statistics.median(rec):.1f} s | {max(rec):.1f} s | "
                   f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or '-'} |")
    kinds = Counter(k for r in rows for k in r["repairs"])
    violations = [v for r in rows for v in r["violations"]]
    out += ["", f"repairs by kind: {dict(sorted(kinds.items())) or '{}'}",
            f"invariant violations: {len(violations)}" + (f" {violations}" if violations else "")]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spark-testbed-chaos")
    p.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS", "600")))
    p.add_argument("--seed", type=int, default=None)
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    testbed.up()
    os.environ.update(testbed.env())
    testbed.clean_containers()
    for node in testbed.NODES:
        testbed.write_gpu(node)
    FAULT_FILE.unlink(missing_ok=True)
    workdir = testbed.DIR / "chaos" / time.strftime("%Y%m%dT%H%M%S")
    workdir.mkdir(parents=True)
    run = Run(workdir)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    try:
        run.daemon.wait_phase("SERVING", 300)
        while time.monotonic() - t0 < a.seconds:
            name = rng.choice(sorted(FAULTS))
            row = one(run, name)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        FAULT_FILE.unlink(missing_ok=True)
        testbed.start_sshd()
        budget = len(json.loads((workdir / "state" / "repairs.json").read_text() or "[]")) \
            if (workdir / "state" / "repairs.json").exists() else 0
        run.daemon.stop()
        subprocess.run([sys.executable, "-m", "spark_supervisor.cli", "teardown", "--config", str(run.config)],
                       check=False, capture_output=True, timeout=120)
    print(table(rows, budget, time.monotonic() - t0))
    return 0 if not any(r["violations"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
