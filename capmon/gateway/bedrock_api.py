"""AWS Bedrock's runtime API on the gateway: ``POST /model/{modelId}/converse`` and
``/model/{modelId}/converse-stream`` (AWS's binary event stream), so boto3's bedrock-runtime
client (``endpoint_url=`` the gateway) reaches every model of the config through capmon; and
InvokeModel's ``/invoke`` and ``/invoke-with-response-stream`` with Anthropic's Messages body
(``anthropic_version`` in it, the model in the path), what the anthropic SDK's
``AnthropicBedrock`` sends, answered in Messages' shapes (a stream's events as the ``chunk``
events' bytes) and failing in Bedrock's, as Bedrock's InvokeModel does (boto3's
``invoke_model`` raises its own exception classes; AnthropicBedrock reads the status).

A Converse request is routed like any other (the same models, aliases, deadline, priority
and fallbacks; the model is the path's ``modelId``, URL-decoded) and answered in Converse's
shapes whichever model served it. boto3 signs every request with SigV4: a gateway with
client keys checks the signature (capmon/core/providers/aws_sigv4.py), a client key's alias
as the access key id and the key itself as the secret (``aws_access_key_id="team",
aws_secret_access_key=KEY``: the key never travels, the signature over the method, path,
signed headers and body proves it); one without keys takes any signature, or none. Errors on these paths are Bedrock's
(capmon/gateway/bedrock_errors.py).
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive

from capmon.core.providers import aws_sigv4
from capmon.gateway import bodies, shape, sse
from capmon.gateway.bedrock_errors import BedrockError
from capmon.gateway.bodies import Asked, Wanted
from capmon.gateway.context import Gateway, gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.inbound import ProxiedApi, header_map, proxied, read_raw
from capmon.gateway.replies import Nothing

VERSION_FIELD = "anthropic_version"  # InvokeModel's Messages body carries Bedrock's version
KEY_HEADER = "x-api-key"  # where a verified signer's key is put for the gateway's auth to read


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed over first (then the connection's own
    messages: a disconnect)."""
    given = False

    async def replayed() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


def _secret_of(gw: Gateway, key_id: str) -> str | None:
    """The client key whose alias signed, as the SigV4 secret."""
    return next((k.secret.reveal() for k in gw.settings.keys if k.alias == key_id), None)


def _refused() -> ApiError:
    return ApiError(
        401,
        "The request signature we calculated does not match the signature you provided. Sign with a client key "
        "of this gateway as aws_secret_access_key and its alias as aws_access_key_id.",
        "invalid_request_error",
        "invalid_api_key",
    )


async def _signed(request: Request, gw: Gateway) -> tuple[dict[str, str], Receive] | None:
    """The request's headers and body as the gateway's auth and reader take them: a SigV4
    signature checked (on a gateway with client keys) and its signer's key put where the auth
    reads one; None when the client went away."""
    headers = header_map(request.scope)
    receive = request.receive
    signed = aws_sigv4.parse(headers.get("authorization", ""))
    if signed is None:
        return headers, receive
    del headers["authorization"]  # a signature, not a key: the gateway's auth reads no key there
    if gw.settings.open:
        return headers, receive
    raw = await read_raw(receive, headers, gw.settings.max_body_bytes)
    if raw is None:
        return None
    path = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    url = f"{request.url.scheme}://{headers.get('host', '')}{path.decode('latin-1')}"
    url += f"?{query.decode('latin-1')}" if query else ""
    secret = _secret_of(gw, signed.access_key)
    if secret is None or not aws_sigv4.verify(signed, secret, "POST", url, headers, raw):
        raise _refused()
    headers[KEY_HEADER] = secret
    return headers, _replay(raw, receive)


async def _proxied(request: Request, api: ProxiedApi) -> Response:
    gw = gateway_of(request)
    got = await _signed(request, gw)
    if got is None:
        return Nothing()
    headers, receive = got
    return await proxied(gw, request.scope, receive, api, headers=headers, model=request.path_params["model_id"])


async def converse(request: Request) -> Response:
    parse = functools.partial(bodies.converse, model=request.path_params["model_id"], stream=False)
    return await _proxied(request, ProxiedApi(shape.CONVERSE, parse))


async def converse_stream(request: Request) -> Response:
    parse = functools.partial(bodies.converse, model=request.path_params["model_id"], stream=True)
    return await _proxied(request, ProxiedApi(shape.CONVERSE, parse))


def _claude(model: str, stream: bool) -> ProxiedApi:
    """InvokeModel's body for Anthropic's models: Messages with Bedrock's ``anthropic_version``
    and the model in the path (the anthropic SDK's ``AnthropicBedrock``)."""

    def parse(body: dict[str, Any], asked: Asked) -> Wanted:
        body.pop(VERSION_FIELD, None)
        body["model"] = model
        body.pop("stream", None)
        wanted = bodies.messages(body, asked)
        framing = sse.InvokeStreamFraming if stream else None
        return Wanted(wanted.request, stream, wanted.priority, framing, BedrockError.of)

    return ProxiedApi(shape.MESSAGES, parse)


async def invoke(request: Request) -> Response:
    return await _proxied(request, _claude(request.path_params["model_id"], stream=False))


async def invoke_stream(request: Request) -> Response:
    return await _proxied(request, _claude(request.path_params["model_id"], stream=True))


ROUTES = [
    Route("/model/{model_id:path}/converse", converse, methods=["POST"]),
    Route("/model/{model_id:path}/converse-stream", converse_stream, methods=["POST"]),
    Route("/model/{model_id:path}/invoke", invoke, methods=["POST"]),
    Route("/model/{model_id:path}/invoke-with-response-stream", invoke_stream, methods=["POST"]),
]
