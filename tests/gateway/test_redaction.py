"""Provider keys never reach a client of the gateway, its log or the audit: not when a
hostile upstream echoes the key in any field of its error (message, param, code, type,
a nested field, an error inside a stream), and not through the control API's reads,
where a client-key holder sees a provider key only by its alias and every reason (a
provider's words, or what a person typed) is redacted."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from capmon.audit import AuditLog
from tests.gateway.helpers import HELLO, gateway_for, running, sse_frames, upstream

pytestmark = pytest.mark.looptime

CANARY = "CANARY-provider-key-0123456789-Q777"


def _error_echoing(field: str, token: str) -> tuple[int, Any]:
    """A provider error with the caller's key in ``field``."""
    if field == "message":
        return 400, {"error": {"message": f"bad key {token}", "type": "invalid_request_error", "param": None}}
    if field == "param":
        return 400, {"error": {"message": "no", "type": "invalid_request_error", "param": token, "code": "bad"}}
    if field == "code":
        return 400, {"error": {"message": "no", "type": "invalid_request_error", "param": "x", "code": token}}
    if field == "type":
        return 400, {"error": {"message": "no", "type": token, "param": None, "code": None}}
    if field == "top-level":  # Mistral's shape: the error's fields at the top
        return 400, {"object": "error", "message": "no", "type": token, "code": token, "param": token}
    assert field == "nested"  # OpenRouter's: the provider behind it, as a JSON string
    raw = json.dumps({"error": {"message": f"upstream refused {token}", "code": token}})
    return 400, {"error": {"message": "Provider returned error", "code": 400, "metadata": {"raw": raw}}}


def _hostile_upstream(echo: dict[str, str]) -> Starlette:
    async def answer(request: Request) -> Response:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if echo["field"] == "stream":  # an error inside a 200 stream, before any output
            frame = {"error": {"message": f"oops {token}", "type": token, "code": token, "param": token}}
            return Response(f"data: {json.dumps(frame)}\n\n", media_type="text/event-stream")
        status, body = _error_echoing(echo["field"], token)
        return JSONResponse(body, status)

    return Starlette(routes=[Route("/v1/{path:path}", answer, methods=["POST"])])


@pytest.mark.parametrize("field", ["message", "param", "code", "type", "top-level", "nested", "stream"])
async def test_a_key_echoed_in_any_field_of_a_providers_error_never_reaches_client_log_or_audit(
    field: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"field": field}
    async with (
        upstream(_hostile_upstream(echo)) as base_url,
        gateway_for(base_url, environ={"GW_PROVIDER_KEY": CANARY}, extra="[client]\nmax_attempts = 2") as (
            client,
            _,
            server,
        ),
    ):
        audit = AuditLog(clock=client.clock)
        client.add_observer(audit.observe)
        async with httpx.AsyncClient(base_url=server.origin, trust_env=False, timeout=60) as http:
            stream = field == "stream"
            r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO, "stream": stream})
            snapshot = await http.get("/capmon/snapshot")
            async with http.stream("GET", "/capmon/events") as events:
                lines = []
                async for line in events.aiter_lines():
                    lines.append(line)
                    if line.startswith("data:") and "RequestDone" in line:
                        break
    rows = audit.drain()
    assert r.status_code == (502 if field == "stream" else 400), r.text
    assert rows, "the audit saw the attempts"
    seen = {
        "the reply": r.text + json.dumps(dict(r.headers)),
        "the log": caplog.text,
        "the audit": repr(rows),
        "the snapshot": snapshot.text,
        "the events": "\n".join(lines),
    }
    for where, text in seen.items():
        assert CANARY not in text and "0123456789-Q777" not in text, f"the key reached {where}"
    error = r.json()["error"]
    if field in ("param", "code"):
        assert error[field] == "[redacted]", error  # passed through as the provider said it, without the key


async def test_client_key_holders_see_a_provider_key_only_by_its_alias_and_trip_reasons_are_redacted() -> None:
    client_key, admin_key = "sk-gw-client-0123456789abcdef", "sk-gw-admin-0123456789abcdef"
    refused_key = "CANARY-KEY-000-Q777"  # the simulator echoes it as CAN****Q777, as OpenAI does
    typed = "rotating sk-live-abcdefghijklmnopqrstuvwx after a leak"
    async with (
        running(
            environ={"GW_PROVIDER_KEY": refused_key, "GW_CLIENT": client_key, "GW_ADMIN": admin_key},
            gateway='keys = [{ env = "GW_CLIENT", alias = "team" }]\nadmin_key_env = "GW_ADMIN"',
        ) as gw,
        gw.http(client_key) as as_client,
        gw.http(admin_key) as as_admin,
    ):
        refused = await as_client.post("/v1/chat/completions", json={"model": "flagship", "messages": HELLO})
        tripped = await as_admin.post("/capmon/trip", json={"target": "medium", "reason": typed})
        reads = {}
        for who, http in (("client", as_client), ("admin", as_admin)):
            snapshot = await http.get("/capmon/snapshot")
            lines = []
            async with http.stream("GET", "/capmon/events") as events:
                async for line in events.aiter_lines():
                    lines.append(line)
                    if line.startswith("data:") and "rotating" in line:
                        break
            reads[who] = (snapshot, "\n".join(lines))
    assert refused.status_code == 502 and tripped.status_code == 200
    for who, (snapshot, events) in reads.items():
        assert snapshot.status_code == 200
        targets = snapshot.json()["targets"]
        flagship = next(t for t in targets if t["model"] == "flagship")
        medium = next(t for t in targets if t["model"] == "medium")
        assert flagship["key_state"] != "ok" and flagship["key_alias"] == "sim-key"
        assert "invalid_api_key" in flagship["key_reason"]  # the reason is there, without the key
        everything = snapshot.text + events
        assert "abcdefghijkl" not in everything, who  # what a person typed is redacted for everyone
        assert refused_key not in everything
        if who == "client":
            assert "Q777" not in everything and "CAN****" not in everything and "sk-liv" not in everything
            assert medium["breaker_reason"] == "rotating **** after a leak"
            assert any("rotating **** after a leak" in f.get("data", "") for f in sse_frames(events))
        else:  # the operator still tells keys apart by their first characters
            assert "CAN****Q777" in flagship["key_reason"]
            assert medium["breaker_reason"] == "rotating sk-liv**** after a leak"
