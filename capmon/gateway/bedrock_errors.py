"""Errors as AWS Bedrock shapes them: the exception's name in ``x-amzn-ErrorType`` and
``{"message": ...}`` as the body, which boto3 raises as the client's own exception class
(``client.exceptions.ThrottlingException``...). For every answer on the gateway's Bedrock
routes (capmon/gateway/bedrock_api.py): its own refusals and a failed request.

A failed request keeps the gateway's policy (capmon/gateway/errors.py: which status, the
Retry-After, the message), told in Bedrock's words: the exception each status stands for,
and 503 ``ServiceUnavailableException`` instead of 429 when every model is at capacity (what
Bedrock sends when it cannot serve, apart from a throttled account). A stream that breaks
after its first byte ends with an exception message in the stream (:func:`in_stream`),
which boto3 raises as ``EventStreamError`` after the events it yielded.
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
ERROR_TYPE = "x-amzn-ErrorType"
_NAMESPACE = ":http://internal.amazon.com/coral/com.amazon.bedrock/"

# Bedrock's exception for each status the gateway answers with.
_EXCEPTION = {
    400: "ValidationException",
    401: "AccessDeniedException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    405: "ValidationException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    429: "ThrottlingException",
    500: "InternalServerException",
    502: "InternalServerException",
    503: "ServiceUnavailableException",
    504: "ModelTimeoutException",
}


def exception_name(status: int) -> str:
    """The Bedrock exception an HTTP status stands for."""
    if status in _EXCEPTION:
        return _EXCEPTION[status]
    return "InternalServerException" if status >= 500 else "ValidationException"


@dataclass(eq=False)
class BedrockError(ApiError):
    """An :class:`ApiError` in Bedrock's shape: the exception in a header, the message in
    the body (no ``param``: the message names the field)."""

    def body(self) -> dict[str, Any]:
        return {"message": redact(self.message)}

    @staticmethod
    def of(err: ApiError, failure_kind: Kind | None = None) -> BedrockError:
        """``err`` told in Bedrock's shape; ``failure_kind``: what the failed request last
        met (capacity turns the 429 into ServiceUnavailableException's 503)."""
        if isinstance(err, BedrockError):
            return err
        status = UNAVAILABLE if failure_kind is Kind.CAPACITY and err.status == 429 else err.status
        headers = {**err.headers, ERROR_TYPE: exception_name(status) + _NAMESPACE}
        return BedrockError(status, err.message, err.type, err.code, err.param, headers)


def in_stream(e: RequestFailed, request_id: str) -> tuple[str, str]:
    """The exception (its lowerCamel stream name) and message that end a ConverseStream
    broken after output, in the same redacted words as the OpenAI routes' error event."""
    words = f"{openai_in_stream(e)['message']} (request {request_id})"
    if e.failure.kind is Kind.CAPACITY:
        return "serviceUnavailableException", words
    if e.failure.kind in (Kind.RATE_LIMITED, Kind.QUOTA):
        return "throttlingException", words
    return "modelStreamErrorException", words
