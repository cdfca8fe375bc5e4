"""A proxied request as it comes in: the caller's key, the body within the gateway's cap,
the checked body, and the reply that routes it (plain or streamed). The same for every
API the gateway speaks; an error raised here is told in the shape of the route's API
(capmon/gateway/app.py's handler, capmon/gateway/anthropic_errors.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from capmon.gateway import fields
from capmon.gateway.auth import Access
from capmon.gateway.bodies import Wanted
from capmon.gateway.context import gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.replies import Nothing, PlainReply, StreamReply


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
    raw = await read_body(request, gw.settings.max_body_bytes)
    if raw is None:
        return Nothing()
    wanted = parse(fields.json_object(raw), request.headers, caller, gw.names)
    if wanted.request.deadline is None:  # no x-capmon-deadline: the gateway's own default
        wanted = replace(wanted, request=replace(wanted.request, deadline=gw.client.config.gateway.deadline))
    return StreamReply(gw, wanted) if wanted.stream else PlainReply(gw, wanted)
