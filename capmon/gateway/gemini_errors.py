"""Errors as Google's APIs shape them (``{"error": {"code", "message", "status"}}``, the
``google.rpc.Status`` of the Gemini API and Vertex AI), for every answer on the gateway's
Gemini routes (capmon/gateway/gemini_api.py): its own refusals (400 naming the field, 401,
404, 413) and a failed request.

A failed request keeps the gateway's policy (capmon/gateway/errors.py: which status, the
Retry-After, the message), told in Google's words: the canonical status name of each HTTP
status (``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``...), and 503 ``UNAVAILABLE`` instead
of 429 when every model is at capacity, which is what Google sends for an overloaded model
and what its clients (google-genai's ``ServerError``, Gemini CLI) retry or fall back on. A
429 carries its wait as ``google.rpc.RetryInfo.retryDelay`` too, where Google's clients
read it. A stream that breaks after its first byte ends with ``data: {"error": {...}}``
(:func:`in_stream`), which google-genai raises on after the chunks it yielded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capmon.core.base.exceptions import RequestFailed
from capmon.core.base.secrets import redact
from capmon.core.types.failure import Kind
from capmon.gateway.errors import ApiError
from capmon.gateway.errors import in_stream as openai_in_stream

UNAVAILABLE = 503
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

# google.rpc.Code's names for the HTTP statuses the gateway answers with
# (googleapis/google/rpc/code.proto gives each code its HTTP mapping).
_STATUS_NAME = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def status_name(status: int) -> str:
    """Google's canonical status name of an HTTP status."""
    if status in _STATUS_NAME:
        return _STATUS_NAME[status]
    return "INTERNAL" if status >= 500 else "FAILED_PRECONDITION"


def _retry_details(headers: dict[str, str]) -> list[dict[str, Any]]:
    """``RetryInfo`` from the reply's Retry-After (whole seconds), where Google's clients look."""
    after = headers.get("retry-after", "")
    return [{"@type": RETRY_INFO, "retryDelay": f"{int(after)}s"}] if after.isdigit() else []


@dataclass(eq=False)
class GeminiError(ApiError):
    """An :class:`ApiError` whose body is Google's shape. There is no ``param``: the
    message names the field, as the gateway's 400s always do."""

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.status,
            "message": redact(self.message),
            "status": status_name(self.status),
        }
        details = _retry_details(dict(self.headers))
        if details:
            error["details"] = details
        return {"error": error}

    @staticmethod
    def of(err: ApiError, failure_kind: Kind | None = None) -> GeminiError:
        """``err`` told in Google's shape; ``failure_kind``: what the failed request last
        met (capacity turns the 429 into Google's 503 UNAVAILABLE)."""
        if isinstance(err, GeminiError):
            return err
        status = UNAVAILABLE if failure_kind is Kind.CAPACITY and err.status == 429 else err.status
        return GeminiError(status, err.message, err.type, err.code, err.param, err.headers)


def in_stream(e: RequestFailed, request_id: str) -> dict[str, Any]:
    """The ``data:`` of the frame that ends a Gemini stream broken after output: Google's
    error object, with the same redacted words as the OpenAI routes' error event."""
    words = openai_in_stream(e)
    status = UNAVAILABLE if e.failure.kind is Kind.CAPACITY else 500
    if e.failure.kind in (Kind.RATE_LIMITED, Kind.QUOTA):
        status = 429
    message = f"{words['message']} (request {request_id})"
    return {"error": {"code": status, "message": message, "status": status_name(status)}}
