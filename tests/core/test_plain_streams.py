"""A streaming request answered with a plain JSON 200 (an OpenAI-compatible server that ignores
``stream: true``, as the scripted upstream does): the answer is read whole and told to the caller
as its stream's events, in the caller's format, not waited on until the stream's end that never
comes. A plain error body to a stream request stays classified."""

from __future__ import annotations

import json

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.result import Decision
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def tool_answer(model: str) -> Reply:
    reply = ok(model)
    reply.body["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    reply.body["choices"][0]["finish_reason"] = "tool_calls"
    return reply


async def test_a_plain_answer_to_a_stream_is_the_streams_whole_answer() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_chunks("hi", stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert script.served() == 1 and script.seen[0].body["stream"] is True
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert "".join(c["delta"].get("content") or "" for c in choices) == "hello"
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 7  # include_usage honoured
    assert stream.result is not None and stream.result.content == "hello"
    assert stream.result.usage["total_tokens"] == 7 and stream.model == "flagship"
    assert [a.decision for a in stream.result.attempts] == [Decision.OK]


async def test_usage_is_left_out_when_not_asked() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        chunks = [c async for c in client.stream_chunks("hi")]
    assert all(c["choices"] for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_a_plain_tool_call_to_a_stream_is_told_as_its_call() -> None:
    script = Script()
    script.always("flagship", tool_answer("flagship"))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_chunks("weather?")
        chunks = [c async for c in stream]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls = [d for delta in deltas for d in delta.get("tool_calls") or []]
    assert [d["function"]["name"] for d in calls if d["function"].get("name")] == ["get_weather"]
    assert calls[0]["id"] == "call_1"
    assert "".join(d["function"].get("arguments") or "" for d in calls) == CALL["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert stream.result is not None and stream.result.tool_calls == [CALL]


async def test_a_plain_chat_answer_to_a_messages_stream_is_told_as_messages_events() -> None:
    script = Script()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_messages(body)
        events = [e async for e in stream]
    kinds = [e["type"] for e in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2]["delta"] == {"type": "text_delta", "text": "hello"}
    assert events[4]["delta"]["stop_reason"] == "end_turn" and events[4]["usage"]["output_tokens"] == 2
    assert stream.result is not None and stream.result.response["type"] == "message"
    assert stream.result.content == "hello"


async def test_a_plain_responses_answer_to_a_responses_stream_is_told_as_its_events() -> None:
    answer = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "flagship",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "hello there", "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
    }
    script = Script()
    script.always("flagship", Reply(200, answer))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_responses({"input": "hi"})
        events = [e async for e in stream]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "hello there"
    assert events[-1]["response"]["usage"]["output_tokens"] == 2
    assert stream.result is not None and stream.result.content == "hello there"


async def test_a_plain_error_to_a_stream_is_still_classified_and_falls_back() -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_chunks("hi")
        chunks = [c async for c in stream]
    assert stream.model == "medium" and script.served("flagship") == 1
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hello"


async def test_a_plain_200_that_is_no_answer_is_classified() -> None:
    script = Script()
    script.set("flagship", lambda n, body: Reply(200, json.dumps({"nothing": 1}), {"content-type": "application/json"}))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        stream = client.stream_chunks("hi")
        chunks = [c async for c in stream]
    assert chunks and stream.result is not None and stream.result.content == "hello"
    assert stream.result.attempts[0].decision is not Decision.OK
