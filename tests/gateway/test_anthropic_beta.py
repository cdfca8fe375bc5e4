"""The caller's ``anthropic-beta`` reaches an Anthropic-wire target that serves the request
in its own format (merged with the endpoint's own betas), and no other target; a header
that is no list of beta names is a 400 in Anthropic's shape."""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.gateway.helpers import CHAT_ANSWER, gateway_for, upstream

CLAUDE_ANSWER = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "sim-claude",
    "content": [{"type": "text", "text": "hello"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
BODY = {"model": "auto", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _upstream(seen: list[tuple[str, str | None]]) -> Starlette:
    async def messages(request: Request) -> Response:
        seen.append(("messages", request.headers.get("anthropic-beta")))
        return JSONResponse(CLAUDE_ANSWER)

    async def chat(request: Request) -> Response:
        seen.append(("chat", request.headers.get("anthropic-beta")))
        return JSONResponse(CHAT_ANSWER)

    return Starlette(
        routes=[
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ]
    )


@pytest.mark.parametrize("endpoint_beta", [None, "files-api-2025-04-14"])
async def test_the_callers_betas_reach_an_anthropic_target_of_the_same_format_only(endpoint_beta: str | None) -> None:
    seen: list[tuple[str, str | None]] = []
    own = f'{{ "anthropic-beta" = "{endpoint_beta}" }}' if endpoint_beta else ""
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "mid-conversation-system-2026-04-07, x-1"}
    async with (
        upstream(_upstream(seen)) as base_url,
        gateway_for(base_url, models=("claude", "flagship"), anthropic=("claude",), anthropic_headers=own) as gw,
        httpx.AsyncClient(base_url=gw[2].origin, trust_env=False) as http,
    ):
        client = gw[0]
        same = await http.post("/v1/messages", json=BODY, headers=headers)
        client.trip("claude")
        crossed = await http.post("/v1/messages", json=BODY, headers=headers)
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": "auto", "messages": BODY["messages"]},
            headers={"anthropic-beta": "x-1", "content-type": "application/json"},
        )
        bad = await http.post("/v1/messages", json=BODY, headers={"anthropic-beta": "a b;c"})
    assert same.status_code == 200 and same.headers["x-capmon-model"] == "claude", same.text
    assert crossed.status_code == 200 and crossed.headers["x-capmon-model"] == "flagship", crossed.text
    assert chat.status_code == 200, chat.text
    wanted = ",".join([*([endpoint_beta] if endpoint_beta else []), "mid-conversation-system-2026-04-07", "x-1"])
    assert seen == [("messages", wanted), ("chat", None), ("chat", None)], seen
    assert bad.status_code == 400, bad.text
    error = json.loads(bad.text)
    assert error["type"] == "error" and "anthropic-beta" in error["error"]["message"], error
