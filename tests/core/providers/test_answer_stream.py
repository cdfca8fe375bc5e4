"""A whole answer told as its format's stream (a plain answer to a stream request): the stream's
own assembler puts the same answer back together."""

from __future__ import annotations

from typing import Any

import pytest

from capmon.core.providers.hub import FORMATS
from capmon.core.types.result import Format

CHAT = {
    "id": "c1",
    "object": "chat.completion",
    "created": 7,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "on it",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}
MESSAGES = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "text", "text": "on it"},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 2},
}
RESPONSES = {
    "id": "resp_1",
    "object": "response",
    "created_at": 7,
    "model": "m",
    "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "on it", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "f",
            "arguments": '{"a": 1}',
            "status": "completed",
        },
    ],
    "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
}


GEMINI = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [
                    {"text": "hmm", "thought": True},
                    {"text": "on it"},
                    {"functionCall": {"id": "call_1", "name": "f", "args": {"a": 1}}},
                ],
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "totalTokenCount": 7},
    "modelVersion": "m",
    "responseId": "r1",
}


def assembled(fmt: Format, events: list[dict[str, Any]]) -> Any:
    whole = FORMATS[fmt].assembler()
    for i, e in enumerate(events):
        whole.add(e, fmt is not Format.CHAT and i == len(events) - 1)
    return whole.answer()


@pytest.mark.parametrize(
    "fmt,answer",
    [(Format.CHAT, CHAT), (Format.MESSAGES, MESSAGES), (Format.RESPONSES, RESPONSES), (Format.GEMINI, GEMINI)],
)
def test_a_whole_answer_told_as_a_stream_assembles_back(fmt: Format, answer: dict[str, Any]) -> None:
    module = FORMATS[fmt]
    events = module.answer_stream(answer, created=7, include_usage=True)
    back = assembled(fmt, events)
    assert back is not None
    assert module.text(back) == module.text(answer) == "on it"
    assert list(module.tool_calls(back)) == list(module.tool_calls(answer))
    assert module.used_tokens(back) == module.used_tokens(answer)
    if fmt is Format.MESSAGES:
        assert back["content"][0] == MESSAGES["content"][0]  # thinking and its signature
        assert back["stop_reason"] == "tool_use"
    if fmt is Format.RESPONSES:
        assert events[-1]["response"] == RESPONSES and [e["sequence_number"] for e in events] == list(
            range(len(events))
        )
    if fmt is Format.CHAT:
        assert back["choices"][0]["finish_reason"] == "tool_calls"
    if fmt is Format.GEMINI:
        assert back == GEMINI and [bool(e["candidates"][0].get("finishReason")) for e in events][-1]


def test_a_chat_refusal_is_told_as_a_refusal() -> None:
    refused = {
        **CHAT,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None, "refusal": "no"}, "finish_reason": "stop"}
        ],
    }
    events = FORMATS[Format.CHAT].answer_stream(refused, created=7, include_usage=False)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert {"refusal": "no"} in deltas and not any(d.get("content") for d in deltas)
