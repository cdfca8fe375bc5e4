"""Google's Gemini API on the gateway: ``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` (``?alt=sse``: server-sent events; without it, one JSON array)
and ``:countTokens``, the same under ``/v1/``, and ``GET /v1beta/models`` (and one model).

A Gemini request is routed like any other (the same models, aliases, deadline, priority
and fallbacks) and answered in Gemini's shapes whichever model served it: the core's
``Format.GEMINI`` request is translated for a target on another wire and its answer and
chunks back (capmon/core/providers/formats.py). The google-genai SDKs and Gemini CLI then
reach every model through capmon. The key comes as ``x-goog-api-key`` or ``?key=`` (or any
header the other routes take). Errors on these paths are Google's
(capmon/gateway/gemini_errors.py).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.core.providers.tokens import estimate_body
from capmon.core.types.result import Format
from capmon.gateway import bodies, shape
from capmon.gateway.auth import Access
from capmon.gateway.context import Gateway, gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.inbound import Parse, ProxiedApi, checked_body, header_map, proxied
from capmon.gateway.replies import JsonReply, Nothing
from capmon.gateway.sse import GeminiArrayFraming

KEY_HEADER = "x-goog-api-key"
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
METHODS = (GENERATE, STREAM, COUNT)


def _headers(request: Request) -> dict[str, str]:
    """The request's headers, with a ``?key=`` moved to ``x-goog-api-key`` (where the
    gateway's auth reads it) when no header carries one."""
    headers = header_map(request.scope)
    key = request.query_params.get("key")
    if key and KEY_HEADER not in headers:
        headers[KEY_HEADER] = key
    return headers


def _model_and_method(request: Request) -> tuple[str, str]:
    """``{model}:{method}`` from the path; a method Google's API has not is its 404."""
    model, _, method = request.path_params["target"].rpartition(":")
    if not model or method not in METHODS:
        raise ApiError(404, f"Method not found: {request.path_params['target'][:100]!r}", "not_found_error")
    return model.removeprefix("models/"), method


async def models_method(request: Request) -> Response:
    gw = gateway_of(request)
    model, method = _model_and_method(request)
    headers = _headers(request)
    if method == COUNT:
        return await _count_tokens(gw, request, headers, model)
    stream = method == STREAM
    parse = functools.partial(bodies.gemini, model=model, stream=stream)
    api = ProxiedApi(shape.GEMINI, parse)
    if stream and request.query_params.get("alt") != "sse":
        api = ProxiedApi(shape.GEMINI, _array_framed(parse))
    return await proxied(gw, request.scope, request.receive, api, headers=headers, model=model)


def _array_framed(parse: Parse) -> Parse:
    def framed(body: dict[str, Any], asked: bodies.Asked) -> bodies.Wanted:
        wanted = parse(body, asked)
        return bodies.Wanted(wanted.request, wanted.stream, wanted.priority, GeminiArrayFraming)

    return framed


async def _count_tokens(gw: Gateway, request: Request, headers: dict[str, str], model: str) -> Response:
    """``:countTokens``: the project's one estimate (capmon/core/providers/tokens.py) of the
    contents (or of a ``generateContentRequest``), as routing and the simulator count them."""
    gw.auth.require(headers, Access.USE)
    gw.names.resolve(model)  # 404 for a name it does not know
    body = await checked_body(gw, request.receive, headers, shape.GEMINI_COUNT)
    if body is None:
        return Nothing()
    inner = body.get("generateContentRequest")
    counted = inner if isinstance(inner, dict) else {"contents": body.get("contents") or []}
    return JsonReply({"totalTokens": estimate_body(Format.GEMINI, counted)})


def _model_entry(gw: Gateway, name: str) -> dict[str, Any]:
    """Google's Model object for one of the gateway's names (its limits: the configured
    model's, an alias's target's, or the largest for the preference order)."""
    target = gw.names.resolve(name)
    models = [m for m in gw.client.config.models if target is None or m.name == target]
    return {
        "name": f"models/{name}",
        "displayName": name,
        "inputTokenLimit": max(m.context_window for m in models),
        "outputTokenLimit": max(m.max_tokens for m in models),
        "supportedGenerationMethods": list(METHODS),
    }


async def list_models(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(_headers(request), Access.USE)
    names = list(gw.names.models) + [a for a in gw.names.exact if a not in gw.names.models]
    return JsonReply({"models": [_model_entry(gw, n) for n in names]})


async def get_model(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(_headers(request), Access.USE)
    return JsonReply(_model_entry(gw, request.path_params["name"].removeprefix("models/")))


ROUTES = [
    Route("/v1beta/models/{target:path}", models_method, methods=["POST"]),
    Route("/v1/models/{target:path}", models_method, methods=["POST"]),  # google-genai 3.x's default version
    Route("/v1beta/models", list_models, methods=["GET"]),  # /v1/models is the OpenAI API's list
    Route("/v1beta/models/{name:path}", get_model, methods=["GET"]),
]
