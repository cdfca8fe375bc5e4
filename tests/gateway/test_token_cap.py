"""The client's own token cap reaches the provider as it was sent (chat's max_tokens /
max_completion_tokens, the Responses API's max_output_tokens); the model's max_tokens is the
default when it sends none, and a ceiling only with ``[client] cap_client_tokens``, when the
reply says so (``x-capmon-max-tokens``). Seen by an upstream that records each body."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.gateway.helpers import CHAT_ANSWER, HELLO, gateway_for, running, upstream

pytestmark = pytest.mark.looptime

RESPONSE_ANSWER = {
    "id": "resp_1",
    "object": "response",
    "created_at": 0,
    "status": "completed",
    "model": "sim-flagship",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4},
}
MODEL_CAP = 64  # the helper's config: every model's max_tokens


def _upstream(seen: list[dict[str, Any]]) -> Starlette:
    async def chat(request: Request) -> Response:
        seen.append(json.loads(await request.body()))
        return JSONResponse({**CHAT_ANSWER, "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    async def responses(request: Request) -> Response:
        seen.append(json.loads(await request.body()))
        return JSONResponse(RESPONSE_ANSWER)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )


def _cap(body: dict[str, Any]) -> Any:
    return body.get("max_output_tokens", body.get("max_completion_tokens", body.get("max_tokens")))


async def test_the_clients_own_cap_is_kept_and_the_models_is_the_default() -> None:
    seen: list[dict[str, Any]] = []
    async with upstream(_upstream(seen)) as base_url, gateway_for(base_url) as (_client, _app, server):
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        kept = await sdk.responses.with_raw_response.create(model="auto", input="hi", max_output_tokens=4000)
        chat = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, max_completion_tokens=4000
        )
        await sdk.chat.completions.create(model="auto", messages=HELLO, max_tokens=3000)
        await sdk.responses.create(model="auto", input="hi")  # none given, as Codex sends
        await sdk.chat.completions.create(model="auto", messages=HELLO)
    assert [_cap(b) for b in seen] == [4000, 4000, 3000, MODEL_CAP, MODEL_CAP]
    assert "x-capmon-max-tokens" not in kept.headers and "x-capmon-max-tokens" not in chat.headers


async def test_with_cap_client_tokens_the_models_cap_is_a_ceiling_and_the_reply_says_so() -> None:
    seen: list[dict[str, Any]] = []
    ceiling = "[client]\ncap_client_tokens = true"
    async with upstream(_upstream(seen)) as base_url, gateway_for(base_url, extra=ceiling) as (_c, _a, server):
        sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        lowered = await sdk.responses.with_raw_response.create(model="auto", input="hi", max_output_tokens=4000)
        chat = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, max_completion_tokens=4000
        )
        below = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO, max_tokens=10)
    assert [_cap(b) for b in seen] == [MODEL_CAP, MODEL_CAP, 10]
    assert lowered.headers["x-capmon-max-tokens"] == str(MODEL_CAP)
    assert chat.headers["x-capmon-max-tokens"] == str(MODEL_CAP)
    assert "x-capmon-max-tokens" not in below.headers  # not lowered: nothing to say


async def test_a_stream_whose_cap_was_lowered_says_so_in_its_headers() -> None:
    async with running(extra="[client]\ncap_client_tokens = true") as gw, gw.openai() as sdk:
        async with sdk.chat.completions.with_streaming_response.create(
            model="auto", messages=HELLO, max_tokens=4000, stream=True
        ) as r:
            assert r.headers["x-capmon-max-tokens"] == str(MODEL_CAP)
            assert [line async for line in r.iter_lines() if line.startswith("data: [DONE]")]
