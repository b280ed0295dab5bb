"""`make bench-beside` (`python -m spark_testbed.bench --beside [TAG]`, issue 26 part 5): the current code and
the previous release measured in the same run, so that "this machine ran slower" and "this change is slower"
are told apart.

The release (the last tag before HEAD unless named) runs from a venv of its own wheel (spark_testbed.release)
with the dev venv's dependencies, on its own etc/testbed.toml. Each measure is taken `--runs` times (n >= 3)
for both, interleaved run by run (current, release, current, release, ...) so that the machine's drift hits
both alike; the faults are made on one serving daemon per version, the current one's first. Each figure is
written as its median and worst (the highest) of the n runs. bench/runs/results-beside.md is rewritten after every
run, so that an interrupted bench keeps what it measured; a run that fails is listed with its error, and the
bench goes on.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bench, release, testbed
from .harness import BIN, Supervisor

Rows = list[dict[str, float]]
Got = dict[str, Rows]  # what one step measured: group -> its rows (one a run)
Results = dict[str, dict[str, Rows]]  # group -> side's label -> every run's row

# The table: (measure, group, key, format of one value, goal). The goals are issue 26's.
ROWS: list[tuple[str, str, str, str, str]] = [
    ("start to SERVING (nothing else running)", "cold", "total", "{:.2f} s", ""),
    ("of which Ray's own join", "cold", "ray_join", "{:.2f} s", ""),
    ("of which the model's own load", "cold", "load", "{:.2f} s", ""),
    ("**supervisor overhead** (the rest, from process spawn)", "cold", "overhead", "{:.2f} s",
     "<= 2 s median, worst <= 3 s"),
    ("supervisor overhead of a first start (a new state directory: each node's image and model checked first)",
     "first", "overhead", "{:.2f} s", ""),
    ("idle daemon CPU over {idle} s, one deployment SERVING", "idle", "cpu_percent", "{:.2f} %",
     "<= 0.25 % of a core"),
    ("idle daemon resident memory (max), one deployment", "idle", "rss_mib", "{:.1f} MiB", "<= 80 MB"),
    ("idle daemon CPU over {idle} s, the stack SERVING (3 deployments, 3 nodes)", "stack", "cpu_percent",
     "{:.2f} %", "<= 0.35 % of a core"),
    ("idle daemon resident memory (max), the stack", "stack", "rss_mib", "{:.1f} MiB", "<= 80 MB"),
    ("`spark-supervisor status`, the stack", "stack", "status_s", "{:.3f} s", "< 0.5 s"),
    ("serve killed -> repair started", "death", "detect", "{:.2f} s", "<= 1 s"),
    ("serve killed -> SERVING again", "death", "back", "{:.2f} s", ""),
    ("worker Ray container removed -> repair started", "loss", "detect", "{:.2f} s", ""),
    ("... after Ray marks the node DEAD", "loss", "after_ray_dead", "{:.2f} s", "<= 1 s"),
    ("worker lost -> SERVING again", "loss", "back", "{:.2f} s", ""),
    ("real vLLM (torch.compile on): cold start to SERVING, empty compile cache", "real", "cold_start",
     "{:.1f} s", ""),
    ("real vLLM: repair (serve killed) to SERVING, compile cache warm", "real", "warm_repair", "{:.1f} s", ""),
    ("**real vLLM: warm repair / cold start**", "real", "warm_over_cold", "{:.2f}", "<= 0.55"),
]


@dataclass(frozen=True)
class Side:
    """One version measured: its label, the directory of its spark-supervisor, the config it starts from
    (None: the current etc/testbed.toml) and its own working directory (state, logs, configs)."""
    label: str
    bin_dir: Path
    base: dict[str, Any] | None
    workdir: Path


def cell(values: list[float], fmt: str) -> str:
    """A measure of one side: median, worst (the highest) and n."""
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} (worst {fmt.format(max(values))}, n={len(values)})"


def table(results: Results, labels: list[str], idle_seconds: float) -> list[str]:
    """The table's lines: a measure a row, a column for each side."""
    lines = ["| measure | " + " | ".join(f"{lb} (median, worst, n)" for lb in labels) + " | goal |",
             "|---" * (len(labels) + 2) + "|"]
    for measure, group, key, fmt, goal in ROWS:
        sides = results.get(group, {})
        cells = [cell([r[key] for r in sides.get(lb, []) if key in r], fmt) for lb in labels]
        lines.append(f"| {measure.format(idle=f'{idle_seconds:.0f}')} | " + " | ".join(cells) + f" | {goal} |")
    return lines


def document(facts: dict[str, str], results: Results, labels: list[str], idle_seconds: float,
             errors: list[str]) -> str:
    """bench/runs/results-beside.md: the machine's facts, the table, the runs that failed, every run's figures."""
    out = [f"# make bench-beside: {' beside '.join(labels)}", "",
           *(f"- {k}: {v}" for k, v in facts.items()), "", *table(results, labels, idle_seconds)]
    if errors:
        out += ["", "## Runs that failed", "", *(f"- {e}" for e in errors)]
    runs = [json.dumps({"group": g, "side": lb, "runs": rows}, sort_keys=True)
            for g, sides in results.items() for lb, rows in sides.items()]
    out += ["", "## Every run (JSON lines)", "", "```json", *runs, "```"]
    return "\n".join(out) + "\n"


class Record:
    """What the bench measured so far, rewritten to ``path`` after every run."""

    def __init__(self, path: Path, facts: dict[str, str], labels: list[str], idle_seconds: float) -> None:
        self.path, self.facts, self.labels, self.idle_seconds = path, facts, labels, idle_seconds
        self.results: Results = {}
        self.errors: list[str] = []

    def add(self, label: str, got: Got) -> None:
        for group, rows in got.items():
            self.results.setdefault(group, {}).setdefault(label, []).extend(rows)
        self.write(done=False)

    def fail(self, what: str, error: BaseException) -> None:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        self.errors.append(f"{what}: {type(error).__name__}: {first}")
        self.write(done=False)

    def write(self, done: bool) -> None:
        load = "load average at the end" if done else "load average now (the bench still running)"
        text = document({**self.facts, load: loadavg()}, self.results, self.labels, self.idle_seconds, self.errors)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)


Step = tuple[str, int, Callable[[Side], Got]]  # (name, how many times, one measurement of a side)


def run(sides: list[Side], steps: list[Step], record: Record) -> None:
    """Each step ``times`` over, the sides taking turns within each time; a failed run is recorded, not fatal."""
    for name, times, measure in steps:
        for i in range(times):
            for side in sides:
                what = f"{name}, {side.label}, run {i + 1}/{times}"
                print(f"[beside] {what} ...", flush=True)
                try:
                    got = measure(side)
                except Exception as e:  # the bench goes on; the error is in the results
                    print(f"[beside] {what} failed: {type(e).__name__}: {e}", flush=True)
                    record.fail(what, e)
                    continue
                print(f"[beside] {what}: {got}", flush=True)
                record.add(side.label, got)


# ------------------------------------------------------------------------------------------- the measures
def cold(side: Side) -> Got:
    """A first start in a new state directory (its image check: once per image), then a cold start beside it,
    as after a reboot (the state directory kept): each its own figure."""
    workdir = side.workdir / f"cold-{time.time_ns()}"
    workdir.mkdir()
    first = bench.cold_start(workdir, False, side.bin_dir, side.base)
    return {"first": [first], "cold": [bench.cold_start(workdir, False, side.bin_dir, side.base)]}


def idle_one(side: Side, watch: dict[str, Any], seconds: float) -> Got:
    quiet = bench.on_a_serving_daemon(side.workdir, watch, f"idle-{int(time.time())}",
                                      lambda d: bench.idle(d, seconds), side.bin_dir, side.base)
    return {"idle": [quiet]}


def stack(side: Side, watch: dict[str, Any], seconds: float) -> Got:
    return {"stack": [bench.stack_idle(side.workdir, watch, seconds, side.bin_dir, side.base)]}


def faults(side: Side, watch: dict[str, Any], runs: int) -> Got:
    """``runs`` serve deaths, then ``runs`` worker losses, on one serving daemon."""
    def both(d: Supervisor) -> Got:
        deaths = [bench.fault(d, bench.kill_serve) for _ in range(runs)]
        return {"death": deaths, "loss": [bench.fault(d, bench.lose_worker) for _ in range(runs)]}
    return bench.on_a_serving_daemon(side.workdir, watch, "faults", both, side.bin_dir, side.base)


def real(side: Side) -> Got:
    r = bench.real_restarts(side.workdir, cold_repair=False, bin_dir=side.bin_dir)
    return {"real": [{**r, "warm_over_cold": r["warm_repair"] / r["cold_start"]}]}


STEPS = ("cold", "idle", "faults", "stack", "real")  # what `--steps` names


def steps(watch: dict[str, Any], runs: int, idle_seconds: float, only: tuple[str, ...] = ()) -> list[Step]:
    """In the order run: the quicker and more telling first, the real server's slow starts last (the stack
    brings a third node up; the others use the first two, or one). only: those of STEPS (empty: all)."""
    every: dict[str, Step] = {
        "cold": ("cold start", runs, cold),
        "idle": ("idle, one deployment", runs, functools.partial(idle_one, watch=watch, seconds=idle_seconds)),
        "faults": ("serve deaths and worker losses", 1, functools.partial(faults, watch=watch, runs=runs)),
        "stack": ("idle, the stack", runs, functools.partial(stack, watch=watch, seconds=idle_seconds)),
        "real": ("real vLLM warm repair / cold start", runs, real)}
    unknown = sorted(set(only) - set(every))
    if unknown:
        raise ValueError(f"no such step: {', '.join(unknown)} (the steps: {', '.join(STEPS)})")
    return [step for key, step in every.items() if not only or key in only]


# ------------------------------------------------------------------------------------------- the run
def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def uncommitted(src: Path) -> list[str]:
    """The tracked paths with changes not committed: git status's porcelain -z entries ("XY path", paths
    unquoted), a rename's or copy's new path, its old one (the entry after it) skipped."""
    out = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=no"], cwd=src,
                         capture_output=True, text=True, check=False, timeout=60).stdout
    entries, paths = iter(out.split("\0")), []
    for entry in entries:
        if len(entry) > 3:
            paths.append(entry[3:])
            if entry[0] in "RC":
                next(entries, None)
    return paths


def facts(src: Path, tag: str, venv_note: str, current_note: str, dirty: bool) -> dict[str, str]:
    """The machine and the two versions, at the start."""
    head = release.commit_of(src, "HEAD")
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "cores (nproc)": str(len(os.sched_getaffinity(0))),
            "load average at the start": loadavg(),
            "current": f"HEAD {head[:12]}" + (" with uncommitted changes" if dirty else "") + f" ({src}), "
                       + current_note,
            "release": f"{tag} at {release.commit_of(src, tag)[:12]}, {venv_note}"}


def current_side(src: Path, cache: Path, workdir: Path, dirty: list[str]) -> tuple[Side, str]:
    """The current code as a head node runs it: HEAD's wheel, in a venv built as the release's is (the dev venv's
    editable install puts a finder before every import: measured here, 0.04 s more to import the daemon and 0.17 s
    later to its first log line); with changes to the wheel's sources not committed, the dev venv's install, and
    the facts say so."""
    if any(p == w or p.startswith(f"{w}/") for p in dirty for w in release.WHEEL_SOURCES):
        note = "the dev venv's editable install (the wheel's sources have uncommitted changes)"
        print(f"[beside] current: {note}", flush=True)
        return Side("current", BIN, None, workdir / "current"), note
    t = time.monotonic()
    bin_dir = release.release_venv(src, "HEAD", cache, kind="current")
    note = f"HEAD's wheel, its venv {bin_dir.parent} (ready in {time.monotonic() - t:.1f} s)"
    print(f"[beside] current: {note}", flush=True)
    return Side("current", bin_dir, None, workdir / "current"), note


def release_side(src: Path, tag: str, cache: Path, workdir: Path) -> tuple[Side, str]:
    """The release's side, its venv built (or found in ``cache``); and a note of which and how long."""
    t = time.monotonic()
    bin_dir = release.release_venv(src, tag, cache)
    note = f"its venv {bin_dir.parent} (ready in {time.monotonic() - t:.1f} s)"
    print(f"[beside] {tag}: {note}", flush=True)
    return Side(f"release {tag}", bin_dir, release.release_config(src, tag), workdir / f"release-{tag}"), note


def main(workdir: Path, watch: dict[str, Any], tag: str, runs: int, idle_seconds: float, cache: Path,
         only: tuple[str, ...] = ()) -> int:
    """only: some of STEPS; their results go to bench/runs/results-beside-<steps>.md, the whole bench's stay."""
    src = testbed.SRC
    chosen = steps(watch, runs, idle_seconds, only)
    tag = tag or release.previous_release(src)
    dirty = uncommitted(src)
    cur, current_note = current_side(src, cache, workdir, dirty)
    rel, note = release_side(src, tag, cache, workdir)
    sides = [cur, rel]
    for side in sides:
        side.workdir.mkdir(parents=True, exist_ok=True)
    name = f"results-beside-{'-'.join(k for k in STEPS if k in only)}.md" if only else "results-beside.md"
    record = Record(src / "bench" / "runs" / name, facts(src, tag, note, current_note, bool(dirty)), [s.label for s in sides],
                    idle_seconds)
    record.write(done=False)
    print(f"[beside] {' beside '.join(s.label for s in sides)}, {runs} runs each, into {record.path}", flush=True)
    run(sides, chosen, record)
    record.write(done=True)
    print(record.path.read_text(), flush=True)
    return 1 if record.errors else 0
