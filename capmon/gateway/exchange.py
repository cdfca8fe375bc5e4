"""One HTTP request to the gateway and its answer, as the operator sees it: its request id
(the client's ``x-request-id`` / ``x-client-request-id`` when sane, else a new one), and
what the answer came to (who asked, which model served, the attempts and fallbacks, the
status, the time to the first byte and in all, the tokens), written to the access log
(capmon/gateway/access_log.py) when the answer is done.

:class:`Exchanges` is the outermost ASGI layer: every reply of the gateway, refusals of
the browser checks and 404s included, gets ``x-request-id`` (and ``request-id``, which
Anthropic's SDKs read, on ``/v1/messages``), ``x-capmon-requested-model`` once the body
named one, and a ``Date`` of now (uvicorn's own is refreshed on its ticks, which the
gateway makes long: capmon/gateway/server.py TICK)."""

from __future__ import annotations

import datetime
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Protocol

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from capmon.core.base.clock import Clock
from capmon.core.providers.usage import count
from capmon.core.types.result import Attempt, ChatResult, continued, sent, skipped
from capmon.gateway import fields
from capmon.gateway.access_log import AccessLog
from capmon.gateway.errors import ApiError, json_bytes
from capmon.gateway.faces import face_of_path, shaped_for
from capmon.gateway.headers import Served, header_value

REQUEST_ID_HEADERS = (b"x-request-id", b"x-client-request-id")  # the OpenAI SDKs send the second
log = logging.getLogger(__name__)
_STATE_KEY = "capmon_exchange"


def new_request_id() -> str:
    # 96 random bits from the process's generator (seeded from the OS at start): an id must be
    # unique, not secret, and os.urandom per request was a system call on the hot path.
    return f"req_{random.getrandbits(96):024x}"


def api_of(path: str) -> str:
    """Which of the gateway's APIs a path belongs to (the metrics' and the access log's ``api``)."""
    face = face_of_path(path)
    if face is not None:
        return face.api
    if path.startswith("/v1/models"):
        return "models"
    if path.startswith("/capmon/"):
        return "control"
    return path[1:] if path in ("/metrics", "/health", "/ready") else "other"


def _count(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = count(usage.get(name))
        if value is not None:
            return value
    return None


@dataclass(eq=False)
class Exchange:
    """Filled in as the answer is worked out (capmon/gateway/inbound.py, replies.py)."""

    request_id: str
    method: str
    path: str
    api: str
    started: float  # clock.now()
    wall: float  # clock.wall() when it came
    caller: str | None = None  # the client key's alias, never the key
    model_requested: str | None = None  # the name the client sent (auto, an alias, a model)
    model_served: str | None = None
    endpoint: str | None = None
    deployment: str | None = None  # the id the serving endpoint knows the model by
    served_api: str | None = None  # the serving endpoint's provider API: openai | anthropic | azure
    attempts: int = 0
    fallbacks: int = 0
    status: int | None = None  # None: no answer was sent (the client went away first)
    error_kind: str | None = None
    priority: str | None = None
    ttfb: float | None = None  # seconds to the response start (a stream's: its first chunk)
    latency: float | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    tokens_cached: int | None = None  # the part of the input read from the provider's cache
    cost: float | None = None  # USD at the serving target's prices; None: no price known, or no usage
    records: tuple[Attempt, ...] = ()  # the attempts, when known: for traces (capmon/gateway/traces.py)
    response_model: str | None = None  # the model the provider's answer names

    def served(self, s: Served, attempts: Sequence[Attempt] = ()) -> None:
        """``attempts``: the record so far (the skips and failures before the answer)."""
        self.model_served, self.endpoint, self.served_api = s.model, s.endpoint, s.api or None
        self.deployment = s.deployment or None
        self.attempts, self.fallbacks = s.attempts, s.fallbacks
        if attempts:
            self.records = tuple(attempts)

    def used(self, usage: Mapping[str, Any]) -> None:
        """The answer's usage in any API's words (chat's prompt/completion, the others' input/output)."""
        self.tokens_in = _count(usage, "input_tokens", "prompt_tokens")
        self.tokens_out = _count(usage, "output_tokens", "completion_tokens")

    def answered(self, result: ChatResult) -> None:
        """The answer is complete (a stream's too): its usage and its attempts."""
        self.used(result.usage)
        self.cost = result.cost
        tokens = result.attempts[-1].tokens if result.attempts else None
        self.tokens_cached = tokens.cached if tokens is not None else None
        self.records = result.attempts
        # A stream continued after a break had more attempts than when its first byte went out.
        self.attempts, self.fallbacks = len(sent(result.attempts)), result.fallbacks
        model = result.response.get("model")
        self.response_model = model if isinstance(model, str) else None

    def failed(self, kind: str, attempts: Sequence[Attempt] | None = None) -> None:
        self.error_kind = kind
        if attempts is not None:
            self.attempts, self.records = len(sent(attempts)), tuple(attempts)

    def line(self) -> dict[str, Any]:
        """The access log's line: no key, no prompt or answer text."""
        return {
            "time": log_time(self.wall),
            "request_id": self.request_id,
            "caller": self.caller,
            "method": self.method,
            "path": self.path,
            "model_requested": self.model_requested,
            "model_served": self.model_served,
            "endpoint": self.endpoint,
            "deployment": self.deployment,
            "api": self.api,
            "served_api": self.served_api,
            "attempts": self.attempts,
            "fallbacks": self.fallbacks,
            "status": self.status,
            "error_kind": self.error_kind,
            "priority": self.priority,
            "latency_ms": _ms(self.latency),
            "ttfb_ms": _ms(self.ttfb),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_cached": self.tokens_cached,
            "cost_usd": self.cost,
            # The targets passed over and why: the reason is capmon's own words (a feature, a
            # window, a state), never the request's content.
            "skipped": [{"target": a.target, "why": a.skip, "reason": a.reason} for a in skipped(self.records)],
            # A stream that broke after output and was continued: by which model, from which
            # character of the answer (capmon/core/routing/continuation.py).
            "continued": [c.as_json() for c in continued(self.records)],
        }


_second: tuple[tuple[int, int, int, int, int, int], str] = ((0, 0, 0, 0, 0, 0), "")


def log_time(wall: float) -> str:
    """``wall`` as the access log writes it: ISO 8601 in UTC to the millisecond
    (``2026-01-01T12:00:00.123Z``), the part up to the second formatted once a second."""
    global _second
    at = datetime.datetime.fromtimestamp(wall, datetime.UTC)
    key = (at.year, at.month, at.day, at.hour, at.minute, at.second)
    if key != _second[0]:
        _second = key, at.replace(microsecond=0).isoformat().removesuffix("+00:00")
    return f"{_second[1]}.{at.microsecond // 1000:03d}Z"


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 1) if seconds is not None else None


def exchange_of(scope: Scope) -> Exchange | None:
    """The exchange :class:`Exchanges` opened for the request of ``scope`` (None for an app without it)."""
    ex = scope.get("state", {}).get(_STATE_KEY)
    return ex if isinstance(ex, Exchange) else None


def _own_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name in REQUEST_ID_HEADERS:
            own = fields.request_id(value.decode("latin-1"))
            if own is not None:
                return own
    return None


class ExchangeTracer(Protocol):
    """Told of every exchange when its reply is done (capmon/gateway/traces.py, only when
    ``[telemetry]`` asks for traces): its spans are made then, off the reply's path."""

    def finish(self, ex: Exchange, scope: Scope) -> None: ...
    def close(self) -> None: ...


class Exchanges:
    """Opens an :class:`Exchange` per HTTP request, stamps its headers on the reply, and
    hands it to the access log (and the tracer) when the reply is done (pure ASGI:
    streams stay streams)."""

    def __init__(
        self,
        app: ASGIApp,
        clock: Clock,
        log: AccessLog | None,
        count: Callable[[str, int], None] | None = None,
        worker: int | None = None,
        tracer: ExchangeTracer | None = None,
        spent: Callable[[Exchange], None] | None = None,
    ) -> None:
        """``count(api, status)`` is told every answer (the metrics); ``worker``: this
        process's number among several serving one port, stamped as ``x-capmon-worker``;
        ``tracer`` makes the exchange's spans once its reply is done; ``spent`` is told
        every exchange whose answer has a cost, once it is done (the metrics)."""
        self.app = app
        self.clock = clock
        self.log = log
        self.count = count
        self.tracer = tracer
        self.spent = spent
        self._worker = [(b"x-capmon-worker", str(worker).encode())] if worker is not None else []
        self._date: tuple[int, bytes] = (-1, b"")

    def http_date(self) -> bytes:
        second = int(self.clock.wall())
        if second != self._date[0]:  # formatted once a second, not per reply
            self._date = (second, formatdate(second, usegmt=True).encode())
        return self._date[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        ex = Exchange(
            _own_id(scope) or new_request_id(),
            scope.get("method", ""),
            path,
            api_of(path),
            self.clock.now(),
            self.clock.wall(),
        )
        scope.setdefault("state", {})[_STATE_KEY] = ex
        rid = ex.request_id.encode()
        ids = [(b"x-request-id", rid), (b"request-id", rid)] if ex.api == "messages" else [(b"x-request-id", rid)]

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                ex.status = message["status"]
                ex.ttfb = self.clock.now() - ex.started
                if self.count is not None:
                    self.count(ex.api, ex.status)
                own = [(b"date", self.http_date()), *ids, *self._worker]
                if ex.model_requested is not None:
                    own.append((b"x-capmon-requested-model", header_value(ex.model_requested).encode("latin-1")))
                message = {**message, "headers": [*message.get("headers", ()), *own]}
            await send(message)

        try:
            await self.app(scope, receive, stamped)
        except Exception:
            if ex.status is not None:  # the reply had begun: uvicorn closes the connection
                raise
            # Answered here, not by Starlette's ServerErrorMiddleware, which sits outside this
            # layer: the 500 has its request id, the API's error shape and its access-log line.
            log.exception("internal error answering %s %s (request %s)", ex.method, path, ex.request_id)
            await self._internal_error(ex, stamped)
        finally:
            ex.latency = self.clock.now() - ex.started
            if self.log is not None:
                self.log.write(ex.line())
            if self.tracer is not None:
                self.tracer.finish(ex, scope)
            if self.spent is not None and ex.cost is not None:
                self.spent(ex)

    @staticmethod
    async def _internal_error(ex: Exchange, send: Send) -> None:
        err = shaped_for(
            ex.path,
            ApiError(500, f"internal error in the gateway (request {ex.request_id})", "server_error", "internal_error"),
        )
        ex.error_kind = "internal"
        body = json_bytes(err.body())
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})
