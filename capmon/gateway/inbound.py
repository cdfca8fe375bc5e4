"""A proxied request as it comes in: the caller's key, the body within the gateway's cap,
the checked body, and the reply that routes it (plain or streamed). The same for every
API the gateway speaks; an error raised here is told in the shape of the route's API
(capmon/gateway/app.py's handler, capmon/gateway/anthropic_errors.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from capmon.core.secrets import redact
from capmon.gateway import fields
from capmon.gateway.auth import Access
from capmon.gateway.bodies import Wanted
from capmon.gateway.context import gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.exchange import exchange_of
from capmon.gateway.replies import Nothing, PlainReply, StreamReply

MAX_MODEL_NAME = 200  # characters of the model a client asked for kept for its header and log line


async def read_body(request: Request, cap: int) -> bytes | None:
    """The body, at most ``cap`` bytes (413 past it); None when the client went away."""
    too_large = ApiError(
        413,
        f"the request body is larger than this gateway takes ({cap} bytes; gateway.max_body_bytes)",
        "invalid_request_error",
        "request_too_large",
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        raise too_large
    pieces, size = [], 0
    try:
        async for piece in request.stream():
            size += len(piece)
            if size > cap:
                raise too_large
            pieces.append(piece)
    except ClientDisconnect:
        return None
    return b"".join(pieces)


async def proxied(request: Request, parse: Callable[..., Wanted]) -> Response:
    """Read, check and route one request (``parse``: bodies.chat, bodies.responses or
    bodies.messages)."""
    gw = gateway_of(request)
    caller = gw.auth.require(request.headers, Access.USE)
    ex = exchange_of(request)
    raw = await read_body(request, gw.settings.max_body_bytes)
    if raw is None:
        return Nothing()
    body = fields.json_object(raw)
    if ex is not None:
        ex.caller = caller.alias
        model = body.get("model")
        # redacted: a key pasted where a model name goes is echoed nowhere
        ex.model_requested = redact(model[:MAX_MODEL_NAME]) if isinstance(model, str) else None
    wanted = parse(body, request.headers, caller, gw.names)
    if wanted.request.deadline is None:  # no x-capmon-deadline: the gateway's own default
        wanted = dataclasses.replace(
            wanted, request=dataclasses.replace(wanted.request, deadline=gw.client.config.gateway.deadline)
        )
    if ex is not None:
        ex.priority = wanted.priority.value
        wanted = dataclasses.replace(wanted, request=dataclasses.replace(wanted.request, request_id=ex.request_id))
    return StreamReply(gw, wanted, ex) if wanted.stream else PlainReply(gw, wanted, ex)
