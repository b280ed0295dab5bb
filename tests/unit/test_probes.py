import json

import pytest

from spark_supervisor.probes import judge_completion


def body(msg: dict, finish: str = "length", tokens: int = 32) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", **msg}, "logprobs": None,
                                    "finish_reason": finish, "stop_reason": None}],
                       "usage": {"prompt_tokens": 12, "total_tokens": 12 + tokens, "completion_tokens": tokens}})


@pytest.mark.parametrize("msg, field", [
    ({"content": None, "reasoning_content": "Okay, the user"}, "reasoning_content"),            # vLLM <= 0.11.0
    ({"content": None, "reasoning": "Okay", "reasoning_content": "Okay"}, "reasoning"),        # 0.11.1 - 0.15
    ({"content": None, "reasoning": "Okay, the user wants"}, "reasoning"),                      # >= 0.16
])
def test_thinking_cut_off_by_max_tokens_is_healthy(msg, field) -> None:
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
def test_failures(status, payload, why) -> None:
    v = judge_completion(status, payload)
    assert not v.passed and why in v.why
