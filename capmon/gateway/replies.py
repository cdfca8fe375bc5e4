"""The answers to proxied requests (the OpenAI APIs and Anthropic's Messages), as ASGI
callables that do their own work: each runs the client call while watching the
connection (capmon/gateway/disconnect.py), so a client that goes away cancels its
attempt. A stream waits for the first chunk before it sends the response start, so
fallbacks and retries happen before the first byte and the headers name the model that
serves. Errors and stream framing are in the caller's
format (its face: capmon/gateway/faces.py)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from capmon.core.base.exceptions import CannotWait, RequestFailed
from capmon.core.base.secrets import redact
from capmon.core.types.failure import Failure, Kind
from capmon.gateway.bodies import Wanted
from capmon.gateway.context import Gateway
from capmon.gateway.disconnect import ClientGone, until_disconnect
from capmon.gateway.errors import ApiError, Shaper, from_failure, json_bytes
from capmon.gateway.exchange import Exchange
from capmon.gateway.faces import FACES
from capmon.gateway.headers import Served
from capmon.gateway.readiness import retry_after

log = logging.getLogger("capmon.gateway")


def _raw(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def send_json(
    send: Send,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None = None,
    *,
    raw_headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """``raw_headers``: more headers, encoded already (after ``headers``)."""
    data = json_bytes(body)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if headers:
        raw += _raw(headers)
    raw += raw_headers
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


def _shaper(w: Wanted) -> Shaper:
    return w.errors or FACES[w.request.format].shaped


def _failed(gw: Gateway, e: RequestFailed, shaped: Shaper) -> ApiError:
    targets = gw.client.targets
    # With every key disabled the core refuses at once ("no model can serve this request"):
    # that is the gateway's own key problem, whatever kind the core gives it.
    disabled = (
        ()
        if any(t.state.usable() for t in targets)
        else tuple(dict.fromkeys(f"{t.key.alias!r} at endpoint {t.endpoint.name!r}" for t in targets))
    )
    err = from_failure(e, retry_after=retry_after(gw.client), disabled_keys=disabled)
    return shaped(err, e.failure.kind)


def _internal(e: BaseException, shaped: Shaper) -> ApiError:
    # Where and what, redacted; not the traceback, whose text no log filter sees.
    tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" at {tb[0].filename}:{tb[0].lineno}" if tb else ""
    log.error("request failed inside the gateway%s: %s", where, redact(f"{type(e).__name__}: {e}"))
    err = ApiError(500, "the gateway failed to handle the request; see its log", "server_error", "internal_error")
    return shaped(err, None)


class JsonReply(Response):
    """JSON with ASCII escapes (starlette's JSONResponse cannot encode a lone surrogate)."""

    def __init__(self, body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(json_bytes(body), status, dict(headers or {}), "application/json")


def error_reply(err: ApiError) -> JsonReply:
    return JsonReply(err.body(), err.status, err.headers)


class Nothing(Response):
    """No answer: the client has gone."""

    def __init__(self) -> None:
        super().__init__()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None


class _Proxied(Response):
    """An answer to one proxied request: worked out while watching for the client to go
    away (then the work is cancelled, and its slot given back)."""

    def __init__(self, gw: Gateway, wanted: Wanted, exchange: Exchange | None = None) -> None:
        super().__init__()
        self.gw = gw
        self.wanted = wanted
        # Always one to fill in (a test's app without the Exchanges layer gets a loose one).
        self.ex = exchange or Exchange(wanted.request.request_id or "", "POST", "", "", 0.0, 0.0)

    async def _work(self, send: Send) -> None:
        raise NotImplementedError

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(scope, receive, self._work(send))
        except ClientGone:
            self.ex.failed("client_gone")
            self.gw.metrics.disconnects.labels(self.wanted.request.format.value).inc()

    def _failed(self, e: RequestFailed) -> ApiError:
        # A request answered at once is logged as what it was refused for, not as the kind of
        # failure the refusal carries (a model tripped by hand is no capacity failure).
        self.ex.failed(e.why.value if isinstance(e, CannotWait) else e.failure.kind.value, e.attempts)
        return _failed(self.gw, e, _shaper(self.wanted))

    def _internal(self, e: Exception) -> ApiError:
        self.ex.failed("internal_error")
        return _internal(e, _shaper(self.wanted))


class PlainReply(_Proxied):
    async def _work(self, send: Send) -> None:
        w = self.wanted
        try:
            result = await self.gw.client.chat(w.request)  # a Responses request too: it says which API it is
        except RequestFailed as e:
            err = self._failed(e)
            await send_json(send, err.status, err.body(), err.headers)
            return
        except Exception as e:
            err = self._internal(e)
            await send_json(send, err.status, err.body())
            return
        served = Served.of_result(result)
        self.ex.served(served)
        self.ex.answered(result)
        await send_json(send, 200, result.response, raw_headers=served.raw(w.priority))


class StreamReply(_Proxied):
    async def _work(self, send: Send) -> None:
        w = self.wanted
        framing = (w.framing or FACES[w.request.format].framing)()
        stream = self.gw.client.stream_chunks(w.request)
        try:
            try:
                first: Mapping[str, Any] | None = await stream.__anext__()
            except StopAsyncIteration:
                first = None
            except RequestFailed as e:
                err = self._failed(e)
                await send_json(send, err.status, err.body(), err.headers)
                return
            except Exception as e:
                err = self._internal(e)
                await send_json(send, err.status, err.body())
                return
            served = Served.of_stream(stream)
            self.ex.served(served, stream.attempts)
            headers = {**framing.headers, **served.headers(w.priority)}
            await send({"type": "http.response.start", "status": 200, "headers": _raw(headers)})
            try:
                if first is not None:
                    await send({"type": "http.response.body", "body": framing.frame(first), "more_body": True})
                async for chunk in stream:
                    await send({"type": "http.response.body", "body": framing.frame(chunk), "more_body": True})
                end = framing.done()
                if stream.result is not None:
                    self.ex.answered(stream.result)
            except RequestFailed as e:
                self.ex.failed(e.failure.kind.value, e.attempts)
                end = framing.error(e, self.ex.request_id)
            except Exception as e:  # a bug must still end the stream as broken, not as complete
                self._internal(e)
                broken = RequestFailed(Failure(Kind.TRANSIENT, f"the gateway failed ({type(e).__name__})"))
                end = framing.error(broken, self.ex.request_id)
            await send({"type": "http.response.body", "body": end, "more_body": False})
        finally:
            await stream.aclose()
