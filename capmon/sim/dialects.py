"""How each provider says "no": capacity rejections and OpenAI-style errors on the wire.

The simulator speaks the OpenAI chat API, but a model that is full rejects in the
dialect its scenario names, so the client's classifier is exercised against the
shapes real providers send. Pure: builds :class:`WireError` values, no web framework.

A model's ``hint`` (seconds) is carried the way that provider would carry it
(``retry-after``, ``retry-after-ms``, ``x-ratelimit-reset-*``, Gemini ``retryDelay``,
"try again in 1.5s"); with no hint, a rejection carries no hint at all.

Some providers say "no" inside a 200 stream instead (the ``*-stream`` and ``responses-*``
dialects): each speaks one API's stream (:func:`speaks`), and answers a request it
cannot answer that way (a plain request, or the other API's stream) with the HTTP error
that its in-stream frame describes. Where each shape comes from is cited beside it.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from capmon.core.base.hints import MAX_HINT
from capmon.core.providers import aws_frames as eventstream

OPENAI_429 = "openai-429"
OPENAI_503 = "openai-503"
ANTHROPIC_529 = "anthropic-529"
ANTHROPIC_429 = "anthropic-429"  # rate_limit_error with retry-after and the anthropic-ratelimit-* headers
GEMINI_429 = "gemini-429"
GEMINI_503 = "gemini-503"
# Vertex AI's pay-as-you-go pool is full (a capacity-like 429, no details); and a project's
# per-minute quota, in the list Vertex wraps some errors in.
VERTEX_429 = "vertex-429"
VERTEX_QUOTA_429 = "vertex-quota-429"
AZURE_429 = "azure-429"
# Bedrock: ThrottlingException, ServiceUnavailableException, ModelNotReadyException and
# ServiceQuotaExceededException (a 400), each in AWS's rest-json error shape.
BEDROCK_429 = "bedrock-429"
BEDROCK_503 = "bedrock-503"
BEDROCK_NOT_READY = "bedrock-not-ready"
BEDROCK_QUOTA = "bedrock-quota"
CAPACITY_TEXT = "capacity-text"

DIALECTS: tuple[str, ...] = (
    OPENAI_429,
    OPENAI_503,
    ANTHROPIC_529,
    ANTHROPIC_429,
    GEMINI_429,
    GEMINI_503,
    VERTEX_429,
    VERTEX_QUOTA_429,
    AZURE_429,
    BEDROCK_429,
    BEDROCK_503,
    BEDROCK_NOT_READY,
    BEDROCK_QUOTA,
    CAPACITY_TEXT,
)

# In-stream capacity dialects: a 200 stream whose only (or next) frame is the rejection.
OPENROUTER_STREAM = "openrouter-stream"  # error.code 429: the upstream provider rate-limits
OPENROUTER_STREAM_502 = "openrouter-stream-502"  # the model is down / gave an invalid answer
OPENROUTER_STREAM_503 = "openrouter-stream-503"  # no provider can take the request
ANTHROPIC_STREAM = "anthropic-stream"
GEMINI_OPENAI_STREAM = "gemini-openai-stream"
VLLM_STREAM = "vllm-stream"
OLLAMA_STREAM = "ollama-stream"
RESPONSES_FAILED = "responses-failed"  # Responses API: response.failed, code server_is_overloaded
RESPONSES_SLOW_DOWN = "responses-slow-down"  # Responses API: response.failed, code slow_down
RESPONSES_ERROR = "responses-error"  # Responses API: an `error` event, code server_is_overloaded
# Gemini's streamGenerateContent: Google's error object, pretty-printed and raw (no `data:`).
GEMINI_STREAM = "gemini-stream"
# Bedrock's ConverseStream: an exception message inside the 200 event stream
# (throttlingException, serviceUnavailableException, modelStreamErrorException).
BEDROCK_STREAM = "bedrock-stream"
BEDROCK_STREAM_503 = "bedrock-stream-503"
BEDROCK_STREAM_ERROR = "bedrock-stream-error"
BEDROCK_STREAM_FRAME = "bedrock-stream-frame"  # an error message of the stream (:message-type: error)

CHAT_STREAM_DIALECTS: tuple[str, ...] = (
    OPENROUTER_STREAM,
    OPENROUTER_STREAM_502,
    OPENROUTER_STREAM_503,
    ANTHROPIC_STREAM,
    GEMINI_OPENAI_STREAM,
    VLLM_STREAM,
    OLLAMA_STREAM,
)
RESPONSES_STREAM_DIALECTS: tuple[str, ...] = (RESPONSES_FAILED, RESPONSES_SLOW_DOWN, RESPONSES_ERROR)
BEDROCK_STREAM_DIALECTS: tuple[str, ...] = (
    BEDROCK_STREAM,
    BEDROCK_STREAM_503,
    BEDROCK_STREAM_ERROR,
    BEDROCK_STREAM_FRAME,
)
STREAM_DIALECTS: tuple[str, ...] = (
    CHAT_STREAM_DIALECTS + RESPONSES_STREAM_DIALECTS + (GEMINI_STREAM,) + BEDROCK_STREAM_DIALECTS
)
CAPACITY_DIALECTS: tuple[str, ...] = DIALECTS + STREAM_DIALECTS

# How a model words its 400 for a token parameter it does not take.
UNSUPPORTED_OPENAI = "openai"
UNSUPPORTED_AZURE = "azure"
UNSUPPORTED_DIALECTS: tuple[str, ...] = (UNSUPPORTED_OPENAI, UNSUPPORTED_AZURE)

CAPACITY_MESSAGE = "Selected model is at capacity. Please try a different model."
OPENAI_OVERLOADED_MESSAGE = "The engine is currently overloaded, please try again later"
GEMINI_OVERLOADED_MESSAGE = "The model is overloaded. Please try again later."
GEMINI_HIGH_DEMAND_MESSAGE = (
    "This model is currently experiencing high demand. Spikes in demand are usually temporary. Please try again later."
)
VERTEX_EXHAUSTED_MESSAGE = "Resource exhausted, please try again later."
GEMINI_KEY_INVALID = "API key not valid. Please pass a valid API key."
GEMINI_NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
VERTEX_UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
PENALTY_MESSAGE = "penalised: too many requests after rejections"
# ollama/ollama server/sched.go ErrMaxQueue, answered 503 when the request queue is full.
OLLAMA_BUSY_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"
# vLLM rejects nothing for capacity itself (it queues); this is the simulator's wording in
# vLLM's error shape, with vLLM's HTTPStatus-named error type.
VLLM_OVERLOADED_MESSAGE = "The server is overloaded: too many requests are waiting. Please try again later."
SLOW_DOWN_MESSAGE = "Too many requests arrived at once. Please slow down and try again later."
AZURE_API_VERSION = "2024-10-21"  # the GA version an Azure 429 names when the request named none
AZURE_ACCESS_DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid "
    "key for an active subscription and use a correct regional API endpoint for your resource."
)
AZURE_DEPLOYMENT_NOT_FOUND = (
    "The API deployment for this resource does not exist. If you created the deployment within the "
    "last 5 minutes, please wait a moment and try again."
)
AZURE_MISSING_VERSION = "Missing required query parameter: api-version"


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


class Api(str, enum.Enum):
    """Which API's stream an in-stream dialect speaks."""

    CHAT = "chat"  # POST /v1/chat/completions
    RESPONSES = "responses"  # POST /v1/responses
    MESSAGES = "messages"  # POST /v1/messages (Anthropic)
    GEMINI = "gemini"  # :generateContent, :streamGenerateContent (Gemini API, Vertex AI)
    CONVERSE = "converse"  # Bedrock's /model/{id}/converse, /converse-stream


class Wire(str, enum.Enum):
    """Whose URLs, keys and error shapes a request came in on."""

    OPENAI = "openai"  # /v1/chat/completions, /v1/responses
    AZURE = "azure"  # /openai/deployments/{deployment}/..., /openai/v1/...
    ANTHROPIC = "anthropic"  # /v1/messages
    GEMINI = "gemini"  # /v1beta/models/{model}:generateContent, /v1/...
    VERTEX = "vertex"  # /v1/projects/{p}/locations/{r}/publishers/{google,anthropic}/models/{model}:...
    BEDROCK = "bedrock"  # /model/{modelId}/converse, /converse-stream


# A scenario model's `api`: the wire it is served on, two wires that serve the same model
# (Gemini on Google's API and on Vertex AI, Claude on Anthropic's and on Vertex AI), or all.
ALL_WIRES = "all"
GEMINI_AND_VERTEX = f"{Wire.GEMINI.value}+{Wire.VERTEX.value}"
ANTHROPIC_AND_VERTEX = f"{Wire.ANTHROPIC.value}+{Wire.VERTEX.value}"
ANTHROPIC_AND_BEDROCK = f"{Wire.ANTHROPIC.value}+{Wire.BEDROCK.value}"
CLAUDE_CLOUDS = f"{Wire.ANTHROPIC.value}+{Wire.VERTEX.value}+{Wire.BEDROCK.value}"
MODEL_APIS: tuple[str, ...] = (
    *(w.value for w in Wire),
    GEMINI_AND_VERTEX,
    ANTHROPIC_AND_VERTEX,
    ANTHROPIC_AND_BEDROCK,
    CLAUDE_CLOUDS,
    ALL_WIRES,
)
# What a model says when full unless its scenario names a dialect: its provider's own.
WIRE_DIALECTS: dict[str, str] = {
    Wire.OPENAI.value: OPENAI_503,
    Wire.AZURE.value: AZURE_429,
    Wire.ANTHROPIC.value: ANTHROPIC_529,
    Wire.GEMINI.value: GEMINI_503,
    Wire.VERTEX.value: VERTEX_429,
    GEMINI_AND_VERTEX: GEMINI_503,
    Wire.BEDROCK.value: BEDROCK_429,
    ANTHROPIC_AND_VERTEX: ANTHROPIC_529,
    ANTHROPIC_AND_BEDROCK: ANTHROPIC_529,
    CLAUDE_CLOUDS: ANTHROPIC_529,
    ALL_WIRES: OPENAI_503,
}
# Google's front ends (the Gemini API's and Vertex AI's): errors in google.rpc.Status JSON.
GOOGLE_WIRES = (Wire.GEMINI, Wire.VERTEX)


def serves(api: str, wire: Wire) -> bool:
    """Whether a model whose scenario says ``api`` is served on ``wire``."""
    return api == ALL_WIRES or wire.value in api.split("+")


def speaks(dialect: str, api: Api) -> bool:
    """Whether ``dialect``'s in-stream rejection is a frame of ``api``'s stream. Anthropic's
    ``event: error`` is one in both a chat stream (as some proxies send it) and its own."""
    if api is Api.CHAT:
        return dialect in CHAT_STREAM_DIALECTS
    if api is Api.RESPONSES:
        return dialect in RESPONSES_STREAM_DIALECTS
    if api is Api.GEMINI:
        return dialect == GEMINI_STREAM
    if api is Api.CONVERSE:
        return dialect in BEDROCK_STREAM_DIALECTS
    return dialect == ANTHROPIC_STREAM


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


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_error(status: int, type: str, message: str, headers: Mapping[str, str] | None = None) -> WireError:
    """Anthropic's error body (docs.anthropic.com/en/api/errors)."""
    return _json(status, {"type": "error", "error": {"type": type, "message": message}}, headers)


ANTHROPIC_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def anthropic_error_event() -> bytes:
    """Anthropic's in-stream ``error`` event: the stream says overloaded after its 200."""
    return b"event: error\ndata: " + json.dumps(ANTHROPIC_OVERLOADED).encode() + b"\n\n"


def openai_error(
    status: int,
    message: str,
    *,
    type: str,
    code: str | None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> WireError:
    return _json(status, {"error": {"message": message, "type": type, "param": param, "code": code}}, headers)


def capacity_rejection(
    dialect: str,
    *,
    model: str,
    slots: int,
    hint: float | None,
    now: float = 0.0,
    api_version: str = AZURE_API_VERSION,
    context_window: int = 0,
) -> WireError:
    """The answer to a request that found no free slot on ``model``. ``now`` (wall-clock
    seconds) dates Anthropic's reset headers; ``api_version`` is the Azure request's."""
    headers: dict[str, str] = {}
    if hint is not None:
        hint = min(max(0.0, float(hint)), MAX_HINT)  # keep every rendering finite
    if dialect == OPENAI_429:
        headers = {"x-ratelimit-limit-requests": str(max(slots, 0)), "x-ratelimit-remaining-requests": "0"}
        message = (
            f"Rate limit reached for {model} in organization org-capmon-sim on requests per min (RPM): "
            f"Limit {max(slots, 0)}, Used {max(slots, 0)}, Requested 1."
        )
        if hint is not None:
            headers["x-ratelimit-reset-requests"] = format_duration(hint)
            headers["retry-after"] = _retry_after(hint)
            message += f" Please try again in {format_duration(hint)}."
        return openai_error(429, message, type="requests", code="rate_limit_exceeded", headers=headers)
    if dialect == OPENAI_503:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return openai_error(
            503, OPENAI_OVERLOADED_MESSAGE, type="server_error", code="server_is_overloaded", headers=headers
        )
    if dialect == ANTHROPIC_529:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return _json(529, ANTHROPIC_OVERLOADED, headers)
    if dialect == ANTHROPIC_429:
        return _anthropic_rate_limited(model, slots, hint, now, context_window)
    if dialect in (GEMINI_429, GEMINI_503, VERTEX_429, VERTEX_QUOTA_429):
        return _google_capacity(dialect, model, slots, hint)
    if dialect == AZURE_429:
        message = (
            f"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version {api_version} "
            f"have exceeded call rate limit of your current OpenAI S0 pricing tier for {model}."
        )
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
            headers["retry-after-ms"] = str(max(0, round(hint * 1000)))
            message += f" Please retry after {_retry_after(hint)} seconds."
        return _json(429, {"error": {"code": "429", "message": message}}, headers)
    if dialect in BEDROCK_DIALECTS:
        # Bedrock sends no retry hint, so a model's ``hint`` is not carried.
        return bedrock_error(*BEDROCK_CAPACITY[dialect])
    if dialect == CAPACITY_TEXT:
        if hint is not None:
            headers["retry-after"] = _retry_after(hint)
        return WireError(503, CAPACITY_MESSAGE.encode(), "text/plain; charset=utf-8", headers)
    if dialect in STREAM_DIALECTS:
        return _stream_dialect_as_http(dialect, model=model, hint=hint)
    raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(CAPACITY_DIALECTS)}")


def google_error(
    status: int, code: str, message: str, details: list[dict[str, Any]] | None = None, *, listed: bool = False
) -> WireError:
    """Google's error body, a google.rpc.Status as JSON (cloud.google.com/apis/design/errors):
    ``{"error": {"code", "message", "status", "details"?}}``; ``listed``: wrapped in a list,
    as Vertex AI and Gemini's OpenAI-compatible endpoint send some."""
    error: dict[str, Any] = {"code": status, "message": message, "status": code}
    if details:
        error["details"] = details
    return _json(status, [{"error": error}] if listed else {"error": error})


def _retry_info(hint: float) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": _proto_duration(hint)}


def _google_capacity(dialect: str, model: str, slots: int, hint: float | None) -> WireError:
    """A full model on Google's wires. gemini-429: the free tier's per-minute request quota,
    worded and detailed as the Gemini API words it (Help, QuotaFailure with a per-minute
    quotaId, RetryInfo; "Please retry in 25.46s." in the message); gemini-503: overloaded;
    vertex-429: the shared pay-as-you-go pool, no details; vertex-quota-429: the project's
    per-minute quota for the base model, in a list. A hint rides in RetryInfo (and the
    Gemini 429's message)."""
    retry = [] if hint is None else [_retry_info(hint)]
    if dialect == GEMINI_503:
        return google_error(503, "UNAVAILABLE", GEMINI_OVERLOADED_MESSAGE, retry)
    if dialect == VERTEX_429:
        return google_error(429, "RESOURCE_EXHAUSTED", VERTEX_EXHAUSTED_MESSAGE)
    if dialect == VERTEX_QUOTA_429:
        message = (
            f"Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base "
            f"model: {model}. Please submit a quota increase request. "
            f"https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai."
        )
        return google_error(429, "RESOURCE_EXHAUSTED", message, retry, listed=True)
    limit = max(slots, 0)
    metric = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
    message = (
        "You exceeded your current quota, please check your plan and billing details. For more information on "
        "this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, "
        f"head to: https://ai.dev/usage?tab=rate-limit. \n* Quota exceeded for metric: {metric}, limit: {limit}, "
        f"model: {model}"
    )
    if hint is not None:
        message += f"\nPlease retry in {round(hint, 2):g}s."
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [
                {
                    "description": "Learn more about Gemini API quotas",
                    "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                }
            ],
        },
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": metric,
                    # A per-minute quota: the classifier must read this as rate_limited, not a daily quota.
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                    "quotaDimensions": {"location": "global", "model": model},
                    "quotaValue": str(limit),
                }
            ],
        },
        *retry,
    ]
    return google_error(429, "RESOURCE_EXHAUSTED", message, details)


def _anthropic_rate_limited(model: str, slots: int, hint: float | None, now: float, window: int) -> WireError:
    """Anthropic's 429 (docs.anthropic.com/en/api/rate-limits): ``retry-after`` and the
    ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` headers, resets in
    RFC 3339. The simulator's limit is concurrency, so the token figures are what the
    model's slots could hold at once (its context window each)."""
    limit = max(slots, 0)
    reset = rfc3339(math.ceil(now + (hint or 0.0)))  # never before the real reset
    headers = {
        "anthropic-ratelimit-requests-limit": str(limit),
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-tokens-limit": str(limit * window),
        "anthropic-ratelimit-tokens-remaining": "0",
        "anthropic-ratelimit-tokens-reset": reset,
    }
    if hint is not None:
        headers["retry-after"] = _retry_after(hint)
    message = (
        f"This request would exceed the rate limit for your organization (org-capmon-sim) of {limit} "
        f"concurrent requests to {model}. For details, refer to: https://docs.claude.com/en/api/rate-limits. "
        f"You can see the response headers for current usage."
    )
    return anthropic_error(429, "rate_limit_error", message, headers)


def penalty_rejection(remaining: float, wire: Wire = Wire.OPENAI) -> WireError:
    """A key that kept hammering after rejections; the hint is the real time left."""
    if wire is Wire.ANTHROPIC:
        return anthropic_error(429, "rate_limit_error", PENALTY_MESSAGE, {"retry-after": _retry_after(remaining)})
    if wire in GOOGLE_WIRES:
        return google_error(429, "RESOURCE_EXHAUSTED", PENALTY_MESSAGE, [_retry_info(remaining)])
    if wire is Wire.BEDROCK:
        return bedrock_error(429, THROTTLING, PENALTY_MESSAGE)
    return openai_error(
        429,
        PENALTY_MESSAGE,
        type="requests",
        code="rate_limit_exceeded",
        headers={"retry-after": _retry_after(remaining)},
    )


def azure_error(status: int, code: str, message: str) -> WireError:
    """Azure OpenAI's own error body (its front end's, before a request reaches a model)."""
    return _json(status, {"error": {"code": code, "message": message}})


def _error_info(reason: str, service: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {"service": service},
    }


def invalid_api_key(token: str | None, wire: Wire = Wire.OPENAI) -> WireError:
    if wire is Wire.BEDROCK:
        if not token:
            return bedrock_error(403, "AccessDeniedException", BEDROCK_NO_AUTH)
        return bedrock_error(403, "UnrecognizedClientException", BEDROCK_BAD_TOKEN)
    if wire is Wire.AZURE:
        return azure_error(401, "401", AZURE_ACCESS_DENIED)
    if wire is Wire.ANTHROPIC:
        # Anthropic names the header it read, whichever the caller used.
        return anthropic_error(401, "authentication_error", "invalid x-api-key")
    if wire is Wire.GEMINI:
        if not token:
            return google_error(403, "PERMISSION_DENIED", GEMINI_NO_KEY)
        # A wrong key is a 400 on the Gemini API, not a 401: the reason says what it is.
        info = _error_info("API_KEY_INVALID", "generativelanguage.googleapis.com")
        localized = {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US"}
        return google_error(
            400, "INVALID_ARGUMENT", GEMINI_KEY_INVALID, [info, {**localized, "message": GEMINI_KEY_INVALID}]
        )
    if wire is Wire.VERTEX:
        reason = "ACCESS_TOKEN_TYPE_UNSUPPORTED" if token else "CREDENTIALS_MISSING"
        info = _error_info(reason, "aiplatform.googleapis.com")
        return google_error(401, "UNAUTHENTICATED", VERTEX_UNAUTHENTICATED, [info])
    if not token:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    else:
        # Like OpenAI, show only enough of the key to recognise it.
        shown = f"{token[:3]}****{token[-4:]}" if len(token) > 10 else "****"
        message = f"Incorrect API key provided: {shown}. This simulator accepts the keys listed in its scenario."
    return openai_error(401, message, type="invalid_request_error", code="invalid_api_key")


def model_not_found(model: str, wire: Wire = Wire.OPENAI) -> WireError:
    if wire is Wire.BEDROCK:
        return bedrock_error(404, "ResourceNotFoundException", BEDROCK_NOT_FOUND.format(model=model))
    if wire is Wire.AZURE:
        return azure_error(404, "DeploymentNotFound", AZURE_DEPLOYMENT_NOT_FOUND)
    if wire is Wire.ANTHROPIC:
        return anthropic_error(404, "not_found_error", f"model: {model}")
    if wire is Wire.GEMINI:
        message = (
            f"models/{model} is not found for API version v1beta, or is not supported for generateContent. "
            f"Call ListModels to see the list of available models and their supported methods."
        )
        return google_error(404, "NOT_FOUND", message)
    if wire is Wire.VERTEX:
        message = (
            f"Publisher Model `{model}` was not found or your project does not have access to it. Please ensure "
            f"you are using a valid model version. For more information, see: "
            f"https://cloud.google.com/vertex-ai/generative-ai/docs/learn/model-versions"
        )
        return google_error(404, "NOT_FOUND", message)
    return openai_error(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        type="invalid_request_error",
        code="model_not_found",
    )


def context_length_exceeded(window: int, prompt_tokens: int, max_tokens: int, wire: Wire = Wire.OPENAI) -> WireError:
    if wire is Wire.ANTHROPIC:
        if prompt_tokens > window:
            return anthropic_error(
                400, "invalid_request_error", f"prompt is too long: {prompt_tokens} tokens > {window} maximum"
            )
        return anthropic_error(
            400,
            "invalid_request_error",
            f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > {window}, "
            f"decrease input length or `max_tokens` and try again",
        )
    if wire is Wire.BEDROCK:
        return bedrock_error(400, VALIDATION, BEDROCK_TOO_LONG)
    if wire in GOOGLE_WIRES:
        # Google counts the input only; the simulator's window holds the answer too, so the
        # requested output is counted in as the input it displaces.
        message = (
            f"The input token count ({prompt_tokens + max_tokens}) exceeds the maximum number of tokens "
            f"allowed ({window})."
        )
        return google_error(400, "INVALID_ARGUMENT", message)
    message = (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
        f"completion). Please reduce the length of the messages or completion."
    )
    return openai_error(400, message, type="invalid_request_error", code="context_length_exceeded", param="messages")


def bad_request(message: str, param: str | None = None, wire: Wire = Wire.OPENAI) -> WireError:
    if wire is Wire.ANTHROPIC:
        return anthropic_error(400, "invalid_request_error", message)
    if wire in GOOGLE_WIRES:
        return google_error(400, "INVALID_ARGUMENT", message)
    if wire is Wire.BEDROCK:
        return bedrock_error(400, VALIDATION, message)
    return openai_error(400, message, type="invalid_request_error", code=None, param=param)


# The statuses the `error` fault answers with, worded as each provider words them:
# (Anthropic's error type and message, OpenAI's type, code and message).
STATUS_ERRORS: dict[int, tuple[str, str, str, str | None, str]] = {
    400: ("invalid_request_error", "Invalid request.", "invalid_request_error", None, "Invalid request."),
    401: ("authentication_error", "invalid x-api-key", "invalid_request_error", "invalid_api_key", "Invalid key."),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
        "invalid_request_error",
        "permission_denied",
        "You are not allowed to sample from this model.",
    ),
    404: ("not_found_error", "Not found.", "invalid_request_error", None, "Not found."),
    408: ("timeout_error", "Request timed out.", "server_error", None, "Request timed out."),
    413: (
        "request_too_large",
        "Request exceeds the maximum allowed number of bytes.",
        "invalid_request_error",
        None,
        "Request too large.",
    ),
    424: ("api_error", "Failed dependency.", "server_error", None, "Failed dependency."),
    429: ("rate_limit_error", "Rate limited.", "requests", "rate_limit_exceeded", "Rate limit reached."),
    500: (
        "api_error",
        "Internal server error",
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("api_error", "Service unavailable.", "server_error", None, "Service unavailable."),
    504: ("timeout_error", "Request timed out.", "server_error", None, "Request timed out."),
    529: ("overloaded_error", "Overloaded", "server_error", "server_is_overloaded", OPENAI_OVERLOADED_MESSAGE),
}
# ... and as Google words them (its canonical codes; it sends no 529, the nearest is UNAVAILABLE).
GOOGLE_STATUS_ERRORS: dict[int, tuple[str, str]] = {
    400: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
    401: ("UNAUTHENTICATED", VERTEX_UNAUTHENTICATED),
    403: ("PERMISSION_DENIED", "The caller does not have permission"),
    404: ("NOT_FOUND", "Requested entity was not found."),
    408: ("DEADLINE_EXCEEDED", "The request timed out. Please try again."),
    413: ("INVALID_ARGUMENT", "Request payload size exceeds the limit: 20971520 bytes."),
    424: ("FAILED_PRECONDITION", "Precondition check failed."),
    429: ("RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."),
    500: (
        "INTERNAL",
        "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    ),
    503: ("UNAVAILABLE", "The service is currently unavailable."),
    504: ("DEADLINE_EXCEEDED", "The request timed out. Please try again."),
    529: ("UNAVAILABLE", GEMINI_OVERLOADED_MESSAGE),
}


def status_error(status: int, wire: Wire = Wire.OPENAI) -> WireError:
    """The ``error`` fault's answer: ``status`` in the wire's own error shape."""
    a_type, a_message, o_type, o_code, o_message = STATUS_ERRORS[status]
    if wire is Wire.ANTHROPIC:
        return anthropic_error(status, a_type, a_message)
    if wire is Wire.AZURE and status == 401:
        return invalid_api_key(None, wire)
    if wire in GOOGLE_WIRES:
        return google_error(status, *GOOGLE_STATUS_ERRORS[status])
    if wire is Wire.BEDROCK:
        return bedrock_error(*BEDROCK_STATUS_ERRORS[status])
    return openai_error(status, o_message, type=o_type, code=o_code)


# ---------------------------------------------------------------- errors inside a 200 stream


def _openrouter_error(dialect: str, model: str) -> dict[str, Any]:
    """OpenRouter's error object (openrouter.ai/docs/api-reference/errors: ``{code, message,
    metadata}``, code = the HTTP status it stands for). Upstream failures say "Provider returned
    error" with the upstream's own text in ``metadata.raw`` and its name in ``provider_name``."""
    if dialect == OPENROUTER_STREAM:
        raw = (
            f"{model} is temporarily rate-limited upstream. Please retry shortly, or add your own key "
            f"to accumulate your rate limits: https://openrouter.ai/settings/integrations"
        )
        return {"code": 429, "message": "Provider returned error", "metadata": {"raw": raw, "provider_name": "Capmon"}}
    if dialect == OPENROUTER_STREAM_502:
        raw = "upstream connect error or disconnect/reset before headers. reset reason: overflow"
        return {"code": 502, "message": "Provider returned error", "metadata": {"raw": raw, "provider_name": "Capmon"}}
    return {
        "code": 503,
        "message": "No endpoints available: every provider of this model is at capacity.",
        "metadata": {"provider_name": None},
    }


def _gemini_unavailable(hint: float | None, message: str = GEMINI_OVERLOADED_MESSAGE) -> dict[str, Any]:
    details = [] if hint is None else [_retry_info(hint)]
    body: dict[str, Any] = google_error(503, "UNAVAILABLE", message, details).json()
    return body


def gemini_stream_error() -> bytes:
    """Gemini's error inside a 200 streamGenerateContent: the google.rpc.Status object sent
    raw, pretty-printed, with no ``data:`` before it (google-genai gathers the lines until
    its braces balance, then raises ServerError; a client that reads only ``data:`` lines
    sees a stream that just ends, as Bifrost's did: maximhq/bifrost#5188)."""
    return json.dumps(_gemini_unavailable(None, GEMINI_HIGH_DEMAND_MESSAGE), indent=2).encode() + b"\n"


def _vllm_error() -> dict[str, Any]:
    # vLLM's ErrorResponse (vllm/entrypoints/openai/protocol.py, before the 2025 `{"error": ...}`
    # wrapper): object "error", an HTTPStatus-named type and the numeric code.
    return {
        "object": "error",
        "message": VLLM_OVERLOADED_MESSAGE,
        "type": "ServiceUnavailableError",
        "param": None,
        "code": 503,
    }


def responses_failure(dialect: str) -> tuple[str, str]:
    """(error code, message) that a ``responses-*`` dialect puts in response.failed / error."""
    if dialect == RESPONSES_SLOW_DOWN:
        return "slow_down", SLOW_DOWN_MESSAGE
    return "server_is_overloaded", OPENAI_OVERLOADED_MESSAGE


def _stream_dialect_as_http(dialect: str, *, model: str, hint: float | None) -> WireError:
    """What an in-stream dialect answers when it cannot answer inside a stream."""
    headers = {} if hint is None else {"retry-after": _retry_after(hint)}
    if dialect in (OPENROUTER_STREAM, OPENROUTER_STREAM_502, OPENROUTER_STREAM_503):
        error = _openrouter_error(dialect, model)
        return _json(error["code"], {"error": error}, headers)
    if dialect == ANTHROPIC_STREAM:
        return capacity_rejection(ANTHROPIC_529, model=model, slots=0, hint=hint)
    if dialect == GEMINI_OPENAI_STREAM:
        # Gemini's OpenAI-compatible endpoint wraps its HTTP error body in a list
        # (seen in n4ze3m/page-assist#406: `[{"error": {"code": 429, ..., "status": ...}}]`).
        return _json(503, [_gemini_unavailable(hint)])
    if dialect == GEMINI_STREAM:
        return _json(503, _gemini_unavailable(hint, GEMINI_HIGH_DEMAND_MESSAGE))
    if dialect in BEDROCK_STREAM_DIALECTS:
        status, name, message = BEDROCK_STREAM_EXCEPTIONS[dialect]
        return bedrock_error(status, name, message)
    if dialect == VLLM_STREAM:
        return _json(503, _vllm_error(), headers)
    if dialect == OLLAMA_STREAM:
        # ollama/ollama middleware/openai.go writeError: openai.NewError(status, message), type api_error.
        return _json(
            503, {"error": {"message": OLLAMA_BUSY_MESSAGE, "type": "api_error", "param": None, "code": None}}, headers
        )
    code, message = responses_failure(dialect)
    return openai_error(503, message, type="server_error", code=code, headers=headers)


def _sse_data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


OPENROUTER_COMMENT = b": OPENROUTER PROCESSING\n\n"


def chat_stream_error(dialect: str, *, model: str, chunk: Mapping[str, Any] | None) -> bytes:
    """The bytes that end a chat stream with ``dialect``'s in-stream rejection. ``chunk`` is
    the stream's chunk envelope (id, object, created, model) once output has begun, None
    before any output."""
    if dialect in (OPENROUTER_STREAM, OPENROUTER_STREAM_502, OPENROUTER_STREAM_503):
        error = _openrouter_error(dialect, model)
        if chunk is None:
            # Before any token: OpenRouter has already sent 200 and its keep-alive comments.
            return OPENROUTER_COMMENT + _sse_data({"error": error})
        # After tokens: one chunk with the error beside a choice finished with "error"
        # (OpenRouter's "Handling Errors During Streaming"; also seen in CommandCodeAI/command-code#834).
        return _sse_data(
            {
                **chunk,
                "provider": "Capmon",
                "error": error,
                "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
            }
        )
    if dialect == ANTHROPIC_STREAM:
        # Anthropic Messages streaming: an `error` event (docs.anthropic.com, "Error events").
        return anthropic_error_event()
    if dialect == GEMINI_OPENAI_STREAM:
        # Google's error object as a data frame; the stream ends with no [DONE].
        return _sse_data(_gemini_unavailable(None))
    if dialect == VLLM_STREAM:
        # serving_chat.py chat_completion_stream_generator: `data: {error}` then `data: [DONE]`.
        return _sse_data(_vllm_error()) + b"data: [DONE]\n\n"
    if dialect == OLLAMA_STREAM:
        # ollama server/routes.go streamResponse: a streamed error is `{"error": "<text>"}`.
        return _sse_data({"error": OLLAMA_BUSY_MESSAGE})
    raise ValueError(f"{dialect!r} is not a chat stream dialect; expected one of {', '.join(CHAT_STREAM_DIALECTS)}")


# ---------------------------------------------------------------- token parameters

# Azure returns OpenAI's error with the Python call stack of its front end appended
# (lobehub/lobehub#5909, jekalmin/extended_openai_conversation#298); abridged here.
AZURE_CALLSTACK = (
    '  File "/usr/local/bin/gunicorn", line 8, in <module>\n    sys.exit(run())\n'
    'at   File "/usr/local/lib/python3.11/site-packages/gunicorn/app/wsgiapp.py", line 66, in run\n'
    '    WSGIApplication("%(prog)s [OPTIONS] [APP_MODULE]", prog=prog).run()\n'
)


def unsupported_parameter(dialect: str, param: str, instead: str) -> WireError:
    """OpenAI's 400 for a parameter this model refuses (o1 and later refuse max_tokens; o1-mini
    refused tools, with no ``instead``)."""
    message = f"Unsupported parameter: '{param}' is not supported with this model."
    if instead:
        message += f" Use '{instead}' instead."
    if dialect == UNSUPPORTED_AZURE:
        return _json(
            400,
            {
                "error": {
                    "code": "unsupported_parameter",
                    "type": "invalid_request_error",
                    "param": param,
                    "message": message,
                    "callstack": AZURE_CALLSTACK,
                }
            },
        )
    if dialect == UNSUPPORTED_OPENAI:
        return openai_error(400, message, type="invalid_request_error", code="unsupported_parameter", param=param)
    raise ValueError(f"unknown unsupported_dialect {dialect!r}; expected one of {', '.join(UNSUPPORTED_DIALECTS)}")


# ---------------------------------------------------------------- AWS Bedrock

# Bedrock's front end names the exception in x-amzn-ErrorType ("Name:namespace"; botocore's
# rest-json parser takes the part before the colon as the error code) and says why in the
# body's "message".
BEDROCK_ERROR_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"
THROTTLING = "ThrottlingException"
VALIDATION = "ValidationException"
BEDROCK_THROTTLED = "Too many requests, please wait before trying again."
BEDROCK_UNAVAILABLE = "Bedrock is unable to process your request."
BEDROCK_NOT_READY_MESSAGE = "Model is not ready to serve inference requests. Try your request again later."
BEDROCK_QUOTA_MESSAGE = "Too many tokens per day, please wait before trying again."
BEDROCK_TOO_LONG = "Input is too long for requested model."
BEDROCK_BAD_TOKEN = "The security token included in the request is invalid."
BEDROCK_BAD_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check your AWS Secret "
    "Access Key and signing method. Consult the service documentation for details."
)
BEDROCK_NO_AUTH = "Authorization header requires a SigV4 signature or a Bedrock API key (Bearer)."
BEDROCK_NOT_FOUND = (
    "Could not resolve the foundation model from the provided model identifier: {model}. Please verify that "
    "the requested model exists and is accessible within the specified region."
)
BEDROCK_NEEDS_PROFILE = (
    "Invocation of model ID {model} with on-demand throughput isn't supported. Retry your request with the ID or "
    "ARN of an inference profile that contains this model."
)
BEDROCK_STREAM_FAILED = "An error occurred while streaming the response. Retry your request."
BEDROCK_DIALECTS: tuple[str, ...] = (BEDROCK_429, BEDROCK_503, BEDROCK_NOT_READY, BEDROCK_QUOTA)
# A full model's HTTP error per dialect: (status, exception, message).
BEDROCK_CAPACITY: dict[str, tuple[int, str, str]] = {
    BEDROCK_429: (429, THROTTLING, BEDROCK_THROTTLED),
    BEDROCK_503: (503, "ServiceUnavailableException", BEDROCK_UNAVAILABLE),
    BEDROCK_NOT_READY: (429, "ModelNotReadyException", BEDROCK_NOT_READY_MESSAGE),
    BEDROCK_QUOTA: (400, "ServiceQuotaExceededException", BEDROCK_QUOTA_MESSAGE),
}
# An in-stream dialect's exception: (the HTTP status it stands for, its name, message).
BEDROCK_STREAM_EXCEPTIONS: dict[str, tuple[int, str, str]] = {
    BEDROCK_STREAM: (429, THROTTLING, BEDROCK_THROTTLED),
    BEDROCK_STREAM_503: (503, "ServiceUnavailableException", BEDROCK_UNAVAILABLE),
    BEDROCK_STREAM_ERROR: (424, "ModelStreamErrorException", BEDROCK_STREAM_FAILED),
    BEDROCK_STREAM_FRAME: (429, THROTTLING, BEDROCK_THROTTLED),
}
# The `error` fault's statuses as Bedrock's exceptions (it has no 401, 504 or 529: the nearest).
BEDROCK_STATUS_ERRORS: dict[int, tuple[int, str, str]] = {
    400: (400, VALIDATION, "Malformed input request, please reformat your input and try again."),
    401: (403, "UnrecognizedClientException", BEDROCK_BAD_TOKEN),
    403: (403, "AccessDeniedException", "You don't have access to the model with the specified model ID."),
    404: (404, "ResourceNotFoundException", "The requested resource could not be found."),
    408: (408, "ModelTimeoutException", "Model has timed out in processing the request. Try your request again."),
    413: (400, VALIDATION, BEDROCK_TOO_LONG),
    424: (424, "ModelErrorException", "The model encountered an error processing the request."),
    429: (429, THROTTLING, BEDROCK_THROTTLED),
    500: (500, "InternalServerException", "The server encountered an internal error. Try your request again."),
    503: (503, "ServiceUnavailableException", BEDROCK_UNAVAILABLE),
    504: (408, "ModelTimeoutException", "Model has timed out in processing the request. Try your request again."),
    529: (503, "ServiceUnavailableException", BEDROCK_UNAVAILABLE),
}


def bedrock_error(status: int, exception: str, message: str) -> WireError:
    """Bedrock's error answer: ``exception`` in ``x-amzn-ErrorType``, ``{"message"}`` as the body."""
    return _json(status, {"message": message}, {"x-amzn-ErrorType": f"{exception}:{BEDROCK_ERROR_NAMESPACE}"})


def _lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def bedrock_stream_error(dialect: str) -> bytes:
    """The exception message that ends a ConverseStream in ``dialect``: ``:message-type:
    exception`` and the exception's name in lowerCamel case (``throttlingException``); a
    modelStreamErrorException says what the model itself answered. ``bedrock-stream-frame``
    ends it with an error message of the stream instead (``:message-type: error``, the
    exception's name as ``:error-code``), the other shape AWS's event streams fail in."""
    _status, name, message = BEDROCK_STREAM_EXCEPTIONS[dialect]
    if dialect == BEDROCK_STREAM_FRAME:
        return eventstream.error(name, message)
    payload: dict[str, Any] = {"message": message}
    if dialect == BEDROCK_STREAM_ERROR:
        payload.update(originalStatusCode=500, originalMessage="Internal server error")
    return eventstream.exception(_lower_camel(name), payload)
