"""Vertex AI's paths on the gateway, so clients built for Vertex (google-genai with
``vertexai=True``, the anthropic SDK's ``AnthropicVertex``) reach capmon by changing their
base URL: ``POST /{v1,v1beta1}/projects/{project}/locations/{location}/publishers/google/
models/{model}:generateContent`` (and ``:streamGenerateContent``, ``:countTokens``), served
as the Gemini API's routes are (capmon/gateway/gemini_api.py), and
``.../publishers/anthropic/models/{model}:rawPredict`` / ``:streamRawPredict``, Anthropic's
Messages body with the model in the path and ``anthropic_version`` in the body, served as
``/v1/messages`` is (the version field is Vertex's, not the Messages API's: it is left
out). The project and location are the caller's business, not the gateway's: any are
taken. The key is a Bearer token (what both SDKs send), checked as on every route; errors
are in the shape of the publisher's API (capmon/gateway/faces.py).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.gateway import bodies, shape
from capmon.gateway.anthropic_api import count_tokens
from capmon.gateway.bodies import Asked, Wanted
from capmon.gateway.context import gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.gemini_api import models_method
from capmon.gateway.inbound import ProxiedApi, proxied

VERTEX_VERSION = "anthropic_version"  # the body's field on Vertex (the model is in the path)
RAW = "rawPredict"
COUNT_TOKENS = "count-tokens"  # AnthropicVertex's count_tokens: .../models/count-tokens:rawPredict
STREAM_RAW = "streamRawPredict"


def _claude(model: str, stream: bool) -> ProxiedApi:
    def parse(body: dict[str, Any], asked: Asked) -> Wanted:
        body.pop(VERTEX_VERSION, None)
        body["model"] = model
        if stream:
            body["stream"] = True
        return bodies.messages(body, asked)

    return ProxiedApi(shape.MESSAGES, parse)


async def anthropic_method(request: Request) -> Response:
    model, _, method = request.path_params["target"].rpartition(":")
    if not model or method not in (RAW, STREAM_RAW):
        raise ApiError(404, f"Method not found: {request.path_params['target'][:100]!r}", "not_found_error")
    gw = gateway_of(request)
    if model == COUNT_TOKENS and method == RAW:
        return await count_tokens(request)  # the model is in the body; anthropic_version counts for nothing
    return await proxied(gw, request.scope, request.receive, _claude(model, method == STREAM_RAW), model=model)


_ROOT = "/{version}/projects/{project}/locations/{location}/publishers"

ROUTES = [
    Route(_ROOT + "/google/models/{target:path}", models_method, methods=["POST"]),
    Route(_ROOT + "/anthropic/models/{target:path}", anthropic_method, methods=["POST"]),
]
