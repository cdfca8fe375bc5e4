"""client.transport = "aiohttp": httpx-aiohttp's transport over an aiohttp session, under the
FallbackClient's httpx API (the ``aiohttp`` extra; capmon/core/routing/transport.py imports this
module only when it is chosen). httpx-aiohttp 0.2.0 gets several failures wrong, and this
module mends them so that both transports fail alike:

* a refused connection and a server that hangs up before answering come out of it as
  ``httpx.ConnectTimeout``; a garbage status line, header or chunk escapes as a raw
  ``aiohttp.ClientResponseError``. Here each aiohttp error becomes the httpx exception
  httpcore raises for the same event (ConnectError, RemoteProtocolError, ReadError,
  ReadTimeout, ...), with httpcore's wording first where the suite reads it;
* a wait for a pooled connection that runs out is ``httpx.PoolTimeout``, not a connect
  timeout (which the client would take for an unreachable endpoint);
* aiohttp puts the request URL in its messages, and a Gemini key travels in the query,
  while its exceptions hold the request headers (the key). Messages here are scrubbed of
  URL queries, credential headers and every key capmon holds, and raised without the
  aiohttp exception chained to them, so no traceback prints it;
* aiohttp would keep a cookie jar of its own beside httpx's; it keeps none here.

The aiohttp session is created on the first request (it belongs to the running event
loop) and closed by ``aclose()``, which ``httpx.AsyncClient.aclose()`` calls: a
FallbackClient closes its transport when it closes. aiohttp sets TCP_NODELAY on every
connection itself. aiohttp has no write timeout, and its pool timeout covers the pool
wait and the connect together (httpx's ``pool``), with ``connect`` on the socket connect.

aiohttp and httpx-aiohttp are pinned to exact versions in pyproject.toml: this module
overrides aiohttp's connector's private ``_get`` and ``_wait_for_available_connection``,
reads its ``_acquired`` and ``_conns``, and stands in for httpx-aiohttp's request path.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import httpx_aiohttp
from yarl import URL

from capmon.core.base import secrets as _secrets
from capmon.core.routing.transport import default_timeout, pool_limits

__all__ = ["AiohttpTransport"]

_MESSAGE_CHARS = 300


class _PoolWait:
    """Whether one request's wait for a pooled connection is under way."""

    __slots__ = ("queued",)

    def __init__(self) -> None:
        self.queued = False


# Set per request by AiohttpTransport, read by _Connector: aiohttp raises the same
# ConnectionTimeoutError whether the pool wait or the connect ran out, and only the
# connector knows which phase the request was in. The connector runs in the request's
# own task, so a context variable reaches it without any lock.
_POOL_WAIT: contextvars.ContextVar[_PoolWait | None] = contextvars.ContextVar("capmon_pool_wait", default=None)


class _Connector(aiohttp.TCPConnector):
    async def _get(self, key: Any, traces: Any) -> Any:
        # The most recently released connection first (aiohttp takes the oldest): under
        # steady traffic a burst's extra connections are then left idle and expire after
        # KEEPALIVE_EXPIRY (pool_limits), instead of each being reused in turn before it can, which kept
        # every connection of the biggest burst open (and its memory) for good.
        conns = self._conns.get(key)
        if conns is not None and len(conns) > 1:
            conns.rotate(1)  # the newest, at the right end, to the left, where aiohttp takes one
        return await super()._get(key, traces)

    async def _wait_for_available_connection(self, key: Any, traces: Any) -> None:
        waiting = _POOL_WAIT.get()
        if waiting is not None:
            waiting.queued = True
        await super()._wait_for_available_connection(key, traces)
        # Cancelled by the pool timeout, this line is not reached: the flag stays up.
        if waiting is not None:
            waiting.queued = False


class AiohttpTransport(httpx_aiohttp.AiohttpTransport):
    """httpx-aiohttp's transport over one aiohttp session, with its failures mended
    (see the module docstring)."""

    def __init__(self, *, max_connections: int, connect_timeout: float) -> None:
        limits = pool_limits(max_connections)
        # A factory, not a session: a session belongs to the event loop it was made in,
        # and the transport is often built before any loop runs.
        super().__init__(limits=limits, client=self._new_session)
        self._default_timeout = default_timeout(connect_timeout)
        self._timeouts: dict[tuple[float | None, float | None, float | None], aiohttp.ClientTimeout] = {}

    def _new_session(self) -> aiohttp.ClientSession:
        connector = _Connector(
            limit=self.limits.max_connections or 0,
            limit_per_host=0,
            keepalive_timeout=self.limits.keepalive_expiry,
            ssl=self.ssl_context,
        )
        return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if "timeout" not in request.extensions:
            request.extensions["timeout"] = self._default_timeout
        waiting = _PoolWait()
        token = _POOL_WAIT.set(waiting)
        try:
            response = await self._send(request)
        except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
            failure = _translate(e, request, reading=False, queued=waiting.queued)
        else:
            return response
        finally:
            _POOL_WAIT.reset(token)
        # Raised here, outside the except block, so the aiohttp exception (which holds
        # the request and its headers) is not chained to it as its context.
        raise failure

    async def _send(self, request: httpx.Request) -> httpx.Response:
        """httpx-aiohttp 0.2.0's ``handle_async_request`` (this transport has no proxy), the aiohttp errors left
        raw for :func:`_translate`, which reads the same cause from either (httpx-aiohttp
        maps them to httpx exceptions chained to the aiohttp one), the body read straight
        from aiohttp (:class:`_Body`) and the timeout built once per set of values: the
        package's layers (a context manager per request and per body, a generator in a
        generator) cost more CPU than the whole of capmon's routing."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        timeout = request.extensions.get("timeout", {})
        data: bytes | httpx.AsyncByteStream | None
        try:
            data = request.content or None
        except httpx.RequestNotRead:
            data = request.stream  # type: ignore[assignment]  # an async stream here
            request.headers.pop("transfer-encoding", None)  # handled by aiohttp
        response = await self.client.request(
            method=request.method,
            # The URL as httpx encoded it, byte for byte: yarl would unquote a path's %3A (a
            # Bedrock model id's colon) and the request would no longer be the one signed.
            url=URL(str(request.url), encoded=True),
            headers=request.headers,
            data=data,
            allow_redirects=False,
            auto_decompress=False,
            compress=False,
            timeout=self._client_timeout(timeout.get("connect"), timeout.get("read"), timeout.get("pool")),
            server_hostname=request.extensions.get("sni_hostname"),
        ).__aenter__()
        extensions = {"http_version": b"HTTP/1.1"}
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode()
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_Body(response, request),
            request=request,
            extensions=extensions,
        )

    def _client_timeout(self, connect: float | None, read: float | None, pool: float | None) -> aiohttp.ClientTimeout:
        key = (connect, read, pool)
        timeout = self._timeouts.get(key)
        if timeout is None:
            if len(self._timeouts) > 64:  # each request's own (a deadline's) would grow it for good
                self._timeouts.clear()
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(sock_connect=connect, sock_read=read, connect=pool)
        return timeout


_CHUNK = httpx_aiohttp.transport.AiohttpResponseStream.CHUNK_SIZE


class _Body(httpx.AsyncByteStream):
    """The response body read from aiohttp as httpx-aiohttp reads it (``iter_chunked``),
    with its errors translated."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        content.set_read_chunk_size(_CHUNK)  # as iter_chunked does
        failure: httpx.TransportError
        while True:
            try:
                chunk = await content.read(_CHUNK)
            except aiohttp.EofStream:
                return
            except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
                failure = _translate(e, self._request, reading=True, queued=False)
                break
            if not chunk:
                return
            yield chunk
        raise failure

    async def aclose(self) -> None:
        try:
            # Releases the connection, or closes it if the body was not read to its end.
            await self._response.__aexit__(None, None, None)
        except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
            failure = _translate(e, self._request, reading=True, queued=False)
        else:
            return
        raise failure


# ---------------------------------------------------------------- translating errors


def _translate(exc: BaseException, request: httpx.Request, *, reading: bool, queued: bool) -> httpx.TransportError:
    """The httpx exception httpcore raises for what ``exc`` (from aiohttp, or httpx-aiohttp's
    mapping of it) reports, its message scrubbed of secrets."""
    cause: BaseException = exc
    if isinstance(exc, httpx.TransportError):
        if not isinstance(exc.__cause__, (aiohttp.ClientError, OSError)):
            return exc  # raised by httpx itself, not a mapping of aiohttp's
        cause = exc.__cause__
    cls, lead = _kind_of(cause, reading=reading, queued=queued)
    try:
        # A response error's str() quotes its message with escapes and adds the URL.
        detail = cause.message if isinstance(cause, aiohttp.ClientResponseError) else str(cause)
    except Exception:  # a broken __str__ must not hide the failure
        detail = ""
    detail = _SPACE.sub(" ", detail).strip()
    named = f"{type(cause).__name__}: {detail}" if detail else type(cause).__name__
    text = f"{lead} ({named})" if lead else named
    failure = cls(_scrub(text, request), request=request)
    # What a connect failed with (a DNS, refused, TLS error: the OS's or ssl's own, which
    # holds no request) is chained as httpcore chains it, so the classifier reads the
    # cause of an unreachable endpoint from either transport (errors.unreachable_cause).
    reason = _connect_error(cause)
    if reason is not None:
        failure.__cause__ = reason
    return failure


def _connect_error(cause: BaseException) -> BaseException | None:
    if not isinstance(cause, aiohttp.ClientConnectorError) or isinstance(cause, aiohttp.ClientProxyConnectionError):
        return None
    certificate = getattr(cause, "certificate_error", None)
    found = certificate if isinstance(certificate, BaseException) else getattr(cause, "os_error", None)
    if not isinstance(found, BaseException):
        return None
    try:
        # A fresh one of the same type and arguments: nothing aiohttp attached (its
        # connection key, a traceback holding the request) travels with it.
        return type(found)(*found.args)
    except Exception:
        return OSError(getattr(found, "errno", None), str(found))


def _kind_of(cause: BaseException, *, reading: bool, queued: bool) -> tuple[type[httpx.TransportError], str]:
    # Most specific first: aiohttp's timeouts are connection errors, its connector errors
    # OS errors, and its timeouts asyncio.TimeoutError.
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        if queued:
            return httpx.PoolTimeout, "timed out waiting for a pooled connection"
        return httpx.ConnectTimeout, "timed out connecting"
    if isinstance(cause, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout, "timed out reading"
    if isinstance(cause, TimeoutError):
        return (httpx.ReadTimeout, "timed out reading") if reading else (httpx.TimeoutException, "timed out")
    if isinstance(cause, (aiohttp.ClientProxyConnectionError, aiohttp.ClientHttpProxyError)):
        return httpx.ProxyError, "proxy error"
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError, ""  # its own text says "Cannot connect to host ..." and why
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        if reading:
            return httpx.RemoteProtocolError, "peer closed connection without sending complete message body"
        return httpx.RemoteProtocolError, "Server disconnected without sending a response."
    if isinstance(cause, aiohttp.ClientPayloadError):
        if "not completed" in str(cause):
            return httpx.RemoteProtocolError, "peer closed connection without sending complete message body"
        return httpx.RemoteProtocolError, "invalid message body"
    if isinstance(cause, aiohttp.ClientResponseError):
        # aiohttp's parser errors (a bad status line, header or chunk size) surface as a
        # response error with status 400; nothing in aiohttp's client raises it otherwise
        # here (no redirects are followed, raise_for_status is off).
        return httpx.RemoteProtocolError, "invalid HTTP response"
    if isinstance(cause, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return httpx.UnsupportedProtocol, "unsupported URL"
    if isinstance(cause, OSError):  # ClientOSError, ClientConnectionResetError, a reset
        return httpx.ReadError, "connection error"
    return httpx.TransportError, "transport error"


_SPACE = re.compile(r"\s+")
# A URL's query and fragment: where keys travel (Gemini's ?key=, signed URLs).
_URL_QUERY = re.compile(r"((?:https?|wss?)://[^\s'\"<>?#]*)[?#][^\s'\"<>]*", re.IGNORECASE)
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie")
_MIN_SECRET = _secrets.MIN_SECRET_CHARS


def _scrub(text: str, request: httpx.Request) -> str:
    text = _URL_QUERY.sub(r"\1", text)
    secrets: set[str] = set(_secrets.values())
    for name in _CREDENTIAL_HEADERS:
        for value in request.headers.get_list(name):
            secrets.add(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                secrets.add(token.strip())
    for value in request.url.params.values():
        secrets.add(value)
    for s in sorted(secrets, key=len, reverse=True):  # longest first: a header holds its token
        if len(s) >= _MIN_SECRET and s in text:
            text = text.replace(s, "[redacted]")
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"
