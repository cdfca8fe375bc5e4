"""How each provider says "no": capacity rejections and OpenAI-style errors on the wire.

The simulator speaks the OpenAI chat API, but a model that is full rejects in the
dialect its scenario names, so the client's classifier is exercised against the
shapes real providers send. Pure: builds :class:`WireError` values, no web framework.

A model's ``hint`` (seconds) is carried the way that provider would carry it
(``retry-after``, ``retry-after-ms``, ``x-ratelimit-reset-*``, Gemini ``retryDelay``,
"try again in 1.5s"); with no hint, a rejection carries no hint at all.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from capmon.core.hints import MAX_HINT

OPENAI_429 = "openai-429"
OPENAI_503 = "openai-503"
ANTHROPIC_529 = "anthropic-529"
GEMINI_429 = "gemini-429"
GEMINI_503 = "gemini-503"
AZURE_429 = "azure-429"
CAPACITY_TEXT = "capacity-text"

DIALECTS: tuple[str, ...] = (OPENAI_429, OPENAI_503, ANTHROPIC_529, GEMINI_429, GEMINI_503, AZURE_429, CAPACITY_TEXT)

CAPACITY_MESSAGE = "Selected model is at capacity. Please try a different model."
OPENAI_OVERLOADED_MESSAGE = "The engine is currently overloaded, please try again later"
GEMINI_OVERLOADED_MESSAGE = "The model is overloaded. Please try again later."
PENALTY_MESSAGE = "penalised: too many requests after rejections"


@dataclass(frozen=True)
class WireError:
    """An error response as bytes on the wire."""

    status: int
    body: bytes
    media_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


def _json(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> WireError:
    return WireError(status, json.dumps(payload).encode(), "application/json", dict(headers or {}))




def format_duration(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` style: ``20ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def _proto_duration(seconds: float) -> str:
    """A protobuf Duration in JSON, as Gemini's ``RetryInfo.retryDelay`` has it."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds:.3f}s"


def _retry_after(hint: float) -> str:
    # HTTP says delay-seconds is a whole number; round up so the floor is honoured.
    return str(max(0, math.ceil(hint)))


def openai_error(status: int, message: str, *, type: str, code: str | None, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> WireError:
    return _json(status, {"error": {"message": message, "type": type, "param": param, "code": code}}, headers)


def capacity_rejection(dialect: str, *, model: str, slots: int, hint: float | None) -> WireError:
    """The answer to a request that found no free slot on ``model``."""
    headers: dict[str, str] = {}
    if hint is not None:
        hint = min(max(0.0, float(hint)), MAX_HINT)  # keep every rendering finite
    if dialect == OPENAI_429:
        headers = {"x-ratelimit-limit-requests": str(max(slots, 0)), "x-ratelimit-remaining-requests": "0"}
        message = (f"Rate limit reached for {model} in organization org-capmon-sim on requests per min (RPM): "
                   f"Limit {max(slots, 0)}, Used {max(slots, 0)}, Requested 1.")
        if hint is not None:
            headers["x-ratelimit-reset-requests"] = format_duration(hint)
            headers["retry-after"] = _retry_after(hint)
            message += f" Please try again in {format_duration(hint)}."
        return openai_error(429, message, type="requests", code="rate_limit_exceeded", headers=headers)
    if dialect == OPENAI_503:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return openai_error(503, OPENAI_OVERLOADED_MESSAGE, type="server_error", code="server_is_overloaded",
                            headers=headers)
    if dialect == ANTHROPIC_529:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return _json(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, headers)
    if dialect in (GEMINI_429, GEMINI_503):
        details: list[dict[str, Any]] = []
        if dialect == GEMINI_429:
            status, code, message = 429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."
            # A per-minute quota: the classifier must read this as rate_limited, not a daily quota.
            details.append({
                "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                "violations": [{
                    "quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel",
                    "quotaDimensions": {"model": model, "location": "global"},
                }],
            })
        else:
            status, code, message = 503, "UNAVAILABLE", GEMINI_OVERLOADED_MESSAGE
        if hint is not None:
            details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": _proto_duration(hint)})
        error: dict[str, Any] = {"code": status, "message": message, "status": code}
        if details:
            error["details"] = details
        return _json(status, {"error": error})
    if dialect == AZURE_429:
        message = (f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 "
                   f"have exceeded call rate limit of your current OpenAI S0 pricing tier for {model}.")
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
            headers["retry-after-ms"] = str(max(0, round(hint * 1000)))
            message += f" Please retry after {_retry_after(hint)} seconds."
        return _json(429, {"error": {"code": "429", "message": message}}, headers)
    if dialect == CAPACITY_TEXT:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return WireError(503, CAPACITY_MESSAGE.encode(), "text/plain; charset=utf-8", headers)
    raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")


def penalty_rejection(remaining: float) -> WireError:
    """A key that kept hammering after rejections; the hint is the real time left."""
    return openai_error(429, PENALTY_MESSAGE, type="requests", code="rate_limit_exceeded",
                        headers={"retry-after": _retry_after(remaining)})


def invalid_api_key(token: str | None) -> WireError:
    if not token:
        message = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
                   "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    else:
        # Like OpenAI, show only enough of the key to recognise it.
        shown = f"{token[:3]}****{token[-4:]}" if len(token) > 10 else "****"
        message = f"Incorrect API key provided: {shown}. This simulator accepts the keys listed in its scenario."
    return openai_error(401, message, type="invalid_request_error", code="invalid_api_key")


def model_not_found(model: str) -> WireError:
    return openai_error(404, f"The model `{model}` does not exist or you do not have access to it.",
                        type="invalid_request_error", code="model_not_found")


def context_length_exceeded(window: int, prompt_tokens: int, max_tokens: int) -> WireError:
    message = (f"This model's maximum context length is {window} tokens. However, you requested "
               f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
               f"completion). Please reduce the length of the messages or completion.")
    return openai_error(400, message, type="invalid_request_error", code="context_length_exceeded", param="messages")


def bad_request(message: str, param: str | None = None) -> WireError:
    return openai_error(400, message, type="invalid_request_error", code=None, param=param)
