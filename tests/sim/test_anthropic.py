"""The official anthropic SDK (2.x: anthropic-version 2026-10-21, key as Bearer) talks to the
simulator's Messages API over loopback, and so does the same SDK set up the way older ones
send (2023-06-01, x-api-key): answers, streams, tool use, count_tokens, and each error as
the SDK's own exception."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import httpx
import pytest

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.faults import parse_rules
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import frames

SCENARIO = Scenario(
    name="anthropic",
    max_request_bytes=64_000,
    models=(
        ModelSpec(
            name="sim-claude",
            api="anthropic",
            slots=4,
            base_latency=0.001,
            per_token=0.0,
            noise=0.0,
            answer_tokens=12,
            context_window=2000,
        ),
        ModelSpec(name="sim-gpt", slots=4, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=5),
    ),
)
HELLO: Any = [{"role": "user", "content": "Say something about capacity."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city", "days"],
    },
}
OLD_VERSION = "2023-06-01"
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


def sdk(sim: SimHandle, *, old: bool = False, key: str = SIMULATOR_DEMO_KEY) -> anthropic.AsyncAnthropic:
    """The current SDK as it ships (2026-10-21, Bearer), or sending what older SDKs send:
    2023-06-01 and the key as x-api-key only (the Authorization header left out)."""
    if not old:
        return anthropic.AsyncAnthropic(base_url=sim.origin, api_key=key, max_retries=0)
    headers = cast(
        dict[str, str], {"anthropic-version": OLD_VERSION, "x-api-key": key, "Authorization": anthropic.omit}
    )
    return anthropic.AsyncAnthropic(base_url=sim.origin, api_key=key, max_retries=0, default_headers=headers)


@pytest.fixture(params=["2026-10-21", OLD_VERSION])
async def client(request: pytest.FixtureRequest, sim: SimHandle) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with sdk(sim, old=request.param == OLD_VERSION) as c:
        yield c


async def test_the_sdks_send_what_they_say(sim: SimHandle) -> None:
    """What the header styles put on the wire (so each test below covers the style it names)."""
    seen: list[httpx.Request] = []
    for old in (False, True):
        async with sdk(sim, old=old) as c:
            raw = await c.messages.with_raw_response.create(model="sim-claude", max_tokens=5, messages=HELLO)
            seen.append(cast(httpx.Request, raw.http_response.request))
    new, old_style = (r.headers for r in seen)
    assert new["anthropic-version"] == "2026-10-21" and new["authorization"] == f"Bearer {SIMULATOR_DEMO_KEY}"
    assert "x-api-key" not in new
    assert old_style["anthropic-version"] == OLD_VERSION and old_style["x-api-key"] == SIMULATOR_DEMO_KEY
    assert "authorization" not in old_style


async def test_plain_message(client: anthropic.AsyncAnthropic) -> None:
    reply = await client.messages.create(model="sim-claude", max_tokens=100, system="Be brief.", messages=HELLO)
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == "sim-claude" and reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert reply.content[0].type == "text" and len(reply.content[0].text.split()) == 12
    assert reply.usage.output_tokens == 12 and reply.usage.cache_read_input_tokens == 0
    counted = await client.messages.count_tokens(model="sim-claude", system="Be brief.", messages=HELLO)
    assert counted.input_tokens == reply.usage.input_tokens > 0


async def test_max_tokens_cuts_the_answer(client: anthropic.AsyncAnthropic) -> None:
    reply = await client.messages.create(model="sim-claude", max_tokens=5, messages=HELLO)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 5
    assert reply.content[0].type == "text" and len(reply.content[0].text.split()) == 5


async def test_streamed_text(client: anthropic.AsyncAnthropic) -> None:
    async with client.messages.stream(model="sim-claude", max_tokens=100, messages=HELLO) as stream:
        events = [e.type async for e in stream]
        final = await stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 12
    assert final.content[0].type == "text" and len(final.content[0].text.split()) == 12


async def test_streamed_tool_use_in_pieces(client: anthropic.AsyncAnthropic) -> None:
    stream = await client.messages.create(
        model="sim-claude",
        max_tokens=100,
        messages=HELLO,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        stream=True,
    )
    pieces, starts, stop = [], [], None
    async for event in stream:
        if event.type == "content_block_start":
            starts.append(event.content_block)
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            pieces.append(event.delta.partial_json)
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    assert len(pieces) >= 3 and stop == "tool_use"
    assert starts[0].type == "tool_use" and starts[0].name == "get_weather" and starts[0].id.startswith("toolu_")
    assert json.loads("".join(pieces)) == {"city": "sample", "days": 1}


async def test_plain_tool_use(client: anthropic.AsyncAnthropic) -> None:
    reply = await client.messages.create(
        model="sim-claude",
        max_tokens=100,
        messages=HELLO,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    block = reply.content[0]
    assert reply.stop_reason == "tool_use" and block.type == "tool_use"
    assert block.input == {"city": "sample", "days": 1}
    # tool_choice auto on a model whose tools are "auto": a text answer
    text = await client.messages.create(model="sim-claude", max_tokens=100, messages=HELLO, tools=[WEATHER])
    assert text.stop_reason == "end_turn"


async def test_the_event_sequence_on_the_wire(sim: SimHandle, http: httpx.AsyncClient) -> None:
    body = {"model": "sim-claude", "max_tokens": 100, "messages": HELLO, "stream": True}
    r = await http.post(
        f"{sim.origin}/v1/messages",
        json=body,
        headers={"x-api-key": SIMULATOR_DEMO_KEY, "anthropic-version": "2026-10-21"},
    )
    names = [f.event for f in frames(r.text)]
    deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert deltas == 3 and r.headers["request-id"].startswith("req_")
    last = frames(r.text)[-2].json()
    assert last["delta"] == {"stop_reason": "end_turn", "stop_sequence": None} and last["usage"]["output_tokens"] == 12


async def test_models_list_is_per_wire(client: anthropic.AsyncAnthropic, sim: SimHandle) -> None:
    assert [m.id async for m in client.models.list()] == ["sim-claude"]
    assert (await client.models.retrieve("sim-claude")).type == "model"
    with pytest.raises(anthropic.NotFoundError):
        await client.models.retrieve("sim-gpt")


# ---------------------------------------------------------------- versions


@pytest.mark.parametrize("param, value", [("temperature", 1.0), ("top_p", 0.9), ("top_k", 5)])
async def test_2026_refuses_sampling_parameters_even_at_defaults(sim: SimHandle, param: str, value: float) -> None:
    async with sdk(sim) as new, sdk(sim, old=True) as old:
        with pytest.raises(anthropic.BadRequestError) as info:
            await new.messages.create(model="sim-claude", max_tokens=10, messages=HELLO, extra_body={param: value})
        # 2023-06-01 takes them
        reply = await old.messages.create(model="sim-claude", max_tokens=10, messages=HELLO, extra_body={param: value})
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": f"{param}: Extra inputs are not permitted"},
    }
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 10


async def test_2026_refuses_assistant_documents_and_user_citations(sim: SimHandle) -> None:
    document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    cited = {"type": "text", "text": "As noted.", "citations": [{"type": "char_location", "cited_text": "n"}]}
    cases: list[Any] = [
        [*HELLO, {"role": "assistant", "content": [document]}, {"role": "user", "content": "And?"}],
        [{"role": "user", "content": [cited]}],
    ]
    async with sdk(sim) as new, sdk(sim, old=True) as old:
        for messages in cases:
            with pytest.raises(anthropic.BadRequestError):
                await new.messages.create(model="sim-claude", max_tokens=10, messages=messages)
            assert (await old.messages.create(model="sim-claude", max_tokens=10, messages=messages)).content


@pytest.mark.parametrize(
    "headers, message",
    [
        ({}, "anthropic-version: header is required"),
        ({"anthropic-version": "2099-01-01"}, 'anthropic-version: "2099-01-01" is not a valid version'),
    ],
)
async def test_missing_or_unknown_version(
    sim: SimHandle, headers: dict[str, str], message: str, http: httpx.AsyncClient
) -> None:
    r = await http.post(
        f"{sim.origin}/v1/messages",
        json={"model": "sim-claude", "max_tokens": 10, "messages": HELLO},
        headers={"x-api-key": SIMULATOR_DEMO_KEY, **headers},
    )
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


async def test_max_tokens_is_required(sim: SimHandle, http: httpx.AsyncClient) -> None:
    # (the SDK itself refuses to send a request without it)
    r = await http.post(
        f"{sim.origin}/v1/messages",
        json={"model": "sim-claude", "messages": HELLO},
        headers={"x-api-key": SIMULATOR_DEMO_KEY, "anthropic-version": OLD_VERSION},
    )
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Field required"


# ---------------------------------------------------------------- errors


async def test_overloaded_529(sim: SimHandle, client: anthropic.AsyncAnthropic) -> None:
    sim.simulator.configure("sim-claude", slots=0)  # the anthropic wire's own dialect: anthropic-529
    with pytest.raises(anthropic.OverloadedError) as info:
        await client.messages.create(model="sim-claude", max_tokens=10, messages=HELLO)
    assert info.value.status_code == 529
    assert info.value.body == OVERLOADED


async def test_rate_limited_429_with_its_headers(sim: SimHandle, client: anthropic.AsyncAnthropic) -> None:
    sim.simulator.configure("sim-claude", slots=0, dialect="anthropic-429", hint=2.5)
    with pytest.raises(anthropic.RateLimitError) as info:
        await client.messages.create(model="sim-claude", max_tokens=10, messages=HELLO)
    h = info.value.response.headers
    assert h["retry-after"] == "3" and h["anthropic-ratelimit-requests-limit"] == "0"
    assert h["anthropic-ratelimit-requests-remaining"] == "0" and h["anthropic-ratelimit-tokens-remaining"] == "0"
    for name in ("anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"):
        assert h[name].endswith("Z") and h[name][10] == "T"  # RFC 3339, UTC
    assert cast(Any, info.value.body)["error"]["type"] == "rate_limit_error"


async def test_prompt_too_long(client: anthropic.AsyncAnthropic) -> None:
    long: Any = [{"role": "user", "content": "x" * 9000}]  # 2254 tokens > the 2000 window
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model="sim-claude", max_tokens=10, messages=long)
    assert cast(Any, info.value.body)["error"]["message"] == "prompt is too long: 2254 tokens > 2000 maximum"


async def test_request_too_large_413(client: anthropic.AsyncAnthropic) -> None:
    huge: Any = [{"role": "user", "content": "x" * 70_000}]  # over the scenario's 64000 bytes
    with pytest.raises(anthropic.ContentTooLargeError) as info:
        await client.messages.create(model="sim-claude", max_tokens=10, messages=huge)
    assert info.value.status_code == 413
    assert cast(Any, info.value.body)["error"]["type"] == "request_too_large"


async def test_authentication_401(sim: SimHandle) -> None:
    for old in (False, True):
        async with sdk(sim, old=old, key="sk-wrong") as c:
            with pytest.raises(anthropic.AuthenticationError) as info:
                await c.messages.create(model="sim-claude", max_tokens=10, messages=HELLO)
        assert cast(Any, info.value.body)["error"] == {"type": "authentication_error", "message": "invalid x-api-key"}


@pytest.mark.parametrize(
    "status, error, kind",
    [
        (403, anthropic.PermissionDeniedError, "permission_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
async def test_error_fault_in_anthropic_shape(
    sim: SimHandle, client: anthropic.AsyncAnthropic, status: int, error: type[anthropic.APIStatusError], kind: str
) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "error", "status": status}))
    with pytest.raises(error) as info:
        await client.messages.create(model="sim-claude", max_tokens=10, messages=HELLO)
    assert info.value.status_code == status and cast(Any, info.value.body)["error"]["type"] == kind


async def test_models_of_other_wires_are_not_found(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        await client.messages.create(model="sim-gpt", max_tokens=10, messages=HELLO)
    assert cast(Any, info.value.body)["error"] == {"type": "not_found_error", "message": "model: sim-gpt"}
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.count_tokens(model="sim-gpt", messages=HELLO)


# ---------------------------------------------------------------- errors inside the stream


async def _stream_until_error(client: anthropic.AsyncAnthropic) -> tuple[list[str], anthropic.APIStatusError]:
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        stream = await client.messages.create(model="sim-claude", max_tokens=100, messages=HELLO, stream=True)
        async for event in stream:
            seen.append(event.type)
    return seen, info.value


def _overloaded(err: anthropic.APIStatusError) -> bool:
    return bool(cast(Any, err.body) == OVERLOADED)


async def test_full_model_rejects_inside_the_stream(sim: SimHandle, client: anthropic.AsyncAnthropic) -> None:
    sim.simulator.configure("sim-claude", slots=0, dialect="anthropic-stream")
    seen, err = await _stream_until_error(client)
    assert seen == ["message_start"] and _overloaded(err)
    # the plain request gets the 529 that frame stands for
    with pytest.raises(anthropic.OverloadedError):
        await client.messages.create(model="sim-claude", max_tokens=10, messages=HELLO)


@pytest.mark.parametrize("after", [0, 2])
async def test_stream_error_fault_before_and_after_output(
    sim: SimHandle, client: anthropic.AsyncAnthropic, after: int
) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": after, "dialect": "anthropic-stream"}))
    seen, err = await _stream_until_error(client)
    assert _overloaded(err)
    assert seen[0] == "message_start" and seen.count("content_block_delta") == after
    assert "message_stop" not in seen and "message_delta" not in seen
