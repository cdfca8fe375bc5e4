"""The gateway as an ASGI app: the OpenAI API (capmon/gateway/openai_api.py), Anthropic's
Messages API (capmon/gateway/anthropic_api.py), Google's generateContent
(capmon/gateway/gemini_api.py) and Vertex AI's paths for both (capmon/gateway/vertex_api.py),
Bedrock's Converse (capmon/gateway/bedrock_api.py),
the control API (capmon/gateway/control.py),
/metrics, /health and /ready, around one shared FallbackClient that the caller owns
(``capmon serve`` opens it with the engine).

Every error the gateway answers is in the OpenAI shape, 404 and 405 included, but on
Anthropic's paths (``/v1/messages...``, Claude on Vertex), where it is in Anthropic's, and on
Google's (``/v1beta/models...``, ``/v1/models/{model}:...``, Gemini on Vertex), where it is in Google's,
and on Bedrock's (``/model/...``), where it is in Bedrock's
(capmon/gateway/faces.py). Paths are exact: a
trailing slash is a 404, never a redirect.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capmon.core.routing.client import FallbackClient
from capmon.gateway import anthropic_api, bedrock_api, control, gemini_api, openai_api, vertex_api
from capmon.gateway.access_log import AccessLog
from capmon.gateway.auth import Access, Authenticator
from capmon.gateway.browsers import BrowserGuard, add_cors
from capmon.gateway.context import Gateway, gateway_of
from capmon.gateway.errors import ApiError
from capmon.gateway.exchange import Exchanges, ExchangeTracer
from capmon.gateway.feed import EventFeed
from capmon.gateway.inbound import ProxiedRoutes, error_response
from capmon.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from capmon.gateway.models import ModelNames
from capmon.gateway.readiness import readiness
from capmon.gateway.replies import JsonReply
from capmon.gateway.settings import GatewaySettings
from capmon.gateway.telemetry import open_tracer

log = logging.getLogger("capmon.gateway")


async def health(request: Request) -> Response:
    return JsonReply({"status": "ok"})


async def ready(request: Request) -> Response:
    state = readiness(gateway_of(request).client)
    return JsonReply(state.as_json(), 200 if state.ready else 503)


async def metrics(request: Request) -> Response:
    gw = gateway_of(request)
    gw.auth.require(request.headers, Access.USE)
    return Response(gw.metrics.exposition(), media_type=CONTENT_TYPE)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(request.scope, exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
    message = {
        404: f"no such endpoint: {request.method} {request.url.path}"[:200],
        405: f"{request.method} is not allowed on {request.url.path}"[:200],
    }.get(exc.status_code, exc.detail)
    err = ApiError(exc.status_code, message, "invalid_request_error", kind, headers=dict(exc.headers or {}))
    return error_response(request.scope, err)


def create_app(
    client: FallbackClient, settings: GatewaySettings, *, tracer: ExchangeTracer | None = None, in_process: bool = False
) -> Starlette:
    """The gateway in front of ``client``. Call it in the event loop that serves it; call
    ``close_app(app)`` when done (the client stays the caller's). Its traces go to
    ``tracer``, else where the config's ``[telemetry]`` says (none without it).
    ``in_process``: for the SDK clients' transport in this process (capmon/inprocess),
    without the browser checks and CORS: no browser can reach an app that has no socket."""
    names = ModelNames(settings.models, settings.aliases)
    access_log = AccessLog(settings.access_log) if settings.access_log else None
    gw = Gateway(
        client=client,
        settings=settings,
        auth=Authenticator(settings),
        names=names,
        metrics=GatewayMetrics(client, access_log, shared_dir=settings.metrics_dir),
        feed=EventFeed(client.bus),
        started=int(client.clock.wall()),
        access_log=access_log,
        tracer=tracer if tracer is not None else open_tracer(client),
    )
    routes = [
        *openai_api.ROUTES,
        *anthropic_api.ROUTES,
        *gemini_api.ROUTES,
        *vertex_api.ROUTES,
        *bedrock_api.ROUTES,
        *control.ROUTES,
        Route("/metrics", metrics, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={ApiError: _api_error, HTTPException: _http_error})
    # A path with a slash too many or too few is a 404 naming it, not Starlette's redirect: that
    # redirect's Location is built from the client's Host (a hostile name when client keys let
    # any Host in), and the SDKs do not follow a redirected POST anyway.
    app.router.redirect_slashes = False
    app.state.gateway = gw
    # Added innermost first. Innermost, the proxied APIs' own routes, ahead of Starlette's
    # exception middleware and router (capmon/gateway/inbound.py). Outermost, the exchange:
    # every reply has its id and is counted (the browser checks' refusals included).
    app.add_middleware(ProxiedRoutes, gateway=gw)
    if not in_process:
        if settings.cors_origins:
            add_cors(app, settings)
        app.add_middleware(BrowserGuard, settings=settings)
    app.add_middleware(
        Exchanges,
        clock=client.clock,
        log=gw.access_log,
        count=gw.metrics.response,
        worker=settings.worker,
        tracer=gw.tracer,
        spent=gw.metrics.spent,
    )
    return app


def close_app(app: Starlette) -> None:
    gw: Gateway = app.state.gateway
    gw.close()
