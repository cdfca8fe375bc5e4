"""The real openai SDK against the gateway on the simulator: chat (async and sync),
streams with tool calls and usage, the Responses API plain and streamed, the model
list, and a fallback when the flagship is out, each answer saying who served it."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.gateway.helpers import HELLO, WEATHER_TOOL, running


@pytest.mark.looptime
async def test_chat_async_names_who_served_it() -> None:
    async with running() as gw, gw.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, max_tokens=8, seed=7, user="u-1"
        )
        reply = raw.parse()
        snap = gw.client.snapshot()
    assert reply.model == "sim-flagship" and reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].message.content.split()) == 8
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    h = raw.headers
    assert (h["x-capmon-model"], h["x-capmon-endpoint"], h["x-capmon-attempts"], h["x-capmon-fallbacks"]) == (
        "flagship",
        "sim",
        "1",
        "0",
    )
    assert h["x-litellm-model-id"] == "flagship@sim/sim-key" and h["x-litellm-attempted-fallbacks"] == "0"
    assert h["x-capmon-request-id"] == "1" and h["x-capmon-priority"] == "interactive"
    assert snap.succeeded == 1 and snap.in_flight == 0


@pytest.mark.looptime
async def test_a_named_model_is_tried_first_and_an_alias_resolves() -> None:
    async with running(gateway='aliases = { "gpt-5" = "medium", "fast" = "auto" }') as gw, gw.openai() as sdk:
        small = await sdk.chat.completions.with_raw_response.create(model="small", messages=HELLO)
        alias = await sdk.chat.completions.with_raw_response.create(model="gpt-5", messages=HELLO)
        auto = await sdk.chat.completions.with_raw_response.create(model="fast", messages=HELLO)
        models = [m async for m in sdk.models.list()]
        one = await sdk.models.retrieve("gpt-5")
    assert small.headers["x-capmon-model"] == "small" and small.parse().model == "sim-small"
    assert alias.headers["x-capmon-model"] == "medium"
    assert auto.headers["x-capmon-model"] == "flagship"
    assert [m.id for m in models] == ["flagship", "medium", "small", "auto", "gpt-5", "fast"]
    assert [getattr(m, "capmon_alias_of", "-") for m in models] == ["-", "-", "-", None, "medium", None]
    assert one.id == "gpt-5"


def test_chat_sync() -> None:
    """The synchronous SDK, from a thread, against the gateway in this test's loop (real time)."""

    async def main() -> None:
        async with running() as gw:

            def call() -> tuple[str, str]:
                with openai.OpenAI(base_url=gw.base_url, api_key="sk-anything", max_retries=0) as sdk:
                    raw = sdk.chat.completions.with_raw_response.create(model="medium", messages=HELLO, max_tokens=5)
                    text = raw.parse().choices[0].message.content or ""
                    chunks = sdk.chat.completions.create(model="auto", messages=HELLO, stream=True)
                    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    return raw.headers["x-capmon-model"] + ": " + text, streamed

            plain, streamed = await asyncio.to_thread(call)
        assert plain.startswith("medium: ") and len(plain.split()) == 6
        assert len(streamed.split()) == 12

    asyncio.run(main())


@pytest.mark.looptime
async def test_streaming_passes_tool_calls_and_usage_through() -> None:
    async with running() as gw, gw.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in raw.parse()]
        stream = await sdk.chat.completions.create(
            model="auto", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        text, usage, finish = [], None, None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    assert raw.headers["x-capmon-model"] == "flagship"
    assert raw.headers["content-type"].startswith("text/event-stream")
    calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function is not None and calls[0].function.name == "get_weather"
    args = "".join(d.function.arguments or "" for d in calls if d.function is not None)
    assert isinstance(json.loads(args), dict)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    assert len("".join(text).split()) == 12 and finish == "stop" and usage is not None and usage.total_tokens > 12


@pytest.mark.looptime
async def test_the_responses_api_plain_and_streamed() -> None:
    async with running() as gw, gw.openai() as sdk:
        raw = await sdk.responses.with_raw_response.create(
            model="auto", input="Say hello", instructions="Be brief.", metadata={"trace": "t-1"}
        )
        plain = raw.parse()
        events = [e async for e in await sdk.responses.create(model="medium", input="Say hello", stream=True)]
    assert raw.headers["x-capmon-model"] == "flagship" and plain.status == "completed"
    assert plain.instructions == "Be brief."  # the fields the client sent reach the provider
    assert len(plain.output_text.split()) == 12
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert len(text.split()) == 12 and events[-1].response.model == "sim-medium"


@pytest.mark.looptime
async def test_a_fallback_when_the_flagship_is_out() -> None:
    async with running() as gw, gw.openai() as sdk:
        await gw.sim_admin("outage/sim-flagship", {"duration": 60})
        raw = await sdk.chat.completions.with_raw_response.create(model="flagship", messages=HELLO)
        async with sdk.chat.completions.with_streaming_response.create(
            model="flagship", messages=HELLO, stream=True
        ) as streamed:
            stream_headers = streamed.headers
            body = "".join([line async for line in streamed.iter_lines()])
        responses = await sdk.responses.with_raw_response.create(model="flagship", input="hi")
    h = raw.headers
    assert raw.parse().model == "sim-medium"
    assert (h["x-capmon-model"], h["x-capmon-attempts"], h["x-capmon-fallbacks"]) == ("medium", "2", "1")
    assert h["x-litellm-attempted-fallbacks"] == "1"
    # the stream fell back before its first byte: its headers name the model that serves it
    assert stream_headers["x-capmon-model"] == "medium" and "sim-flagship" not in body and "[DONE]" in body
    assert responses.headers["x-capmon-model"] == "medium" and responses.parse().model == "sim-medium"
