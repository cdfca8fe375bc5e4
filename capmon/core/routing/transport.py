"""The HTTP transport under the FallbackClient's httpx API: httpcore (httpx's own) or aiohttp.

capmon speaks httpx everywhere (requests, responses, streams, exceptions); only what
moves the bytes is pluggable (``client.transport``). httpcore comes with httpx;
aiohttp is the ``aiohttp`` extra, and its transport (capmon/core/routing/transport_aiohttp.py,
about a quarter of httpcore's CPU per request: ``python -m benchmarks.overhead``) is
imported only when it is chosen. ``auto``, the default, is aiohttp when the extra is
installed and httpcore when not; ``aiohttp`` asked for by name without the extra is
one line saying what to install.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from capmon.core.base import extras

__all__ = ["Head", "HttpcoreTransport", "Sender", "TransportKind", "make_transport", "resolve"]

# httpx.Limits' default: an idle connection is dropped after 5 s, the same on both
# transports, and no longer than servers commonly keep one (uvicorn: 5 s).
KEEPALIVE_EXPIRY = 5.0


class TransportKind(str, enum.Enum):
    AUTO = "auto"  # aiohttp when the aiohttp extra is installed, else httpx
    HTTPX = "httpx"
    AIOHTTP = "aiohttp"


def resolve(kind: str | TransportKind, where: str = "") -> TransportKind:
    """The transport ``kind`` names (``auto`` settled). ``aiohttp`` without the aiohttp
    extra raises MissingExtra naming ``where`` (the config file) and the setting."""
    try:
        which = TransportKind(kind)
    except ValueError:
        choices = ", ".join(k.value for k in TransportKind)
        raise ValueError(f"client.transport: expected one of {choices}, got {kind!r}") from None
    if which is TransportKind.AUTO:
        return TransportKind.AIOHTTP if extras.installed(extras.Extra.AIOHTTP) else TransportKind.HTTPX
    if which is TransportKind.AIOHTTP:
        setting = 'client.transport = "aiohttp"'
        extras.require(extras.Extra.AIOHTTP, f"{where}: {setting}" if where else setting)
    return which


def make_transport(
    kind: str | TransportKind, *, max_connections: int, connect_timeout: float, where: str = ""
) -> httpx.AsyncBaseTransport:
    """The transport named by ``client.transport`` (:func:`resolve`; ``where``: the config
    file that names it), holding at most ``max_connections`` connections.
    ``connect_timeout`` bounds connecting for a request that carries no timeouts of its
    own (an ``httpx.AsyncClient`` always sends its own). Closing the client that uses it
    (``aclose()``) closes it."""
    which = resolve(kind, where)
    if max_connections < 1:
        raise ValueError(f"client.max_connections: expected at least 1, got {max_connections!r}")
    if which is TransportKind.HTTPX:
        return HttpcoreTransport(max_connections=max_connections, connect_timeout=connect_timeout)
    from capmon.core.routing.transport_aiohttp import AiohttpTransport

    return AiohttpTransport(max_connections=max_connections, connect_timeout=connect_timeout)


def pool_limits(max_connections: int) -> httpx.Limits:
    """Either transport's pool: ``max_connections`` open at most, all of them kept alive
    for KEEPALIVE_EXPIRY (read now: tests shorten it)."""
    return httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections, keepalive_expiry=KEEPALIVE_EXPIRY
    )


def default_timeout(connect_timeout: float) -> dict[str, float | None]:
    """The timeouts of a request that carries none of its own: only the connect is bounded."""
    return {"connect": connect_timeout, "read": None, "write": None, "pool": None}


class HttpcoreTransport(httpx.AsyncHTTPTransport):
    """httpx's own transport (what ``httpx.AsyncClient`` uses by default), pooled."""

    def __init__(self, *, max_connections: int, connect_timeout: float) -> None:
        super().__init__(limits=pool_limits(max_connections))
        self._default_timeout = default_timeout(connect_timeout)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "timeout" not in request.extensions:
            request.extensions["timeout"] = self._default_timeout
        return await super().handle_async_request(request)


# ---------------------------------------------------------------- sending


USER_AGENT = "capmon"
_DEFAULT_HEADERS = (
    (b"accept", b"application/json"),
    (b"accept-encoding", b"gzip, deflate"),
    (b"user-agent", USER_AGENT.encode()),
)


@dataclass(frozen=True, slots=True)
class Head:
    """A target's ready header block for one wire (:meth:`Sender.head`)."""

    headers: httpx.Headers
    encoding: str  # the block's header encoding, worked out once
    sized: bool  # it carries a Content-Length of its own (an endpoint's header), which httpx keeps


class Sender:
    """Sends httpx requests on a transport: httpx's request and response models and
    its transports, without ``httpx.AsyncClient`` around them. The client's layer
    (URL merging, cookie jars, redirects, auth flows, event hooks) does nothing an API
    call needs and costs more CPU per request than all of capmon's routing; see
    ARCHITECTURE.md, "The wire"."""

    def __init__(self, transport: httpx.AsyncBaseTransport, *, attempt_timeout: float, connect_timeout: float) -> None:
        self.transport = transport
        self._timeout = httpx.Timeout(attempt_timeout, connect=connect_timeout).as_dict()
        self._extensions = {"timeout": self._timeout}  # copied by each httpx.Request

    @staticmethod
    def headers(extra: Mapping[str, str], credentials: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
        """A target's fixed headers, encoded once: defaults, the endpoint's own, then its
        key in the header its API reads (``Authorization: Bearer``, ``x-api-key`` with
        ``anthropic-version``, Azure's ``api-key``: its dialect's, capmon/core/providers/dialect.py)."""
        out = list(_DEFAULT_HEADERS)
        out += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        out += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in credentials.items()]
        return out

    @staticmethod
    def head(url: httpx.URL, headers: list[tuple[bytes, bytes]]) -> Head:
        """Every header a POST of JSON to ``url`` carries but its length, in the order
        ``httpx.Request(content=...)`` gives them (``Host`` first, unless ``headers`` have
        one): built once per target and wire, copied per request (see :meth:`request`)."""
        block = [*headers, (b"content-type", b"application/json")]
        keys = {k.lower() for k, _ in headers}
        if b"host" not in keys and url.host:
            block.insert(0, (b"Host", url.netloc))
        built = httpx.Headers(block)
        return Head(built, built.encoding, b"content-length" in keys)

    def request(self, url: httpx.URL, head: Head, body: bytes) -> httpx.Request:
        """The request ``httpx.Request("POST", url, headers=..., content=body)`` makes, built
        from the target's ready header block (:meth:`head`): httpx would encode, normalise
        and scan every header again for each request, a sixth of capmon's own CPU per
        request. ``tests/core/test_transport.py`` holds the two to the same request."""
        request = httpx.Request(
            "POST", url, headers=head.headers, stream=httpx.ByteStream(body), extensions=self._extensions
        )
        headers = request.headers
        headers.encoding = head.encoding  # what httpx would work out again from the same bytes
        if not head.sized:  # httpx's setdefault: an endpoint's own Content-Length stays
            headers["Content-Length"] = str(len(body))
        request.read()  # the body is there already: ``request.content``, as with content=
        return request

    async def send(self, request: httpx.Request) -> httpx.Response:
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()
