"""The real google-genai SDK made by capmon.genai_client(): plain, streamed and
function-calling answers on its sync side and its async side (``.aio``), a fallback to a
model on another wire that the response's headers show (translated back into Gemini's
shapes), and every model at capacity raised as the SDK's own ``ServerError`` (503
UNAVAILABLE)."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.genai import errors as genai_errors
from google.genai import types

import capmon
from capmon.inprocess.home import RUNTIME
from tests.sdk.helpers import ANSWER_TOKENS, afill, config, fill

WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="the weather in a city",
            parameters_json_schema={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        )
    ]
)
FORCED = types.GenerateContentConfig(
    tools=[WEATHER],
    tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
)


def _deadline(seconds: str) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(http_options=types.HttpOptions(headers={"x-capmon-deadline": seconds}))


def test_sync_plain_streamed_tools_fallback_and_overloaded(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("claude",))
    built = RUNTIME.built
    sdk = capmon.genai_client(cfg)

    plain = sdk.models.generate_content(model="claude", contents="Say something about capacity.")
    assert plain.sdk_http_response is not None and plain.sdk_http_response.headers is not None
    h = plain.sdk_http_response.headers
    # claude is at capacity: served by the next model, on the OpenAI wire, answered in Gemini's shape
    assert (h["x-capmon-model"], h["x-capmon-api"], h["x-capmon-fallbacks"]) == ("flagship", "openai", "1")
    assert plain.text is not None and len(plain.text.split()) == ANSWER_TOKENS
    assert plain.candidates is not None and plain.candidates[0].finish_reason == types.FinishReason.STOP

    chunks = list(sdk.models.generate_content_stream(model="medium", contents="Say something."))
    assert len("".join(c.text or "" for c in chunks).split()) == ANSWER_TOKENS
    assert chunks[-1].usage_metadata is not None and chunks[-1].usage_metadata.candidates_token_count == ANSWER_TOKENS

    called = sdk.models.generate_content(model="medium", contents="Weather in Paris?", config=FORCED)
    assert called.function_calls and called.function_calls[0].name == "get_weather"
    assert isinstance(called.function_calls[0].args, dict) and called.function_calls[0].args

    fill(cfg, "flagship", "medium")
    with pytest.raises(genai_errors.ServerError) as info:
        sdk.models.generate_content(model="auto", contents="hi", config=_deadline("0.1"))
    assert info.value.code == 503 and info.value.status == "UNAVAILABLE"
    assert RUNTIME.built == built + 1


@pytest.mark.looptime
async def test_async_plain_streamed_tools_fallback_and_overloaded(tmp_path: Path) -> None:
    cfg = config(tmp_path, full=("claude",))
    built = RUNTIME.built
    sdk = capmon.genai_client(cfg).aio
    plain = await sdk.models.generate_content(model="claude", contents="Say something about capacity.")
    assert plain.sdk_http_response is not None and plain.sdk_http_response.headers is not None
    assert plain.sdk_http_response.headers["x-capmon-fallbacks"] == "1"

    chunks = [
        c async for c in await sdk.models.generate_content_stream(model="medium", contents="Weather?", config=FORCED)
    ]
    calls = [call for c in chunks for call in (c.function_calls or [])]
    assert calls and calls[0].name == "get_weather" and isinstance(calls[0].args, dict)

    await afill(cfg, "flagship", "medium")
    with pytest.raises(genai_errors.ServerError):
        await sdk.models.generate_content(model="auto", contents="hi", config=_deadline("2"))
    assert RUNTIME.built == built + 1


def test_the_transport_and_the_base_url_are_capmons_own(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    with pytest.raises(TypeError, match="base_url is capmon's own"):
        capmon.genai_client(cfg, http_options=types.HttpOptions(base_url="https://example.com"))
    with pytest.raises(TypeError, match="vertexai is capmon's own"):
        capmon.genai_client(cfg, vertexai=True)
