"""The performance verdict: serving well, not just serving.

After every start that reaches SERVING (and again every [deployments.performance] interval, only while the
engine is idle), one stream of a fixed prompt with a fixed number of tokens generated in full gives the time
to first token and the decode speed (``measure``; ``streams`` > 1 adds their aggregate). The best decode
speed is kept per key -- the image each node ran (by ID), the model, the serve spec and the nodes -- in the
deployment's state directory (``perf.json``). A measurement more than ``regression`` below the best for its
key, or below the operator's ``baseline``, is a regression (``judge``, pure): DEGRADED ThroughputRegression
(plan.serving; when to measure is the planner's too), alerted, never a repair by itself. A measurement that
could not be made is unknown: shown, never a regression; so is one that cannot be true (more tokens than
asked for, a decode faster than PLAUSIBLE_TPS). One measurement far above the best (JUMP) is kept as a candidate
and becomes the best only when the next one confirms it: a single outlier never sets the bar every later run
fails. `spark-supervisor reset` forgets the bests (``forget``).
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import httpx

from ..adapters.vllm import VllmApi
from ..base.log import Log
from ..config import Deployment
from ..config.view import DeploymentView
from ..model import Kind, PerfVerdict, Status, Throughput
from ..specs import requests
from ..state import names, statefile

FILE = names.PERF
# One stream's decode above this is a clock or counting error. A burst read on a busy CPU reads 80,000 tok/s on the
# real tiny model (make test-noisy): plausible enough to show, and JUMP keeps one such from becoming the best.
PLAUSIBLE_TPS = 1_000_000.0
JUMP = 1.5  # a measurement this far above the best waits for the next to confirm it (within CONFIRM)
CONFIRM = 0.8


class PerfMetrics(Protocol):
    """What record hands a verdict to: one deployment's metrics handle (report.metrics, a layer above this one)."""

    def performance(self, v: PerfVerdict, /) -> None: ...


def key(view: DeploymentView, images: dict[str, str]) -> tuple[str, dict[str, object]]:
    """What a best is kept for: the images the nodes ran (by ID; the tag where none is pinned), the model,
    the serve spec and the nodes. Its hash, and the parts (kept beside the figure, for a person)."""
    parts: dict[str, object] = {"images": sorted(set(images.values())) or [view.dep.ray.image],
                                "model": view.dep.serve.model, "serve": view.serve_hash,
                                "nodes": sorted(n.name for n in view.members)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16], parts


def measure(api: VllmApi, dep: Deployment, serve: str, log: Log, gap: float) -> Throughput:
    """One stream timed; then, with ``streams`` > 1, that many at once for their aggregate. ``api``: the
    serve's API. ``gap``: the longest wait for the next token (healing.deep_probe_timeout):
    the measurement holds the loop, and an engine that stops answering must not hold it longer than a probe."""
    p = dep.performance

    def one() -> tuple[float, float, int]:
        ttft, decode, tokens = api.stream(requests.stream_request(dep.serve.name, p.prompt, p.max_tokens), p.timeout, gap)
        return float(ttft), float(decode), int(tokens)
    try:
        ttft, decode, tokens = one()
        aggregate = 0.0
        if p.streams > 1:
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=p.streams, thread_name_prefix="perf") as pool:
                got = list(pool.map(lambda _: one(), range(p.streams)))
            aggregate = sum(t for _, _, t in got) / max(time.monotonic() - t0, 1e-6)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        log.warning("perf.unmeasured", why=f"{type(e).__name__}: {e}"[:200])
        return Throughput(serve, error=f"{type(e).__name__}: {e}"[:200])
    t = Throughput(serve, round(ttft, 3), round(decode, 2), tokens, round(aggregate, 2), p.streams if aggregate else 0)
    log.info("perf.measured", ttft_s=t.ttft_s, decode_tokens_per_s=t.decode_tps, tokens=tokens,
             aggregate_tokens_per_s=t.aggregate_tps or None, streams=t.streams or None)
    return t


def best_of(kept: object) -> float:
    """A kept best's decode speed; anything but a positive finite number is none."""
    tps = kept.get("decode_tps") if isinstance(kept, dict) else None
    return float(tps) if isinstance(tps, int | float) and not isinstance(tps, bool) and 0 < tps < 1e9 else 0.0


def implausible(t: Throughput, dep: Deployment) -> str:
    """Why a measurement cannot be true ("": it can)."""
    if t.tokens > dep.performance.max_tokens:
        return f"{t.tokens} tokens counted for max_tokens {dep.performance.max_tokens}"
    if not 0 < t.decode_tps <= PLAUSIBLE_TPS:
        return f"a decode of {t.decode_tps:g} tok/s"
    return ""


def judge(t: Throughput, best: float, dep: Deployment, now: float) -> PerfVerdict:
    """The verdict on one measurement, against the operator's baseline when set, else the best for its key."""
    if t.error:
        return PerfVerdict(t.serve, now, error=t.error)
    if why := implausible(t, dep):
        return PerfVerdict(t.serve, now, error=f"implausible, not kept: {why}")
    p = dep.performance
    reference, against = ("baseline", p.baseline) if p.baseline else ("best", best) if best else ("", 0.0)
    regression = ""
    if against and t.decode_tps < against * (1 - p.regression):
        of = "this spec" if reference == "best" else "the operator's ([deployments.performance] baseline)"
        regression = (f"{t.decode_tps:.1f} tok/s, {reference} {against:.1f} for {of}: more than {p.regression:.0%} "
                      f"below; time to first token {t.ttft_s:.2f}s")
    return PerfVerdict(t.serve, now, t.ttft_s, t.decode_tps, t.aggregate_tps, max(best, t.decode_tps), reference,
                       regression)


def record(st: Status, t: Throughput, view: DeploymentView, metrics: PerfMetrics, log: Log, now: float) -> None:
    """A measurement taken in: judged against the best kept for its key, the best raised (persisted), the
    verdict on the status, its figures in the metrics."""
    state_dir = view.cfg.supervisor.state_dir
    k, parts = key(view, st.pinned)
    kept = statefile.read_json(state_dir, FILE)
    best = best_of(kept.get(k))
    st.perf = v = judge(t, best, view.dep, now)
    if v.regression:
        log.warning("perf.regression", decode_tokens_per_s=v.decode_tps, best=best, baseline=view.dep.performance.baseline,
                    key=k, why=f"{Kind.THROUGHPUT_REGRESSION}: {v.regression}")
    entry = kept.get(k)
    raised = _raised(v, best, entry if isinstance(entry, dict) else {})
    if raised is not None:
        try:
            statefile.write_json(state_dir, FILE, {**kept, k: {**raised, "at": statefile.iso(time.time()), "key": parts}})
        except OSError as e:
            log.error("state.write_failed", file=FILE, error=str(e))
    metrics.performance(v)


def _raised(v: PerfVerdict, best: float, entry: dict[str, Any]) -> dict[str, Any] | None:
    """What the key's entry becomes after ``v`` (None: unchanged): the best raised, or a jump kept as a candidate
    until the next measurement confirms it."""
    if v.error or v.decode_tps <= best:
        return None
    if best and v.decode_tps > best * JUMP:
        candidate = best_of({"decode_tps": entry.get("candidate_tps")})
        if not candidate or v.decode_tps < candidate * CONFIRM:
            return {**entry, "candidate_tps": v.decode_tps}
    return {"decode_tps": v.decode_tps, "ttft_s": v.ttft_s}


def forget(state_dir: str, log: Log) -> None:
    """The bests forgotten (the operator's reset): the next measurement of each key sets it afresh."""
    try:
        if (Path(state_dir) / FILE).exists():
            statefile.atomic_write(Path(state_dir) / FILE, "{}")
            log.info("perf.bests_forgotten", file=FILE)
    except OSError as e:
        log.error("state.write_failed", file=FILE, error=str(e))

