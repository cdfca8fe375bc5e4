"""Vertex AI on the simulator, through the real SDKs over loopback: google-genai in Vertex
mode (v1beta1, an OAuth token as Bearer) for Gemini, AnthropicVertex (rawPredict and
streamRawPredict, anthropic_version in the body, the model in the URL) for Claude. The same
model is served on each wire its scenario names (gemini+vertex: one model, one set of slots,
two APIs); Google's front end answers the token and the model in Google's shape, Claude
its own errors in Anthropic's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import anthropic
import google.oauth2.credentials
import httpx
import httpx2
import pytest
from google import genai
from google.genai import errors, types

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.app import create_app, simulator_of
from capmon.sim.faults import parse_rules
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle

PROJECT, REGION = "capmon-test", "us-east5"


def _model(name: str, api: str) -> ModelSpec:
    return ModelSpec(
        name=name, api=api, slots=2, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=10, context_window=2000
    )


SCENARIO = Scenario(
    name="vertex",
    models=(
        _model("gemini-flash", "gemini+vertex"),
        _model("claude-sonnet", "anthropic+vertex"),
        _model("gemini-only", "gemini"),
    ),
)
HELLO: Any = [{"role": "user", "content": "Say something about capacity."}]
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}, required=["city"]
    ),
)
TOOLS = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[WEATHER])])


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


def google_sdk(sim: SimHandle, token: str = SIMULATOR_DEMO_KEY) -> genai.client.AsyncClient:
    credentials = google.oauth2.credentials.Credentials(token=token)  # type: ignore[no-untyped-call]
    return genai.Client(
        vertexai=True,
        project=PROJECT,
        location=REGION,
        credentials=credentials,
        http_options=types.HttpOptions(base_url=sim.origin),
    ).aio


def claude_sdk(sim: SimHandle, token: str = SIMULATOR_DEMO_KEY) -> anthropic.AsyncAnthropicVertex:
    return anthropic.AsyncAnthropicVertex(
        region=REGION, project_id=PROJECT, access_token=token, base_url=f"{sim.origin}/v1", max_retries=0
    )


@pytest.fixture
async def gemini(sim: SimHandle) -> AsyncIterator[genai.client.AsyncClient]:
    async with google_sdk(sim) as c:
        yield c


@pytest.fixture
async def claude(sim: SimHandle) -> AsyncIterator[anthropic.AsyncAnthropicVertex]:
    async with claude_sdk(sim) as c:
        yield c


# ---------------------------------------------------------------- Gemini on Vertex


async def test_gemini_plain_streamed_and_usage(sim: SimHandle, gemini: genai.client.AsyncClient) -> None:
    r = await gemini.models.generate_content(model="gemini-flash", contents="Hello.")
    assert r.text and len(r.text.split()) == 10 and r.usage_metadata
    assert r.usage_metadata.total_token_count == (r.usage_metadata.prompt_token_count or 0) + 10
    chunks = [c async for c in await gemini.models.generate_content_stream(model="gemini-flash", contents="Hello.")]
    assert len("".join(c.text or "" for c in chunks).split()) == 10
    assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert sim.simulator.stats()["models"]["gemini-flash"]["completed"] == 2
    counted = await gemini.models.count_tokens(model="gemini-flash", contents="Hello.")
    assert counted.total_tokens == r.usage_metadata.prompt_token_count


async def test_gemini_function_call_round(gemini: genai.client.AsyncClient) -> None:
    ask = "Call get_weather for Paris."
    r = await gemini.models.generate_content(model="gemini-flash", contents=ask, config=TOOLS)
    (call,) = r.function_calls or []
    assert call.name == "get_weather" and call.args == {"city": "sample"}
    history = [
        types.Content(role="user", parts=[types.Part(text=ask)]),
        types.Content(role="model", parts=[types.Part(function_call=call)]),
        types.Content(
            role="user", parts=[types.Part.from_function_response(name="get_weather", response={"output": "rain"})]
        ),
    ]
    answer = await gemini.models.generate_content(model="gemini-flash", contents=history, config=TOOLS)
    assert answer.text and answer.text.startswith("The tool returned: rain")


async def test_one_model_two_wires_one_set_of_slots(sim: SimHandle, gemini: genai.client.AsyncClient) -> None:
    """gemini+vertex: the Gemini API's client and Vertex's share the model's slots."""
    direct = genai.Client(api_key=SIMULATOR_DEMO_KEY, http_options=types.HttpOptions(base_url=sim.origin)).aio
    await direct.models.generate_content(model="gemini-flash", contents="Hello.")
    await gemini.models.generate_content(model="gemini-flash", contents="Hello.")
    assert sim.simulator.stats()["models"]["gemini-flash"]["completed"] == 2
    sim.simulator.configure("gemini-flash", slots=0)  # its dialect is gemini-503 on both
    for c in (direct, gemini):
        with pytest.raises(errors.ServerError):
            await c.models.generate_content(model="gemini-flash", contents="Hello.")


async def test_vertex_429_the_shared_pool(sim: SimHandle, gemini: genai.client.AsyncClient) -> None:
    sim.simulator.configure("gemini-flash", slots=0, dialect="vertex-429")
    with pytest.raises(errors.ClientError) as info:
        await gemini.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert info.value.message == "Resource exhausted, please try again later."


async def test_vertex_quota_429_in_a_list(
    sim: SimHandle, gemini: genai.client.AsyncClient, http: httpx.AsyncClient
) -> None:
    sim.simulator.configure("gemini-flash", slots=0, dialect="vertex-quota-429", hint=3)
    url = f"{sim.origin}/v1/projects/{PROJECT}/locations/{REGION}/publishers/google/models/gemini-flash:generateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "Hello."}]}]}
    r = await http.post(url, json=body, headers={"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"})
    assert r.status_code == 429 and isinstance(r.json(), list)
    with pytest.raises(errors.ClientError) as info:  # the SDK unwraps the one-item list
        await gemini.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert info.value.details["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}
    ]


async def test_a_wrong_token_is_401(sim: SimHandle) -> None:
    async with google_sdk(sim, token="ya29.wrong") as c:
        with pytest.raises(errors.ClientError) as info:
            await c.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (401, "UNAUTHENTICATED")
    async with claude_sdk(sim, token="ya29.wrong") as a:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            await a.messages.create(model="claude-sonnet", max_tokens=10, messages=HELLO)
    assert cast(Any, denied.value.body)["error"]["status"] == "UNAUTHENTICATED"  # Google's front end


async def test_a_model_not_on_vertex_is_googles_404(
    gemini: genai.client.AsyncClient, claude: anthropic.AsyncAnthropicVertex
) -> None:
    with pytest.raises(errors.ClientError) as info:
        await gemini.models.generate_content(model="gemini-only", contents="Hello.")
    assert (info.value.code, info.value.status) == (404, "NOT_FOUND")
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.messages.create(model="gemini-only", max_tokens=10, messages=HELLO)
    assert cast(Any, missing.value.body)["error"]["status"] == "NOT_FOUND"


async def test_gemini_in_stream_error_on_vertex(sim: SimHandle, gemini: genai.client.AsyncClient) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": 1, "dialect": "gemini-stream"}))
    seen: list[str] = []
    with pytest.raises(errors.ServerError) as info:
        async for chunk in await gemini.models.generate_content_stream(model="gemini-flash", contents="Hello."):
            seen.append(chunk.text or "")
    assert len(seen) == 1 and seen[0] and info.value.code == 503


# ---------------------------------------------------------------- Claude on Vertex


async def test_claude_plain_and_streamed(sim: SimHandle, claude: anthropic.AsyncAnthropicVertex) -> None:
    m = await claude.messages.create(model="claude-sonnet", max_tokens=50, messages=HELLO)
    assert m.model == "claude-sonnet" and m.stop_reason == "end_turn" and m.usage.output_tokens == 10
    async with claude.messages.stream(model="claude-sonnet", max_tokens=50, messages=HELLO) as stream:
        text = "".join([t async for t in stream.text_stream])
    assert len(text.split()) == 10
    counted = await claude.messages.count_tokens(model="claude-sonnet", messages=HELLO)
    assert counted.input_tokens == m.usage.input_tokens
    # the same model on Anthropic's own wire: one model, its slots counted once
    async with anthropic.AsyncAnthropic(base_url=sim.origin, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as direct:
        await direct.messages.create(model="claude-sonnet", max_tokens=50, messages=HELLO)
    assert sim.simulator.stats()["models"]["claude-sonnet"]["completed"] == 3


async def test_claude_overloaded_529(sim: SimHandle, claude: anthropic.AsyncAnthropicVertex) -> None:
    sim.simulator.configure("claude-sonnet", slots=0)  # anthropic+vertex: anthropic-529
    with pytest.raises(anthropic.OverloadedError) as info:
        await claude.messages.create(model="claude-sonnet", max_tokens=10, messages=HELLO)
    assert info.value.status_code == 529 and info.value.body == OVERLOADED


async def test_claude_overloaded_inside_the_stream(sim: SimHandle, claude: anthropic.AsyncAnthropicVertex) -> None:
    sim.simulator.configure("claude-sonnet", slots=0, dialect="anthropic-stream")
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as info:
        stream = await claude.messages.create(model="claude-sonnet", max_tokens=10, messages=HELLO, stream=True)
        async for event in stream:
            seen.append(event.type)
    assert seen == ["message_start"] and info.value.body == OVERLOADED


async def test_claude_bad_request_in_anthropics_shape(claude: anthropic.AsyncAnthropicVertex) -> None:
    long: Any = [{"role": "user", "content": "x" * 9000}]
    with pytest.raises(anthropic.BadRequestError) as info:
        await claude.messages.create(model="claude-sonnet", max_tokens=10, messages=long)
    assert cast(Any, info.value.body)["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("version", "status"),
    [("vertex-2023-10-16", 200), ("2026-10-21", 400), (None, 400), ("2099-01-01", 400)],
)
async def test_the_version_in_the_body(
    sim: SimHandle, http: httpx.AsyncClient, version: str | None, status: int
) -> None:
    """The documented vertex-2023-10-16 keeps the old rules (it takes temperature); the
    2026-10-21 that AnthropicVertex 2.x sends refuses it; none or an unknown one is a 400."""
    body: dict[str, Any] = {"messages": HELLO, "max_tokens": 10, "temperature": 0.5}
    if version is not None:
        body["anthropic_version"] = version
    url = f"{sim.origin}/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/claude-sonnet:rawPredict"
    r = await http.post(url, json=body, headers={"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"})
    assert r.status_code == status
    if status == 400:
        assert r.json()["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------- the demo


@pytest.mark.looptime
async def test_the_demo_serves_one_gemini_on_two_wires_and_claude_on_vertex() -> None:
    """The bundled demo, in-process on a fast-forwarded loop: sim-gemini-flash on the Gemini
    API and on Vertex AI at once (one set of slots, narrowed to 2 from 40 s to 55 s), and
    sim-claude-vertex through AnthropicVertex."""
    app = create_app("demo")
    # google-genai takes an httpx client, anthropic 2.x an httpx2 one: both into the same app
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as http,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)) as http2,
    ):
        options = types.HttpOptions(base_url="http://sim", httpx_async_client=http)
        direct = genai.Client(api_key=SIMULATOR_DEMO_KEY, http_options=options).aio
        credentials = google.oauth2.credentials.Credentials(token=SIMULATOR_DEMO_KEY)  # type: ignore[no-untyped-call]
        vertex = genai.Client(
            vertexai=True, project=PROJECT, location=REGION, credentials=credentials, http_options=options
        ).aio
        for c in (direct, vertex):
            r = await c.models.generate_content(model="sim-gemini-flash", contents="Hello.")
            assert r.text and r.model_version == "sim-gemini-flash"
        claude = anthropic.AsyncAnthropicVertex(
            region=REGION,
            project_id=PROJECT,
            access_token=SIMULATOR_DEMO_KEY,
            base_url="http://sim/v1",
            http_client=http2,
        )
        m = await claude.messages.create(model="sim-claude-vertex", max_tokens=20, messages=HELLO)
        assert m.stop_reason == "max_tokens"

        await asyncio.sleep(41 - simulator_of(app).elapsed())  # into the narrow phase
        held = [
            asyncio.create_task(c.models.generate_content(model="sim-gemini-flash", contents="Hello."))
            for c in (direct, vertex)
        ]
        await asyncio.sleep(0.1)  # both admitted: the two slots the model has
        for c in (direct, vertex):
            with pytest.raises(errors.ServerError) as info:
                await c.models.generate_content(model="sim-gemini-flash", contents="Hello.")
            assert info.value.code == 503
        assert all([(await t).text for t in held])
