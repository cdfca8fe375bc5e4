"""The real openai SDK made by capmon.openai_client() / async_openai_client(): plain, streamed
and tool-calling answers, a fallback its raw response's headers show, and capmon's failure
raised as the SDK's own exception; all through the process's one engine, on the simulator the
engine embeds. The sync client runs the engine on its background thread (real time, a simulator
that answers in milliseconds); the async one on the test's own loop (looptime)."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

import capmon
from capmon.inprocess.home import RUNTIME
from tests.sdk.helpers import ANSWER_TOKENS, HELLO, WEATHER_TOOL, afill, config, fill


def test_sync_plain_streamed_tools_fallback_and_rate_limit(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("flagship",))
    built = RUNTIME.built
    sdk = capmon.openai_client(cfg)
    assert sdk.max_retries == 0 and str(sdk.base_url) == "http://capmon.invalid/v1/"

    raw = sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
    plain = raw.parse()
    h = raw.headers
    # flagship is at capacity: the request fell back at once to the next model, on Anthropic's wire
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-fallbacks"]) == ("claude", "anthropic", "1")
    assert h["x-capmon-requested-model"] == "auto" and h["x-request-id"].startswith("req_") and "date" in h
    assert plain.model == "sim-claude" and len((plain.choices[0].message.content or "").split()) == ANSWER_TOKENS

    chunks = list(sdk.chat.completions.create(model="medium", messages=HELLO, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == ANSWER_TOKENS and chunks[-1].choices[0].finish_reason == "stop"

    tools = sdk.chat.completions.create(
        model="medium",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
    )
    call = (tools.choices[0].message.tool_calls or [])[0]
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
    assert tools.choices[0].finish_reason == "tool_calls"

    fill(cfg, "claude", "medium")
    with pytest.raises(openai.RateLimitError) as info:
        sdk.chat.completions.create(model="auto", messages=HELLO, extra_headers={"x-capmon-deadline": "0.1"})
    r = info.value.response
    assert r.status_code == 429 and info.value.code == "model_at_capacity" and int(r.headers["retry-after"]) >= 1
    assert RUNTIME.built == built + 1
    snap = capmon.inprocess.engine().client.snapshot()  # type: ignore[union-attr]
    assert snap.requests == 4 and snap.in_flight == 0


@pytest.mark.looptime
async def test_async_plain_streamed_tools_fallback_and_rate_limit(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("flagship",))
    built = RUNTIME.built
    sdk = capmon.async_openai_client(cfg)
    raw = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
    assert (raw.headers["x-capmon-model"], raw.headers["x-capmon-fallbacks"]) == ("claude", "1")
    assert len((raw.parse().choices[0].message.content or "").split()) == ANSWER_TOKENS

    stream = await sdk.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert calls and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert json.loads("".join(d.function.arguments or "" for d in calls if d.function is not None))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

    # a stream the caller leaves early: the engine hears it, and the attempt's slot is given back
    early = await sdk.chat.completions.create(model="medium", messages=HELLO, stream=True)
    async for _ in early:
        break
    await early.close()

    await afill(cfg, "claude", "medium")
    with pytest.raises(openai.RateLimitError) as info:
        await sdk.chat.completions.create(model="auto", messages=HELLO, extra_headers={"x-capmon-deadline": "2"})
    assert info.value.code == "model_at_capacity"
    engine = capmon.inprocess.engine()
    assert engine is not None and RUNTIME.built == built + 1 and engine.client.snapshot().in_flight == 0
