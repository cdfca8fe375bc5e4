"""The OpenAI API the gateway speaks: POST /v1/chat/completions, POST /v1/responses (plain
or ``"stream": true``), GET /v1/models and /v1/models/{name}."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.gateway.auth import Access
from capmon.gateway.context import gateway_of
from capmon.gateway.inbound import CHAT, RESPONSES, proxied
from capmon.gateway.replies import JsonReply


async def chat_completions(request: Request) -> Response:
    return await proxied(gateway_of(request), request.scope, request.receive, CHAT)


async def responses(request: Request) -> Response:
    return await proxied(gateway_of(request), request.scope, request.receive, RESPONSES)


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
