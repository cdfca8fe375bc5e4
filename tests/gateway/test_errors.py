"""When the gateway cannot answer: an OpenAI-shaped error, never a hang and never a
truncated answer that looks complete. Nothing can serve (429 with Retry-After), the
provider refuses the request (its 4xx), the upstream keeps failing (502), the
gateway's own provider key is refused (502 naming its alias), a stream that breaks
after its first byte, and requests the gateway itself refuses."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

from tests.gateway.helpers import HELLO, data_of, running, scenario, spec, sse_frames

pytestmark = pytest.mark.looptime


def _error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


async def test_nothing_can_serve_within_the_deadline_gives_429_with_retry_after() -> None:
    full = scenario(*(spec(m, slots=0) for m in ("flagship", "medium", "small")))
    async with running(full) as gw, gw.openai() as sdk, gw.http() as http:
        with pytest.raises(openai.RateLimitError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO, extra_headers={"x-capmon-deadline": "3"})
        streamed = await http.post(
            "/v1/chat/completions",
            headers={"x-capmon-deadline": "2"},
            json={"model": "auto", "messages": HELLO, "stream": True},
        )
        responses = await http.post(
            "/v1/responses", headers={"x-capmon-deadline": "2"}, json={"model": "flagship", "input": "hi"}
        )
    r = info.value.response
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
    err = _error(r)
    assert err["type"] == "rate_limit_error" and err["code"] == "model_at_capacity"
    assert "within its deadline" in err["message"] and "capacity" in err["message"]
    assert int(r.headers["x-capmon-attempts"]) >= 3  # every model was tried before the deadline passed
    # a stream that never started is a plain error, not an event stream
    assert streamed.status_code == 429 and streamed.headers["content-type"] == "application/json"
    assert "retry-after" in streamed.headers and _error(streamed)["code"] == "model_at_capacity"
    assert responses.status_code == 429 and "retry-after" in responses.headers


async def test_the_deadline_header_shortens_the_configs_deadline_never_lengthens_it() -> None:
    full = scenario(*(spec(m, slots=0) for m in ("flagship", "medium", "small")))
    loop = asyncio.get_running_loop()
    async with running(full, extra="[client]\ndeadline = 5.0") as gw, gw.http() as http:
        timings = []
        for header in ("1.5", "1000"):
            t0 = loop.time()
            r = await http.post(
                "/v1/chat/completions", headers={"x-capmon-deadline": header}, json={"model": "auto", "messages": HELLO}
            )
            timings.append((r.status_code, loop.time() - t0))
    (s1, short), (s2, capped) = timings
    assert s1 == s2 == 429
    assert 1.5 <= short < 2.0 and 5.0 <= capped < 5.5, timings


async def test_a_rate_limit_hint_becomes_the_retry_after() -> None:
    limited = scenario(*(spec(m, slots=0, dialect="openai-429", hint=7.0) for m in ("flagship", "medium", "small")))
    async with running(limited) as gw, gw.http() as http:
        r = await http.post(
            "/v1/chat/completions", headers={"x-capmon-deadline": "3"}, json={"model": "auto", "messages": HELLO}
        )
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert _error(r)["code"] == "rate_limit_exceeded"


async def test_the_providers_400_is_passed_through() -> None:
    async with running() as gw, gw.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO, tools=[{"type": "function"}])
        snap = gw.client.snapshot()
    err = _error(info.value.response)
    assert info.value.status_code == 400 and err["type"] == "invalid_request_error"
    assert err["message"].startswith("Invalid 'tools[0]'")  # the provider's own words, not a prefix of ours
    assert int(info.value.response.headers["x-capmon-attempts"]) == 1  # a bad request is not retried
    assert [t.consecutive_failures for t in snap.targets] == [0, 0, 0]


async def test_a_prompt_too_large_for_every_model_is_the_providers_400() -> None:
    small = scenario(*(spec(m, window=300) for m in ("flagship", "medium", "small")))
    async with running(small) as gw, gw.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.chat.completions.create(model="auto", messages=[{"role": "user", "content": "word " * 2000}])
    err = _error(info.value.response)
    assert err["code"] == "context_length_exceeded" and "context length" in err["message"]


async def test_transient_failures_that_exhaust_the_retries_give_502() -> None:
    async with running(extra="[client]\nmax_attempts = 4") as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", {"mode": "html_500", "rate": 1.0})
        with pytest.raises(openai.InternalServerError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO)
    r = info.value.response
    assert r.status_code == 502 and _error(r)["code"] == "upstream_failed"
    assert "500" in _error(r)["message"] and int(r.headers["x-capmon-attempts"]) >= 2


async def test_a_refused_provider_key_is_the_gateways_problem_and_never_shown() -> None:
    wrong = "sk-wrong-provider-key-0123456789"
    async with running(environ={"GW_PROVIDER_KEY": wrong}) as gw, gw.http() as http:
        r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
        streamed = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO, "stream": True})
    # The first is refused by the provider; the second finds every key disabled and is
    # answered at once, without an attempt (waiting cannot help: only a person resets a key).
    assert r.status_code == 502 and _error(r)["code"] == "upstream_auth_failed" and "'sim-key'" in _error(r)["message"]
    assert streamed.status_code == 503 and _error(streamed)["code"] == "no_usable_key"
    assert "retry-after" not in streamed.headers and streamed.headers["x-capmon-attempts"] == "0"
    for answer in (r, streamed):
        err = _error(answer)
        assert "sim-key" in err["message"] and "not about the key you sent" in err["message"]
        everything = answer.text + json.dumps(dict(answer.headers))
        assert wrong not in everything and wrong[-4:] not in everything  # not even the provider's masked echo


async def test_a_chat_stream_that_breaks_after_its_first_byte_ends_with_an_error_event() -> None:
    async with running() as gw, gw.openai() as sdk, gw.http() as http:
        await gw.sim_admin("faults", {"mode": "stream_error", "after": 3, "dialect": "anthropic-stream", "count": 1})
        out = {"x-capmon-continue": "false"}  # opted out: the old end (tests/gateway/test_continuation.py)
        stream = await sdk.chat.completions.create(model="auto", messages=HELLO, stream=True, extra_headers=out)
        seen = []
        with pytest.raises(openai.APIError) as info:
            async for chunk in stream:
                seen.append(chunk)
        await gw.sim_admin("faults", {"mode": "stream_cut", "count": 1})
        cut = await http.post(
            "/v1/chat/completions", headers=out, json={"model": "auto", "messages": HELLO, "stream": True}
        )
    assert any(c.choices and c.choices[0].delta.content for c in seen)  # output had reached the client
    assert "incomplete" in info.value.message and info.value.body["code"] == "server_is_overloaded"
    frames = sse_frames(cut.text)
    assert cut.status_code == 200 and frames[-1]["data"] != "[DONE]"
    assert "data: [DONE]" not in cut.text
    last = json.loads(frames[-1]["data"])
    assert set(last) == {"error"} and last["error"]["code"] == "server_error"
    assert "stream ended before [DONE]" in last["error"]["message"]
    assert any(c.get("choices") and c["choices"][0]["delta"].get("content") for c in data_of(frames[:-1]))


async def test_a_responses_stream_that_breaks_after_its_first_byte_ends_with_response_failed() -> None:
    async with running() as gw, gw.openai() as sdk:
        await gw.sim_admin("faults", {"mode": "stream_error", "after": 3, "dialect": "responses-failed", "count": 1})
        out = {"x-capmon-continue": "false"}  # opted out: the old end (tests/gateway/test_continuation.py)
        events = [e async for e in await sdk.responses.create(model="auto", input="hi", stream=True, extra_headers=out)]
    types = [e.type for e in events]
    assert "response.output_text.delta" in types and types[-1] == "response.failed"
    assert "response.completed" not in types
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None and "incomplete" in failed.error.message
    assert failed.id == events[0].response.id  # the response that was under way is the one that failed
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_requests_the_gateway_refuses_itself() -> None:
    async with running(gateway="max_body_bytes = 2048") as gw, gw.http() as http, gw.openai() as sdk:
        with pytest.raises(openai.NotFoundError) as info:
            await sdk.chat.completions.create(model="gpt-9", messages=HELLO)
        not_json = await http.post(
            "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
        no_messages = await http.post("/v1/chat/completions", json={"model": "auto"})
        no_model = await http.post("/v1/chat/completions", json={"messages": HELLO})
        n2 = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO, "n": 2})
        deadline = await http.post(
            "/v1/chat/completions", headers={"x-capmon-deadline": "soon"}, json={"model": "auto", "messages": HELLO}
        )
        priority = await http.post(
            "/v1/chat/completions", headers={"x-capmon-priority": "urgent"}, json={"model": "auto", "messages": HELLO}
        )
        huge = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO, "pad": "x" * 4096})
        nowhere = await http.get("/v1/embeddings")
        wrong_method = await http.get("/v1/chat/completions")
        snap = gw.client.snapshot()
    err = _error(info.value.response)
    assert info.value.status_code == 404 and err["code"] == "model_not_found" and "gpt-9" in err["message"]
    assert "flagship, medium, small" in err["message"]
    for r, param in (
        (not_json, None),
        (no_messages, "messages"),
        (no_model, "model"),
        (n2, "n"),
        (deadline, "x-capmon-deadline"),
        (priority, "x-capmon-priority"),
    ):
        assert r.status_code == 400 and _error(r)["param"] == param, r.text
    assert huge.status_code == 413 and _error(huge)["code"] == "request_too_large"
    assert nowhere.status_code == 404 and _error(nowhere)["code"] == "not_found"
    assert wrong_method.status_code == 405 and _error(wrong_method)["code"] == "method_not_allowed"
    assert snap.requests == 0  # none of them reached the client
