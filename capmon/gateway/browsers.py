"""Requests from web browsers. Any page a user visits can make the browser send requests
to a gateway on loopback; without client keys nothing else stops them spending the
provider's key (``text/plain`` POSTs go out without a CORS preflight), and a page that
rebinds its own name to 127.0.0.1 can read the answers too. So:

- the open gateway (no client keys) answers only requests addressed to a loopback name
  (``Host``: localhost, 127.x.x.x or [::1], any port); any other is a 421;
- a request carrying ``Origin`` (only browsers send one) is refused with a 403 unless
  that origin is in ``gateway.cors_origins``, with client keys or without; those
  origins get CORS done properly (starlette's CORSMiddleware: preflights answered,
  ``Access-Control-Allow-Origin`` echoing the allowed origin only);
- on the open gateway, a POST with a body must say ``Content-Type: application/json``
  (a browser can send anything else without a preflight); else a 403.

With client keys the Host check is off (behind a proxy or on a LAN name is the point of
keys) and so is the content-type check: a page cannot send a key it does not have.
The SDKs, curl and ``capmon --connect`` send no Origin and are never refused here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from capmon.gateway.errors import ApiError
from capmon.gateway.faces import shaped_for
from capmon.gateway.inbound import read_headers
from capmon.gateway.replies import error_reply
from capmon.gateway.settings import GatewaySettings

# What a browser app on an allowed origin may read of an answer.
EXPOSED = (
    "retry-after",
    "x-capmon-model",
    "x-capmon-endpoint",
    "x-capmon-deployment",
    "x-capmon-api",
    "x-capmon-dropped",
    "x-capmon-max-tokens",
    "x-capmon-target",
    "x-capmon-attempts",
    "x-capmon-fallbacks",
    "x-capmon-requested-model",
    "x-capmon-request-id",
    "x-capmon-priority",
    "x-capmon-worker",
    "x-litellm-model-id",
    "x-litellm-attempted-fallbacks",
    "request-id",
    "x-request-id",
)


def loopback_host(host: str) -> bool:
    """Whether a ``Host`` header names this machine's loopback: localhost, 127.0.0.0/8 or
    [::1], with or without a port."""
    name = host.strip().lower()
    if name.startswith("["):
        name, sep, rest = name[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return False
    else:
        name, _, port = name.partition(":")
        if port and not port.isdigit():
            return False
    if name in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _shown(value: str) -> str:
    return repr(value[:100])


class BrowserGuard:
    """The checks above, before anything else reads the request (pure ASGI)."""

    def __init__(self, app: ASGIApp, settings: GatewaySettings) -> None:
        self.app = app
        self.open = settings.open
        self.origins = frozenset(settings.cors_origins)

    def denial(self, method: str, headers: Mapping[str, str]) -> ApiError | None:
        host = headers.get("host")
        if self.open and host is not None and not loopback_host(host):
            return ApiError(
                421,
                f"this gateway has no client keys, so it answers only requests addressed to a loopback "
                f"name (localhost, 127.0.0.1, [::1]); this one was addressed to {_shown(host)}",
                "invalid_request_error",
                "misdirected_request",
            )
        origin = headers.get("origin")
        if origin is not None and origin.strip().lower() not in self.origins:
            return ApiError(
                403,
                f"requests from web pages are refused: the origin {_shown(origin)} is not in the "
                f"gateway's cors_origins",
                "invalid_request_error",
                "origin_not_allowed",
            )
        has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
        content_type = headers.get("content-type")
        if self.open and method == "POST" and (has_body or content_type) and not _json(content_type or ""):
            return ApiError(
                403,
                f"a POST to this gateway must be JSON (Content-Type: application/json), not "
                f"{_shown(content_type) if content_type else 'without a content type'}",
                "invalid_request_error",
                "unsupported_content_type",
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers, lower = read_headers(scope)  # the proxied routes read the same map
            err = self.denial(scope["method"], headers if lower else Headers(scope=scope))
            if err is not None:
                await error_reply(shaped_for(scope.get("path", ""), err))(scope, receive, send)
                return
        await self.app(scope, receive, send)


def add_cors(app: Starlette, settings: GatewaySettings) -> None:
    """CORS for the operator's origins: those exact origins, the methods the API has, any
    request header (the SDKs send their own), the headers that say who served, no cookies."""
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(settings.cors_origins),
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=list(EXPOSED),
        allow_credentials=False,
        max_age=600,
    )
