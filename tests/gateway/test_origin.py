"""Browsers cannot use the open gateway: a foreign Host (DNS rebinding) gets 421, an
Origin not in gateway.cors_origins 403, a non-JSON POST 403, in the API's error shape;
the origins the operator names get CORS done properly. On main the browser-shaped
request (foreign Host, Origin, text/plain) got a 200."""

from __future__ import annotations

import json

import pytest

from capmon.gateway.browsers import loopback_host
from tests.gateway.helpers import HELLO, running

pytestmark = pytest.mark.looptime

CHAT = json.dumps({"model": "flagship", "messages": HELLO})
KEY = "client-key-0123456789abcdef"


def error_code(r: object) -> str:
    body = r.json()  # type: ignore[attr-defined]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return str(body["error"]["code"])


async def test_a_browser_shaped_request_to_the_open_gateway_is_refused() -> None:
    async with running() as gw, gw.http() as http:
        # what a page on evil.example sends after rebinding its name to 127.0.0.1
        rebound = await http.post(
            "/v1/chat/completions",
            content=CHAT,
            headers={"host": "evil.example:4000", "origin": "http://evil.example:4000", "content-type": "text/plain"},
        )
        cross = await http.post(
            "/v1/chat/completions",
            content=CHAT,
            headers={"origin": "http://evil.example", "content-type": "text/plain"},
        )
        plain = await http.post("/v1/chat/completions", content=CHAT, headers={"content-type": "text/plain"})
        form = await http.post(  # curl -d without -H
            "/v1/chat/completions", content=CHAT, headers={"content-type": "application/x-www-form-urlencoded"}
        )
        untyped = await http.post(  # fetch() with a Blob body: no content type, and no preflight
            "/v1/chat/completions", content=CHAT, headers={"content-type": ""}
        )
        preflight = await http.options(
            "/v1/chat/completions",
            headers={"origin": "http://evil.example", "access-control-request-method": "POST"},
        )
        snap = gw.client.snapshot()
    assert rebound.status_code == 421 and error_code(rebound) == "misdirected_request"
    assert cross.status_code == 403 and error_code(cross) == "origin_not_allowed"
    assert plain.status_code == 403 and error_code(plain) == "unsupported_content_type"
    assert "application/json" in plain.json()["error"]["message"]
    assert form.status_code == 403 and error_code(form) == "unsupported_content_type"
    assert untyped.status_code == 403 and error_code(untyped) == "unsupported_content_type"
    assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers
    assert snap.succeeded == 0 and snap.failed == 0  # nothing reached the provider


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.1.2.3", "[::1]", "LOCALHOST"])
async def test_loopback_names_with_any_port_are_served(host: str) -> None:
    async with running() as gw, gw.http() as http:
        r = await http.get("/health", headers={"host": f"{host}:{gw.server.port}"})
        bare = await http.get("/health", headers={"host": host})
    assert r.status_code == 200 and bare.status_code == 200


async def test_the_sdk_curl_style_and_the_control_api_are_not_refused() -> None:
    async with running() as gw, gw.http() as http:
        reply = await gw.openai().chat.completions.create(model="flagship", messages=HELLO)  # type: ignore[arg-type]
        curl = await http.post("/v1/chat/completions", content=CHAT, headers={"content-type": "application/json"})
        snapshot = await http.get("/capmon/snapshot")
        trip = await http.post("/capmon/trip", json={"target": "flagship"})  # what --connect sends
    assert reply.choices[0].message.content
    assert curl.status_code == 200 and snapshot.status_code == 200
    # refused for want of an admin key (this gateway has none), not as a browser
    assert trip.status_code == 403 and error_code(trip) not in ("origin_not_allowed", "unsupported_content_type")


async def test_allowed_origins_get_cors_and_others_do_not() -> None:
    allowed = "http://localhost:3000"
    async with running(gateway=f'cors_origins = ["{allowed}"]') as gw, gw.http() as http:
        preflight = await http.options(
            "/v1/chat/completions",
            headers={
                "origin": allowed,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type, authorization, x-stainless-os",
            },
        )
        call = await http.post(
            "/v1/chat/completions", content=CHAT, headers={"origin": allowed, "content-type": "application/json"}
        )
        other = await http.options(
            "/v1/chat/completions",
            headers={"origin": "http://localhost:3001", "access-control-request-method": "POST"},
        )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == allowed
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert "x-stainless-os" in preflight.headers["access-control-allow-headers"].lower()
    assert call.status_code == 200 and call.headers["access-control-allow-origin"] == allowed
    assert "x-capmon-model" in call.headers["access-control-expose-headers"]
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


async def test_with_client_keys_any_host_is_served_but_origins_are_still_refused() -> None:
    keys = 'keys = [{ env = "GW_CLIENT_KEY", alias = "team" }]'
    async with running(gateway=keys, environ={"GW_CLIENT_KEY": KEY}) as gw, gw.http(KEY) as http:
        named = await http.post(
            "/v1/chat/completions",
            content=CHAT,
            headers={"host": "gateway.lan:4000", "content-type": "application/json"},
        )
        page = await http.post(
            "/v1/chat/completions",
            content=CHAT,
            headers={"origin": "http://evil.example", "content-type": "text/plain"},
        )
    assert named.status_code == 200
    assert page.status_code == 403 and error_code(page) == "origin_not_allowed"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost:4000", True),
        ("127.0.0.1", True),
        ("127.255.0.9:1", True),
        ("[::1]:4000", True),
        ("[::1]", True),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("10.0.0.1:4000", False),
        ("[::1]x", False),
        ("localhost:port", False),
        ("", False),
    ],
)
def test_loopback_host(host: str, loopback: bool) -> None:
    assert loopback_host(host) is loopback


async def test_a_trailing_slash_is_a_404_in_the_apis_shape_never_a_redirect_to_the_clients_host() -> None:
    # With client keys any Host is served; Starlette's redirect_slashes built its Location from it.
    keys = 'keys = [{ env = "GW_CLIENT_KEY", alias = "team" }]'
    async with running(gateway=keys, environ={"GW_CLIENT_KEY": KEY}) as gw, gw.http(KEY) as http:
        hostile = {"host": "evil.example", "anthropic-version": "2023-06-01"}
        body = {"model": "auto", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        messages = await http.post("/v1/messages/", json=body, headers=hostile)
        chat = await http.post("/v1/chat/completions/", content=CHAT, headers={"host": "evil.example"})
        models = await http.get("/v1/models/", headers={"host": "evil.example"})
        snapshot = await http.get("/capmon/snapshot/", headers={"host": "evil.example"})
    for reply in (messages, chat, models, snapshot):
        assert reply.status_code == 404, (reply.request.url, reply.status_code, reply.headers)
        assert "location" not in reply.headers
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "not_found_error"
    assert "/v1/messages/" in messages.json()["error"]["message"]
    assert error_code(chat) == "not_found" and error_code(snapshot) == "not_found"
    assert error_code(models) == "model_not_found"  # /v1/models/{id} with an empty id
