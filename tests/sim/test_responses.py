"""The Responses API over real HTTP and through the official openai SDK
(client.responses.create, plain and stream=True): shapes, max_output_tokens, the same
slots / penalties / faults as chat, and its in-stream failures."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, PenaltySpec, Scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import AUTH, chat_body, fast_scenario, frames
from tests.support.simulated import StartSim

ORDER = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
CLOSE = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario(answer_tokens=30, slots=1)


@pytest.fixture
async def client(sim: SimHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        yield c


async def post(sim: SimHandle, http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await http.post(
        f"{sim.base_url}/responses", json={"model": "sim-a", "input": "Hello there", **body}, headers=AUTH
    )


async def test_plain_response(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, instructions="Be brief.")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "response" and body["id"].startswith("resp_") and body["status"] == "completed"
    (item,) = body["output"]
    assert (item["type"], item["role"], item["status"]) == ("message", "assistant", "completed")
    (part,) = item["content"]
    assert part["type"] == "output_text" and len(part["text"].split()) == 30
    assert body["usage"]["output_tokens"] == 30 and body["usage"]["input_tokens"] == 5  # (11 + 9 chars) / 4
    assert body["usage"]["total_tokens"] == 35 and body["instructions"] == "Be brief."


async def test_streamed_response_events(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    parsed = frames(r.text)
    names = [f.event for f in parsed]
    payloads = [f.json() for f in parsed]
    assert all(p["type"] == n for p, n in zip(payloads, names, strict=False))
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert names[:4] == ORDER and names[-4:] == [*CLOSE, "response.completed"]
    deltas = [p["delta"] for p in payloads if p["type"] == "response.output_text.delta"]
    assert len(deltas) > 2 and names[4:-4] == ["response.output_text.delta"] * len(deltas)
    text = "".join(deltas)
    assert payloads[-4]["text"] == text and payloads[-3]["part"]["text"] == text
    done = payloads[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["content"][0]["text"] == text
    assert done["usage"]["output_tokens"] == 30
    assert payloads[0]["response"]["status"] == "in_progress" and payloads[0]["response"]["output"] == []


async def test_max_output_tokens_caps_the_answer(sim: SimHandle, http: httpx.AsyncClient) -> None:
    body = (await post(sim, http, max_output_tokens=16)).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert len(body["output"][0]["content"][0]["text"].split()) == 16 and body["usage"]["output_tokens"] == 16
    names = [f.event for f in frames((await post(sim, http, max_output_tokens=20, stream=True)).text)]
    assert names[-1] == "response.incomplete"
    r = await post(sim, http, max_output_tokens=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": 3}, "input"),
        ({"model": ""}, "model"),
        ({"stream": "yes"}, "stream"),
        ({"instructions": ["x"]}, "instructions"),
    ],
)
async def test_bad_requests(sim: SimHandle, http: httpx.AsyncClient, body: dict[str, Any], param: str) -> None:
    r = await post(sim, http, **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


async def test_shares_slots_with_chat_and_rejects_in_the_models_dialect(
    sim: SimHandle, http: httpx.AsyncClient
) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"latency_factor": 300})  # ~0.3 s per request
    import asyncio

    chat = asyncio.create_task(http.post(f"{sim.base_url}/chat/completions", json=chat_body(), headers=AUTH))
    await asyncio.sleep(0.1)
    r = await post(sim, http)  # the only slot is the chat request's
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_is_overloaded"
    assert (await chat).status_code == 200
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": "anthropic-529", "hint": 1})
    r = await post(sim, http, stream=True)  # an HTTP dialect answers a stream with its HTTP error
    assert (r.status_code, r.headers["retry-after"]) == (529, "1")
    stats = (await http.get(f"{sim.admin_url}/stats")).json()
    assert stats["models"]["sim-a"]["rejected"]["capacity"] == 2


@pytest.mark.parametrize(
    "dialect, event, code",
    [
        ("responses-failed", "response.failed", "server_is_overloaded"),
        ("responses-slow-down", "response.failed", "slow_down"),
        ("responses-error", "error", "server_is_overloaded"),
    ],
)
async def test_in_stream_capacity_rejection(
    sim: SimHandle, http: httpx.AsyncClient, dialect: str, event: str, code: str
) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": dialect})
    r = await post(sim, http, stream=True)
    assert r.status_code == 200
    parsed = frames(r.text)
    assert [f.event for f in parsed] == ["response.created", "response.in_progress", event]
    last = parsed[-1].json()
    error = last["response"]["error"] if event == "response.failed" else last
    assert error["code"] == code and error["message"]
    if event == "response.failed":
        assert last["response"]["status"] == "failed"
    plain = await post(sim, http)
    assert plain.status_code == 503 and plain.json()["error"]["code"] == code


async def test_chat_stream_dialects_answer_responses_with_http(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"slots": 0, "dialect": "vllm-stream"})
    r = await post(sim, http, stream=True)
    assert r.status_code == 503 and r.json()["object"] == "error"


@pytest.mark.parametrize("after", [0, 2])
async def test_stream_error_fault(sim: SimHandle, http: httpx.AsyncClient, after: int) -> None:
    await http.post(
        f"{sim.admin_url}/faults", json={"mode": "stream_error", "after": after, "dialect": "responses-slow-down"}
    )
    r = await http.post(f"{sim.base_url}/chat/completions", json=chat_body(stream=True), headers=AUTH)
    assert frames(r.text)[-1].data == "[DONE]"  # a chat stream passes by a Responses dialect's fault
    parsed = frames((await post(sim, http, stream=True)).text)
    deltas = [f for f in parsed if f.event == "response.output_text.delta"]
    assert len(deltas) == after and parsed[-1].event == "response.failed"
    assert parsed[-1].json()["response"]["error"]["code"] == "slow_down"


async def test_stream_cut_and_broken_bodies(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/faults", json=[{"mode": "stream_cut"}, {"mode": "truncate"}])
    names = [f.event for f in frames((await post(sim, http, stream=True)).text)]
    assert "response.completed" not in names and "response.output_text.delta" in names
    r = await post(sim, http)
    assert r.status_code == 200
    with pytest.raises(ValueError):
        r.json()


async def test_penalty_is_shared_with_chat(start_sim: StartSim, http: httpx.AsyncClient) -> None:
    scn = Scenario(
        name="p",
        models=(ModelSpec(name="sim-a", slots=0),),
        penalty=PenaltySpec(enabled=True, threshold=2, window=10, duration=30, basis="rejections"),
    )
    sim = await start_sim(scn)
    await http.post(f"{sim.base_url}/chat/completions", json=chat_body(), headers=AUTH)
    for _ in range(2):
        await http.post(f"{sim.base_url}/responses", json={"model": "sim-a", "input": "x"}, headers=AUTH)
    r = await http.post(f"{sim.base_url}/responses", json={"model": "sim-a", "input": "x"}, headers=AUTH)
    assert r.status_code == 429 and r.json()["error"]["message"].startswith("penalised")


# ---------------------------------------------------------------- the openai SDK


async def test_sdk_plain(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model="sim-a", input="Say something.", max_output_tokens=20)
    assert response.status == "incomplete" and len(response.output_text.split()) == 20
    assert response.usage is not None and response.usage.output_tokens == 20
    full = await client.responses.create(model="sim-a", input=[{"role": "user", "content": "Say more."}])
    assert full.status == "completed" and len(full.output_text.split()) == 30


async def test_sdk_stream(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(model="sim-a", input="Stream it.", stream=True)
    kinds, text, final = [], "", None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            final = event.response
    assert kinds[:4] == ORDER and kinds[-1] == "response.completed"
    assert final is not None and final.output_text == text and len(text.split()) == 30


async def test_sdk_sees_the_failures(sim: SimHandle, client: openai.AsyncOpenAI) -> None:
    sim.simulator.configure("sim-a", slots=0, dialect="responses-failed")
    stream = await client.responses.create(model="sim-a", input="x", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "response.failed"
    assert events[-1].response.error is not None and events[-1].response.error.code == "server_is_overloaded"
    with pytest.raises(openai.InternalServerError) as info:
        await client.responses.create(model="sim-a", input="x")
    assert info.value.status_code == 503 and info.value.code == "server_is_overloaded"
    sim.simulator.configure("sim-a", dialect="openai-429", hint=1.5)
    with pytest.raises(openai.RateLimitError):
        await client.responses.create(model="sim-a", input="x")
