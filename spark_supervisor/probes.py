"""Reading a sanity completion the way a reasoning model means it. Pure.

A reasoning model that runs out of ``max_tokens`` while thinking answers ``content: null`` with its
text in ``reasoning`` (vLLM >= 0.11.1) or ``reasoning_content`` (<= 0.15) and ``finish_reason:
"length"``: that is healthy. HTTP errors, zero completion tokens and empty answers are not.
"""

from __future__ import annotations

import json
from typing import Any

from .model import EndpointObservation, Verdict

def chat_request(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": False}


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


def health_result(ep: EndpointObservation | None) -> str:
    """/health while a serve runs: 200 is success; refused or 503 is failure; anything else unknown."""
    if ep is None or ep.state in ("unknown", "error"):
        return "unknown"
    if ep.state == "refused":
        return "failure"
    return "success" if ep.health == 200 else "failure"


def deep_result(v: Verdict) -> str:
    return "unknown" if not v.ran else ("success" if v.passed else "failure")

