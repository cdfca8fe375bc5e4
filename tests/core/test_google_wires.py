"""The client on Google's wires, over real HTTP to the simulator: a model on the Gemini API
(``api = "gemini"``) and on Vertex AI (``api = "vertex"``: Gemini models by generateContent,
Claude by rawPredict), asked in every caller format (chat, Messages, Gemini's own), plain,
streamed and with a tool call; Google's errors as the classifier reads them (a 503
UNAVAILABLE falls back, a 429's RetryInfo is its hint, the raw in-stream error before output
falls back and after it breaks the stream); and one model on three deployments (Anthropic's
API, Vertex AI's Claude and an OpenAI-wire server): one at capacity moves its work to the
others with no fallback counted, all three at capacity fall back to the next model; and Claude
on Anthropic's API, Vertex AI and Bedrock: a 529 storm at the first moves its work to the
other two."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request, sent
from capmon.sim.scenario import Scenario
from tests.support.configs import BACKUP, every_api, google_models
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _scenario(flash: int = 4, claude: int = 4, **flash_kw: Any) -> Scenario:
    return Scenario(
        models=(
            sim_model("flash", flash, api="gemini+vertex", **flash_kw),
            dataclasses.replace(sim_model("x", claude, api="vertex"), name="claude-v"),
            sim_model("backup"),
        )
    )


def _origin(base_url: str) -> str:
    return base_url.removesuffix("/v1")


def _raw_error(*, after: int, count: int) -> dict[str, Any]:
    """sim-flash's next ``count`` streams end, after ``after`` chunks, with Google's raw error object."""
    return {"mode": "stream_error", "after": after, "model": "sim-flash", "count": count, "dialect": "gemini-stream"}


async def _fault(sim: Any, fault: dict[str, Any]) -> None:
    async with httpx.AsyncClient(trust_env=False) as http:
        (await http.post(f"{sim.admin_url}/faults", json=fault)).raise_for_status()


async def test_every_caller_format_is_served_on_the_gemini_api_and_claude_on_vertex(start_sim: StartSim) -> None:
    sim = await start_sim(_scenario())
    async with FallbackClient(google_models(_origin(sim.base_url)), environ=ENV) as client:
        chat = await client.chat(Request.of("Say hi", model="flash"))
        messages = await client.chat(
            Request.anthropic({"max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}, model="flash")
        )
        gemini = await client.chat(
            Request.of_body(Format.GEMINI, {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, model="claude")
        )
        stream = client.stream_chunks(Request.of("Say hi", model="claude"))
        chunks = [c async for c in stream]
        tools = await client.chat(
            Request.of("Weather in Paris?", model="flash", tools=[WEATHER], tool_choice="required")
        )
    assert (chat.model, chat.endpoint, chat.deployment) == ("flash", "gemini", "sim-flash")
    assert chat.content and chat.response["choices"][0]["finish_reason"] == "stop"
    assert messages.response["type"] == "message" and messages.response["content"][0]["text"]
    # Gemini's own format, served by Claude on Vertex (Messages on the wire) and told back in Gemini's shape
    assert gemini.endpoint == "vertex" and gemini.response["candidates"][0]["content"]["parts"][0]["text"]
    assert (stream.endpoint, stream.deployment) == ("vertex", "claude-v")
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")).split()
    (call,) = tools.tool_calls
    assert call["function"]["name"] == "get_weather" and "city" in call["function"]["arguments"]


async def test_a_full_gemini_api_moves_to_vertex_and_a_full_model_falls_back(start_sim: StartSim) -> None:
    # sim-flash holds no request at all: its 503 UNAVAILABLE on both of Google's wires
    sim = await start_sim(_scenario(flash=0))
    async with FallbackClient(google_models(_origin(sim.base_url)), environ=ENV) as client:
        result = await client.chat(Request.of("hi", model="flash"))
    assert [(a.endpoint, a.status, a.kind) for a in sent(result.attempts)] == [
        ("gemini", 503, Kind.CAPACITY),
        ("vertex", 503, Kind.CAPACITY),
        ("vertex", 200, None),  # claude, next in the order
    ]
    assert (result.model, result.fallbacks) == ("claude", 1)


async def test_a_per_minute_429_is_a_rate_limit_with_googles_retry_delay_and_limit_0_a_quota(
    start_sim: StartSim,
) -> None:
    # the free tier's per-minute quota (QuotaFailure, RetryInfo): "limit: N" where N is the slots
    sim = await start_sim(_scenario(flash=1, dialect="gemini-429", hint=3.0, base_latency=2.0))
    async with FallbackClient(google_models(_origin(sim.base_url)), environ=ENV) as client:
        both = await asyncio.gather(*(client.chat(Request.of("hi", model="flash")) for _ in range(2)))
    refused = [a for r in both for a in sent(r.attempts) if a.status == 429]
    assert refused and {(a.kind, a.hint) for a in refused} == {(Kind.RATE_LIMITED, 3.0)}

    sim = await start_sim(_scenario(flash=0, dialect="gemini-429", hint=3.0))  # "limit: 0": no free tier at all
    async with FallbackClient(google_models(_origin(sim.base_url)), environ=ENV) as client:
        result = await client.chat(Request.of("hi", model="flash"))
    assert [(a.kind, a.endpoint) for a in sent(result.attempts)][0] == (Kind.QUOTA, "gemini")


async def test_googles_raw_in_stream_error_falls_back_before_output_and_breaks_after(start_sim: StartSim) -> None:
    sim = await start_sim(_scenario())
    config = google_models(_origin(sim.base_url))
    async with FallbackClient(config, environ=ENV) as client:
        await _fault(
            sim, {"mode": "stream_error", "after": 0, "model": "sim-flash", "count": 2, "dialect": "gemini-stream"}
        )
        before = client.stream_chunks(Request.of("hi", model="flash"))
        _ = [c async for c in before]
        await _fault(
            sim, {"mode": "stream_error", "after": 2, "model": "sim-flash", "count": 1, "dialect": "gemini-stream"}
        )
        after = client.stream_chunks(Request.of("hi", model="flash", continuation=False))
        got: list[Any] = []
        with pytest.raises(RequestFailed) as broken:
            async for c in after:
                got.append(c)
    # before output: each of flash's deployments refused inside its 200 stream, and the request
    # was served all the same (by claude, or flash again once the two refusals were spent)
    assert [(a.endpoint, a.kind) for a in sent(before.attempts)][:2] == [
        ("gemini", Kind.CAPACITY),
        ("vertex", Kind.CAPACITY),
    ]
    assert before.result is not None and before.result.content
    assert got and broken.value.failure.kind is Kind.CAPACITY


def _three_deployments(origin: str) -> Config:
    return every_api(
        origin,
        """
[[models]]
name = "sonnet"
deployments = [
  { endpoint = "anthropic", model = "sim-sonnet-a" },
  { endpoint = "vertex", model = "claude-sonnet-v" },
  { endpoint = "sim", model = "sim-sonnet-o" },
]
max_tokens = 64
"""
        + BACKUP,
    )


def _three(a: int, v: int, o: int) -> Scenario:
    return Scenario(
        models=(
            sim_model("sonnet-a", a, api="anthropic"),
            dataclasses.replace(sim_model("x", v, api="vertex"), name="claude-sonnet-v"),
            sim_model("sonnet-o", o),
            sim_model("backup"),
        )
    )


async def test_one_model_on_three_deployments_moves_between_them_and_falls_back_when_all_are_full(
    start_sim: StartSim,
) -> None:
    sim = await start_sim(_three(a=0, v=4, o=4))
    async with FallbackClient(_three_deployments(_origin(sim.base_url)), environ=ENV) as client:
        moved = await client.chat(Request.of("hi"))
    assert [(a.endpoint, a.kind) for a in sent(moved.attempts)] == [("anthropic", Kind.CAPACITY), ("vertex", None)]
    assert (moved.model, moved.deployment, moved.fallbacks) == ("sonnet", "claude-sonnet-v", 0)

    sim = await start_sim(_three(a=0, v=0, o=0))
    async with FallbackClient(_three_deployments(_origin(sim.base_url)), environ=ENV) as client:
        fell = await client.chat(Request.of("hi"))
    assert [a.endpoint for a in sent(fell.attempts)] == ["anthropic", "vertex", "sim", "sim"]
    assert (fell.model, fell.fallbacks) == ("backup", 1)


async def test_a_529_storm_at_anthropic_moves_claude_to_vertex_and_bedrock_with_no_fallback(
    start_sim: StartSim,
) -> None:
    # claude on Anthropic's API (overloaded: every request its 529), Vertex AI and Bedrock
    sim = await start_sim(
        Scenario(
            models=(
                sim_model("sonnet-a", 0, api="anthropic", dialect="anthropic-529"),
                dataclasses.replace(sim_model("x", 16, api="vertex"), name="claude-sonnet-v"),
                dataclasses.replace(sim_model("x", 16, api="bedrock"), name="us.anthropic.sim-sonnet-v1:0"),
                sim_model("backup"),
            )
        )
    )
    config = every_api(
        _origin(sim.base_url),
        """
[[models]]
name = "sonnet"
deployments = [
  { endpoint = "anthropic", model = "sim-sonnet-a" },
  { endpoint = "vertex", model = "claude-sonnet-v" },
  { endpoint = "bedrock", model = "us.anthropic.sim-sonnet-v1:0" },
]
max_tokens = 64
"""
        + BACKUP,
    )
    bus = ev.EventBus()
    seen: list[ev.Event] = []
    bus.subscribe(seen.append)
    async with FallbackClient(config, environ=ENV, bus=bus) as client:
        results = await asyncio.gather(*(client.chat(Request.of("hi")) for _ in range(16)))
        states = {t.target: t.capacity for t in client.snapshot().targets}
    assert {r.model for r in results} == {"sonnet"} and {r.fallbacks for r in results} == {0}
    assert {r.endpoint for r in results} == {"vertex", "bedrock"}  # both of the other two took work
    refused = [a for r in results for a in sent(r.attempts) if a.endpoint == "anthropic"]
    assert refused and {(a.status, a.kind) for a in refused} == {(529, Kind.CAPACITY)}
    # Anthropic's deployment learned from its 529 that it holds nothing now; the others took it all
    assert states["sonnet@anthropic/k"] == 1
    assert not [e for e in seen if isinstance(e, ev.FellBack)]
    assert [e for e in seen if isinstance(e, ev.DeploymentMoved)]
