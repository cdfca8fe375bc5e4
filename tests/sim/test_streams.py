"""Stream shapes of real providers (a model's stream_style) over real HTTP: what each one
sends that a client must take as normal traffic, and that the openai SDK reads them all."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import STREAM_STYLES, parse_scenario
from capmon.sim.server import SimHandle
from capmon.sim.streams import answer_text
from tests.sim.helpers import AUTH, HELLO, chat_body, content_of, data_frames, frames


async def stream(sim: SimHandle, http: httpx.AsyncClient, style: str, **extra: Any) -> str:
    r = await http.post(f"{sim.admin_url}/models/sim-a", json={"stream_style": style})
    assert r.status_code == 200 and r.json()["stream_style"] == style
    r = await http.post(f"{sim.base_url}/chat/completions", json=chat_body(stream=True, **extra), headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return r.text


def expected_text(sim: SimHandle, nth: int) -> str:
    """The answer the nth admitted request of this simulator gets."""
    from capmon.sim.model import Ticket

    return " ".join(answer_text(Ticket(nth, "sim-a", "", 0, 10, "stop", 0.0, 0.0)))


async def test_openai_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    text = await stream(sim, http, "openai", stream_options={"include_usage": True})
    assert text.endswith("data: [DONE]\n\n")
    chunks = data_frames(text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert content_of(chunks) == expected_text(sim, 1)


async def test_azure_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    text = await stream(sim, http, "azure", stream_options={"include_usage": True})
    chunks = data_frames(text)
    first = chunks[0]
    assert first["choices"] == []
    assert (first["id"], first["model"], first["object"], first["created"]) == ("", "", "", 0)
    assert first["prompt_filter_results"][0]["content_filter_results"]["hate"] == {
        "filtered": False,
        "severity": "safe",
    }
    role, *content, finish, annotation, used = chunks[1:]
    assert role["choices"][0]["content_filter_results"] == {} and role["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["content_filter_results"]["violence"]["filtered"] is False for c in content)
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["content_filter_results"] == {}
    # The annotation chunk: a choice with no delta at all, and content filter offsets.
    choice = annotation["choices"][0]
    assert "delta" not in choice and annotation["id"] == "" and choice["content_filter_offsets"]["check_offset"] > 0
    assert used["choices"] == [] and used["usage"]["total_tokens"] > 10
    assert content_of(chunks) == expected_text(sim, 1)


async def test_openrouter_style_has_comment_lines(sim: SimHandle, http: httpx.AsyncClient) -> None:
    text = await stream(sim, http, "openrouter")
    parsed = frames(text)
    assert parsed[0].comment == "OPENROUTER PROCESSING"  # before any chunk
    comments = [i for i, f in enumerate(parsed) if f.comment]
    assert len(comments) >= 2 and comments[1] < len(parsed) - 2  # and between chunks
    chunks = data_frames(text)
    assert all(c["id"].startswith("gen-") and c["provider"] for c in chunks)
    assert chunks[-1]["choices"][0]["native_finish_reason"] == "stop"
    assert content_of(chunks) == expected_text(sim, 1)


async def test_vllm_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    text = await stream(sim, http, "vllm", stream_options={"include_usage": True})
    chunks = data_frames(text)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("system_fingerprint" not in c and "usage" not in c for c in chunks[:-1])
    last_content = chunks[-2]["choices"][0]
    # the finish reason rides on the last content chunk, with stop_reason beside it
    assert last_content["delta"]["content"] and last_content["finish_reason"] == "stop"
    assert "stop_reason" in last_content and last_content["stop_reason"] is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert content_of(chunks) == expected_text(sim, 1)


async def test_ollama_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    text = await stream(sim, http, "ollama", stream_options={"include_usage": True})
    chunks = data_frames(text)
    assert all(c["system_fingerprint"] == "fp_ollama" and "logprobs" not in c["choices"][0] for c in chunks[:-1])
    assert all(c["choices"][0]["delta"]["role"] == "assistant" for c in chunks[:-1])  # no role-only chunk
    assert chunks[0]["choices"][0]["delta"]["content"]  # the first chunk already carries text
    assert chunks[-2]["choices"][0] == {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
    }
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert content_of(chunks) == expected_text(sim, 1)


@pytest.mark.parametrize("style", STREAM_STYLES)
async def test_the_openai_sdk_reads_every_style(sim: SimHandle, http: httpx.AsyncClient, style: str) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"stream_style": style})
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as client:
        chunks = await client.chat.completions.create(
            model="sim-a",
            messages=HELLO,
            stream=True,  # type: ignore[call-overload]
            stream_options={"include_usage": True},
        )
        pieces, finish, used = [], None, None
        async for chunk in chunks:
            used = chunk.usage or used
            for choice in chunk.choices:
                if choice.delta is not None:
                    pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
    assert "".join(pieces) == expected_text(sim, 1)
    assert finish == "stop" and used is not None and used.completion_tokens == 10


async def test_max_tokens_cuts_every_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    for style in STREAM_STYLES:
        chunks = data_frames(await stream(sim, http, style, max_completion_tokens=3))
        assert len(content_of(chunks).split()) == 3, style
        finishes = [
            c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")
        ]
        assert finishes == ["length"], style


async def test_stream_style_is_a_scenario_key_and_validated() -> None:
    scn = parse_scenario('[[models]]\nname = "a"\nstream_style = "vllm"\n', "s.toml")
    assert scn.models[0].stream_style == "vllm"
    with pytest.raises(ConfigError) as info:
        parse_scenario('[[models]]\nname = "a"\nstream_style = "grpc"\n', "s.toml")
    assert (info.value.file, info.value.key) == ("s.toml", "models[0].stream_style")
    assert "expected one of openai, azure, openrouter, vllm, ollama" in str(info.value)


async def test_admin_refuses_an_unknown_style(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await http.post(f"{sim.admin_url}/models/sim-a", json={"stream_style": "grpc"})
    assert r.status_code == 400 and "stream_style must be one of" in r.json()["error"]["message"]
