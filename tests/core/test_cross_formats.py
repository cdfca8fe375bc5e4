"""Fallback across formats, over real HTTP against the simulator: a chat request served by
an Anthropic-wire model when the OpenAI-wire flagship is tripped, a Messages request served
by an OpenAI-wire model when its Anthropic model is tripped (text, streamed text, a tool
call round trip), Anthropic's in-stream overload before and after output, and Azure's
two URL shapes with the api-key header, whose key shows nowhere."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY, EndpointApi, parse_config
from capmon.core.types.failure import Kind
from capmon.core.types.result import Decision, Skip
from capmon.core.types.serial import snapshot_to_json
from capmon.sim.scenario import Scenario
from tests.reliability.helpers import set_fault
from tests.support import configs
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

AZURE_KEY = "5f0e4d3c2b1a09f8e7d6c5b4a3928170"  # 32 hex digits, as Azure's keys are
WRONG_KEY = "0123456789abcdef0123456789abcdef"
ENV = {"KEY": SIMULATOR_DEMO_KEY, "AZ": AZURE_KEY, "BAD": WRONG_KEY}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]  # type: ignore[index]


@pytest.fixture
def sim_scenario() -> Scenario:
    models = (
        sim_model("flagship", 4, answer_tokens=20),
        sim_model("claude", 4, answer_tokens=20, api="anthropic"),
        sim_model("gpt-az", 4, answer_tokens=20, api="azure"),
    )
    return Scenario(models=models, keys=(SIMULATOR_DEMO_KEY, AZURE_KEY))


def two_providers(sim: Any, *, first: str = "flagship") -> FallbackClient:
    """flagship on OpenAI's wire and claude on Anthropic's, ``first`` preferred."""
    text = configs.two_providers(sim.base_url, sim.origin, first=first, key_env="KEY")
    return FallbackClient(parse_config(text, "test.toml"), environ=ENV)


def chat_text(chunks: list[Any]) -> str:
    return "".join((c["choices"][0].get("delta", {}).get("content") or "") for c in chunks if c.get("choices"))


# ---------------------------------------------------------------- chat -> Anthropic


async def test_a_chat_request_is_served_by_the_anthropic_model_when_the_openai_flagship_is_tripped(sim: Any) -> None:
    async with two_providers(sim) as client:
        client.trip("flagship")
        result = await client.chat("hi", temperature=0.5)
        stream = client.stream_chunks("hi", stream_options={"include_usage": True})
        chunks = [c async for c in stream]
    assert (result.model, result.api) == ("claude", EndpointApi.ANTHROPIC)
    assert result.response["object"] == "chat.completion"
    assert result.response["choices"][0]["finish_reason"] == "stop"
    assert len(result.content.split()) == 20 and result.usage["completion_tokens"] == 20
    # 2026-10-21 refuses temperature: sent without it (the default rule), and the record says so
    assert result.dropped == ("temperature",) and result.attempts[-1].dropped == ("temperature",)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len(chat_text(chunks).split()) == 20 and stream.model == "claude"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20  # include_usage honoured
    assert stream.result is not None and stream.result.api is EndpointApi.ANTHROPIC


async def test_a_chat_tool_call_round_trip_crosses_to_anthropic_and_back_with_ids_kept(sim: Any) -> None:
    async with two_providers(sim) as client:
        client.trip("flagship")
        called = await client.chat("weather in Paris?", tools=TOOLS, tool_choice="required")
        (call,) = called.tool_calls
        assert called.response["choices"][0]["finish_reason"] == "tool_calls"
        assert call["id"].startswith("toolu_") and json.loads(call["function"]["arguments"])["city"]
        messages = [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "18C and sunny"},
        ]
        answer = await client.chat(messages, tools=TOOLS)
        streamed = client.stream_chunks(
            "weather?", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}
        )
        chunks = [c async for c in streamed]
    assert answer.model == "claude" and answer.content and not answer.tool_calls
    assert streamed.result is not None
    (streamed_call,) = streamed.result.tool_calls
    assert json.loads(streamed_call["function"]["arguments"])["city"]  # input_json_delta pieces put together
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert sum(1 for d in deltas if d.get("tool_calls")) >= 2  # the name, then argument pieces


# ---------------------------------------------------------------- Messages -> OpenAI


async def test_a_messages_request_is_served_by_the_openai_model_when_its_anthropic_model_is_tripped(sim: Any) -> None:
    body = {"system": "be brief", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}
    async with two_providers(sim, first="claude") as client:
        same = await client.messages(body)
        client.trip("claude")
        result = await client.messages(body)
        stream = client.stream_messages(body)
        events = [e async for e in stream]
        texts = [t async for t in client.stream_messages(body).texts()]
    assert (same.model, same.api, same.response["type"]) == ("claude", EndpointApi.ANTHROPIC, "message")
    assert (result.model, result.api) == ("flagship", EndpointApi.OPENAI)
    assert result.response["type"] == "message" and result.response["stop_reason"] == "end_turn"
    assert result.response["usage"]["output_tokens"] == 20 and len(result.content.split()) == 20
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert len(text.split()) == 20 and len("".join(texts).split()) == 20  # texts() reads Messages events too
    assert events[-2]["usage"]["output_tokens"] == 20  # the chat side was asked for usage
    assert stream.result is not None and stream.result.response["type"] == "message"


async def test_a_messages_tool_use_round_trip_is_served_by_the_openai_model(sim: Any) -> None:
    async with two_providers(sim, first="claude") as client:
        client.trip("claude")
        called = await client.messages(
            {
                "messages": [{"role": "user", "content": "weather?"}],
                "tools": ANTHROPIC_TOOLS,
                "tool_choice": {"type": "any"},
            }
        )
        (use,) = [b for b in called.response["content"] if b["type"] == "tool_use"]
        assert called.response["stop_reason"] == "tool_use" and use["input"]["city"]
        followup = {
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "18C"}]},
            ],
            "tools": ANTHROPIC_TOOLS,
        }
        answer = await client.messages(followup)
        stream = client.stream_messages({**followup, "tool_choice": {"type": "tool", "name": "get_weather"}})
        events = [e async for e in stream]
    assert answer.model == "flagship" and answer.response["stop_reason"] == "end_turn" and answer.content
    pieces = [e["delta"]["partial_json"] for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    assert json.loads("".join(pieces))["city"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


async def test_a_target_that_cannot_carry_the_request_is_skipped_on_the_record_or_refused(sim: Any) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    body = {"messages": [{"role": "user", "content": "hi"}], "thinking": thinking}
    cited = [{"type": "text", "text": "hi", "citations": [{"type": "char_location"}]}]
    async with two_providers(sim, first="flagship") as client:
        served = await client.messages(body)
        with pytest.raises(RequestFailed) as e:  # neither can carry it: refused at once, nothing sent
            await client.messages({"messages": [{"role": "user", "content": cited}], "thinking": thinking})
    # served by claude; the flagship, preferred, was passed over on the record with the reason
    assert served.model == "claude"
    skip, ok = served.attempts
    assert (skip.model, skip.decision, skip.number, skip.api) == ("flagship", Decision.SKIP, 0, EndpointApi.OPENAI)
    assert skip.reason.startswith("incapable: thinking") and ok.number == 1 and served.fell_back
    assert e.value.failure.kind is Kind.BAD_REQUEST
    assert [(a.model, a.decision, a.skip) for a in e.value.attempts] == [
        ("flagship", Decision.SKIP, Skip.INCAPABLE),
        ("claude", Decision.SKIP, Skip.INCAPABLE),
    ]
    refused = str(e.value)
    assert "flagship (openai): thinking" in refused and "claude (anthropic): messages[0]: citations" in refused


# ---------------------------------------------------------------- Anthropic's in-stream overload


async def test_anthropics_in_stream_overload_before_output_falls_back(sim: Any) -> None:
    await set_fault(sim, mode="stream_error", model="sim-claude", after=0, dialect="anthropic-stream", count=1)
    async with two_providers(sim, first="claude") as client:
        stream = client.stream_chunks("hi")
        chunks = [c async for c in stream]
    assert stream.model == "flagship" and len(chat_text(chunks).split()) == 20
    (failed,) = stream.attempts
    assert (failed.model, failed.kind, failed.status) == ("claude", Kind.CAPACITY, 200)


@pytest.mark.parametrize("caller", ["chat", "messages"])
async def test_anthropics_in_stream_overload_after_output_fails_the_stream(sim: Any, caller: str) -> None:
    await set_fault(sim, mode="stream_error", model="sim-claude", after=3, dialect="anthropic-stream", count=1)
    async with two_providers(sim, first="claude") as client:
        if caller == "chat":
            stream = client.stream_chunks("hi", continuation=False)  # opted out
        else:
            stream = client.stream_messages({"messages": [{"role": "user", "content": "hi"}]}, continuation=False)
        got: list[Any] = []
        with pytest.raises(RequestFailed) as e:
            async for c in stream:
                got.append(c)
    assert e.value.failure.kind is Kind.CAPACITY and "after output" in str(e.value)
    assert got and stream.result is None  # some output went out, and never a completed answer
    if caller == "messages":
        assert "message_stop" not in [c["type"] for c in got]
    else:
        assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in got)


@pytest.mark.parametrize("caller", ["chat", "responses", "messages"])
async def test_a_broken_tool_call_across_formats_fails_the_stream_after_output_never_ending_it(
    sim: Any, caller: str
) -> None:
    """The simulator's broken_tool_args fault: the call's arguments stop halfway but its
    stream ends as a whole one would. The library's stream yields the call's pieces, then
    raises; the caller's own end never comes before."""
    served = "flagship" if caller == "messages" else "claude"  # the model on the other wire
    await set_fault(sim, mode="broken_tool_args", model=f"sim-{served}", count=1)
    paris = [{"role": "user", "content": "Weather in Paris?"}]
    async with two_providers(sim, first=served) as client:
        if caller == "chat":
            stream = client.stream_chunks(paris, tools=TOOLS, tool_choice="required")
        elif caller == "responses":
            tool = {"type": "function", **TOOLS[0]["function"]}  # type: ignore[dict-item]
            stream = client.stream_responses({"input": paris, "tools": [tool], "tool_choice": "required"})
        else:
            body = {"messages": paris, "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"}}
            stream = client.stream_messages(body)
        got: list[Any] = []
        with pytest.raises(RequestFailed) as e:
            async for c in stream:
                got.append(c)
    assert e.value.failure.kind is Kind.TRANSIENT and "after output" in str(e.value)
    assert "broken tool call get_weather" in str(e.value) and stream.model == served and stream.result is None
    if caller == "messages":
        assert [c["type"] for c in got][-1] == "content_block_delta"
    elif caller == "responses":
        assert [c["type"] for c in got][-1] == "response.function_call_arguments.delta"
    else:
        assert got[-1]["choices"][0]["delta"]["tool_calls"] and not any(
            c["choices"][0].get("finish_reason") for c in got
        )
    (record,) = e.value.attempts
    assert (record.model, record.kind, record.status) == (served, Kind.TRANSIENT, 200)


# ---------------------------------------------------------------- Azure


def azure_client(sim: Any, api_version: str, env: str = "AZ") -> FallbackClient:
    return FallbackClient(configs.on_azure(sim.origin, api_version=api_version, key_env=env), environ=ENV)


@pytest.mark.parametrize("api_version", ["2024-10-21", "v1", ""])
async def test_azure_classic_and_v1_with_the_api_key_header(
    sim: Any, api_version: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with azure_client(sim, api_version) as client:
        result = await client.chat("hi")
        chunks = [c async for c in client.stream_chunks("hi")]
        if api_version != "2024-10-21":
            answered = await client.responses({"input": "hi"})
            assert answered.response["object"] == "response"
        snapshot = json.dumps(snapshot_to_json(client.snapshot()))
    assert (result.model, result.api, len(result.content.split())) == ("gpt", EndpointApi.AZURE, 20)
    assert len(chat_text(chunks).split()) == 20
    assert AZURE_KEY not in caplog.text and AZURE_KEY not in snapshot and AZURE_KEY not in repr(result)


async def test_an_azure_key_refused_shows_in_no_exception_log_or_snapshot(
    sim: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with azure_client(sim, "2024-10-21", env="BAD") as client:
        with pytest.raises(RequestFailed) as e:
            await client.chat("hi")
        snapshot = json.dumps(snapshot_to_json(client.snapshot()))
    assert e.value.failure.kind is Kind.AUTH and e.value.failure.status == 401
    for text in (str(e.value), repr(e.value.failure), caplog.text, snapshot, repr(e.value.attempts)):
        assert WRONG_KEY not in text


# ---------------------------------------------------------------- Anthropic's failures


@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, Kind.AUTH), (403, Kind.AUTH), (413, Kind.TOO_LARGE), (500, Kind.TRANSIENT), (400, Kind.BAD_REQUEST)],
)
async def test_anthropics_http_errors_are_classified_like_every_other(sim: Any, status: int, kind: Kind) -> None:
    await set_fault(sim, mode="error", status=status, model="sim-claude", count=1)
    async with two_providers(sim, first="claude") as client:
        try:
            result = await client.messages({"messages": [{"role": "user", "content": "hi"}]})
            first = result.attempts[0]
        except RequestFailed as e:  # a bad request is the caller's: never retried elsewhere
            first = e.attempts[0]
    assert (first.model, first.status, first.kind) == ("claude", status, kind)


@pytest.mark.parametrize(
    ("dialect", "kind", "status"),
    [("anthropic-529", Kind.CAPACITY, 529), ("anthropic-429", Kind.RATE_LIMITED, 429)],
)
async def test_anthropics_capacity_and_rate_limit_answers_are_classified_with_their_hints(
    dialect: str, kind: Kind, status: int, start_sim: StartSim
) -> None:
    models = (sim_model("flagship", 4), sim_model("claude", 0, api="anthropic", dialect=dialect, hint=2.0))
    server = await start_sim(Scenario(models=models, keys=(SIMULATOR_DEMO_KEY,)))
    async with two_providers(server, first="claude") as client:
        result = await client.chat("hi")
    first = result.attempts[0]
    assert (first.model, first.kind, first.status) == ("claude", kind, status) and result.model == "flagship"
    if kind is Kind.RATE_LIMITED:
        assert first.hint is not None and first.hint >= 2.0  # retry-after / anthropic-ratelimit-* read


async def test_a_prompt_too_long_for_the_anthropic_model_is_too_large_there_and_goes_to_a_larger_one(
    start_sim: StartSim,
) -> None:
    big = dataclasses.replace(sim_model("flagship", 4), context_window=1_000_000)
    server = await start_sim(
        Scenario(models=(big, sim_model("claude", 4, api="anthropic")), keys=(SIMULATOR_DEMO_KEY,))
    )
    async with two_providers(server, first="claude") as client:
        # The config believes claude's window (200,000) larger than the simulator's (128,000):
        # the API's own "prompt is too long" 400 is what tells the client.
        for t in client.targets:
            window = 200_000 if t.model.name == "claude" else 1_000_000
            t.model = dataclasses.replace(t.model, context_window=window)
        result = await client.chat("word " * 120_000)
    first = result.attempts[0]
    assert (first.model, first.status, first.kind) == ("claude", 400, Kind.TOO_LARGE)
    assert "prompt is too long" in first.reason and result.model == "flagship"
