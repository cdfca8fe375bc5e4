"""Azure OpenAI's URL shapes over loopback with the real openai SDK: ``AzureOpenAI`` on the
classic deployment URLs (``api-key`` header, ``api-version`` query) and ``OpenAI`` on the v1
URLs, Azure's own errors and stream framing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import openai
import pytest

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import HELLO, data_frames

SCENARIO = Scenario(
    name="azure",
    models=(
        ModelSpec(
            name="sim-azure",
            api="azure",
            slots=4,
            base_latency=0.001,
            per_token=0.0,
            noise=0.0,
            answer_tokens=12,
        ),
        ModelSpec(name="sim-gpt", slots=4, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=5),
    ),
)
VERSION = "2024-10-21"
MESSAGES: Any = HELLO


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


@pytest.fixture
async def classic(sim: SimHandle) -> AsyncIterator[openai.AsyncAzureOpenAI]:
    async with openai.AsyncAzureOpenAI(
        azure_endpoint=sim.origin, api_version=VERSION, api_key=SIMULATOR_DEMO_KEY, max_retries=0
    ) as c:
        yield c


@pytest.fixture
async def v1(sim: SimHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{sim.origin}/openai/v1/", api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        yield c


async def test_classic_chat_on_the_deployment_url(classic: openai.AsyncAzureOpenAI) -> None:
    raw = await classic.chat.completions.with_raw_response.create(model="sim-azure", messages=MESSAGES)
    sent = raw.http_request
    assert sent.url.path == "/openai/deployments/sim-azure/chat/completions"
    assert sent.url.params["api-version"] == VERSION and sent.headers["api-key"] == SIMULATOR_DEMO_KEY
    assert "authorization" not in sent.headers
    reply = raw.parse()
    assert reply.model == "sim-azure" and len((reply.choices[0].message.content or "").split()) == 12


async def test_classic_stream_starts_with_the_prompt_filter_chunk(classic: openai.AsyncAzureOpenAI) -> None:
    stream = await classic.chat.completions.create(model="sim-azure", messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    first = chunks[0]
    assert first.choices == [] and first.id == ""
    assert cast(Any, first).prompt_filter_results[0]["content_filter_results"]["hate"]["filtered"] is False
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].delta)
    assert len(text.split()) == 12


async def test_classic_responses(classic: openai.AsyncAzureOpenAI) -> None:
    reply = await classic.responses.create(model="sim-azure", input="Say something.")
    assert reply.status == "completed" and len(reply.output_text.split()) == 12


async def test_v1_chat_and_responses(sim: SimHandle, v1: openai.AsyncOpenAI, http: httpx.AsyncClient) -> None:
    reply = await v1.chat.completions.create(model="sim-azure", messages=MESSAGES)
    assert reply.model == "sim-azure" and reply.choices[0].finish_reason == "stop"
    answered = await v1.responses.create(model="sim-azure", input="Say something.")
    assert answered.status == "completed"
    # Azure's own header alone is enough
    r = await http.post(
        f"{sim.origin}/openai/v1/chat/completions",
        json={"model": "sim-azure", "messages": MESSAGES, "stream": True},
        headers={"api-key": SIMULATOR_DEMO_KEY},
    )
    assert r.status_code == 200 and data_frames(r.text)[0]["choices"] == []


async def test_missing_api_version_is_a_400(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await http.post(
        f"{sim.origin}/openai/deployments/sim-azure/chat/completions",
        json={"messages": MESSAGES},
        headers={"api-key": SIMULATOR_DEMO_KEY},
    )
    assert r.status_code == 400
    assert r.json() == {"error": {"code": "BadRequest", "message": "Missing required query parameter: api-version"}}


async def test_rate_limited_in_azures_words(sim: SimHandle, classic: openai.AsyncAzureOpenAI) -> None:
    sim.simulator.configure("sim-azure", slots=0, hint=4.2)  # the azure wire's own dialect: azure-429
    with pytest.raises(openai.RateLimitError) as info:
        await classic.chat.completions.create(model="sim-azure", messages=MESSAGES)
    h = info.value.response.headers
    assert h["retry-after"] == "5" and h["retry-after-ms"] == "4200"
    message = cast(Any, info.value.body)["message"]
    assert message.startswith(
        f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {VERSION} "
        "have exceeded call rate limit"
    )
    assert message.endswith("Please retry after 5 seconds.")


async def test_azures_auth_and_deployment_errors(sim: SimHandle, classic: openai.AsyncAzureOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        await classic.chat.completions.create(model="sim-gpt", messages=MESSAGES)  # not deployed on Azure
    assert cast(Any, missing.value.body)["code"] == "DeploymentNotFound"
    async with openai.AsyncAzureOpenAI(
        azure_endpoint=sim.origin, api_version=VERSION, api_key="sk-wrong", max_retries=0
    ) as bad:
        with pytest.raises(openai.AuthenticationError) as denied:
            await bad.chat.completions.create(model="sim-azure", messages=MESSAGES)
    assert cast(Any, denied.value.body)["message"].startswith("Access denied due to invalid subscription key")
    assert "sk-wrong" not in denied.value.response.text


async def test_azure_models_are_not_on_openais_urls(sim: SimHandle) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(model="sim-azure", messages=MESSAGES)
        assert (await c.chat.completions.create(model="sim-gpt", messages=MESSAGES)).choices
