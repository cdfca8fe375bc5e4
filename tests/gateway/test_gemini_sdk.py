"""The real google-genai SDK against the gateway's Gemini API, on models of the simulator's
other wires (OpenAI's chat completions, Anthropic's Messages): generate_content plain and
streamed (text, usage, finish reason), a function call and its response, countTokens, the
key as ``x-goog-api-key`` or ``?key=``, both API versions (v1beta, v1), the gateway's
errors as the SDK's typed exceptions in Google's shape (every model at capacity: 503
UNAVAILABLE; rate-limited: 429 RESOURCE_EXHAUSTED with its RetryInfo), and a stream broken
after output ending with Google's error object, which the SDK raises on after the chunks
it yielded. The clients built for Vertex AI (google-genai with ``vertexai=True``, the anthropic
SDK's ``AnthropicVertex``) reach the gateway by their base URL too."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anthropic
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from google.oauth2.credentials import Credentials

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import Scenario
from tests.gateway.helpers import WEATHER_TOOL, running, scenario, spec
from tests.support.configs import google_models
from tests.support.simulated import sim_model

pytestmark = pytest.mark.looptime

CLIENT = "sk-gw-client-gemini-7d6e5f40"
KEYS = 'keys = [{ env = "GW_CLIENT", alias = "team" }]'
ENVIRON = {"GW_CLIENT": CLIENT}
# claude on the simulator's Anthropic wire, then flagship on its OpenAI wire
TWO = {"models": ("claude", "flagship"), "anthropic": ("claude",), "gateway": KEYS, "environ": ENVIRON}
HI: Any = [{"role": "user", "content": "Say something about capacity."}]
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


def two_providers(**kw: Any) -> Any:
    return scenario(spec("claude", api="anthropic", **kw), spec("flagship", **kw))


@pytest.mark.parametrize("version", ["v1beta", "v1"])
async def test_generate_content_plain_and_streamed_on_either_wire(version: str) -> None:
    async with running(two_providers(), **TWO) as gw:
        sdk = gw.gemini(CLIENT, version=version).aio
        config = types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=100)
        plain = await sdk.models.generate_content(model="claude", contents="Say hi", config=config)
        chunks = [
            c
            async for c in await sdk.models.generate_content_stream(
                model="flagship", contents="Say hi", config=types.GenerateContentConfig(max_output_tokens=5)
            )
        ]
        counted = await sdk.models.count_tokens(model="auto", contents="Say hi")
    assert plain.text is not None and len(plain.text.split()) == 12
    assert plain.candidates is not None and plain.candidates[0].finish_reason == types.FinishReason.STOP
    assert plain.usage_metadata is not None and plain.usage_metadata.candidates_token_count == 12
    assert plain.usage_metadata.prompt_token_count and plain.usage_metadata.prompt_token_count > 0
    assert plain.sdk_http_response is not None and plain.sdk_http_response.headers is not None
    h = plain.sdk_http_response.headers
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-fallbacks"]) == ("claude", "anthropic", "0")
    text = "".join(c.text or "" for c in chunks)
    assert len(text.split()) == 5 and len(chunks) >= 2
    last = chunks[-1]
    assert last.candidates is not None and last.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert last.usage_metadata is not None and last.usage_metadata.candidates_token_count == 5
    assert counted.total_tokens and counted.total_tokens > 0


async def test_a_function_call_and_its_response_round_trip() -> None:
    async with running(two_providers(), **TWO) as gw:
        sdk = gw.gemini(CLIENT).aio
        ask = types.Content(role="user", parts=[types.Part.from_text(text="Weather in Paris?")])
        config = types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[WEATHER])],
            tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        )
        results = {}
        for model in ("claude", "flagship"):
            called = await sdk.models.generate_content(model=model, contents=[ask], config=config)
            assert called.function_calls, (model, called)
            call = called.function_calls[0]
            assert call.name == "get_weather" and isinstance(call.args, dict) and "city" in call.args
            assert called.candidates is not None and called.candidates[0].content is not None
            answer = types.Part.from_function_response(name="get_weather", response={"forecast": "sunny"})
            turn = [ask, called.candidates[0].content, types.Content(role="user", parts=[answer])]
            results[model] = await sdk.models.generate_content(
                model=model, contents=turn, config=types.GenerateContentConfig(tools=config.tools)
            )
    for model, done in results.items():
        assert done.text, (model, done)
        assert done.candidates is not None and done.candidates[0].finish_reason == types.FinishReason.STOP


async def test_the_key_comes_as_x_goog_api_key_or_as_the_key_parameter() -> None:
    async with running(two_providers(), **TWO) as gw, gw.http() as http:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        by_param = await http.post(f"/v1beta/models/flagship:generateContent?key={CLIENT}", json=body)
        by_header = await http.post(
            "/v1beta/models/flagship:generateContent", json=body, headers={"x-goog-api-key": CLIENT}
        )
        wrong = await http.post("/v1beta/models/flagship:generateContent?key=sk-not-this-one", json=body)
        unknown = await http.post(f"/v1beta/models/nope:generateContent?key={CLIENT}", json=body)
        no_method = await http.post(f"/v1beta/models/flagship:explode?key={CLIENT}", json=body)
        bad = await http.post(f"/v1beta/models/flagship:generateContent?key={CLIENT}", json={"contents": "hi"})
    assert by_param.status_code == by_header.status_code == 200
    assert by_param.json()["candidates"][0]["content"]["role"] == "model"
    assert wrong.status_code == 401 and wrong.json()["error"]["status"] == "UNAUTHENTICATED"
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    assert no_method.status_code == 404 and no_method.json()["error"]["status"] == "NOT_FOUND"
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "contents" in bad.json()["error"]["message"] and "sk-not-this-one" not in wrong.text


async def test_every_model_at_capacity_is_googles_503_unavailable() -> None:
    full = scenario(spec("claude", slots=0, api="anthropic"), spec("flagship", slots=0))
    async with running(full, **TWO) as gw:
        sdk = gw.gemini(CLIENT).aio
        deadline = types.GenerateContentConfig(http_options=types.HttpOptions(headers={"x-capmon-deadline": "2"}))
        with pytest.raises(genai_errors.ServerError) as plain:
            await sdk.models.generate_content(model="auto", contents="hi", config=deadline)
        with pytest.raises(genai_errors.ServerError) as streamed:
            async for _ in await sdk.models.generate_content_stream(model="claude", contents="hi", config=deadline):
                pass
    for info in (plain, streamed):
        assert info.value.code == 503 and info.value.status == "UNAVAILABLE"
        assert "within its deadline" in (info.value.message or "")
        details = info.value.details["error"]["details"]
        assert details[0]["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
        assert int(details[0]["retryDelay"].removesuffix("s")) >= 1


async def test_every_model_rate_limited_is_a_429_resource_exhausted_with_retry_info() -> None:
    limited = scenario(spec("claude", slots=0, api="anthropic", dialect="anthropic-429", hint=7.0))
    async with running(limited, models=("claude",), anthropic=("claude",), gateway=KEYS, environ=ENVIRON) as gw:
        sdk = gw.gemini(CLIENT).aio
        deadline = types.GenerateContentConfig(http_options=types.HttpOptions(headers={"x-capmon-deadline": "3"}))
        with pytest.raises(genai_errors.ClientError) as info:
            await sdk.models.generate_content(model="claude", contents="hi", config=deadline)
    assert info.value.code == 429 and info.value.status == "RESOURCE_EXHAUSTED"
    assert info.value.details["error"]["details"] == [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}
    ]


async def test_a_stream_broken_after_output_ends_with_googles_error_object() -> None:
    async with running(two_providers(answer_tokens=40), **TWO) as gw:
        fault = {
            "mode": "stream_error",
            "after": 3,
            "dialect": "openrouter-stream",
            "model": "sim-flagship",
            "count": 1,
        }
        await gw.sim_admin("faults", fault)
        sdk = gw.gemini(CLIENT).aio
        got: list[str] = []
        no_continue = types.GenerateContentConfig(
            http_options=types.HttpOptions(headers={"x-capmon-continue": "false"})
        )
        with pytest.raises(genai_errors.APIError) as info:
            async for chunk in await sdk.models.generate_content_stream(
                model="flagship", contents="hi", config=no_continue
            ):
                got.append(chunk.text or "")
    assert "".join(got).strip(), "the chunks before the break reached the caller"
    # the upstream's in-stream error was a rate limit (OpenRouter's code 429): Google's word for it
    assert info.value.code == 429 and info.value.status == "RESOURCE_EXHAUSTED"
    assert "request req_" in (info.value.message or "")


async def test_a_stream_without_alt_sse_is_one_json_array() -> None:
    async with running(two_providers(), **TWO) as gw, gw.http() as http:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 4}}
        r = await http.post(f"/v1beta/models/claude:streamGenerateContent?key={CLIENT}", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    chunks = json.loads(r.text)
    assert isinstance(chunks, list) and chunks[-1]["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]).split()


async def test_clients_built_for_vertex_reach_the_gateway_by_their_base_url() -> None:
    async with running(two_providers(), **TWO) as gw:
        vertex = genai.Client(
            vertexai=True,
            project="any-project",
            location="us-central1",
            credentials=Credentials(token=CLIENT),  # sent as Authorization: Bearer
            http_options=types.HttpOptions(base_url=gw.origin),
        ).aio
        plain = await vertex.models.generate_content(model="flagship", contents="Say hi")
        chunks = [c async for c in await vertex.models.generate_content_stream(model="claude", contents="Say hi")]
        claude = anthropic.AsyncAnthropicVertex(
            region="us-east5", project_id="any-project", access_token=CLIENT, base_url=f"{gw.origin}/v1", max_retries=0
        )
        raw = await claude.messages.with_raw_response.create(model="flagship", max_tokens=64, messages=HI)
        message = await raw.parse()
        async with claude.messages.stream(model="claude", max_tokens=5, messages=HI) as stream:
            texts = [t async for t in stream.text_stream]
        counted = await claude.messages.count_tokens(model="claude", messages=HI)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await claude.messages.create(model="nope", max_tokens=5, messages=HI)
        with pytest.raises(genai_errors.ClientError) as gemini_unknown:
            await vertex.models.generate_content(model="nope", contents="hi")
    assert plain.text and plain.sdk_http_response is not None and plain.sdk_http_response.headers is not None
    assert plain.sdk_http_response.headers["x-capmon-model"] == "flagship"
    assert "".join(c.text or "" for c in chunks).split()
    # Claude's Messages body on Vertex, served by a model on the OpenAI wire, answered in Anthropic's shape
    assert raw.headers["x-capmon-api"] == "openai" and message.stop_reason == "end_turn"
    assert len("".join(texts).split()) == 5 and counted.input_tokens > 0
    assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert gemini_unknown.value.code == 404 and gemini_unknown.value.status == "NOT_FOUND"


async def test_models_on_googles_wires_serve_every_sdk_through_the_gateway() -> None:
    # flash on the Gemini API (then Vertex AI), claude on Vertex AI: both of Google's dialects
    scn = Scenario(
        models=(
            sim_model("flash", 4, api="gemini+vertex"),
            dataclasses.replace(sim_model("x", 4, api="vertex"), name="claude-v"),
            sim_model("backup"),
        )
    )
    environ = {"KEY": SIMULATOR_DEMO_KEY}
    async with running(scn, built=lambda url: google_models(url.removesuffix("/v1")), environ=environ) as gw:
        async with gw.openai() as openai_sdk, gw.anthropic() as anthropic_sdk:
            chat = await openai_sdk.chat.completions.with_raw_response.create(
                model="flash",
                messages=[{"role": "user", "content": "Weather in Paris?"}],
                tools=[WEATHER_TOOL],  # type: ignore[list-item]
                tool_choice="required",
            )
            message = await anthropic_sdk.messages.create(model="flash", max_tokens=64, messages=HI)
            async with anthropic_sdk.messages.stream(model="claude", max_tokens=5, messages=HI) as stream:
                texts = [t async for t in stream.text_stream]
        gemini = gw.gemini().aio
        same = await gemini.models.generate_content(model="flash", contents="Say hi")
        on_vertex = await gemini.models.generate_content(model="claude", contents="Say hi")
    call = chat.parse().choices[0].message.tool_calls
    assert chat.headers["x-capmon-api"] == "gemini" and call and call[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert message.content[0].type == "text" and message.content[0].text and message.stop_reason == "end_turn"
    assert len("".join(texts).split()) == 5
    assert same.text and same.sdk_http_response is not None and same.sdk_http_response.headers is not None
    assert same.sdk_http_response.headers["x-capmon-api"] == "gemini"
    assert (
        on_vertex.text and on_vertex.sdk_http_response is not None and on_vertex.sdk_http_response.headers is not None
    )
    assert on_vertex.sdk_http_response.headers["x-capmon-api"] == "vertex"
