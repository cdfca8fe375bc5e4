"""Errors inside a 200 stream, over real HTTP: a full model whose dialect rejects in the
stream (and with the matching HTTP error when the request is not a stream), and the
stream_error fault that sends N content chunks before the error frame."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from capmon.sim import dialects
from capmon.sim.scenario import Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import AUTH, chat_body, content_of, data_frames, fast_scenario, frames


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario(answer_tokens=20)


async def post(sim: SimHandle, http: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    return await http.post(f"{sim.base_url}/chat/completions", json=chat_body(**extra), headers=AUTH)


def check_frame(dialect: str, text: str, *, after_output: bool) -> None:
    """The error frame at the end of ``text`` is ``dialect``'s, in its real shape."""
    parsed = frames(text)
    if dialect == dialects.VLLM_STREAM:
        assert parsed[-1].data == "[DONE]"
        parsed = parsed[:-1]
    else:
        assert "[DONE]" not in text
    last = parsed[-1]
    if dialect == dialects.ANTHROPIC_STREAM:
        assert last.event == "error"
        assert last.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        return
    body = last.json()
    if dialect.startswith("openrouter-stream"):
        code = {"openrouter-stream": 429, "openrouter-stream-502": 502, "openrouter-stream-503": 503}[dialect]
        error = body["error"]
        assert error["code"] == code and error["message"] and isinstance(error["metadata"], dict)
        if after_output:  # the unified mid-stream chunk: the error beside a choice finished with "error"
            assert body["object"] == "chat.completion.chunk" and body["id"].startswith("chatcmpl-")
            assert body["choices"] == [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]
        else:
            assert set(body) == {"error"} and parsed[-2].comment == "OPENROUTER PROCESSING"
    elif dialect == dialects.GEMINI_OPENAI_STREAM:
        assert body == {
            "error": {
                "code": 503,
                "message": "The model is overloaded. Please try again later.",
                "status": "UNAVAILABLE",
            }
        }
    elif dialect == dialects.VLLM_STREAM:
        assert body["object"] == "error" and body["code"] == 503 and body["type"] == "ServiceUnavailableError"
        assert body["message"]
    elif dialect == dialects.OLLAMA_STREAM:
        assert body == {"error": "server busy, please try again.  maximum pending requests exceeded"}
    else:  # pragma: no cover
        raise AssertionError(dialect)


@pytest.mark.parametrize("dialect", dialects.CHAT_STREAM_DIALECTS)
async def test_full_model_rejects_inside_the_stream(sim: SimHandle, http: httpx.AsyncClient, dialect: str) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": dialect})
    r = await post(sim, http, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert content_of(data_frames(r.text)) == ""  # nothing before the error
    check_frame(dialect, r.text, after_output=False)
    stats = (await http.get(f"{sim.admin_url}/stats")).json()
    assert stats["models"]["sim-a"]["rejected"]["capacity"] == 1 and stats["models"]["sim-a"]["in_flight"] == 0


EXPECTED_HTTP = {
    dialects.OPENROUTER_STREAM: 429,
    dialects.OPENROUTER_STREAM_502: 502,
    dialects.OPENROUTER_STREAM_503: 503,
    dialects.ANTHROPIC_STREAM: 529,
    dialects.GEMINI_OPENAI_STREAM: 503,
    dialects.VLLM_STREAM: 503,
    dialects.OLLAMA_STREAM: 503,
    dialects.RESPONSES_FAILED: 503,
    dialects.RESPONSES_SLOW_DOWN: 503,
    dialects.RESPONSES_ERROR: 503,
    dialects.GEMINI_STREAM: 503,
    dialects.BEDROCK_STREAM: 429,
    dialects.BEDROCK_STREAM_503: 503,
    dialects.BEDROCK_STREAM_ERROR: 424,
    dialects.BEDROCK_STREAM_FRAME: 429,
}


@pytest.mark.parametrize("dialect", dialects.STREAM_DIALECTS)
async def test_a_plain_request_gets_the_matching_http_error(
    sim: SimHandle, http: httpx.AsyncClient, dialect: str
) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": dialect, "hint": 2})
    r = await post(sim, http)
    assert r.status_code == EXPECTED_HTTP[dialect]
    body = r.json()
    if dialect == dialects.GEMINI_OPENAI_STREAM:
        # Gemini's OpenAI-compatible endpoint: the error object in a list, RetryInfo in details
        assert body[0]["error"]["status"] == "UNAVAILABLE"
        assert body[0]["error"]["details"][0]["retryDelay"] == "2s"
    elif dialect == dialects.ANTHROPIC_STREAM:
        assert body["error"]["type"] == "overloaded_error" and r.headers["retry-after"] == "2"
    elif dialect == dialects.GEMINI_STREAM:  # Google's 503, its hint in RetryInfo
        assert body["error"]["status"] == "UNAVAILABLE" and body["error"]["details"][0]["retryDelay"] == "2s"
    elif dialect == dialects.VLLM_STREAM:
        assert body["object"] == "error" and body["code"] == 503
    elif dialect in dialects.RESPONSES_STREAM_DIALECTS:
        assert body["error"]["code"] in ("server_is_overloaded", "slow_down")
    elif dialect == dialects.OLLAMA_STREAM:
        assert body["error"]["type"] == "api_error" and "server busy" in body["error"]["message"]
    elif dialect in dialects.BEDROCK_STREAM_DIALECTS:  # Bedrock's exception; it sends no hint
        _status, exception, message = dialects.BEDROCK_STREAM_EXCEPTIONS[dialect]
        assert body == {"message": message} and r.headers["x-amzn-errortype"].startswith(f"{exception}:")
    else:
        assert body["error"]["code"] == r.status_code and r.headers["retry-after"] == "2"


async def test_a_responses_dialect_answers_a_chat_stream_over_http(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": "responses-failed"})
    r = await post(sim, http, stream=True)
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_is_overloaded"


@pytest.mark.parametrize("dialect", dialects.CHAT_STREAM_DIALECTS)
@pytest.mark.parametrize("after", [0, 2])
async def test_stream_error_fault(sim: SimHandle, http: httpx.AsyncClient, dialect: str, after: int) -> None:
    r = await http.post(f"{sim.admin_url}/faults", json={"mode": "stream_error", "after": after, "dialect": dialect})
    assert r.json()["faults"] == [
        {"mode": "stream_error", "count": 1, "rate": None, "model": None, "after": after, "dialect": dialect}
    ]
    assert (await post(sim, http)).status_code == 200  # a plain request passes by
    r = await post(sim, http, stream=True)
    assert r.status_code == 200
    chunks = [c for c in data_frames(r.text) if c.get("object") == "chat.completion.chunk"]
    content = [c for c in chunks if (c["choices"] and (c["choices"][0].get("delta") or {}).get("content"))]
    assert len(content) == after  # N content chunks, then the frame
    if after == 0:
        assert chunks == []  # not even the role chunk
    check_frame(dialect, r.text, after_output=after > 0)
    # the fault ran out: the next stream is whole
    assert frames((await post(sim, http, stream=True)).text)[-1].data == "[DONE]"


async def test_stream_error_in_another_style_keeps_that_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"stream_style": "azure"})
    await http.post(f"{sim.admin_url}/faults", json={"mode": "stream_error", "after": 1, "dialect": "vllm-stream"})
    chunks = data_frames((await post(sim, http, stream=True)).text)
    assert chunks[0]["prompt_filter_results"]  # Azure's first chunk
    assert chunks[-1]["object"] == "error"


async def test_stream_error_after_more_chunks_than_the_answer_has(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/faults", json={"mode": "stream_error", "after": 99, "dialect": "ollama-stream"})
    chunks = data_frames((await post(sim, http, stream=True)).text)
    assert len(content_of(chunks).split()) == 20  # the whole answer, but no finish and no [DONE]
    assert chunks[-1] == {"error": dialects.OLLAMA_BUSY_MESSAGE}
    assert not any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"mode": "stream_error", "dialect": "openai-503"}, "dialect must be one of"),
        ({"mode": "stream_error", "after": -1}, "after must be"),
        ({"mode": "stream_error", "after": "3"}, "after must be a whole number"),
        ({"mode": "reset", "after": 1}, "applies only to mode 'stream_error'"),
    ],
)
async def test_bad_stream_error_rules(
    sim: SimHandle, http: httpx.AsyncClient, bad: dict[str, object], message: str
) -> None:
    r = await http.post(f"{sim.admin_url}/faults", json=bad)
    assert r.status_code == 400 and message in r.json()["error"]["message"]


async def test_stream_dialects_are_scenario_values() -> None:
    from capmon.sim.scenario import parse_scenario

    scn = parse_scenario(
        '[[models]]\nname = "a"\ndialect = "openrouter-stream"\n'
        '[[models.schedule]]\nat = 1\ndialect = "anthropic-stream"\n'
    )
    assert scn.models[0].dialect == "openrouter-stream" and scn.models[0].schedule[0].dialect == "anthropic-stream"
