"""Client keys and the admin key: no key, a wrong key and admin actions without the
admin key are refused; a key set to a canary value never appears in a log, /metrics,
the snapshot, the events or any answer; a batch key's requests stay batch."""

from __future__ import annotations

import json
import logging

import httpx
import openai
import pytest

from capmon.core.base.secrets import redact
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from tests.gateway.helpers import HELLO, running

pytestmark = pytest.mark.looptime

CLIENT = "sk-gw-client-canary-4f1d2c3b5a69"
BATCH = "sk-gw-batch-canary-77aa88bb99cc"
ADMIN = "sk-gw-admin-canary-0e0d0c0b0a09"
PROVIDER = "sk-capmon-sim-1"  # a key the simulator accepts, as the gateway's provider key
KEYS = (
    'keys = [{ env = "GW_CLIENT", alias = "team" }, { env = "GW_BATCH", alias = "nightly", priority = "batch" }]\n'
    'admin_key_env = "GW_ADMIN"'
)
ENVIRON = {"GW_CLIENT": CLIENT, "GW_BATCH": BATCH, "GW_ADMIN": ADMIN, "GW_PROVIDER_KEY": PROVIDER}


def _code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


async def test_no_key_and_a_wrong_key_are_refused_everywhere_but_health() -> None:
    async with running(gateway=KEYS, environ=ENVIRON) as gw, gw.http() as anon, gw.http("sk-not-a-key-of-it") as wrong:
        for http in (anon, wrong):
            chat = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
            assert chat.status_code == 401 and _code(chat) == "invalid_api_key"
            assert chat.headers["www-authenticate"] == "Bearer"
            for path in ("/v1/models", "/metrics", "/capmon/info", "/capmon/snapshot", "/capmon/events"):
                r = await http.get(path)
                assert r.status_code == 401, path
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/ready")).status_code == 200
        async with gw.openai("sk-not-a-key-of-it") as sdk:
            with pytest.raises(openai.AuthenticationError):
                await sdk.chat.completions.create(model="auto", messages=HELLO)
        x_api_key = await anon.post(
            "/v1/chat/completions", headers={"x-api-key": CLIENT}, json={"model": "auto", "messages": HELLO}
        )
        snap = gw.client.snapshot()
    assert x_api_key.status_code == 200
    assert snap.requests == 1  # only the request with a key reached the client


async def test_admin_actions_need_the_admin_key() -> None:
    async with (
        running(gateway=KEYS, environ=ENVIRON) as gw,
        gw.http(CLIENT) as client,
        gw.http(ADMIN) as admin,
        gw.http() as anon,
    ):
        for http in (client, anon):
            for path, body in (
                ("/capmon/trip", {"target": "flagship"}),
                ("/capmon/reset", {"target": "flagship"}),
                ("/capmon/force-close", {"target": "flagship"}),
                ("/capmon/pin", {"model": "small"}),
            ):
                r = await http.post(path, json=body)
                assert r.status_code == 403 and _code(r) == "admin_key_required", (path, r.text)
                assert r.json()["error"]["type"] == "permission_error"
        untouched = gw.client.snapshot()
        client_info = (await client.get("/capmon/info")).json()
        admin_info = (await admin.get("/capmon/info")).json()
        tripped = await admin.post("/capmon/trip", json={"target": "flagship"})
    assert [str(t.state) for t in untouched.targets] == ["closed", "closed", "closed"] and untouched.pinned is None
    assert client_info["readonly"] is True and client_info["caller"] == "client"
    assert admin_info["readonly"] is False and admin_info["caller"] == "admin"
    assert tripped.status_code == 200 and tripped.json()["targets"][0]["state"] == "forced-open"


async def test_without_an_admin_key_the_control_api_is_read_only() -> None:
    async with running() as gw, gw.http("anything") as http:
        r = await http.post("/capmon/trip", json={"target": "flagship"})
        info = (await http.get("/capmon/info")).json()
        snap = await http.get("/capmon/snapshot")
    assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
    assert info["readonly"] is True and info["admin_key_configured"] is False and snap.status_code == 200


async def test_a_batch_key_stays_batch_and_a_client_key_may_ask_for_batch() -> None:
    async with running(gateway=KEYS, environ=ENVIRON) as gw, gw.http(BATCH) as batch, gw.http(CLIENT) as client:
        asks_more = await batch.post(
            "/v1/chat/completions",
            headers={"x-capmon-priority": "interactive"},
            json={"model": "auto", "messages": HELLO},
        )
        default = await client.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
        asks_less = await client.post(
            "/v1/chat/completions", headers={"x-capmon-priority": "batch"}, json={"model": "auto", "messages": HELLO}
        )
    assert asks_more.headers["x-capmon-priority"] == "batch"
    assert default.headers["x-capmon-priority"] == "interactive"
    assert asks_less.headers["x-capmon-priority"] == "batch"


async def test_no_key_value_reaches_a_log_metrics_the_snapshot_events_or_an_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    async with (
        running(gateway=KEYS, environ=ENVIRON) as gw,
        gw.http(CLIENT) as client,
        gw.http(ADMIN) as admin,
        gw.http(BATCH) as batch,
        gw.http(CLIENT[:-1] + "x") as almost,
    ):
        async with gw.openai(CLIENT) as sdk:
            reply = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
            seen += [reply.text, json.dumps(dict(reply.headers))]
            seen += [
                json.dumps(e.model_dump())
                async for e in await sdk.responses.create(model="auto", input="hi", stream=True)
            ]
        answers = [
            await client.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO, "stream": True}),
            await batch.post("/v1/chat/completions", json={"model": "nope", "messages": HELLO}),
            await almost.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}),
            await client.post("/capmon/trip", json={"target": "flagship"}),
            await admin.post("/capmon/trip", json={"target": "flagship"}),
            await admin.post("/capmon/reset", json={"target": "nothing"}),
            await admin.post("/capmon/pin", json={"model": CLIENT}),  # a key sent where a model name goes
            await admin.post("/v1/chat/completions", json={"model": CLIENT, "messages": HELLO}),
            await client.get("/metrics"),
            await client.get("/capmon/snapshot"),
            await client.get("/capmon/info"),
            await client.get("/v1/models"),
            await client.get("/ready"),
        ]
        async with client.stream("GET", "/capmon/events") as events:
            async for line in events.aiter_lines():
                seen.append(line)
                if line.startswith("data:") and "BreakerChanged" in line:
                    break
        snapshot = json.dumps(gw.client.snapshot().to_dict(), default=str)
    seen += [r.text + json.dumps(dict(r.headers)) for r in answers] + [snapshot]
    seen += [r.getMessage() for r in caplog.records] + [str(r.args) for r in caplog.records]
    assert [r.status_code for r in answers] == [200, 404, 401, 403, 200, 404, 404, 404, 200, 200, 200, 200, 200]
    assert "capmon_attempts_total" in answers[8].text and "BreakerChanged" in "".join(seen)
    for value in (CLIENT, BATCH, ADMIN, PROVIDER):
        leaks = [s[:200] for s in seen if value in s]
        assert not leaks, (value, leaks)
    assert redact(f"key {CLIENT}") == "key [redacted]"  # registered for redaction when the gateway read it


def test_the_provider_key_in_use_is_the_simulators() -> None:
    assert PROVIDER != SIMULATOR_DEMO_KEY  # so the provider key is one the tests can look for
