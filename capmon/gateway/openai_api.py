"""The OpenAI API the gateway speaks: POST /v1/chat/completions, POST /v1/responses (plain
or ``"stream": true``), GET /v1/models and /v1/models/{name}."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.gateway import bodies, fields
from capmon.gateway.auth import Access
from capmon.gateway.bodies import Wanted
from capmon.gateway.context import gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.replies import JsonReply, Nothing, PlainReply, StreamReply


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


async def _proxied(request: Request, parse: Callable[..., Wanted]) -> Response:
    """Read, check and route one request of either API (``parse``: bodies.chat or bodies.responses)."""
    gw = gateway_of(request)
    caller = gw.auth.require(request.headers, Access.USE)
    raw = await read_body(request, gw.settings.max_body_bytes)
    if raw is None:
        return Nothing()
    wanted = parse(fields.json_object(raw), request.headers, caller, gw.names)
    return StreamReply(gw, wanted) if wanted.stream else PlainReply(gw, wanted)


async def chat_completions(request: Request) -> Response:
    return await _proxied(request, bodies.chat)


async def responses(request: Request) -> Response:
    return await _proxied(request, bodies.responses)


async def list_models(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(request.headers, Access.USE)
    return JsonReply(gw.names.listing(gw.started))


async def get_model(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(request.headers, Access.USE)
    name = request.path_params["name"]
    gw.names.resolve(name)  # 404 for a name it does not know
    return JsonReply(gw.names.entry(name, gw.started))


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{name:path}", get_model, methods=["GET"]),
]
