"""The official openai SDK talks to the simulator over loopback: completions, streams,
and the SDK's own exception types for each kind of rejection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle

# Real sockets and a real loop: keep simulated latencies tiny.
SCENARIO = Scenario(
    name="sdk",
    models=(
        ModelSpec(
            name="sim-flagship",
            slots=4,
            base_latency=0.01,
            per_token=0.0005,
            noise=0.1,
            answer_tokens=30,
            context_window=2000,
        ),
        ModelSpec(name="sim-small", slots=4, base_latency=0.01, per_token=0.0, noise=0.0, answer_tokens=12),
    ),
)


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


@pytest.fixture
async def client(sim: SimHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        yield c


MESSAGES = [{"role": "user", "content": "Say something about capacity."}]


async def test_chat_completion(client: openai.AsyncOpenAI) -> None:
    reply = await client.chat.completions.create(model="sim-flagship", messages=MESSAGES, max_tokens=20)
    assert reply.model == "sim-flagship"
    assert reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].message.content.split()) == 20
    assert reply.usage is not None and reply.usage.completion_tokens == 20


async def test_streaming(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="sim-flagship", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    pieces: list[str] = []
    finish = None
    usage = None
    async for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert len("".join(pieces).split()) == 30
    assert finish == "stop" and usage is not None and usage.total_tokens > 30


async def test_models(client: openai.AsyncOpenAI) -> None:
    models = [m.id async for m in client.models.list()]
    assert models == ["sim-flagship", "sim-small"]


@pytest.mark.parametrize(
    "dialect, error",
    [
        ("openai-429", openai.RateLimitError),
        ("azure-429", openai.RateLimitError),
        ("gemini-429", openai.RateLimitError),
        ("openai-503", openai.InternalServerError),
        ("anthropic-529", openai.InternalServerError),
        ("capacity-text", openai.InternalServerError),
    ],
)
async def test_rejections_raise_the_sdk_errors(
    sim: SimHandle, client: openai.AsyncOpenAI, dialect: str, error: type[openai.APIStatusError]
) -> None:
    sim.simulator.configure("sim-flagship", slots=0, dialect=dialect, hint=1.5)
    with pytest.raises(error) as info:
        await client.chat.completions.create(model="sim-flagship", messages=MESSAGES)
    assert info.value.status_code in (429, 503, 529)
    if dialect == "capacity-text":
        assert info.value.response.text == "Selected model is at capacity. Please try a different model."
    # the other model still answers
    reply = await client.chat.completions.create(model="sim-small", messages=MESSAGES)
    assert reply.choices[0].message.content


async def test_client_errors(sim: SimHandle, client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(
            model="sim-flagship", messages=[{"role": "user", "content": "x" * 8000}], max_tokens=100
        )
    assert info.value.code == "context_length_exceeded"
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key="sk-wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model="sim-flagship", messages=MESSAGES)
