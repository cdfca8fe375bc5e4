"""The Responses API through the FallbackClient, against the simulator over real HTTP:
plain and streamed, in-stream failures before and after output, fallbacks."""

from __future__ import annotations

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.core.types.failure import Kind
from capmon.sim.scenario import ModelSpec, Scenario
from tests.reliability.helpers import set_fault
from tests.support.configs import flagship_and_medium
from tests.support.simulated import StartSim, sim_model

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}


def spec(name: str, slots: int = 4, **kw: object) -> ModelSpec:
    return sim_model(name, slots, base_latency=0.2, answer_tokens=24, **kw)


async def test_a_plain_response_and_a_streamed_one(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship"), spec("medium"))))
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        result = await client.responses(
            {"input": "Say hello", "instructions": "Be brief.", "metadata": {"trace": "t-1"}}
        )
        stream = client.stream_responses({"input": "Say hello"})
        events = [e async for e in stream]
    assert result.model == "flagship" and result.response["object"] == "response"
    assert len(result.content.split()) == 24 and result.response["instructions"] == "Be brief."
    assert result.response["max_output_tokens"] == 64  # the model's cap, sent as the Responses API names it
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert "response.output_text.delta" in types
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert len(text.split()) == 24
    assert stream.model == "flagship" and stream.result is not None and stream.result.content == text


@pytest.mark.parametrize("dialect", ["responses-failed", "responses-slow-down", "responses-error"])
async def test_an_overloaded_model_in_the_stream_falls_back_before_any_output(
    dialect: str, start_sim: StartSim
) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", slots=0, dialect=dialect), spec("medium"))))
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        stream = client.stream_responses({"input": "hi"}, continuation=False)  # opted out: the old end
        events = [e async for e in stream]
        plain = await client.responses({"input": "hi"})
        snap = client.snapshot()
    assert stream.model == "medium" and [a.kind for a in stream.attempts] == [Kind.CAPACITY]
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert all(e["response"]["model"] == "sim-medium" for e in events if "response" in e)  # nothing of the flagship
    assert plain.model == "medium" and plain.attempts[0].kind is Kind.CAPACITY
    assert snap.targets[0].consecutive_failures >= 1


async def test_a_failure_after_output_ends_the_stream_with_an_error(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship"), spec("medium"))))
    await set_fault(sim, mode="stream_error", after=3, dialect="responses-failed", count=1)
    async with FallbackClient(flagship_and_medium(sim.base_url), environ=ENV) as client:
        stream = client.stream_responses({"input": "hi"}, continuation=False)  # opted out: the old end
        events = []
        with pytest.raises(RequestFailed) as info:
            async for e in stream:
                events.append(e)
    assert info.value.failure.kind is Kind.CAPACITY and "after output was sent" in str(info.value)
    assert any(e["type"] == "response.output_text.delta" for e in events)
    assert events[-1]["type"] != "response.completed"  # never shown as complete
