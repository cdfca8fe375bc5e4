"""A request the gateway cannot serve before its deadline, and that waiting cannot help,
is answered at once with a 503 whose code says why (every model tripped by hand, every key
disabled), with no Retry-After and ``x-should-retry: false`` (the SDKs then do not retry);
a model whose breaker opened by itself is still waited for."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.gateway.helpers import HELLO, MODELS, running

pytestmark = pytest.mark.looptime

ADMIN = "admin-secret-key-for-tests"
WITH_ADMIN = 'admin_key_env = "GW_ADMIN"'


async def test_every_model_tripped_by_hand_is_answered_at_once_to_the_openai_sdk() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        for m in MODELS:
            (await http.post("/capmon/trip", json={"target": m})).raise_for_status()
        # The SDK as a user has it: its default two retries, no deadline header (the
        # gateway's own [gateway] deadline applies).
        sdk = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO)
        took = loop.time() - t0
        anthropic = await http.post(
            "/v1/messages", json={"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
        )
    r = info.value.response
    err = r.json()["error"]
    assert took < 1.0, took  # no wait, and no retry by the SDK
    assert r.status_code == 503 and err["code"] == "models_unavailable" and err["type"] == "service_unavailable"
    assert "tripped by hand" in err["message"] and "capacity" not in err["message"]
    assert "retry-after" not in r.headers and r.headers["x-should-retry"] == "false"
    assert r.headers["x-capmon-attempts"] == "0"
    body = anthropic.json()
    assert anthropic.status_code == 503 and body["type"] == "error" and body["error"]["type"] == "api_error"
    assert body["error"]["message"].startswith("models_unavailable: ") and "retry-after" not in anthropic.headers


async def test_a_request_waiting_when_the_last_model_is_tripped_by_hand_is_answered_then() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        for m in MODELS[:2]:
            await http.post("/capmon/trip", json={"target": m})
        await gw.sim_admin("outage/sim-small", {"duration": 600})
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(
            http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}, timeout=600)
        )
        # small's breaker opens by itself after its failures: the request waits for its probe.
        await asyncio.sleep(30)
        assert not waiting.done()
        t0 = loop.time()
        await http.post("/capmon/trip", json={"target": "small"})
        r = await waiting
        took = loop.time() - t0
    assert took < 1.0, took
    assert r.status_code == 503 and r.json()["error"]["code"] == "models_unavailable"


async def test_without_a_deadline_header_the_answer_comes_before_the_openai_sdks_timeout() -> None:
    async with running() as gw:
        for m in MODELS:  # down for longer than any deadline: breakers open by themselves, probes fail
            await gw.sim_admin(f"outage/sim-{m}", {"duration": 3600})
        sdk = openai.AsyncOpenAI(base_url=gw.base_url, api_key="k", max_retries=0)  # its default 600 s timeout
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(openai.APIStatusError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO)
        took = loop.time() - t0
    assert 539 <= took < 600, took  # [gateway] deadline = 540 s, not [client] deadline's 900 s
    assert info.value.response.status_code in (429, 504) and "540s" in info.value.response.json()["error"]["message"]
