"""The client against the simulator speaking real providers' wire: every stream style,
every in-stream capacity dialect, tool calls, usage, the token-parameter quirk, and
errors after output, over real HTTP."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.route import STICK_LIMIT
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.core.types.failure import Kind
from capmon.sim.dialects import CHAT_STREAM_DIALECTS
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.streams import STYLES
from tests.reliability.helpers import set_fault
from tests.support.configs import flagship_and_medium
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def spec(name: str, slots: int = 4, **kw: object) -> ModelSpec:
    return sim_model(name, slots, base_latency=0.1, answer_tokens=20, **kw)


def text_of(chunks: list) -> str:
    return "".join((c["choices"][0].get("delta", {}).get("content") or "") for c in chunks if c.get("choices"))


@pytest.mark.parametrize("style", sorted(STYLES))
async def test_every_stream_style_streams_text_tool_calls_and_usage(style: str, start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", stream_style=style, tools="always"), spec("medium"))))
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        text = client.stream_chunks("hi", stream_options={"include_usage": True})
        chunks = [c async for c in text]
        calls = client.stream_chunks("weather in Paris?", tools=TOOLS, tool_choice="required")
        call_chunks = [c async for c in calls]
    assert len(text_of(chunks).split()) == 20 and text.model == "flagship"
    assert text.result is not None and text.result.usage.get("completion_tokens") == 20
    assert calls.result is not None and calls.result.tool_calls
    call = calls.result.tool_calls[0]
    assert call["function"]["name"] == "get_weather" and '"city"' in call["function"]["arguments"]
    assert any(c["choices"][0].get("delta", {}).get("tool_calls") for c in call_chunks if c.get("choices"))


@pytest.mark.parametrize("dialect", CHAT_STREAM_DIALECTS)
async def test_an_in_stream_capacity_error_falls_back_and_counts_toward_the_breaker(
    dialect: str, start_sim: StartSim
) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", slots=0, dialect=dialect), spec("medium"))))
    bus = ev.EventBus()
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV, bus=bus) as client:
        stream = client.stream_chunks("hi")
        chunks = [c async for c in stream]
        snap = client.snapshot()
    assert stream.model == "medium" and len(text_of(chunks).split()) == 20
    failed = bus.recent(types=[ev.AttemptFailed])
    assert {e.model for e in failed} == {"flagship"}
    if failed[0].kind == Kind.CAPACITY:  # falls back at once, and the breaker counted it
        assert len(failed) == 1 and snap.targets[0].consecutive_failures == 1
    else:  # rate-limited or transient upstream: the same model a little longer, then another
        assert failed[0].kind in (Kind.RATE_LIMITED, Kind.TRANSIENT) and len(failed) == STICK_LIMIT + 1


@pytest.mark.parametrize("dialect", CHAT_STREAM_DIALECTS)
async def test_an_error_after_output_ends_the_stream(dialect: str, start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship"), spec("medium"))))
    await set_fault(sim, mode="stream_error", after=2, dialect=dialect, count=1)
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        chunks: list = []
        with pytest.raises(RequestFailed) as info:
            async for c in client.stream_chunks("hi", continuation=False):  # opted out: the old end
                chunks.append(c)
    assert text_of(chunks) and "after output was sent" in str(info.value)


async def test_a_model_that_wants_max_completion_tokens_is_learned_from_its_400(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", token_param="max_completion_tokens"), spec("medium"))))
    bus = ev.EventBus()
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV, bus=bus) as client:
        first = await client.chat("hi")
        second = await client.chat("again")
    assert first.model == second.model == "flagship"
    assert [a.decision for a in first.attempts] == ["retry", "ok"] and len(second.attempts) == 1
    assert [e.param for e in bus.recent(types=[ev.TokenParamLearned])] == ["max_completion_tokens"]


async def test_huge_answers_are_cut_at_the_cap_valid_or_not(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship"), spec("medium"))))
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        for valid in (True, False):
            await set_fault(sim, mode="huge", bytes=50_000_000, valid=valid, count=1)
            result = await client.chat("hi")
            assert result.model == "medium" and result.attempts[0].kind is Kind.OVERSIZED
