"""Anthropic's Messages API on the gateway: ``POST /v1/messages`` (plain or ``"stream":
true``) and ``POST /v1/messages/count_tokens``.

A Messages request is routed like any other (the same models, aliases, deadline, priority
and fallbacks) and answered in Anthropic's shapes whichever model served it: the core's
``Request.anthropic`` request is translated for an OpenAI-wire target and its answer
and events back (capmon/core/providers/formats.py). The key comes as ``x-api-key`` (Anthropic's
SDKs before 2.x, Claude Code) or ``Authorization: Bearer`` (SDK 2.x); ``anthropic-version``
2023-06-01 and 2026-10-21 are both taken. Errors on these paths are Anthropic's
(capmon/gateway/anthropic_errors.py).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.core.providers.tokens import estimate_body
from capmon.core.types.result import Format
from capmon.gateway import bodies, shape
from capmon.gateway.auth import Access
from capmon.gateway.context import gateway_of
from capmon.gateway.inbound import MESSAGES, checked_body, proxied
from capmon.gateway.replies import JsonReply, Nothing


async def messages(request: Request) -> Response:
    return await proxied(gateway_of(request), request.scope, request.receive, MESSAGES)


def input_tokens(body: dict[str, Any]) -> int:
    """The project's one estimate (capmon/core/providers/tokens.py) of a Messages body: the system
    prompt, the messages and the tools, as routing and the simulator count them."""
    return estimate_body(Format.MESSAGES, body)


async def count_tokens(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(request.headers, Access.USE)
    body = await checked_body(gw, request.receive, request.headers, shape.MESSAGES)
    if body is None:
        return Nothing()
    body = bodies.count_tokens(body, request.headers, gw.names)
    return JsonReply({"input_tokens": input_tokens(body)})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
