"""The real anthropic SDK (2.x) against the gateway's Anthropic API on the simulator, in both
header styles: SDK 2.x as it is (``anthropic-version: 2026-10-21``, ``Authorization: Bearer``)
and the previous major's (``2023-06-01``, ``x-api-key``). messages.create plain and streamed
(text; a tool use with input_json_delta; usage; stop reason), count_tokens, and the gateway's
errors as the SDK's typed exceptions; a 2023-06-01 client's sampling fields for a 2026-10-21
target follow ``[client] refused_sampling``, and the reply says which were left out."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.gateway.helpers import CLAUDE_WEATHER_TOOL, HEADER_STYLES, running, scenario, spec

pytestmark = pytest.mark.looptime

CLIENT = "sk-gw-client-anthropic-5c4b3a29"
KEYS = 'keys = [{ env = "GW_CLIENT", alias = "team" }]'
ENVIRON = {"GW_CLIENT": CLIENT}
HI = [{"role": "user", "content": "Say something about capacity."}]
# claude on the simulator's Anthropic wire (2026-10-21), then flagship on its OpenAI wire
TWO = {"models": ("claude", "flagship"), "anthropic": ("claude",), "gateway": KEYS, "environ": ENVIRON}


def two_providers(**kw: Any) -> Any:
    return scenario(spec("claude", api="anthropic", **kw), spec("flagship", **kw))


@pytest.mark.parametrize("style", HEADER_STYLES)
async def test_messages_create_plain_and_streamed_with_usage_and_stop_reason(style: str) -> None:
    async with running(two_providers(), **TWO) as gw, gw.anthropic(CLIENT, style=style) as sdk:
        raw = await sdk.messages.with_raw_response.create(
            model="auto", max_tokens=100, system="Be brief.", messages=HI, metadata={"user_id": "u-1"}
        )
        plain = await raw.parse()
        async with sdk.messages.stream(model="claude", max_tokens=5, messages=HI) as stream:
            texts = [t async for t in stream.text_stream]
            final = await stream.get_final_message()
        counted = await sdk.messages.count_tokens(model="auto", system="Be brief.", messages=HI)
    assert plain.type == "message" and plain.role == "assistant" and plain.model == "sim-claude"
    assert plain.stop_reason == "end_turn" and len(plain.content[0].text.split()) == 12  # type: ignore[union-attr]
    assert plain.usage.output_tokens == 12
    assert plain.usage.input_tokens == counted.input_tokens > 0  # the project's one estimate, both sides
    h = raw.headers
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-endpoint"], h["x-capmon-fallbacks"]) == (
        "claude",
        "anthropic",
        "anthropic",
        "0",
    )
    assert h["x-capmon-attempts"] == "1" and "x-capmon-dropped" not in h
    assert plain._request_id == h["x-request-id"] and h["request-id"] == h["x-request-id"]
    assert len("".join(texts).split()) == 5 and final.stop_reason == "max_tokens" and final.usage.output_tokens == 5


@pytest.mark.parametrize("style", HEADER_STYLES)
async def test_a_streamed_tool_use_comes_as_input_json_deltas(style: str) -> None:
    async with running(two_providers(), **TWO) as gw, gw.anthropic(CLIENT, style=style) as sdk:
        events = [
            e
            async for e in await sdk.messages.create(
                model="claude",
                max_tokens=100,
                messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[CLAUDE_WEATHER_TOOL],  # type: ignore[list-item]
                tool_choice={"type": "any"},
                stream=True,
            )
        ]
        plain = await sdk.messages.create(
            model="claude",
            max_tokens=100,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[CLAUDE_WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice={"type": "tool", "name": "get_weather"},
        )
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    tool = next(b for b in starts if b.type == "tool_use")
    assert tool.name == "get_weather" and tool.id.startswith("toolu_")
    pieces = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(pieces) > 1 and json.loads("".join(pieces))["city"]  # arguments arrive in pieces
    (delta,) = [e for e in events if e.type == "message_delta"]
    assert delta.delta.stop_reason == "tool_use" and delta.usage.output_tokens > 0
    (block,) = [b for b in plain.content if b.type == "tool_use"]
    assert plain.stop_reason == "tool_use" and block.input["city"]  # type: ignore[index]


async def test_every_model_at_capacity_until_the_deadline_is_anthropics_529_overloaded() -> None:
    full = scenario(spec("claude", slots=0, api="anthropic"), spec("flagship", slots=0))
    async with running(full, **TWO) as gw:
        for style in HEADER_STYLES:
            async with gw.anthropic(CLIENT, style=style) as sdk:
                with pytest.raises(anthropic.OverloadedError) as info:
                    await sdk.messages.create(
                        model="auto", max_tokens=10, messages=HI, extra_headers={"x-capmon-deadline": "2"}
                    )
                with pytest.raises(anthropic.OverloadedError) as streamed:
                    await sdk.messages.create(
                        model="claude",
                        max_tokens=10,
                        messages=HI,
                        stream=True,
                        extra_headers={"x-capmon-deadline": "2"},
                    )
            r = info.value.response
            assert r.status_code == 529 and int(r.headers["retry-after"]) >= 1
            assert info.value.body == {
                "type": "error",
                "error": {"type": "overloaded_error", "message": r.json()["error"]["message"]},
            }
            assert "within its deadline" in r.json()["error"]["message"]
            # every model was tried before the deadline passed (then their breakers are open)
            assert int(r.headers["x-capmon-attempts"]) >= (2 if style == HEADER_STYLES[0] else 0)
            # a stream that never started is a plain error, not an event stream
            assert streamed.value.response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("style", HEADER_STYLES)
async def test_every_model_rate_limited_is_a_429_with_the_providers_retry_after(style: str) -> None:
    limited = scenario(spec("claude", slots=0, api="anthropic", dialect="anthropic-429", hint=7.0))
    running_one = running(limited, models=("claude",), anthropic=("claude",), gateway=KEYS, environ=ENVIRON)
    async with running_one as gw, gw.anthropic(CLIENT, style=style) as sdk:
        with pytest.raises(anthropic.RateLimitError) as info:
            await sdk.messages.create(
                model="claude", max_tokens=10, messages=HI, extra_headers={"x-capmon-deadline": "3"}
            )
    r = info.value.response
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["type"] == "rate_limit_error" and "rate-limited" in r.json()["error"]["message"]


@pytest.mark.parametrize("style", HEADER_STYLES)
async def test_the_gateways_refusals_are_the_sdks_typed_exceptions(style: str) -> None:
    async with running(two_providers(), **TWO) as gw:
        async with gw.anthropic("sk-not-a-key-of-this-gateway", style=style) as wrong:
            with pytest.raises(anthropic.AuthenticationError) as unauthorized:
                await wrong.messages.create(model="auto", max_tokens=10, messages=HI)
            with pytest.raises(anthropic.AuthenticationError):
                await wrong.messages.count_tokens(model="auto", messages=HI)
        async with gw.anthropic(CLIENT, style=style) as sdk:
            with pytest.raises(anthropic.NotFoundError) as unknown:
                await sdk.messages.create(model="claude-opus-9", max_tokens=10, messages=HI)
            with pytest.raises(anthropic.BadRequestError) as zero:
                await sdk.messages.create(model="auto", max_tokens=0, messages=HI)
            with pytest.raises(anthropic.BadRequestError) as role:
                await sdk.messages.create(
                    model="auto",
                    max_tokens=10,
                    messages=[{"role": "tool", "content": "hi"}],  # type: ignore[list-item]
                )
            with pytest.raises(anthropic.BadRequestError) as missing:
                await sdk.messages.create(model="auto", max_tokens=10, messages=HI, extra_body={"max_tokens": None})
    for err, kind, words in (
        (unauthorized, "authentication_error", "API key"),
        (unknown, "not_found_error", "claude-opus-9"),
        (zero, "invalid_request_error", "max_tokens"),
        (role, "invalid_request_error", "messages[0].role"),
        (missing, "invalid_request_error", "max_tokens: Field required"),
    ):
        body = err.value.body
        assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == kind, body
        assert words in body["error"]["message"]


@pytest.mark.parametrize(
    ("rule", "model", "api", "dropped"),
    [("drop", "claude", "anthropic", "temperature,top_p"), ("skip", "flagship", "openai", None)],
)
async def test_a_2023_client_sending_sampling_fields_to_a_2026_target_follows_refused_sampling(
    rule: str, model: str, api: str, dropped: str | None
) -> None:
    extra = f'[client]\nrefused_sampling = "{rule}"'
    async with running(two_providers(), **TWO, extra=extra) as gw, gw.anthropic(CLIENT, style="2023-06-01") as sdk:
        sampled = {"temperature": 0.5, "top_p": 0.9}
        raw = await sdk.messages.with_raw_response.create(model="auto", max_tokens=10, messages=HI, extra_body=sampled)
        streamed = await sdk.messages.with_raw_response.create(
            model="auto", max_tokens=10, messages=HI, extra_body=sampled, stream=True
        )
        events = [e.type async for e in await streamed.parse()]
        snap = gw.client.snapshot()
    for h in (raw.headers, streamed.headers):
        assert (h["x-capmon-model"], h["x-capmon-api"], h.get("x-capmon-dropped")) == (model, api, dropped)
    answer = await raw.parse()
    assert answer.stop_reason == "max_tokens" and events[-1] == "message_stop"
    assert snap.succeeded == 2


@pytest.mark.parametrize("style", HEADER_STYLES)
async def test_a_hanging_upstream_past_the_deadline_is_a_504_timeout_error(style: str) -> None:
    hang = "[client]\nattempt_timeout = 5.0\nmax_attempts = 50"
    async with running(two_providers(), **TWO, extra=hang) as gw, gw.anthropic(CLIENT, style=style) as sdk:
        await gw.sim_admin("faults", {"mode": "hang", "rate": 1.0})
        with pytest.raises(anthropic.InternalServerError) as info:
            await sdk.messages.create(
                model="claude", max_tokens=10, messages=HI, extra_headers={"x-capmon-deadline": "2"}
            )
    r = info.value.response
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert "the request's own deadline of 2s passed" in r.json()["error"]["message"]
