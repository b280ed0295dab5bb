"""vLLM's OpenAI-compatible API: reachability, served models, and one real request (readiness.probe)."""

from __future__ import annotations

import http.client
import json
import math
import time
from collections.abc import Iterable, Iterator

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..model import Answer, EndpointObservation, EndpointState, EngineStats, Verdict
from . import probe
from .health import observed
from .quick import KeptAlive

# The heartbeat's samples (vLLM's v1 metrics, docs/wire-formats.md §1.6) -> EngineStats' fields. vLLM's page (written by
# prometheus_client) types a counter under its sample's name, "…_total"; another writer may type the family.
HEARTBEAT = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
             "vllm:generation_tokens_total": "generated", "vllm:prompt_tokens_total": "prompted",
             "vllm:kv_cache_usage_perc": "kv_usage"}
_TYPED = {*HEARTBEAT, *(n.removesuffix("_total") for n in HEARTBEAT)}
MAX_METRICS_BYTES = 4 << 20  # the real page is ~50 KB; a page past this is not vLLM's


# What a heartbeat line starts with: a page's other lines (a real one has 600) are passed over by one C call each.
_STARTS = (*HEARTBEAT, *(f"# TYPE {n}" for n in _TYPED))


def _heartbeat_line(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(" ", 3)
        return len(parts) > 2 and parts[1] == "TYPE" and parts[2] in _TYPED
    return line.split("{", 1)[0].split(" ", 1)[0] in HEARTBEAT


def engine_stats(text: str) -> EngineStats:
    """The heartbeat's figures of a /metrics page, summed over engines (labels ``engine``, ``model_name``).
    Only the heartbeat's own lines go to prometheus_client's parser: all of the page's 600 lines would cost
    ~10 ms of CPU each tick, these ~0.2 ms. A page without them is an error (not vLLM's, or not yet up)."""
    got: dict[str, float] = {}
    try:
        lines = [x for x in text.splitlines() if x.startswith(_STARTS) and _heartbeat_line(x)]
        for family in text_string_to_metric_families("\n".join(lines) + "\n"):
            for sample in family.samples:
                field = HEARTBEAT.get(sample.name)
                if field and math.isfinite(sample.value):  # a NaN would never equal itself: a beat each tick
                    got[field] = got.get(field, 0.0) + float(sample.value)
    except ValueError as e:
        return EngineStats(error=f"/metrics: {e}"[:200])
    missing = sorted({"running", "generated"} - set(got))
    if missing:
        return EngineStats(error=f"/metrics has no {' or '.join(missing)} figure: not vLLM's v1 metrics")
    return EngineStats(got["running"], got.get("waiting", 0.0), got["generated"], got.get("prompted", 0.0),
                       got.get("kv_usage", 0.0))


def read_stream(events: Iterable[tuple[float, str]], sent: float) -> tuple[float, float, int]:
    """A streamed chat completion's (time, SSE line)s, read: (time to first token, decode tokens/s after
    it, tokens). A chunk carries a token when its delta has text in content, reasoning or
    reasoning_content (a reasoning model thinks first); the usage chunk (stream_options.include_usage) gives
    the count, else the chunks are counted. Raises ValueError on a stream that is not one."""
    first = last = 0.0
    chunks = usage = 0
    for at, line in events:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("a chunk that is not an object")
        if isinstance(doc.get("error"), dict):
            raise ValueError(f"error in the stream: {str(doc['error'].get('message', ''))[:150]}")
        u = doc.get("usage")
        if isinstance(u, dict) and isinstance(u.get("completion_tokens"), int):
            usage = u["completion_tokens"]
        for c in doc.get("choices") or ():
            delta = c.get("delta") if isinstance(c, dict) else None
            if isinstance(delta, dict) and any(isinstance(delta.get(k), str) and delta[k]
                                               for k in ("content", "reasoning", "reasoning_content")):
                chunks += 1
                first, last = first or at, at
    tokens = usage or chunks
    if not chunks:
        raise ValueError("no token in the stream")
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return first - sent, decode, tokens


class VllmApi:
    def __init__(self, client: httpx.Client, url: str, *, api_key: str, timeout: float):
        self.http, self.url, self.timeout = client, url.rstrip("/"), timeout
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.kept = KeptAlive(self.url, timeout)

    @probe("health", lambda e: EndpointObservation(EndpointState.UNKNOWN, str(e)))
    def observe_health(self) -> EndpointObservation:
        """/health alone (the cheap check). Refused is a load in progress: vLLM listens only once loaded."""
        try:
            code = self.http.get(f"{self.url}/health", timeout=self.timeout).status_code
        except httpx.HTTPError as e:
            return observed(failure=e)
        return observed(code)

    @probe("models", lambda e: EndpointObservation(EndpointState.UNKNOWN, str(e)))
    def observe(self) -> EndpointObservation:
        """/health, then the served models."""
        ep = self.observe_health()
        if ep.state != EndpointState.UP:
            return ep
        try:
            r = self.http.get(f"{self.url}/v1/models", headers=self.headers, timeout=self.timeout)
            if r.status_code != 200:
                return EndpointObservation(EndpointState.ERROR, f"/v1/models answered HTTP {r.status_code}", ep.health)
            models = tuple(str(m.get("id")) for m in r.json().get("data", []))
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            return EndpointObservation(EndpointState.ERROR, f"/v1/models: {type(e).__name__}", ep.health)
        return EndpointObservation(EndpointState.UP, "", ep.health, models)

    @probe("engine metrics", lambda e: EngineStats(error=str(e)))
    def engine(self) -> EngineStats:
        """The engine's heartbeat from its own /metrics (cheap: read each tick while it serves). Plain http.client
        over the kept-alive connection the quick check keeps to the same server (``kept``, adapters.quick): httpx
        cost four times the CPU, and a connection of its own, read every 5 s, would find it closed by uvicorn."""
        try:
            status, body = self.kept.get("/metrics", headers=self.headers, limit=MAX_METRICS_BYTES)
        except (OSError, http.client.HTTPException) as e:
            return EngineStats(error=f"/metrics: {type(e).__name__}")
        if status != 200:
            return EngineStats(error=f"/metrics answered HTTP {status}")
        if len(body) > MAX_METRICS_BYTES:
            return EngineStats(error=f"/metrics: more than {MAX_METRICS_BYTES >> 20} MiB")
        return engine_stats(body.decode("utf-8", "replace"))

    def stream(self, body: dict[str, object], timeout: float, gap: float) -> tuple[float, float, int]:
        """One streamed chat completion (specs.requests.stream_request), timed as it arrives: (time to first
        token, decode tokens/s, tokens); at most ``timeout`` in all and ``gap`` between two reads (an engine
        that stops answering must not hold the caller). Raises httpx.HTTPError or ValueError."""
        deadline = time.monotonic() + timeout
        sent = time.monotonic()
        with self.http.stream("POST", f"{self.url}/v1/chat/completions", headers=self.headers, json=body,
                              timeout=httpx.Timeout(min(timeout, gap))) as r:
            if r.status_code != 200:
                raise ValueError(f"HTTP {r.status_code}: {r.read()[:150]!r}")

            def timed() -> Iterator[tuple[float, str]]:
                for line in r.iter_lines():
                    now = time.monotonic()
                    if now > deadline:
                        raise ValueError(f"not done within {timeout:g}s")
                    yield now, line
            return read_stream(timed(), sent)

    def sanity(self, path: str, body: dict[str, object], timeout: float, serve: str) -> Verdict | Answer:
        """One real request of the readiness probe's kind (specs.requests.sanity_request): its answer, for
        judge.completion to judge, or the verdict when there is none (no connection, no answer in time, the
        key refused)."""
        t0 = time.monotonic()
        try:
            r = self.http.post(f"{self.url}{path}", headers=self.headers, timeout=timeout, json=body)
        except httpx.ConnectTimeout:
            return Verdict(False, "could not connect", serve, ran=False)
        except httpx.TimeoutException:
            return Verdict(False, f"no answer within {timeout:.0f}s", serve, round(time.monotonic() - t0, 3),
                           timed_out=True)
        except httpx.HTTPError as e:
            return Verdict(False, f"{type(e).__name__}: {e}"[:200], serve, ran=False)
        if r.status_code in (401, 403):  # the key is refused: the probe cannot ask, which says nothing of the engine
            return Verdict(False, f"HTTP {r.status_code}: cannot ask (the API key is refused: "
                           "the deployment's api_key_file or api_key_env)", serve, ran=False)
        return Answer(r.status_code, r.content, time.monotonic() - t0)
