"""`make chaos`: random faults from the fault matrix against the runbook's stack serving on the testbed
(harness.STACK_MORE: the LLM on two nodes, an embeddings model on a third, a reranker beside the LLM's
worker), for a bounded time (loopback only), then a table: detection and recovery times, repairs, false
repairs, other deployments disturbed, invariant violations.

    spark-testbed-chaos [--seconds 600] [--seed N] [--single]

--single: the testbed's one deployment on two nodes, as before the stack.

Two classes of fault:

- real: something the deployment needs is gone or broken (a serve killed, a Ray container removed, ...);
  each allows the repair kinds listed for it (none for the ones that must be waited for or cleaned).
- observation: only the daemon's view fails (spark_testbed.faults: the Ray dashboard, a Docker engine or a
  containerd hung with SIGSTOP) for a random while, then continues. Unknown is not absent: these must cause
  no repair at all.

A false repair is a repair started during an observation fault or within GRACE_S after it ended, a repair
of a kind its real fault does not allow, or a repair between faults (attributable to none). The summary
prints their total, which must be 0.

Each fault targets some deployments (those whose containers or node it hits). Another deployment is
disturbed when, during the fault and its recovery, it is repaired, has a container removed or replaced, has
its serve stopped or launched, or leaves SERVING. That count must be 0 too.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from . import faults, testbed
from .harness import (
    BACKEND,
    OWNED,
    STACK_OWNED,
    Supervisor,
    containers,
    fault_file,
    invariant_violations,
    stack_config,
    write_config,
)
from .testbed import until

FAULT_FILE = fault_file()  # the LLM's (testbed's) stand-in switch
# The serve-state exec runs at every full observation only while /health is 200: make those frequent so
# that a hung containerd is met while it lasts; a short unknown_patience so that DEGRADED is met too.
PATCH: dict[str, Any] = {"healing": {"repair_budget": 1000, "unknown_patience": 10},
                         "supervisor": {"backoff_base": 0.5, "backoff_max": 2, "full_observe_interval": 5,
                                        "io_timeout": 5}}
GRACE_S = 10.0  # after an observation fault ends, a repair this soon is still its (false) repair
OBSERVATION_S = (15.0, 40.0)  # how long an observation fault lasts (uniform)


class Run:
    def __init__(self, workdir: Path, stack: bool):
        self.workdir, self.stack = workdir, stack
        self.config = stack_config(workdir, PATCH) if stack else write_config(workdir, PATCH)
        self.owned = STACK_OWNED if stack else {n: {c: "testbed"} for n, c in OWNED.items()}
        self.deployments = sorted({d for mine in self.owned.values() for d in mine.values()})
        self.daemon = Supervisor(self.config, workdir, "daemon-0")
        self.generation = 0

    def ids(self) -> dict[str, tuple[str, str]]:
        """container -> (its deployment, its ID), on every node of the run."""
        out = {}
        for node, mine in self.owned.items():
            for name, c in containers(node).items():
                out[name] = (mine.get(name, "?"), c["id"])
        return out

    def restart_daemon(self) -> None:
        self.daemon.proc.kill()
        self.daemon.stop(signal.SIGKILL)
        self.generation += 1
        self.daemon = Supervisor(self.config, self.workdir, f"daemon-{self.generation}")


def _serve_kill(node: str = "spark-1", container: str = "", deployment: str = "testbed") -> None:
    testbed.docker(node, "exec", container or OWNED[node], "sh", "-c",
                   f"kill -9 $(cat /tmp/spark-supervisor/{deployment}/pid)", check=False)


def _engine_restart() -> None:
    pidfile = testbed.DIR / "spark-2" / "dockerd.pid"
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
    until(lambda: not testbed._alive(pidfile), 30, "dockerd to stop")
    testbed.start_dockerd("spark-2")


@dataclass(frozen=True)
class Real:
    inject: Callable[[Run], object]
    repairs: frozenset[str]  # the repair kinds this fault may legitimately cause
    changes_phase: bool = True  # SERVING is left (a repair, cleaning, a new daemon): recovery = SERVING anew
    targets: frozenset[str] = frozenset({"testbed"})  # the deployments it hits ("*": all of them)


REAL: dict[str, Real] = {
    "serve killed": Real(lambda _: _serve_kill(), frozenset({"serve"})),
    "serve wedged": Real(lambda _: FAULT_FILE.write_text("hang-completions"), frozenset({"serve"})),
    "worker Ray container removed": Real(lambda _: testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"], check=False),
                                         frozenset({"gang"})),
    "head Ray container removed": Real(lambda _: testbed.docker("spark-1", "rm", "-f", OWNED["spark-1"], check=False),
                                       frozenset({"gang"})),
    "all owned containers removed": Real(lambda _: [testbed.docker(n, "rm", "-f", c, check=False)
                                                    for n, c in OWNED.items()], frozenset({"gang"})),
    # Unreachable but alive in Ray: held as unknown (DEGRADED after the patience), never torn down.
    "worker SSH down 10s": Real(lambda _: testbed.stop_sshd(sessions=True), frozenset(), changes_phase=False,
                                targets=frozenset({"testbed", "rerank"})),
    "worker Docker engine restarted": Real(lambda _: _engine_restart(), frozenset({"gang", "serve"}),
                                           targets=frozenset({"testbed", "rerank"})),
    "stale container started": Real(lambda _: testbed.docker("spark-1", "run", "-d", "--name", "reranker", "--network",
                                                             "host", testbed.BUSYBOX, "sleep", "100000", check=False),
                                    frozenset()),
    "daemon SIGKILLed": Real(lambda r: r.restart_daemon(), frozenset(), targets=frozenset({"*"})),
    "embeddings serve killed": Real(lambda _: _serve_kill("spark-3", "embed-vllm-spark-3", "embed"),
                                    frozenset({"serve"}), targets=frozenset({"embed"})),
}

# The deployments an observation fault blinds (their phases may show it; no repair is ever right).
OBSERVATION_TARGETS = {"worker Docker engine hung": frozenset({"testbed", "rerank"})}
OBSERVATION: dict[str, Callable[[], faults.Freeze]] = {
    "ray dashboard hung": lambda: faults.ray_dashboard_hung(),
    "head containerd hung (serve-state exec)": lambda: faults.containerd_hung("spark-1"),
    "worker Docker engine hung": lambda: faults.docker_engine_hung("spark-2"),
}
if BACKEND == "mp":  # vLLM's mp mode across both nodes (SPARK_TESTBED_BACKEND=mp): no Ray, a rank per node
    del OBSERVATION["ray dashboard hung"]
    REAL["worker serve rank killed"] = Real(lambda _: _serve_kill("spark-2"), frozenset({"serve"}))
MENU = sorted(REAL) + sorted(OBSERVATION)


def _at(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def _clear(s: dict[str, Any]) -> bool:
    """Every deployment SERVING with nothing unknown."""
    return all(x["phase"] == "SERVING" and not x["reason"].startswith("ObservationUnknown") and not x.get("unknown")
               for x in s.get("deployments") or [s])


def _served_since(s: dict[str, Any], t: float, targets: frozenset[str]) -> bool:
    """Clear, and each deployment the fault hit entered SERVING after it."""
    return _clear(s) and all(datetime.fromisoformat(x["since"]).timestamp() > t for x in s.get("deployments") or [s]
                             if "*" in targets or x["deployment"]["name"] in targets)


# What disturbs a deployment the fault did not target.
_DISTURBING = {"repair.started", "clean.container_removed", "serve.launched", "serve.stopped"}


def disturbed(run: Run, events: list[dict[str, Any]], ids_before: dict[str, tuple[str, str]],
              targets: frozenset[str]) -> list[str]:
    if "*" in targets:
        return []
    out = [f"{e['deployment']}: {e['event']}" + (f" ({e.get('reason', '')})" if e.get("reason") else "")
           for e in events if e.get("deployment") not in (None, *targets)
           and (e.get("event") in _DISTURBING or (e.get("event") == "phase.changed" and e.get("from") == "SERVING"))]
    now = run.ids()
    out += [f"{dep}: {name} replaced or removed" for name, (dep, cid) in ids_before.items()
            if dep not in targets and now.get(name, ("", ""))[1] != cid]
    return out


def _reasons(events: list[dict[str, Any]]) -> list[str]:
    """The reason tags the daemon showed (phase changes and progress), in order, each once."""
    out: list[str] = []
    for e in events:
        if e.get("event") in ("phase.changed", "phase.progress", "repair.started"):
            tag = e.get("reason_kind") or ""
            if tag and tag not in out:
                out.append(tag)
    return out


def _row(run: Run, name: str, cls: str, t: float, detected: dict[str, Any] | None, recovered: float,
         events: list[dict[str, Any]], false: list[str], others: list[str]) -> dict[str, Any]:
    return {"fault": name, "class": cls, "detect_s": _at(detected) - t if detected else None, "recover_s": recovered,
            "repairs": [e["kind"] for e in events if e.get("event") == "repair.started"], "false_repairs": false,
            "disturbed": others, "reasons": _reasons(events), "violations": invariant_violations(run.owned)}


def one_real(run: Run, name: str) -> dict[str, Any]:
    fault = REAL[name]
    before = len(run.daemon.events())
    gen = run.generation
    ids_before = run.ids()
    t = time.time()
    fault.inject(run)
    d = run.daemon
    seen = before if run.generation == gen else 0

    def reaction() -> dict[str, Any] | None:
        for e in d.events()[seen:]:
            if (e.get("event") in ("repair.started", "phase.changed", "daemon.started", "observe.unknown")
                    and _at(e) >= t - 0.01):
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
    if fault.changes_phase:
        d.wait(lambda s: _served_since(s, t, fault.targets), 300, f"SERVING after {name}")
    else:
        d.wait(_clear, 300, f"SERVING with nothing unknown after {name}")
    recovered = time.time() - t
    events = d.events()[seen:]
    false = [f"{e['kind']}: {e['reason']} (not a repair {name} calls for)" for e in events
             if e.get("event") == "repair.started" and e["kind"] not in fault.repairs]
    others = disturbed(run, events, ids_before, fault.targets)
    return _row(run, name, "real", t, detected, recovered, events, false, others)


def one_observation(run: Run, name: str, rng: random.Random) -> dict[str, Any]:
    d = run.daemon
    seen = len(d.events())
    ids_before = run.ids()
    hold = rng.uniform(*OBSERVATION_S)
    fault = OBSERVATION[name]()
    with fault:
        t = fault.started_at
        until(lambda: time.time() - t >= hold, hold + 5, f"{name} for {hold:.0f} s", every=0.2)
    end = fault.ended_at
    d.wait(_clear, 300, f"SERVING with nothing unknown after {name}")
    recovered = time.time() - end
    until(lambda: time.time() - end >= GRACE_S, GRACE_S + 5, "the grace after the fault", every=0.2)
    events = [e for e in d.events()[seen:] if _at(e) >= t - 0.01]
    detected = next((e for e in events if e.get("event") in ("observe.unknown", "repair.started")), None)
    false = [f"{e['kind']}: {e['reason']} ({'during' if _at(e) <= end else 'just after'} {name})" for e in events
             if e.get("event") == "repair.started"]
    others = disturbed(run, events, ids_before, OBSERVATION_TARGETS.get(name, frozenset({"testbed"})))
    row = _row(run, name, "observation", t, detected, recovered, events, false, others)
    row["held_s"] = round(end - t, 1)
    return row


def between(run: Run, since: float) -> list[str]:
    """Repairs started after the last fault's window and before the next fault: attributable to none."""
    return [f"{e['kind']}: {e['reason']} (between faults)" for e in run.daemon.events("repair.started")
            if _at(e) > since]


def _ms(xs: list[float]) -> tuple[str, str]:
    return (f"{statistics.median(xs):.1f} s", f"{max(xs):.1f} s") if xs else ("-", "-")


def table(rows: list[dict[str, Any]], budget_used: int, seconds: float, unattributed: list[str]) -> str:
    out = [f"chaos: {len(rows)} faults in {seconds:.0f} s, budget used {budget_used} repairs", "",
           "| fault | class | n | detect median | detect worst | back to SERVING median | worst | repairs "
           "| false repairs | other deployments disturbed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["fault"], []).append(r)
    for name, rs in sorted(by.items()):
        det = _ms([r["detect_s"] for r in rs if r["detect_s"] is not None])
        rec = _ms([r["recover_s"] for r in rs])
        kinds = Counter(k for r in rs for k in r["repairs"])
        out.append(f"| {name} | {rs[0]['class']} | {len(rs)} | {det[0]} | {det[1]} | {rec[0]} | {rec[1]} | "
                   f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or '-'} | "
                   f"{sum(len(r['false_repairs']) for r in rs)} | {sum(len(r['disturbed']) for r in rs)} |")
    kinds = Counter(k for r in rows for k in r["repairs"])
    violations = [v for r in rows for v in r["violations"]]
    false = [f for r in rows for f in r["false_repairs"]] + unattributed
    out += ["", "back to SERVING: from the injection for real faults, from the end of the fault for observation faults",
            f"repairs by kind: {dict(sorted(kinds.items())) or '{}'}",
            f"false repairs: {len(false)}" + (f" {false}" if false else ""),
            f"other deployments disturbed: {sum(len(r['disturbed']) for r in rows)}"
            + (f" {[x for r in rows for x in r['disturbed']]}" if any(r["disturbed"] for r in rows) else ""),
            f"invariant violations: {len(violations)}" + (f" {violations}" if violations else "")]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spark-testbed-chaos")
    p.add_argument("--seconds", type=float, default=float(os.environ.get("CHAOS_SECONDS", "600")))
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--single", action="store_true", help="the testbed's one deployment on two nodes, no stack")
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    faults.thaw_all()
    nodes = 2 if a.single else 3
    testbed.up(nodes)
    os.environ.update(testbed.env())
    testbed.clean_containers()
    for node in testbed.nodes(nodes):
        testbed.write_gpu(node)
    FAULT_FILE.unlink(missing_ok=True)
    menu = [m for m in MENU if not a.single or m != "embeddings serve killed"]
    workdir = testbed.DIR / "chaos" / time.strftime("%Y%m%dT%H%M%S")
    workdir.mkdir(parents=True)
    run = Run(workdir, stack=not a.single)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    unattributed: list[str] = []
    try:
        run.daemon.wait(_clear, 300, "every deployment SERVING")
        window_end = time.time()
        while time.monotonic() - t0 < a.seconds:
            unattributed += between(run, window_end)
            name = rng.choice(menu)
            row = one_observation(run, name, rng) if name in OBSERVATION else one_real(run, name)
            window_end = time.time()
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        faults.thaw_all()
        FAULT_FILE.unlink(missing_ok=True)
        testbed.start_sshd()
        budget = sum(len(json.loads(f.read_text() or "[]")) for f in (workdir / "state").glob("deployments/*/repairs.json"))
        run.daemon.stop()
        subprocess.run([sys.executable, "-m", "spark_supervisor.cli", "teardown", "--config", str(run.config)],
                       check=False, capture_output=True, timeout=120)
    print(table(rows, budget, time.monotonic() - t0, unattributed))
    bad = any(r["violations"] or r["false_repairs"] or r["disturbed"] for r in rows) or unattributed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
