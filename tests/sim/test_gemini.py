"""The official google-genai SDK (3.6, Gemini API mode: x-goog-api-key, /v1 unless told
v1beta) talks to the simulator's Gemini API over loopback: answers, streams (SSE and the
JSON array), function calls and their responses, usage, countTokens and models.get, and
each error as the SDK's own exception, the in-stream one (Google's raw error object after
some chunks) included."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.faults import parse_rules
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle

ANSWER_TOKENS = 12
SCENARIO = Scenario(
    name="gemini",
    models=(
        ModelSpec(
            name="gemini-flash",
            api="gemini",
            slots=4,
            base_latency=0.001,
            per_token=0.0,
            noise=0.0,
            answer_tokens=ANSWER_TOKENS,
            context_window=2000,
        ),
        ModelSpec(name="sim-gpt", slots=4, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=5),
    ),
)
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="The weather in a city.",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "city": types.Schema(type=types.Type.STRING),
            "days": types.Schema(type=types.Type.INTEGER, minimum=1),
        },
        required=["city", "days"],
    ),
)
TOOLS = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[WEATHER])])
ASK = "Call get_weather for Paris, please."
KEY_HEADERS = {"x-goog-api-key": SIMULATOR_DEMO_KEY}


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


def sdk(sim: SimHandle, *, key: str = SIMULATOR_DEMO_KEY, version: str | None = None) -> genai.Client:
    """The SDK as it ships (it retries nothing unless told), pointed at the simulator."""
    return genai.Client(api_key=key, http_options=types.HttpOptions(base_url=sim.origin, api_version=version))


@pytest.fixture(params=["v1", "v1beta"])
async def client(request: pytest.FixtureRequest, sim: SimHandle) -> AsyncIterator[genai.client.AsyncClient]:
    async with sdk(sim, version=request.param).aio as c:
        yield c


def _url(sim: SimHandle, method: str, *, model: str = "gemini-flash", query: str = "") -> str:
    return f"{sim.origin}/v1beta/models/{model}:{method}{query}"


HELLO = {"contents": [{"role": "user", "parts": [{"text": "Say something about capacity."}]}]}


# ---------------------------------------------------------------- answers


async def test_plain_answer_and_its_usage(client: genai.client.AsyncClient) -> None:
    r = await client.models.generate_content(model="gemini-flash", contents="Say something about capacity.")
    assert r.text and len(r.text.split()) == ANSWER_TOKENS
    (candidate,) = r.candidates or []
    assert (
        candidate.finish_reason == types.FinishReason.STOP and candidate.content and candidate.content.role == "model"
    )
    u = r.usage_metadata
    assert u is not None and u.candidates_token_count == ANSWER_TOKENS
    assert u.prompt_token_count and u.total_token_count == u.prompt_token_count + ANSWER_TOKENS
    assert r.model_version == "gemini-flash" and r.response_id
    counted = await client.models.count_tokens(model="gemini-flash", contents="Say something about capacity.")
    assert counted.total_tokens == u.prompt_token_count  # countTokens counts as usage does


async def test_system_instruction_counts(client: genai.client.AsyncClient) -> None:
    bare = await client.models.generate_content(model="gemini-flash", contents="Hi.")
    told = await client.models.generate_content(
        model="gemini-flash", contents="Hi.", config=types.GenerateContentConfig(system_instruction="Be brief. " * 20)
    )
    assert bare.usage_metadata and told.usage_metadata
    assert (told.usage_metadata.prompt_token_count or 0) > (bare.usage_metadata.prompt_token_count or 0)


async def test_inline_data_is_taken(client: genai.client.AsyncClient) -> None:
    picture = types.Part.from_bytes(data=b"\x89PNG\r\n\x1a\n", mime_type="image/png")
    r = await client.models.generate_content(model="gemini-flash", contents=[picture, "What is this?"])
    assert r.text and r.candidates and r.candidates[0].finish_reason == types.FinishReason.STOP


async def test_max_output_tokens_cuts_the_answer(client: genai.client.AsyncClient) -> None:
    config = types.GenerateContentConfig(max_output_tokens=3)
    r = await client.models.generate_content(model="gemini-flash", contents="Hello.", config=config)
    assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r.text and len(r.text.split()) == 3 and r.usage_metadata and r.usage_metadata.candidates_token_count == 3


async def test_a_stop_sequence_ends_the_answer_before_it(client: genai.client.AsyncClient) -> None:
    # Every answer's second word follows a space: the answer stops after its first word.
    config = types.GenerateContentConfig(stop_sequences=[" "])
    r = await client.models.generate_content(model="gemini-flash", contents="Hello.", config=config)
    assert r.text and " " not in r.text
    assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata and r.usage_metadata.candidates_token_count == 1
    stream = await client.models.generate_content_stream(model="gemini-flash", contents="Hello.", config=config)
    (chunk,) = [c async for c in stream]
    assert chunk.text and " " not in chunk.text
    assert chunk.candidates and chunk.candidates[0].finish_reason == types.FinishReason.STOP


async def test_streamed_text(client: genai.client.AsyncClient) -> None:
    chunks = [c async for c in await client.models.generate_content_stream(model="gemini-flash", contents="Hello.")]
    assert len(chunks) > 1
    text = "".join(c.text or "" for c in chunks)
    assert len(text.split()) == ANSWER_TOKENS
    *pieces, last = chunks
    assert all(p.candidates and p.candidates[0].finish_reason is None and p.usage_metadata is None for p in pieces)
    assert last.candidates and last.candidates[0].finish_reason == types.FinishReason.STOP
    assert last.usage_metadata and last.usage_metadata.candidates_token_count == ANSWER_TOKENS
    assert len({c.response_id for c in chunks}) == 1


async def test_the_stream_on_the_wire(sim: SimHandle, http: httpx.AsyncClient) -> None:
    """?alt=sse: data events apart by CRLF CRLF; without it, one JSON array of the same chunks."""
    r = await http.post(_url(sim, "streamGenerateContent", query="?alt=sse"), json=HELLO, headers=KEY_HEADERS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.text.split("\r\n\r\n")
    assert events[-1] == "" and all(e.startswith("data: ") for e in events[:-1])
    sse = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    r = await http.post(_url(sim, "streamGenerateContent", query=f"?key={SIMULATOR_DEMO_KEY}"), json=HELLO)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    array = r.json()
    assert isinstance(array, list) and len(array) == len(sse)
    assert array[-1]["candidates"][0]["finishReason"] == "STOP" and "usageMetadata" in array[-1]


# ---------------------------------------------------------------- function calls


async def test_a_function_call_and_its_response(client: genai.client.AsyncClient) -> None:
    r = await client.models.generate_content(model="gemini-flash", contents=ASK, config=TOOLS)
    (call,) = r.function_calls or []
    assert call.name == "get_weather" and call.args == {"city": "sample", "days": 1}
    assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata and r.usage_metadata.candidates_token_count
    history = [
        types.Content(role="user", parts=[types.Part(text=ASK)]),
        types.Content(role="model", parts=[types.Part(function_call=call)]),
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="get_weather", response={"output": "sunny, 21 C"})],
        ),
    ]
    answer = await client.models.generate_content(model="gemini-flash", contents=history, config=TOOLS)
    assert not answer.function_calls and answer.text and answer.text.startswith("The tool returned: sunny, 21 C")


async def test_a_streamed_function_call_arrives_whole(client: genai.client.AsyncClient) -> None:
    stream = await client.models.generate_content_stream(model="gemini-flash", contents=ASK, config=TOOLS)
    chunks = [c async for c in stream]
    calls = [fc for c in chunks for fc in c.function_calls or []]
    assert len(calls) == 1 and calls[0].args == {"city": "sample", "days": 1}
    assert chunks[-1].candidates and chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP


@pytest.mark.parametrize(("mode", "calls"), [("ANY", True), ("NONE", False), ("AUTO", False)])
async def test_the_function_calling_mode(client: genai.client.AsyncClient, mode: str, calls: bool) -> None:
    config = types.GenerateContentConfig(
        tools=TOOLS.tools,
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=mode)),  # type: ignore[arg-type]
    )
    r = await client.models.generate_content(model="gemini-flash", contents="Hello there.", config=config)
    assert bool(r.function_calls) is calls


async def test_a_broken_call_is_malformed(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "broken_tool_args"}))
    r = await client.models.generate_content(model="gemini-flash", contents=ASK, config=TOOLS)
    assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.MALFORMED_FUNCTION_CALL
    assert r.candidates[0].content is None and not r.function_calls


# ---------------------------------------------------------------- models


async def test_models_get_and_list(sim: SimHandle, client: genai.client.AsyncClient, http: httpx.AsyncClient) -> None:
    model = await client.models.get(model="gemini-flash")
    assert model.name == "models/gemini-flash" and model.input_token_limit == 2000
    r = await http.get(f"{sim.origin}/v1beta/models", headers=KEY_HEADERS)
    assert [m["name"] for m in r.json()["models"]] == ["models/gemini-flash"]
    r = await http.get(f"{sim.origin}/v1/models", params={"key": SIMULATOR_DEMO_KEY})
    assert [m["name"] for m in r.json()["models"]] == ["models/gemini-flash"]


# ---------------------------------------------------------------- errors


def _error(e: errors.APIError) -> Any:
    return e.details["error"]


async def test_overloaded_503(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.configure("gemini-flash", slots=0)  # the gemini wire's own dialect: gemini-503
    with pytest.raises(errors.ServerError) as info:
        await client.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (503, "UNAVAILABLE")
    assert info.value.message == "The model is overloaded. Please try again later."


async def test_rate_limited_429_with_its_details(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.configure("gemini-flash", slots=0, dialect="gemini-429", hint=25.46)
    with pytest.raises(errors.ClientError) as info:
        await client.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert info.value.message and info.value.message.endswith("Please retry in 25.46s.")
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in _error(info.value)["details"]}
    (violation,) = details["QuotaFailure"]["violations"]
    assert violation["quotaId"] == "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
    assert violation["quotaDimensions"]["model"] == "gemini-flash"
    assert details["RetryInfo"]["retryDelay"] == "25.460s"


async def test_a_wrong_key_is_a_400(sim: SimHandle) -> None:
    with pytest.raises(errors.ClientError) as info:
        await sdk(sim, key="AIza-wrong").aio.models.generate_content(model="gemini-flash", contents="Hello.")
    assert (info.value.code, info.value.status) == (400, "INVALID_ARGUMENT")
    (reason,) = [d["reason"] for d in _error(info.value)["details"] if d["@type"].endswith("ErrorInfo")]
    assert reason == "API_KEY_INVALID"


async def test_no_key_is_a_403(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await http.post(_url(sim, "generateContent"), json=HELLO)
    assert r.status_code == 403 and r.json()["error"]["status"] == "PERMISSION_DENIED"


@pytest.mark.parametrize("model", ["gemini-nope", "sim-gpt"])  # unknown, and another wire's
async def test_a_model_not_served_here_is_a_404(client: genai.client.AsyncClient, model: str) -> None:
    with pytest.raises(errors.ClientError) as info:
        await client.models.generate_content(model=model, contents="Hello.")
    assert (info.value.code, info.value.status) == (404, "NOT_FOUND")
    assert info.value.message and info.value.message.startswith(f"models/{model} is not found")


@pytest.mark.parametrize(
    "body",
    [
        {"contents": []},
        {"contents": [{"role": "user", "parts": [{"nothing": 1}]}]},
        {**HELLO, "generationConfig": {"maxOutputTokens": 0}},
        {**HELLO, "tools": [{"functionDeclarations": [{"description": "no name"}]}]},
    ],
)
async def test_a_bad_body_is_invalid_argument(sim: SimHandle, http: httpx.AsyncClient, body: Any) -> None:
    r = await http.post(_url(sim, "generateContent"), json=body, headers=KEY_HEADERS)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    r = await http.post(_url(sim, "generateContent"), content=b"{not json", headers=KEY_HEADERS)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


async def test_prompt_too_long(client: genai.client.AsyncClient) -> None:
    with pytest.raises(errors.ClientError) as info:
        await client.models.generate_content(model="gemini-flash", contents="x" * 9000)
    assert info.value.code == 400 and info.value.message
    assert "exceeds the maximum number of tokens allowed (2000)" in info.value.message


@pytest.mark.parametrize(("status", "error"), [(403, errors.ClientError), (500, errors.ServerError)])
async def test_error_fault_in_googles_shape(
    sim: SimHandle, client: genai.client.AsyncClient, status: int, error: type[errors.APIError]
) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "error", "status": status}))
    with pytest.raises(error) as info:
        await client.models.generate_content(model="gemini-flash", contents="Hello.")
    assert info.value.code == status and info.value.status in ("PERMISSION_DENIED", "INTERNAL")


# ---------------------------------------------------------------- errors inside the stream


async def _stream_until_error(client: genai.client.AsyncClient) -> tuple[list[str], errors.APIError]:
    seen: list[str] = []
    with pytest.raises(errors.APIError) as info:
        async for chunk in await client.models.generate_content_stream(model="gemini-flash", contents="Hello."):
            seen.append(chunk.text or "")
    return seen, info.value


async def test_full_model_rejects_inside_the_stream(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.configure("gemini-flash", slots=0, dialect="gemini-stream")
    seen, err = await _stream_until_error(client)
    assert seen == [] and isinstance(err, errors.ServerError) and (err.code, err.status) == (503, "UNAVAILABLE")
    # the plain request gets the 503 that object stands for
    with pytest.raises(errors.ServerError):
        await client.models.generate_content(model="gemini-flash", contents="Hello.")


async def test_stream_error_fault_after_some_chunks(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": 2, "dialect": "gemini-stream"}))
    seen, err = await _stream_until_error(client)
    assert len(seen) == 2 and all(seen)  # the SDK yielded what came, then raised
    assert isinstance(err, errors.ServerError) and err.code == 503
    assert err.message and err.message.startswith("This model is currently experiencing high demand.")


async def test_the_in_stream_error_on_the_wire(sim: SimHandle, http: httpx.AsyncClient) -> None:
    """Google's error object, pretty-printed and raw: no ``data:`` before it."""
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": 1, "dialect": "gemini-stream"}))
    r = await http.post(_url(sim, "streamGenerateContent", query="?alt=sse"), json=HELLO, headers=KEY_HEADERS)
    assert r.status_code == 200
    chunk, raw = r.text.split("\r\n\r\n")
    assert chunk.startswith("data: ") and "finishReason" not in chunk
    assert raw.startswith('{\n  "error": {\n    "code": 503,\n') and raw.endswith("}\n")
    assert json.loads(raw)["error"]["status"] == "UNAVAILABLE"


async def test_the_in_stream_error_in_the_json_array(sim: SimHandle, http: httpx.AsyncClient) -> None:
    """Without alt=sse the error object is the array's last element."""
    sim.simulator.faults.set(parse_rules({"mode": "stream_error", "after": 1, "dialect": "gemini-stream"}))
    r = await http.post(_url(sim, "streamGenerateContent"), json=HELLO, headers=KEY_HEADERS)
    chunk, error = r.json()
    assert "candidates" in chunk and error["error"]["code"] == 503


async def test_a_cut_stream_has_no_finish(sim: SimHandle, client: genai.client.AsyncClient) -> None:
    sim.simulator.faults.set(parse_rules({"mode": "stream_cut", "after": 1}))
    chunks = [c async for c in await client.models.generate_content_stream(model="gemini-flash", contents="Hello.")]
    assert len(chunks) == 1 and chunks[0].candidates and chunks[0].candidates[0].finish_reason is None
