"""Reading a sanity request the way the model means it. Pure.

A reasoning model that runs out of ``max_tokens`` while thinking answers ``content: null`` with its
text in ``reasoning`` (vLLM >= 0.11.1) or ``reasoning_content`` (<= 0.15) and ``finish_reason:
"length"``: that is healthy. HTTP errors, zero completion tokens and empty answers are not.

An embeddings model (``readiness.probe = "embeddings"``) cannot chat: it is asked for one embedding
(POST /v1/embeddings) and must return a non-empty vector of finite numbers. A reranker (``"rerank"``) is
asked to score two documents against the prompt (POST /v1/rerank) and must return a finite score for
each (vLLM's pooling API: RerankResponse.results[].relevance_score).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

from ..model import Answer, EndpointObservation, EndpointState, EngineStats, ProbeResult, Verdict
from ..specs.requests import RERANK_DOCUMENTS


def judged(kind: str, got: Verdict | Answer, serve: str) -> Verdict:
    """The verdict on what a sanity request of this kind got: an answer judged, or the adapter's own verdict
    when there was none to judge (no connection, no answer in time, a refused key)."""
    if isinstance(got, Verdict):
        return got
    return judge(kind, got.status_code, got.body, serve=serve, latency_s=got.latency_s)


def judge(kind: str, status_code: int, body: bytes | str, *, serve: str = "", latency_s: float = 0.0) -> Verdict:
    if kind == "embeddings":
        return _judge_pooling(status_code, body, serve, latency_s, _embedding, "an embeddings")
    if kind == "rerank":
        return _judge_pooling(status_code, body, serve, latency_s, _rerank, "a rerank")
    return judge_completion(status_code, body, serve=serve, latency_s=latency_s)


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _object(doc: object) -> dict[str, Any]:
    """A response that must be a JSON object; TypeError (what indexing another value raises) when it is not."""
    if not isinstance(doc, dict):
        raise TypeError(f"a {type(doc).__name__}, not an object")
    return doc


def _embedding(doc: object) -> tuple[bool, str]:
    vec = _object(doc)["data"][0]["embedding"]
    if isinstance(vec, str):  # encoding_format=base64: not asked for, but an answer all the same
        return bool(vec), "a base64 embedding" if vec else "an empty embedding"
    if not isinstance(vec, list) or not vec:
        return False, "an empty embedding"
    if not all(_finite(x) for x in vec):
        return False, f"an embedding of {len(vec)} with a value that is not a finite number (NaN or inf)"
    return True, f"an embedding of {len(vec)} dimensions"


def _rerank(doc: object) -> tuple[bool, str]:
    results = _object(doc)["results"]
    scores = [r["relevance_score"] for r in results]
    if len(scores) != len(RERANK_DOCUMENTS):
        return False, f"{len(scores)} scores for {len(RERANK_DOCUMENTS)} documents"
    if not all(_finite(x) for x in scores):
        return False, "a relevance score that is not a finite number (NaN or inf)"
    return True, f"{len(scores)} documents scored ({', '.join(f'{x:.3g}' for x in scores)})"


def _judge_pooling(status_code: int, body: bytes | str, serve: str, latency_s: float,
                   read: Callable[[object], tuple[bool, str]], what: str) -> Verdict:
    if status_code != 200:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return Verdict(False, f"HTTP {status_code}: {text.strip()[:200]}", serve, round(latency_s, 3))
    try:
        passed, why = read(json.loads(body))
    except (ValueError, KeyError, IndexError, TypeError):
        return Verdict(False, f"the response is not {what} response", serve, round(latency_s, 3))
    return Verdict(passed, why, serve, round(latency_s, 3))


def judge_completion(status_code: int, body: bytes | str, *, serve: str = "",
                     latency_s: float = 0.0) -> Verdict:
    def verdict(passed: bool, why: str, finish: str = "", field: str = "") -> Verdict:
        return Verdict(passed, why, serve, round(latency_s, 3), finish, field)

    if status_code != 200:
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return verdict(False, f"HTTP {status_code}: {text.strip()[:200]}")
    try:
        doc = json.loads(body)
        choice = doc["choices"][0]
        msg = choice.get("message") or {}
    except (ValueError, KeyError, IndexError, TypeError):
        return verdict(False, "the response is not a chat completion")
    finish = str(choice.get("finish_reason") or "")
    tokens = (doc.get("usage") or {}).get("completion_tokens")
    if tokens == 0:
        return verdict(False, "zero completion tokens", finish)
    content = msg.get("content")
    if isinstance(content, str) and content.strip():
        return verdict(True, f"content answered (finish_reason={finish or 'none'})", finish, "content")
    for field in ("reasoning", "reasoning_content"):
        said: object = msg.get(field)
        if isinstance(said, str) and said.strip():
            if finish == "length":
                return verdict(True, f"content is null but {field} is filled and finish_reason=length: "
                                     "the model was still thinking when max_tokens ran out", finish, field)
            return verdict(True, f"{field} answered (finish_reason={finish or 'none'})", finish, field)
    return verdict(False, f"empty answer (finish_reason={finish or 'none'})", finish)


def health_result(ep: EndpointObservation | None) -> ProbeResult:
    """/health while a serve runs: 200 is success; refused or 503 is failure; anything else unknown. The one
    judge of /health: the liveness tracker, the quick watch's fingerprint and the healthy watch ask it."""
    if ep is None or ep.state in (EndpointState.UNKNOWN, EndpointState.ERROR):
        return ProbeResult.UNKNOWN
    if ep.state == EndpointState.REFUSED:
        return ProbeResult.FAILURE
    return ProbeResult.SUCCESS if ep.health == 200 else ProbeResult.FAILURE


def deep_result(v: Verdict) -> ProbeResult:
    if v.busy and not v.passed:
        return ProbeResult.BUSY
    return ProbeResult.UNKNOWN if not v.ran else (ProbeResult.SUCCESS if v.passed else ProbeResult.FAILURE)


def beside_heartbeat(v: Verdict, before: EngineStats, after: EngineStats, *, deep: bool) -> Verdict:
    """A probe's verdict read beside the engine's own counters over its window (before it was sent, after it
    ended). A probe that timed out while any work counter moved waited behind others' work: busy, unknown,
    never a failure. Readiness (deep False) of an engine that generated tokens for others meanwhile is proven
    by them: it serves. Nothing moved, or a reading missing: the verdict stands (a failure stays one)."""
    if not v.timed_out or before.error or after.error or before.work == after.work:
        return v
    n, q = int(after.running), int(after.waiting)
    behind = f"probe waited behind {n} running, {q} waiting"
    made = after.generated - before.generated
    if not deep and made > 0:
        return dataclasses.replace(v, passed=True, ran=True, field="engine counters",
                                   why=f"busy ({behind}): it generated {made:.0f} tokens for others meanwhile")
    return dataclasses.replace(v, ran=False, busy=True, why=f"busy: {behind} ({v.why}; its counters moved)")

