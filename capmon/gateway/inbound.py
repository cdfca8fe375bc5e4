"""A proxied request as it comes in: the caller's key, the body within the gateway's cap
and its limits of shape (capmon/gateway/shape.py), the checked body, and the reply that
routes it (plain or streamed). The same for every API the gateway speaks; an error raised
here is told in the shape of the route's API (:func:`error_response`,
capmon/gateway/anthropic_errors.py).

:class:`ProxiedRoutes` answers the proxied APIs' POSTs ahead of Starlette's exception
middleware and router, which cost a third of the gateway's own work per request and do
nothing these routes need: the paths are exact, the handler is known, and its one
expected error (:class:`ApiError`) is answered here. Every other request, and these paths
with another method (a 405) or under a root path, goes on to Starlette's routes, which
call the same :func:`proxied`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from capmon.core.base.secrets import redact
from capmon.gateway import bodies, fields, shape
from capmon.gateway.auth import Access
from capmon.gateway.bodies import Asked, Wanted
from capmon.gateway.context import Gateway
from capmon.gateway.errors import ApiError
from capmon.gateway.exchange import exchange_of
from capmon.gateway.faces import shaped_for
from capmon.gateway.replies import Nothing, PlainReply, StreamReply, error_reply

MAX_MODEL_NAME = 200  # characters of the model a client asked for kept for its header and log line

Parse = Callable[[dict[str, Any], Asked], Wanted]  # bodies.chat, bodies.responses, bodies.messages...


@dataclass(frozen=True)
class ProxiedApi:
    """A proxied API: where its body's counted arrays are, and what reads the body."""

    shape: shape.Shape
    parse: Parse


CHAT = ProxiedApi(shape.CHAT, bodies.chat)
RESPONSES = ProxiedApi(shape.RESPONSES, bodies.responses)
MESSAGES = ProxiedApi(shape.MESSAGES, bodies.messages)

# The proxied APIs (POST) by path.
PROXIED: Mapping[str, ProxiedApi] = {"/v1/chat/completions": CHAT, "/v1/responses": RESPONSES, "/v1/messages": MESSAGES}


async def _read(receive: Receive, headers: Mapping[str, str], cap: int, add: Callable[[bytes], object]) -> bool:
    """The body's pieces, each to ``add`` as it arrives, at most ``cap`` bytes (413 past it);
    False when the client went away."""
    length = headers.get("content-length", "")
    if length.isdigit() and int(length) > cap:
        raise _too_large(cap)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        piece = message.get("body", b"")
        size += len(piece)
        if size > cap:
            raise _too_large(cap)
        add(piece)
        if not message.get("more_body", False):
            return True


async def read_text(receive: Receive, headers: Mapping[str, str], cap: int) -> str | None:
    """The body's text (:class:`capmon.gateway.fields.BodyText`: decoded as it arrives), at
    most ``cap`` bytes (413 past it); None when the client went away."""
    text = fields.BodyText()
    return text.text() if await _read(receive, headers, cap, text.add) else None


async def read_raw(receive: Receive, headers: Mapping[str, str], cap: int) -> bytes | None:
    """The body's bytes as sent (what a signature is over), at most ``cap`` (413 past it);
    None when the client went away."""
    pieces: list[bytes] = []
    return b"".join(pieces) if await _read(receive, headers, cap, pieces.append) else None


async def checked_body(
    gw: Gateway, receive: Receive, headers: Mapping[str, str], of: shape.Shape
) -> dict[str, Any] | None:
    """A proxied request's body: a JSON object within the gateway's cap and its limits of
    shape (a 413 or 400 else); None when the client went away."""
    text = await read_text(receive, headers, gw.settings.max_body_bytes)
    return None if text is None else await gw.reader.read(text, of)


def _too_large(cap: int) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than this gateway takes ({cap} bytes; gateway.max_body_bytes)",
        "invalid_request_error",
        "request_too_large",
    )


def error_response(scope: Scope, err: ApiError) -> Response:
    """The answer to a request refused with ``err``, in its API's shape, counted on its exchange."""
    ex = exchange_of(scope)
    if ex is not None:
        ex.failed(err.code or err.type)
    return error_reply(shaped_for(scope.get("path", ""), err))


def header_map(scope: Scope) -> dict[str, str]:
    """A request's headers by lower-case name, the first of each name (as Starlette's
    ``Headers.get`` reads them): a copy of :func:`read_headers`' map, for a route that
    changes it (moves a key to where the auth reads one)."""
    return dict(read_headers(scope)[0])


_HEADERS = "capmon.headers"  # the scope's key of read_headers' map


def read_headers(scope: Scope) -> tuple[dict[str, str], bool]:
    """A request's headers by lower-case name, the first of each name (as Starlette's
    ``Headers.get`` reads them), read once for the layers that read it in turn (the browser
    checks, then the proxied routes, which do not change it), and whether
    every name came lower-case (as the ASGI spec has servers send them: then a lookup of a
    lower-case ASCII name in the map finds what Starlette's ``Headers`` finds)."""
    raw = scope["headers"]
    cached = scope.get(_HEADERS)
    if cached is not None and cached[0] is raw:
        return cached[1], cached[2]
    out: dict[str, str] = {}
    lower = True
    for name, value in raw:
        lower = lower and name.lower() == name  # no ASCII capital: what a lookup of an ASCII name tells apart
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    scope[_HEADERS] = (raw, out, lower)
    return out, lower


async def proxied(
    gw: Gateway,
    scope: Scope,
    receive: Receive,
    api: ProxiedApi,
    *,
    headers: dict[str, str] | None = None,
    model: str | None = None,
) -> Response:
    """Read, check and route one request (``headers``: the request's, by lower-case name,
    when the route read them itself; ``model``: the model its path names, for an API whose
    body names none)."""
    if headers is None:
        headers = header_map(scope)
    caller = gw.auth.require(headers, Access.USE)
    ex = exchange_of(scope)
    body = await checked_body(gw, receive, headers, api.shape)
    if body is None:
        return Nothing()
    if ex is not None:
        ex.caller = caller.alias
        if model is None:
            model = body.get("model")
        if isinstance(model, str):
            # a key pasted where a model name goes is echoed nowhere: redacted, unless it is
            # one of the gateway's own names
            ex.model_requested = model if gw.names.known(model) else redact(model[:MAX_MODEL_NAME])
    asked = Asked(
        headers,
        caller,
        gw.names,
        deadline=gw.client.config.gateway.deadline,
        request_id=ex.request_id if ex is not None else None,
    )
    wanted = api.parse(body, asked)
    if ex is not None:
        ex.priority = wanted.priority.value
    return StreamReply(gw, wanted, ex) if wanted.stream else PlainReply(gw, wanted, ex)


class ProxiedRoutes:
    """The proxied APIs' POSTs, answered without Starlette's router (pure ASGI)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = PROXIED.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if api is None or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        try:
            reply = await proxied(self.gw, scope, receive, api, headers=read_headers(scope)[0])
        except ApiError as err:
            reply = error_response(scope, err)
        await reply(scope, receive, send)
