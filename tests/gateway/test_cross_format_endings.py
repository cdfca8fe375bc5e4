"""How a stream served across formats ends when it breaks, through the gateway with the real
SDKs: a model that streams a tool call whose arguments are not JSON (the simulator's
``broken_tool_args`` fault), an in-stream error or a cut after output. Each caller gets its
own format's error event last, and never the format's own end before it: no
``content_block_stop`` of the broken call, ``message_delta`` or ``message_stop`` on
``/v1/messages``; no ``finish_reason`` or ``[DONE]`` on chat; no ``function_call_arguments.done``,
``output_item.done`` or ``response.completed`` on the Responses API. A plain answer with
such arguments fails before output, so it is tried again and the caller gets a whole one."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.gateway.helpers import (
    CLAUDE_WEATHER_TOOL,
    WEATHER_TOOL,
    Running,
    data_of,
    running,
    scenario,
    spec,
    sse_frames,
    two_wires,
)
from tests.reliability.helpers import set_fault

pytestmark = pytest.mark.looptime

PARIS = [{"role": "user", "content": "Weather in Paris?"}]
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}  # type: ignore[index]


def gateway(first: str) -> Any:
    """flagship on the simulator's OpenAI wire and claude on its Anthropic wire, ``first`` first."""
    models = (first, *(m for m in ("flagship", "claude") if m != first))
    return running(two_wires(), models=models, anthropic=("claude",))


async def broken(gw: Running, model: str) -> None:
    await set_fault(gw.sim, mode="broken_tool_args", model=f"sim-{model}", count=1)


def names(text: str) -> list[str]:
    return [f.get("event", "") for f in sse_frames(text)]


def collapsed(sequence: list[str]) -> list[str]:
    """Runs of one name as one (how many deltas a call streams is the simulator's business)."""
    return [n for i, n in enumerate(sequence) if i == 0 or sequence[i - 1] != n]


# ---------------------------------------------------------------- /v1/messages served on OpenAI's wire


MESSAGES_BODY = {
    "model": "claude",
    "max_tokens": 100,
    "messages": PARIS,
    "tools": [CLAUDE_WEATHER_TOOL],
    "tool_choice": {"type": "any"},
}


async def test_a_messages_stream_whose_openai_model_breaks_a_tool_call_ends_with_the_error_event_only() -> None:
    async with gateway("claude") as gw, gw.anthropic() as sdk, gw.http() as http:
        gw.client.trip("claude")  # the OpenAI-wire flagship serves
        await broken(gw, "flagship")
        seen: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as failed:
            async for event in await sdk.messages.create(**MESSAGES_BODY, stream=True):  # type: ignore[call-overload]
                seen.append(event.type)
        await broken(gw, "flagship")
        raw = await http.post("/v1/messages", json={**MESSAGES_BODY, "stream": True})
    assert seen and seen[-1] == "content_block_delta"  # the call's pieces went out, then the SDK raised
    body = failed.value.body
    assert isinstance(body, dict) and "broken tool call" in body["error"]["message"]
    assert "get_weather" in body["error"]["message"]
    sent = names(raw.text)
    assert raw.status_code == 200 and raw.headers["x-capmon-api"] == "openai"
    assert collapsed(sent) == ["message_start", "content_block_start", "content_block_delta", "error"]
    last = data_of(sse_frames(raw.text))[-1]
    assert last["type"] == "error" and "get_weather" in last["error"]["message"]


@pytest.mark.parametrize(
    "fault",
    [
        {"mode": "stream_cut"},
        {"mode": "stream_error", "after": 2, "dialect": "openrouter-stream"},
    ],
    ids=["cut", "error-after-output"],
)
async def test_a_messages_stream_whose_openai_model_breaks_otherwise_ends_with_the_error_event_only(
    fault: dict[str, Any],
) -> None:
    async with gateway("claude") as gw, gw.http() as http:
        gw.client.trip("claude")
        await set_fault(gw.sim, **fault, model="sim-flagship", count=1)
        raw = await http.post("/v1/messages", json={**MESSAGES_BODY, "stream": True})
    sent = names(raw.text)
    assert collapsed(sent) == ["message_start", "content_block_start", "content_block_delta", "error"], sent


async def test_a_plain_messages_answer_with_a_broken_tool_call_is_tried_again_before_output() -> None:
    async with gateway("claude") as gw, gw.anthropic() as sdk:
        gw.client.trip("claude")
        await broken(gw, "flagship")
        raw = await sdk.messages.with_raw_response.create(**MESSAGES_BODY)  # type: ignore[call-overload]
        message = await raw.parse()
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and isinstance(use.input, dict) and use.input["city"]
    assert raw.headers["x-capmon-api"] == "openai" and raw.headers["x-capmon-attempts"] == "2"


# ---------------------------------------------------------------- chat and Responses served on Anthropic's wire


CHAT_BODY: dict[str, Any] = {"model": "flagship", "messages": PARIS, "tools": [WEATHER_TOOL], "tool_choice": "required"}
RESPONSES_BODY: dict[str, Any] = {
    "model": "flagship",
    "input": "Weather in Paris?",
    "tools": [RESPONSES_TOOL],
    "tool_choice": "required",
}


async def test_a_chat_stream_whose_anthropic_model_breaks_a_tool_call_ends_with_the_error_only() -> None:
    async with gateway("flagship") as gw, gw.openai() as sdk, gw.http() as http:
        gw.client.trip("flagship")  # the Anthropic-wire claude serves
        await broken(gw, "claude")
        chunks: list[Any] = []
        with pytest.raises(openai.APIError) as failed:
            async for c in await sdk.chat.completions.create(**CHAT_BODY, stream=True):
                chunks.append(c)
        await broken(gw, "claude")
        raw = await http.post("/v1/chat/completions", json={**CHAT_BODY, "stream": True})
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)  # the call's pieces went out
    assert not any(c.choices and c.choices[0].finish_reason for c in chunks)
    assert "broken tool call" in str(failed.value) and "get_weather" in str(failed.value)
    frames = sse_frames(raw.text)
    assert raw.status_code == 200 and raw.headers["x-capmon-api"] == "anthropic"
    assert "[DONE]" not in [f.get("data") for f in frames]
    data = data_of(frames)
    assert "error" in data[-1] and "get_weather" in data[-1]["error"]["message"]
    assert data[:-1] and all("error" not in d and d["choices"][0]["finish_reason"] is None for d in data[:-1])


async def test_a_responses_stream_whose_anthropic_model_breaks_a_tool_call_ends_failed_never_completed() -> None:
    async with gateway("flagship") as gw, gw.openai() as sdk, gw.http() as http:
        gw.client.trip("flagship")
        await broken(gw, "claude")
        events = [e async for e in await sdk.responses.create(**RESPONSES_BODY, stream=True)]
        await broken(gw, "claude")
        raw = await http.post("/v1/responses", json={**RESPONSES_BODY, "stream": True})
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    assert types[-1] == "response.failed" and "get_weather" in str(events[-1].response.error)  # type: ignore[union-attr]
    assert collapsed(names(raw.text)) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.failed",
    ]


async def test_plain_chat_and_responses_answers_with_a_broken_tool_call_are_tried_again_before_output() -> None:
    async with gateway("flagship") as gw, gw.openai() as sdk:
        gw.client.trip("flagship")
        await broken(gw, "claude")
        raw = await sdk.chat.completions.with_raw_response.create(**CHAT_BODY)
        await broken(gw, "claude")
        reply = await sdk.responses.with_raw_response.create(**RESPONSES_BODY)
    (call,) = raw.parse().choices[0].message.tool_calls or []
    assert isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
    assert raw.headers["x-capmon-api"] == "anthropic" and raw.headers["x-capmon-attempts"] == "2"
    (item,) = [o for o in reply.parse().output if o.type == "function_call"]
    assert isinstance(json.loads(item.arguments), dict)  # type: ignore[union-attr]
    assert reply.headers["x-capmon-attempts"] == "2"


# ---------------------------------------------------------------- the deadline, every direction


@pytest.mark.parametrize("caller", ["messages", "chat", "responses"])
async def test_a_stream_across_formats_past_its_deadline_after_output_ends_with_the_error_only(caller: str) -> None:
    # Each model streams a few tokens every 1.6 loop seconds: the deadline (2 s) passes mid-answer.
    slow = scenario(spec("flagship", per_token=0.4), spec("claude", api="anthropic", per_token=0.4))
    served, other = ("flagship", "claude") if caller == "messages" else ("claude", "flagship")
    path, body = {
        "messages": ("/v1/messages", {"model": other, "max_tokens": 100, "messages": PARIS}),
        "chat": ("/v1/chat/completions", {"model": other, "messages": PARIS}),
        "responses": ("/v1/responses", {"model": other, "input": "Weather in Paris?"}),
    }[caller]
    async with running(slow, models=(other, served), anthropic=("claude",)) as gw, gw.http() as http:
        gw.client.trip(other)
        raw = await http.post(path, json={**body, "stream": True}, headers={"x-capmon-deadline": "2"})
    assert raw.status_code == 200 and raw.headers["x-capmon-model"] == served
    frames = sse_frames(raw.text)
    if caller == "messages":
        assert collapsed(names(raw.text)) == ["message_start", "content_block_start", "content_block_delta", "error"]
    elif caller == "chat":
        data = data_of(frames)
        assert "[DONE]" not in [f.get("data") for f in frames] and "error" in data[-1]
        assert data[:-1] and all(d["choices"][0]["finish_reason"] is None for d in data[:-1])
    else:
        assert collapsed(names(raw.text)) == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.failed",
        ]
    assert "deadline" in json.dumps(data_of(frames)[-1])
