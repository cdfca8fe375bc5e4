"""A small scripted OpenAI-style server for core integration tests.

Each model answers from a script: a callable deciding, per request, what to send.
It runs with uvicorn on a real loopback port in the test's own event loop, so the
client under test goes through real httpx and real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, str/bytes -> raw
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def ok(model: str, text: str = "hello") -> Reply:
    return Reply(
        200,
        {
            "id": "x",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        },
    )


OVERLOADED = Reply(
    503,
    {
        "error": {
            "message": "Selected model is at capacity. Please try a different model.",
            "type": "server_error",
            "code": "server_is_overloaded",
        }
    },
)


@dataclass
class Seen:
    model: str
    key: str
    body: dict[str, Any]
    at: float
    headers: dict[str, str] = field(default_factory=dict)  # every header, by lower-case name
    raw: bytes = b""  # the body's bytes as they came


class Script:
    """Per-model behaviour: ``set(model, fn)`` where ``fn(n, body) -> Reply`` and ``n``
    counts that model's requests from 1."""

    def __init__(self) -> None:
        self.rules: dict[str, Callable[[int, dict[str, Any]], Reply]] = {}
        self.counts: dict[str, int] = {}
        self.seen: list[Seen] = []

    def set(self, model: str, fn: Callable[[int, dict[str, Any]], Reply]) -> None:
        self.rules[model] = fn

    def always(self, model: str, reply: Reply) -> None:
        self.rules[model] = lambda n, body: reply

    def served(self, model: str | None = None) -> int:
        return sum(1 for s in self.seen if model is None or s.model == model)


def build_app(script: Script) -> Starlette:
    async def chat(request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        model = body.get("model", "")
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        at = asyncio.get_running_loop().time()
        script.seen.append(Seen(model, key, body, at, dict(request.headers), raw))
        n = script.counts[model] = script.counts.get(model, 0) + 1
        rule = script.rules.get(model, lambda n, body: ok(model))
        reply = rule(n, body)
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if isinstance(reply.body, (dict, list)):
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        return Response(reply.body or b"", status_code=reply.status, headers=reply.headers)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", chat, methods=["POST"]),  # the same script: a rule answers either
        ]
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(script: Script) -> AsyncIterator[str]:
    """Serve ``script`` on a loopback port; yields the base URL (``.../v1``)."""
    async with serve_app(build_app(script)) as url:
        yield url + "/v1"


@contextlib.asynccontextmanager
async def serve_app(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` on a loopback port in this event loop; yields its root URL."""
    port = free_port()
    # A bounded graceful shutdown: a reply still sleeping (a hung upstream's delay of an hour) is
    # cancelled instead of waited for, in uvicorn's 0.1 s polls (tens of thousands under looptime).
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        timeout_graceful_shutdown=1.0,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
