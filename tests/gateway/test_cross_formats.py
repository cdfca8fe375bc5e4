"""Fallback across formats through the gateway, with the real SDKs: the anthropic SDK served
by an OpenAI-wire model when its Anthropic-wire model is tripped, and the openai SDK (chat
and Responses) served by an Anthropic-wire model when the OpenAI-wire flagship is tripped:
text, streamed text and a tool round trip (call -> result -> answer), every answer in the
caller's format and its headers naming the API that served. Anthropic's in-stream overload
after output reaches each client as its own error event, never as a completed answer. An
Azure model's key shows in no log, metric, snapshot or answer."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import httpx
import openai
import pytest

from capmon.core.routing.client import FallbackClient
from capmon.gateway import close_app, create_app, load_settings, start_server
from tests.gateway.helpers import (
    CLAUDE_WEATHER_TOOL,
    WEATHER_TOOL,
    data_of,
    running,
    scenario,
    spec,
    sse_frames,
    two_wires,
)
from tests.reliability.helpers import set_fault
from tests.support.configs import on_azure
from tests.support.simulated import StartSim

pytestmark = pytest.mark.looptime

PARIS = [{"role": "user", "content": "Weather in Paris?"}]
HI = [{"role": "user", "content": "Say something about capacity."}]


def providers(first: str) -> dict[str, Any]:
    """flagship on the simulator's OpenAI wire and claude on its Anthropic wire, ``first`` first."""
    models = (first, *(m for m in ("flagship", "claude") if m != first))
    return {"models": models, "anthropic": ("claude",)}


async def test_the_anthropic_sdk_is_served_by_the_openai_model_when_its_anthropic_model_is_tripped() -> None:
    async with running(two_wires(), **providers("claude")) as gw, gw.anthropic() as sdk:
        gw.client.trip("claude")
        raw = await sdk.messages.with_raw_response.create(
            model="claude", max_tokens=100, system="Be brief.", messages=HI
        )
        plain = await raw.parse()
        async with sdk.messages.stream(model="claude", max_tokens=100, messages=HI) as stream:
            texts = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        tools: Any = [CLAUDE_WEATHER_TOOL]
        called = await sdk.messages.create(
            model="claude", max_tokens=100, messages=PARIS, tools=tools, tool_choice={"type": "any"}
        )
        (use,) = [b for b in called.content if b.type == "tool_use"]
        answered = await sdk.messages.create(
            model="claude",
            max_tokens=100,
            tools=tools,
            messages=[
                *PARIS,
                {"role": "assistant", "content": [b.model_dump() for b in called.content]},  # type: ignore[misc]
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C, sunny"}]},
            ],
        )
    assert (raw.headers["x-capmon-model"], raw.headers["x-capmon-api"]) == ("flagship", "openai")
    assert plain.type == "message" and plain.stop_reason == "end_turn" and len(plain.content[0].text.split()) == 12  # type: ignore[union-attr]
    assert plain.usage.output_tokens == 12 and plain.usage.input_tokens > 0
    assert len("".join(texts).split()) == 12 and final.stop_reason == "end_turn" and final.usage.output_tokens == 12
    assert called.stop_reason == "tool_use" and use.name == "get_weather" and use.input["city"]  # type: ignore[index]
    assert answered.stop_reason == "end_turn" and answered.content[0].type == "text"


async def test_the_openai_sdk_is_served_by_the_anthropic_model_when_the_flagship_is_tripped() -> None:
    async with running(two_wires(), **providers("flagship")) as gw, gw.openai() as sdk:
        gw.client.trip("flagship")
        raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HI, temperature=0.2)
        chat = raw.parse()
        chunks = [
            c
            async for c in await sdk.chat.completions.create(
                model="flagship", messages=HI, stream=True, stream_options={"include_usage": True}
            )
        ]
        called = await sdk.chat.completions.create(
            model="flagship",
            messages=PARIS,
            tools=[WEATHER_TOOL],
            tool_choice="required",  # type: ignore[list-item]
        )
        (call,) = called.choices[0].message.tool_calls or []
        answered = await sdk.chat.completions.create(
            model="flagship",
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            messages=[
                *PARIS,
                called.choices[0].message.model_dump(exclude_none=True),  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"},
            ],
        )
        reply = await sdk.responses.with_raw_response.create(model="flagship", input="Say hello")
        response = reply.parse()
        events = [e async for e in await sdk.responses.create(model="flagship", input="Say hello", stream=True)]
        r_called = await sdk.responses.create(
            model="flagship",
            input="Weather in Paris?",
            tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL["function"]["parameters"]}],  # type: ignore[index,list-item]
            tool_choice="required",
        )
        (r_call,) = [o for o in r_called.output if o.type == "function_call"]
        r_answered = await sdk.responses.create(
            model="flagship",
            input=[
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "type": "function_call",
                    "call_id": r_call.call_id,
                    "name": r_call.name,
                    "arguments": r_call.arguments,
                },
                {"type": "function_call_output", "call_id": r_call.call_id, "output": "18C, sunny"},
            ],
        )
    # served by claude on Anthropic's wire; 2026-10-21 refuses temperature: left out, and the reply says so
    assert (raw.headers["x-capmon-model"], raw.headers["x-capmon-api"]) == ("claude", "anthropic")
    assert raw.headers["x-capmon-dropped"] == "temperature"
    assert chat.object == "chat.completion" and chat.choices[0].finish_reason == "stop"
    assert len((chat.choices[0].message.content or "").split()) == 12
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 12 and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert called.choices[0].finish_reason == "tool_calls" and json.loads(call.function.arguments)["city"]  # type: ignore[union-attr]
    assert call.id.startswith("toolu_") and answered.choices[0].message.content  # ids kept both ways
    assert reply.headers["x-capmon-api"] == "anthropic" and "x-capmon-dropped" not in reply.headers
    assert response.status == "completed" and len(response.output_text.split()) == 12
    assert events[-1].type == "response.completed" and len(events[-1].response.output_text.split()) == 12  # type: ignore[union-attr]
    assert json.loads(r_call.arguments)["city"] and r_answered.output_text  # type: ignore[union-attr]


async def test_anthropics_in_stream_overload_after_output_is_each_clients_own_error_event() -> None:
    async with (
        running(two_wires(), **providers("claude")) as gw,
        gw.anthropic() as claude_sdk,
        gw.openai() as openai_sdk,
    ):
        out = {"x-capmon-continue": "false"}  # opted out: the break ends each stream (see test_continuation.py)
        after = {"mode": "stream_error", "model": "sim-claude", "after": 2, "dialect": "anthropic-stream", "count": 1}
        await set_fault(gw.sim, **after)
        got: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as broken:
            async for e in await claude_sdk.messages.create(
                model="claude", max_tokens=100, messages=HI, stream=True, extra_headers=out
            ):
                got.append(e.type)
        gw.client.reset("claude")  # capacity failures open its breaker: each case starts afresh
        await set_fault(gw.sim, **after)
        async with gw.http() as http:
            raw = await http.post(
                "/v1/messages",
                headers=out,
                json={"model": "claude", "max_tokens": 100, "messages": HI, "stream": True},
            )
        gw.client.reset("claude")
        await set_fault(gw.sim, **after)
        chunks: list[Any] = []
        with pytest.raises(openai.APIError) as chat_broken:
            async for c in await openai_sdk.chat.completions.create(
                model="claude", messages=HI, stream=True, extra_headers=out
            ):
                chunks.append(c)
        gw.client.reset("claude")
        await set_fault(gw.sim, **after)
        events = [
            e.type
            async for e in await openai_sdk.responses.create(model="claude", input="hi", stream=True, extra_headers=out)
        ]
    assert "content_block_delta" in got and "message_stop" not in got  # output went out, then the SDK raised
    body = broken.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error"
    assert "incomplete" in body["error"]["message"]
    frames = sse_frames(raw.text)
    assert raw.status_code == 200 and frames[-1]["event"] == "error"
    assert "message_stop" not in [f.get("event") for f in frames]
    last = data_of(frames)[-1]
    assert last["type"] == "error" and last["error"]["type"] == "overloaded_error"
    assert chunks and "incomplete" in str(chat_broken.value)
    assert not any(c.choices and c.choices[0].finish_reason for c in chunks)
    assert events[-1] == "response.failed" and "response.completed" not in events


async def test_an_azure_models_key_shows_in_no_log_metric_snapshot_or_answer(
    caplog: pytest.LogCaptureFixture, start_sim: StartSim
) -> None:
    caplog.set_level(logging.DEBUG)
    azure_key = "7e6d5c4b3a2918f7e6d5c4b3a2918f70"  # 32 hex digits, as Azure's keys are
    env = {"AZ": azure_key}
    sim_handle = await start_sim(scenario(spec("gpt-az", api="azure"), keys=(azure_key,)))
    cfg = on_azure(sim_handle.origin, api_version="2024-10-21")
    async with FallbackClient(cfg, environ=env) as client:
        app = create_app(client, load_settings(cfg, listen="127.0.0.1:0", environ=env))
        server = await start_server(app, "127.0.0.1", 0)
        try:
            headers = {"content-type": "application/json"}
            async with httpx.AsyncClient(base_url=server.origin, headers=headers, trust_env=False) as http:
                chat = await http.post("/v1/chat/completions", json={"model": "gpt", "messages": HI})
                streamed = await http.post(
                    "/v1/chat/completions", json={"model": "gpt", "messages": HI, "stream": True}
                )
                messages = await http.post("/v1/messages", json={"model": "gpt", "max_tokens": 20, "messages": HI})
                seen = [chat, streamed, messages, await http.get("/metrics"), await http.get("/capmon/snapshot")]
        finally:
            close_app(app)
            await server.stop()
    assert chat.status_code == streamed.status_code == messages.status_code == 200
    assert chat.headers["x-capmon-api"] == "azure" and messages.json()["type"] == "message"
    assert len(data_of(sse_frames(streamed.text))) > 2 and "capmon_" in seen[3].text
    for r in seen:
        assert r.status_code == 200 and azure_key not in r.text and azure_key not in str(r.headers), r.request.url
    assert azure_key not in caplog.text
