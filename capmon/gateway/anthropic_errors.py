"""Errors as Anthropic's API shapes them (``{"type": "error", "error": {"type", "message"}}``),
for every answer on ``/v1/messages`` and below: the gateway's own refusals (400 naming the
field in its message, 401, 404, 413, the browser checks) and a failed request.

A failed request keeps the gateway's policy (capmon/gateway/errors.py: which status, the
Retry-After, the message), told in Anthropic's words: the error type that status stands
for on Anthropic's API (``capmon.core.providers.messages_format.ERROR_STATUS``, read backwards), and
529 ``overloaded_error`` instead of 429 when every model is at capacity, which is what
Anthropic's clients (and their SDKs' ``OverloadedError``) expect. A stream that breaks after
its first byte ends with Anthropic's ``event: error`` (:func:`in_stream`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capmon.core.base.exceptions import RequestFailed
from capmon.core.base.secrets import redact
from capmon.core.providers import messages_format
from capmon.core.types.failure import Kind
from capmon.gateway.errors import ApiError
from capmon.gateway.errors import in_stream as openai_in_stream

MESSAGES_PREFIX = "/v1/messages"
OVERLOADED = 529
_TYPE_OF_STATUS = {status: kind for kind, status in messages_format.ERROR_STATUS.items()}


def on_messages_path(path: str) -> bool:
    """Whether a path is Anthropic's API on this gateway (its errors are then Anthropic's)."""
    return path == MESSAGES_PREFIX or path.startswith(MESSAGES_PREFIX + "/")


def error_type(status: int) -> str:
    """The Anthropic error type of an HTTP status (404 not_found_error, 413 request_too_large...)."""
    if status in _TYPE_OF_STATUS:
        return _TYPE_OF_STATUS[status]
    return "api_error" if status >= 500 else "invalid_request_error"


@dataclass(eq=False)
class AnthropicError(ApiError):
    """An :class:`ApiError` whose body is Anthropic's shape. There is no ``param`` there:
    the message names the field, as the gateway's 400s always do."""

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error_type(self.status), "message": redact(self.message)}}

    @staticmethod
    def of(err: ApiError, failure_kind: Kind | None = None) -> AnthropicError:
        """``err`` told in Anthropic's shape; ``failure_kind``: what the failed request
        last met (capacity turns the 429 into Anthropic's 529)."""
        if isinstance(err, AnthropicError):
            return err
        status = OVERLOADED if failure_kind is Kind.CAPACITY and err.status == 429 else err.status
        return AnthropicError(status, err.message, err.type, err.code, err.param, err.headers)


def in_stream(e: RequestFailed) -> dict[str, Any]:
    """The data of the ``event: error`` that ends a Messages stream broken after output:
    the type Anthropic gives the failure (``overloaded_error`` for capacity), and the same
    redacted words as the OpenAI routes' error event."""
    return messages_format.error_body(e.failure, openai_in_stream(e)["message"])
