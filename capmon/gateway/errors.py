"""Errors as the OpenAI API shapes them (``{"error": {"message", "type", "param",
"code"}}``), and what a failed request becomes for a client of the gateway.

| the core says | the client gets |
|---|---|
| unreachable (no connection: DNS, refused, TLS, proxy), at once or at last | 502 ``upstream_unreachable`` |
| CannotWait (waiting cannot help: tripped by hand, keys disabled or out of quota) | 503 at once (below) |
| CannotWait for a prompt over every window | 400 ``context_length_exceeded`` (clients compact on it) |
| CannotWait: no model can do what the request needs (tools, a schema, images, reasoning) | 400 ``no_capable_model`` |
| capacity, rate_limited, quota; DeadlineExceeded after those (or with no attempt) | 429 with Retry-After |
| DeadlineExceeded after any other failure (an upstream that hangs or keeps failing) | 504 |
| bad_request, too_large | the provider's 4xx and message (400 when no provider answered) |
| transient, oversized | 502: the upstream failed, retries are spent |
| auth | 502 naming the gateway's provider key by its alias: the gateway's problem, not the client's |

An unreachable 502 names the endpoint and the cause, with no Retry-After (nobody knows when
the address or the network is mended) and ``x-should-retry: false``.
A CannotWait 503's code is why (``models_unavailable``, ``no_usable_key``); it carries
``x-should-retry: false``, which the openai and anthropic SDKs obey instead of retrying, and
a Retry-After only when the time something admits again is known (a quota's reset).

Every message, param and code passes :func:`capmon.core.base.secrets.redact` (the core's
classifier already redacted what it took from the provider); a provider's text about
a refused key is never repeated (it may show part of the key).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capmon.core.base.exceptions import CannotWait, DeadlineExceeded, RequestFailed, Unavailable
from capmon.core.base.secrets import redact
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import sent
from capmon.gateway.headers import skipped_header


@dataclass(eq=False)
class ApiError(Exception):
    """An answer the gateway gives instead of a completion."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def error(self) -> dict[str, Any]:
        # param and code may be a provider's (a 4xx passed through): redacted like the message.
        param = redact(self.param) if self.param is not None else None
        code = redact(self.code) if self.code is not None else None
        return {"message": redact(self.message), "type": self.type, "param": param, "code": code}

    def body(self) -> dict[str, Any]:
        return {"error": self.error()}


# An error in one API's shape (capmon/gateway/faces.py), given the kind of failure it stands for.
Shaper = Callable[[ApiError, Kind | None], ApiError]

# One encoder for every answer (json.dumps with separators builds a new one per call).
# ASCII escapes (its default) keep a lone surrogate from a provider's JSON encodable.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def json_bytes(obj: Any) -> bytes:
    return _ENCODER.encode(obj).encode()


_LIMITED = (Kind.CAPACITY, Kind.RATE_LIMITED, Kind.QUOTA)


def _provider_message(f: Failure) -> str:
    """The provider's own message (already redacted by the classifier), or the reason."""
    return f.message or f.reason


def _retry_after(f: Failure, fallback: float) -> str:
    seconds = f.retry_after if f.retry_after is not None and f.retry_after > 0 else fallback
    return str(max(1, math.ceil(seconds)))


def from_failure(e: RequestFailed, *, retry_after: float = 1.0, disabled_keys: Sequence[str] = ()) -> ApiError:
    """What a request the core gave up on becomes. ``retry_after`` (seconds): the hint
    when the failure carries none (the gateway's guess at when a model admits again).
    ``disabled_keys``: the gateway's provider keys disabled after the provider refused
    them, when no key is left; a request refused without an attempt then failed for that."""
    f = e.failure
    attempts = {"x-capmon-attempts": str(len(sent(e.attempts)))}
    skips = skipped_header(e.attempts)
    if skips:
        attempts["x-capmon-skipped"] = skips
    if f.kind is Kind.UNREACHABLE:
        # Not capacity, not the caller's request: the gateway cannot reach its provider (a
        # wrong base_url, DNS, a proxy, TLS). No time to name: nobody knows when it is mended.
        return ApiError(
            502,
            f"upstream_unreachable: {e}",
            "upstream_error",
            Unavailable.UNREACHABLE.value,
            headers={"x-should-retry": "false", **attempts},
        )
    if isinstance(e, CannotWait) and e.why is Unavailable.NO_CAPABLE:
        # The request itself asks for what no model here can do: the caller's to change.
        return ApiError(400, f"{e.why.value}: {e}", "invalid_request_error", e.why.value, headers=attempts)
    if isinstance(e, CannotWait) and e.why is not Unavailable.WINDOW:
        # The SDKs retry a 503 at once unless told not to; a known reset is the only time to name.
        headers = {"x-should-retry": "false", **attempts}
        if e.retry_after is not None:
            headers["retry-after"] = str(max(1, math.ceil(e.retry_after)))
        own = " (this is not about the key you sent)" if e.why is Unavailable.KEYS else ""
        return ApiError(503, f"{e.why.value}: {e}{own}", "service_unavailable", e.why.value, headers=headers)
    if disabled_keys and not e.attempts:
        return ApiError(
            502,
            f"every provider key of the gateway is disabled after the provider refused it "
            f"({', '.join(disabled_keys)}); the gateway's operator must fix the key and reset it "
            f"(this is not about the key you sent)",
            "upstream_error",
            "upstream_auth_failed",
            headers=attempts,
        )
    if isinstance(e, DeadlineExceeded) and f.kind not in _LIMITED:
        return ApiError(
            504,
            f"no model answered within the request's deadline: {e}",
            "upstream_error",
            "deadline_exceeded",
            headers=attempts,
        )
    if isinstance(e, DeadlineExceeded) or f.kind in _LIMITED:
        what = {Kind.RATE_LIMITED: "every model is rate-limited", Kind.QUOTA: "every model is out of quota"}.get(
            f.kind, "every model is at capacity"
        )
        if isinstance(e, DeadlineExceeded):
            what = f"no model could serve the request within its deadline ({what.removeprefix('every model is ')})"
            what += f": {e.passed}" if e.passed else ""
        return ApiError(
            429,
            f"{what}; try again later. Last: {f.kind.value}: {f.reason}",
            "rate_limit_error",
            "quota_exceeded"
            if f.kind is Kind.QUOTA and not isinstance(e, DeadlineExceeded)
            else "model_at_capacity"
            if f.kind is Kind.CAPACITY
            else "rate_limit_exceeded",
            headers={"retry-after": _retry_after(f, retry_after), **attempts},
        )
    if f.kind in (Kind.BAD_REQUEST, Kind.TOO_LARGE):
        status = f.status if f.status is not None and 400 <= f.status < 500 else 400
        code = f.code or ("context_length_exceeded" if f.kind is Kind.TOO_LARGE else None)
        return ApiError(status, _provider_message(f), "invalid_request_error", code, param=f.param, headers=attempts)
    if f.kind is Kind.AUTH:
        last = e.attempts[-1] if e.attempts else None
        key = f"provider key {last.key_alias!r} at endpoint {last.endpoint!r}" if last else "its provider key"
        return ApiError(
            502,
            f"the gateway's {key} was refused ({f.status or 'auth'}); the gateway's operator must "
            f"fix it (this is not about the key you sent)",
            "upstream_error",
            "upstream_auth_failed",
            headers=attempts,
        )
    if f.kind is Kind.OVERSIZED:
        return ApiError(
            502,
            f"the provider's answer was too large for the gateway: {f.reason}",
            "upstream_error",
            "upstream_oversized",
            headers=attempts,
        )
    return ApiError(
        502,
        f"the upstream failed and retries are spent: {f.reason}",
        "upstream_error",
        "upstream_failed",
        headers=attempts,
    )


def in_stream(e: RequestFailed) -> dict[str, Any]:
    """The error object that ends a stream that broke after its first byte."""
    f = e.failure
    code = {Kind.CAPACITY: "server_is_overloaded", Kind.RATE_LIMITED: "rate_limit_exceeded"}.get(f.kind, "server_error")
    why = f"{e.passed}; last: " if isinstance(e, DeadlineExceeded) and e.passed else ""
    return {
        "message": redact(
            f"the stream broke after output was sent ({why}{f.kind.value}: {f.reason}); the answer is incomplete"
        ),
        "type": "server_error",
        "param": None,
        "code": code,
    }
