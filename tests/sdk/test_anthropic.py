"""The real anthropic SDK made by capmon.anthropic_client() / async_anthropic_client(): plain,
streamed and tool-use answers, a fallback to a model on the OpenAI wire that the raw
response's headers show (translated back into Anthropic's shapes), and every model at capacity
raised as the SDK's own ``OverloadedError`` (529)."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

import capmon
from capmon.inprocess.home import RUNTIME
from tests.sdk.helpers import ANSWER_TOKENS, CLAUDE_WEATHER_TOOL, HELLO, afill, config, fill


def test_sync_plain_streamed_tools_fallback_and_overloaded(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("claude",))
    built = RUNTIME.built
    sdk = capmon.anthropic_client(cfg)
    assert sdk.max_retries == 0

    raw = sdk.messages.with_raw_response.create(model="claude", max_tokens=64, messages=HELLO)
    plain = raw.parse()
    h = raw.headers
    # claude is at capacity: served by the next model, on the OpenAI wire, answered in Anthropic's shape
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-fallbacks"]) == ("flagship", "openai", "1")
    assert h["request-id"] == h["x-request-id"] and plain._request_id == h["request-id"]
    assert plain.type == "message" and plain.stop_reason == "end_turn"
    assert len(plain.content[0].text.split()) == ANSWER_TOKENS  # type: ignore[union-attr]

    with sdk.messages.stream(model="medium", max_tokens=64, messages=HELLO) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len("".join(texts).split()) == ANSWER_TOKENS and final.usage.output_tokens == ANSWER_TOKENS

    tool = sdk.messages.create(
        model="medium",
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[CLAUDE_WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    use = [b for b in tool.content if b.type == "tool_use"]
    assert tool.stop_reason == "tool_use" and use and use[0].name == "get_weather" and isinstance(use[0].input, dict)

    fill(cfg, "flagship", "medium")
    with pytest.raises(anthropic.OverloadedError) as info:
        sdk.messages.create(model="auto", max_tokens=64, messages=HELLO, extra_headers={"x-capmon-deadline": "0.1"})
    assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert RUNTIME.built == built + 1


@pytest.mark.looptime
async def test_async_plain_streamed_tools_fallback_and_overloaded(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("claude",))
    built = RUNTIME.built
    sdk = capmon.async_anthropic_client(cfg)
    raw = await sdk.messages.with_raw_response.create(model="claude", max_tokens=64, messages=HELLO)
    assert (raw.headers["x-capmon-model"], raw.headers["x-capmon-fallbacks"]) == ("flagship", "1")
    assert (await raw.parse()).stop_reason == "end_turn"

    async with sdk.messages.stream(
        model="medium",
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[CLAUDE_WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    ) as stream:
        events = [e.type async for e in stream]
        final = await stream.get_final_message()
    assert "content_block_delta" in events and events[-1] == "message_stop"
    use = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use and isinstance(use[0].input, dict) and use[0].input

    await afill(cfg, "flagship", "medium")
    with pytest.raises(anthropic.OverloadedError):
        await sdk.messages.create(model="auto", max_tokens=64, messages=HELLO, extra_headers={"x-capmon-deadline": "2"})
    assert RUNTIME.built == built + 1
