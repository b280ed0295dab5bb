"""The requests the supervisor sends a serve, as data: vLLM's OpenAI-compatible API (a chat completion, an
embedding, a rerank) as path and body. The adapter sends them (adapters.vllm), judge.completion reads the
answers."""

from __future__ import annotations

from typing import Any


def chat_request(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": False}


RERANK_DOCUMENTS = ("ready", "not ready")


def sanity_request(kind: str, model: str, prompt: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """The path and body of a sanity request of this kind (readiness.probe)."""
    if kind == "embeddings":
        return "/v1/embeddings", {"model": model, "input": prompt}
    if kind == "rerank":
        return "/v1/rerank", {"model": model, "query": prompt, "documents": list(RERANK_DOCUMENTS)}
    return "/v1/chat/completions", chat_request(model, prompt, max_tokens)


def stream_request(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A chat completion streamed and generated in full (vLLM's ignore_eos), its usage in the last event: the
    throughput measurement's request."""
    return {**chat_request(model, prompt, max_tokens), "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
