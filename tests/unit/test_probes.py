import json
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.judge import completion
from spark_supervisor.judge.completion import judge_completion
from spark_supervisor.specs import requests


def body(msg: dict[str, Any], finish: str = "length", tokens: int = 32) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", **msg}, "logprobs": None,
                                    "finish_reason": finish, "stop_reason": None}],
                       "usage": {"prompt_tokens": 12, "total_tokens": 12 + tokens, "completion_tokens": tokens}})


@pytest.mark.parametrize("msg, field", [
    ({"content": None, "reasoning_content": "Okay, the user"}, "reasoning_content"),            # vLLM <= 0.11.0
    ({"content": None, "reasoning": "Okay", "reasoning_content": "Okay"}, "reasoning"),        # 0.11.1 - 0.15
    ({"content": None, "reasoning": "Okay, the user wants"}, "reasoning"),                      # >= 0.16
])
def test_thinking_cut_off_by_max_tokens_is_healthy(msg: dict[str, Any], field: str) -> None:
    v = judge_completion(200, body(msg))
    assert v.passed and v.field == field and v.finish_reason == "length"
    assert "still thinking" in v.why


def test_qwen3_parser_puts_cut_off_thinking_in_content() -> None:
    v = judge_completion(200, body({"content": "Okay, the user wants", "reasoning": None}))
    assert v.passed and v.field == "content"


def test_plain_answer_passes() -> None:
    assert judge_completion(200, body({"content": "ready"}, finish="stop")).passed


@pytest.mark.parametrize("status, payload, why", [
    (500, '{"error": {"message": "EngineCore encountered an issue", "code": 500}}', "HTTP 500"),
    (401, '{"error": "Unauthorized"}', "HTTP 401"),
    (200, body({"content": None, "reasoning": None}, tokens=0), "zero completion tokens"),
    (200, body({"content": "", "reasoning": ""}, finish="stop", tokens=3), "empty answer"),
    (200, "<html>proxy</html>", "not a chat completion"),
])
def test_failures(status: int, payload: str, why: str) -> None:
    v = judge_completion(status, payload)
    assert not v.passed and why in v.why


# ------------------------------------------------------------------------------ embeddings and rerank
REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"


def test_the_real_servers_embedding_passes() -> None:
    v = completion.judge("embeddings", 200, (REAL / "embeddings.json").read_bytes(), serve="s", latency_s=0.01)
    assert v.passed and v.why == "an embedding of 128 dimensions" and v.serve == "s"


def test_the_real_servers_rerank_passes_with_a_negative_score() -> None:
    v = completion.judge("rerank", 200, (REAL / "rerank.json").read_bytes())
    assert v.passed and v.why.startswith("2 documents scored (")


@pytest.mark.parametrize("kind, body, why", [
    ("embeddings", {"data": [{"embedding": []}]}, "an empty embedding"),
    ("embeddings", {"data": []}, "the response is not an embeddings response"),
    ("embeddings", '{"data": [{"embedding": [0.1, NaN]}]}', "an embedding of 2 with a value that is not a finite"),
    ("rerank", {"results": [{"relevance_score": 0.1}]}, "1 scores for 2 documents"),
    ("rerank", {"results": [{"relevance_score": 0.1}, {"relevance_score": "x"}]}, "a relevance score that is not"),
    ("rerank", {"detail": "Not Found"}, "the response is not a rerank response"),
])
def test_a_broken_pooling_answer_fails(kind: str, body: str | dict[str, Any], why: str) -> None:
    v = completion.judge(kind, 200, body if isinstance(body, str) else json.dumps(body))
    assert not v.passed and v.why.startswith(why), v.why


def test_a_chat_probe_on_a_pooling_model_is_a_404_failure() -> None:
    v = completion.judge("chat", 404, (REAL / "pooling_chat.json").read_bytes())
    assert not v.passed and v.why == 'HTTP 404: {"detail":"Not Found"}'


def test_each_kind_asks_its_own_route() -> None:
    assert requests.sanity_request("embeddings", "m", "p", 8) == ("/v1/embeddings", {"model": "m", "input": "p"})
    assert requests.sanity_request("rerank", "m", "p", 8)[0] == "/v1/rerank"
    assert requests.sanity_request("chat", "m", "p", 8)[1]["max_tokens"] == 8
