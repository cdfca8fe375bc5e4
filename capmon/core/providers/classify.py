"""Classify a failed attempt from its status, body, error code and headers.

``classify_response`` and ``classify_exception`` never raise: a garbage header or a
body that is not JSON is still classified. See ARCHITECTURE.md, "Kinds and what they do", and the README's table.
"""

from __future__ import annotations

import asyncio
import html
import http
import json
import re
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from capmon.core.base.clock import default_clock
from capmon.core.base.exceptions import CredentialsError
from capmon.core.base.hints import hint_from
from capmon.core.base.secrets import redact as _redact
from capmon.core.types.capability import Feature
from capmon.core.types.failure import (
    INFERENCE_PROFILE_REQUIRED,
    MODEL_NOT_FOUND,
    UNSUPPORTED_FEATURE,
    Cause,
    Failure,
    Kind,
)

# --- classification -------------------------------------------------------------------

MESSAGE_CHARS = 2000


def _param(parsed: object) -> str | None:
    error = parsed.get("error") if isinstance(parsed, Mapping) else None
    param = error.get("param") if isinstance(error, Mapping) else None
    return _redact(param) if isinstance(param, str) and param.isprintable() and len(param) <= 200 else None


# A 429 that says "wait an hour or more" is a quota that resets later, not a rate limit
# worth retrying on this key now.
QUOTA_HINT = 3600.0  # the default of [backoff] max_hint
_REASON_MESSAGE_CHARS = 200
_SCAN_CHARS = 65536  # enough for any provider error; caps regex work on huge bodies

# Signals are matched against the error's code / type / status strings and its message,
# lower-cased, with URLs removed (OpenAI's rate-limit text links to ".../account/billing").
_AUTH = re.compile(
    r"invalid_api_key|invalid api key|incorrect api key|api key not valid|api_key_invalid|invalid x-api-key"
    r"|authentication_error|permission_error|permission_denied|unauthenticated|invalid_authentication"
)
_TOO_LARGE = re.compile(
    r"context_length_exceeded|context.length|maximum context|context window|prompt is too long"
    r"|request too large|request_too_large|string_above_max_length|input is too long"
    r"|exceeds the maximum number of tokens"
)
_QUOTA = re.compile(
    r"insufficient_quota|exceeded your current quota|spend(?:ing)? limit|usage limit|credit balance"
    r"|insufficient (?:credits|balance|funds)|out of credits|billing.hard.limit|billing_not_active"
    r"|plan and billing|billing details|enable billing|billing (?:is )?not (?:enabled|active)"
    r"|per ?day|\((?:rpd|tpd)\)|daily (?:limit|quota)"
)
_CAPACITY = re.compile(
    r"overloaded|at capacity|over capacity|out of capacity|no capacity|insufficient capacity"
    r"|capacity constraint|capacity.exceeded|slow.down|high demand|server busy|server is busy"
    r"|maximum pending requests"
)
# A 404 that says the model (or Azure's deployment) is not there: that target cannot serve
# anything, which is a fact about the target, not the request (ARCHITECTURE.md, "Kinds and
# what they do": code ``model_not_found``). OpenAI's ``model_not_found``, Anthropic's
# "model: NAME", Google's "models/NAME is not found" and "Publisher Model `NAME` was not found".
_NO_MODEL = re.compile(
    r"model_not_found|deploymentnotfound|model: |models/\S+ is not found|publisher model"
    r"|model\b[^.]{0,80}\b(?:does not exist|not found|was not found)"
)
# A 400 that says the model does not support a feature the request uses, by the providers'
# own words (tests/core/test_unsupported_feature.py holds them): OpenAI's "does not support
# tools", "tools is not supported with this model", "'response_format' of type 'json_schema'
# is not supported with this model", "Invalid content type. image_url is only supported by
# certain models", "Unsupported parameter: 'reasoning_effort' is not supported with this
# model"; Anthropic's "does not support image input"; Gemini's "Function calling is not
# enabled for models/..." and "JSON mode is not enabled for models/..."; Bedrock's "This model
# doesn't support tool use." and "The model returned the following errors: ... does not
# support ...". The first row that matches names the feature.
_UNSUPPORTED: tuple[tuple[Feature, re.Pattern[str]], ...] = (
    (
        Feature.TOOLS,
        re.compile(
            r"does(?: not|n.t) support (?:tools|tool use|tool calling|function calling|functions)"
            r"|\btools?'? (?:is|are) not supported|function calling is not (?:enabled|supported)"
            r"|tool use is not supported"
        ),
    ),
    (
        Feature.STRUCTURED_OUTPUT,
        re.compile(
            r"response_format'? of type '?json_(?:schema|object)'? is not supported|json mode is not enabled"
            r"|does(?: not|n.t) support (?:structured outputs?|json|response_format)"
            r"|structured outputs? (?:is|are) not supported|response_?mime_?type\b.{0,60}not supported"
        ),
    ),
    (
        Feature.IMAGES,
        re.compile(
            r"does(?: not|n.t) support (?:image|vision)|image input is not supported"
            r"|image_url is only supported by certain models|\bimages? (?:is|are) not supported"
        ),
    ),
    (
        Feature.REASONING,
        re.compile(
            r"reasoning_effort'? is not supported|does(?: not|n.t) support (?:reasoning|thinking|extended thinking)"
            r"|thinking is not (?:supported|enabled)|thinking_?config\b.{0,60}not supported"
        ),
    ),
)


def unsupported_feature(signals: str) -> Feature | None:
    """The feature a bad request's signals (lower-cased) say the model does not support, or None."""
    for feature, words in _UNSUPPORTED:
        if words.search(signals):
            return feature
    return None


_RATE = re.compile(r"rate.limit|ratelimit|too many requests|too_many_requests|resource_exhausted")
# Google's errors (the Gemini API's and Vertex AI's, whether array-wrapped or not): the
# canonical code in ``error.status`` (google.rpc.Code) says the kind, but for the two whose
# details and message say more (see _google_kind). PERMISSION_DENIED and UNAUTHENTICATED are
# a key's; FAILED_PRECONDITION is a project's region or billing, which no retry mends.
_GOOGLE: Mapping[str, Kind | None] = {
    "UNAVAILABLE": Kind.CAPACITY,  # "The model is overloaded", "... experiencing high demand"
    "RESOURCE_EXHAUSTED": None,
    "INVALID_ARGUMENT": None,
    "FAILED_PRECONDITION": Kind.BAD_REQUEST,
    "PERMISSION_DENIED": Kind.AUTH,
    "UNAUTHENTICATED": Kind.AUTH,
    "NOT_FOUND": Kind.BAD_REQUEST,
    "OUT_OF_RANGE": Kind.BAD_REQUEST,
    "UNIMPLEMENTED": Kind.BAD_REQUEST,
    "INTERNAL": Kind.TRANSIENT,
    "DEADLINE_EXCEEDED": Kind.TRANSIENT,
    "UNKNOWN": Kind.TRANSIENT,
    "ABORTED": Kind.TRANSIENT,
    "CANCELLED": Kind.TRANSIENT,
}
# A RESOURCE_EXHAUSTED per-minute 429 also says "exceeded your current quota ... billing
# details"; only a per-day quota (a QuotaFailure's quotaId) or a zero limit (the model is not
# in the plan) is a real quota, whatever retryDelay it comes with.
_GOOGLE_QUOTA = re.compile(r"per ?day|limit: 0\b")
# Vertex AI's shared pay-as-you-go pool has no room: the model's capacity, not this project's quota.
_GOOGLE_POOL = re.compile(r"resource exhausted[.,]\s*please try again later")
# AWS's errors (Bedrock's), by the exception's name (``x-amzn-ErrorType`` before its ":", or
# the body's ``__type`` after its "#"; in a stream, ``:exception-type`` in lowerCamel case):
# the HTTP status each comes with, and its kind, but for those whose message says more
# (None: see _aws_kind). ModelErrorException is the model's own failure passed on (its
# originalStatusCode), ModelStreamErrorException the same inside a stream: both transient.
_AWS: Mapping[str, tuple[int, Kind | None]] = {
    "ThrottlingException": (429, None),  # "Too many requests/tokens, please wait ..."
    "ServiceUnavailableException": (503, Kind.CAPACITY),  # "Bedrock is unable to process your request."
    "ModelNotReadyException": (429, Kind.CAPACITY),
    "ModelTimeoutException": (408, Kind.TRANSIENT),
    "ModelErrorException": (424, Kind.TRANSIENT),
    "ModelStreamErrorException": (424, Kind.TRANSIENT),
    "InternalServerException": (500, Kind.TRANSIENT),
    "ServiceQuotaExceededException": (400, Kind.QUOTA),
    "ValidationException": (400, None),
    "AccessDeniedException": (403, Kind.AUTH),
    "UnrecognizedClientException": (403, Kind.AUTH),
    "ExpiredTokenException": (403, Kind.AUTH),
    "InvalidSignatureException": (403, Kind.AUTH),
    "IncompleteSignatureException": (403, Kind.AUTH),
    "MissingAuthenticationTokenException": (403, Kind.AUTH),
    "ResourceNotFoundException": (404, Kind.BAD_REQUEST),  # the model id is not there: MODEL_NOT_FOUND
    "ConflictException": (400, Kind.BAD_REQUEST),
}
# A ThrottlingException that says a day's tokens are spent ("Too many tokens per day") is a quota.
_AWS_QUOTA = re.compile(r"per ?day|daily")
# A model that newer Bedrock serves only through an inference profile, called by its own id:
# "Invocation of model ID anthropic.claude-... with on-demand throughput isn't supported.
# Retry your request with the ID or ARN of an inference profile that contains this model."
_AWS_PROFILE = re.compile(r"on-demand throughput isn.t supported|arn of an inference profile")
# A model id Bedrock does not know comes as a 400 ("The provided model identifier is invalid.")
# or a 404 ResourceNotFoundException: either way the target's model is not there.
_AWS_NO_MODEL = re.compile(r"model identifier is invalid")
_URL = re.compile(r"https?://\S+")
_HTML = re.compile(r"<\s*(?:!doctype|html|head|body|title)\b", re.IGNORECASE)
# HTML is taken apart with patterns that cannot run past the next "<", so a page of
# junk costs linear time, not quadratic.
_HTML_TAG = re.compile(r"<[^<>]*>")
_HTML_ELEMENT = re.compile(r"<(title|script|style)\b[^<>]*>", re.IGNORECASE)
_HTML_CLOSE = {name: re.compile(rf"</{name}[^<>]*>", re.IGNORECASE) for name in ("title", "script", "style")}
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class _Body:
    """What a response body says, whatever its shape."""

    # Every string a Failure takes from here is redacted here, where the provider's
    # error is read: its message, code (or type, or status) and, in _param, its param.
    message: str  # provider message or a text snippet; "" when there is none
    code: str | None  # provider code for Failure.code
    signals: str  # lower-cased codes + message, URLs removed: what the patterns read
    json: object | None  # parsed JSON (None if not JSON)
    google: str | None  # Google's canonical code (error.status: RESOURCE_EXHAUSTED, UNAVAILABLE, ...)
    error_object: bool  # JSON with an error object (or an error string)
    html: bool


def _trim(text: str, limit: int = _REASON_MESSAGE_CHARS) -> str:
    if not text.isascii():
        # A JSON "\ud800" escape decodes to a lone surrogate, which no log, terminal or
        # database can encode: replace it here, where every reason passes.
        text = text.encode("utf-8", "replace").decode("utf-8")
    text = _SPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _decode(body: object) -> tuple[str, object | None]:
    """(text, parsed JSON or None). Accepts bytes, str, or an already-parsed object.

    The text is cut to ``_SCAN_CHARS`` for the patterns, but JSON is parsed whole
    (linear work): an answer longer than the cut is still an answer.
    """
    if body is None:
        return "", None
    if isinstance(body, (bytes, bytearray, memoryview)):
        raw = bytes(body)
        whole: bytes | str = raw
        text = raw[:_SCAN_CHARS].decode("utf-8", errors="replace")
    elif isinstance(body, str):
        whole = body
        text = body[:_SCAN_CHARS]
    else:  # a caller that already parsed the JSON
        return "", body
    if text.lstrip("\ufeff \t\r\n")[:1] in ("{", "["):
        try:
            return text, json.loads(whole)
        except Exception:  # JSONDecodeError, UnicodeDecodeError, RecursionError on deep nesting, ...
            pass
    return text, None


def _first_str(mapping: Mapping[str, Any], *keys: str, skip_numeric: bool = False) -> str | None:
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, str) and value.strip():
            if skip_numeric and value.strip().isdigit():
                continue  # Azure's "429" says nothing the status does not
            return value.strip()
    return None


def _detail_strings(error: Mapping[str, Any]) -> list[str]:
    """Gemini's ErrorInfo reasons and QuotaFailure quota ids / metrics."""
    out: list[str] = []
    details = error.get("details")
    if not isinstance(details, list):
        return out
    for detail in details[:16]:
        if not isinstance(detail, Mapping):
            continue
        reason = detail.get("reason")
        if isinstance(reason, str):
            out.append(reason)
        violations = detail.get("violations")
        if isinstance(violations, list):
            for violation in violations[:16]:
                if isinstance(violation, Mapping):
                    out.extend(v for k in ("quotaId", "quotaMetric") if isinstance(v := violation.get(k), str))
    return out


def _wrapped(error: Mapping[str, Any]) -> list[str]:
    """What a gateway says the provider behind it answered: OpenRouter wraps it as
    ``error.metadata.raw`` (a string, often the upstream's JSON error)."""
    metadata = error.get("metadata")
    if not isinstance(metadata, Mapping):
        return []
    raw = metadata.get("raw")
    if isinstance(raw, str) and raw.strip():
        return [raw[:2048]]
    if isinstance(raw, Mapping):
        return [json.dumps(raw)[:2048]]
    return []


def _upstream_message(raw: str) -> str | None:
    try:
        parsed = json.loads(raw)
    except Exception:
        return raw.strip()[:500] or None
    _, message = _json_error(parsed)
    return message


def _json_error(parsed: object) -> tuple[Mapping[str, Any] | None, str | None]:
    """(error object, message) from the provider shapes capmon knows."""
    candidates = parsed[:4] if isinstance(parsed, list) else [parsed]
    for item in candidates:
        if not isinstance(item, Mapping):
            continue
        error = item.get("error")
        if isinstance(error, Mapping):
            return error, _first_str(error, "message", "msg", "detail")
        if isinstance(error, str) and error.strip():  # {"error": "Model is overloaded"}
            return item, error.strip()
        detail = item.get("detail")
        if isinstance(detail, list) and detail and isinstance(detail[0], Mapping):  # FastAPI 422
            detail = detail[0].get("msg")
        message = _first_str(item, "message", "Message") or (detail.strip() if isinstance(detail, str) else None)
        if message:
            # Mistral and others put the error fields at the top level.
            flat = any(isinstance(item.get(k), str) for k in ("code", "type", "status"))
            return (item if flat else None), message
    return None, None


def _html_parts(page: str) -> tuple[str, str]:
    """(title, visible text) of an HTML page; script and style contents are dropped."""
    title, visible, pos = "", [], 0
    while match := _HTML_ELEMENT.search(page, pos):
        visible.append(page[pos : match.start()])
        name = match.group(1).lower()
        close = _HTML_CLOSE[name].search(page, match.end())
        if name == "title" and not title:
            title = page[match.end() : close.start() if close else len(page)]
        pos = close.end() if close else len(page)  # an unclosed element runs to the end
    visible.append(page[pos:])
    return title, " ".join(visible)


def _html_text(text: str) -> str:
    """An HTML error page as "502 Bad Gateway (nginx)": its title, plus the rest if short."""
    raw_title, raw_rest = _html_parts(text[:16384])
    # Redact before trimming: a cut can leave a key too short for the pattern to know it.
    title = _trim(_redact(html.unescape(_HTML_TAG.sub(" ", raw_title))), 120)
    rest = _trim(_redact(html.unescape(_HTML_TAG.sub(" ", raw_rest))), 10_000)
    if not title:
        return _trim(rest)
    rest = _trim(rest.replace(title, " "), 10_000)
    return f"{title} ({rest})" if rest and len(rest) <= 40 else title


def _read_body(body: object) -> _Body:
    text, parsed = _decode(body)
    error, message = _json_error(parsed) if parsed is not None else (None, None)
    codes: list[str] = []
    code = None
    if error is not None:
        code = _first_str(error, "code", "type", "status", skip_numeric=True)
        code = _redact(code) if code is not None and code != "error" else None  # {"type": "error"} names nothing
        codes = [c for k in ("code", "type", "status") if isinstance(c := error.get(k), str)]
        codes += _detail_strings(error)
        wrapped = _wrapped(error)
        codes += wrapped
        upstream = _upstream_message(wrapped[0]) if wrapped else None
        if upstream and message and upstream not in message:
            message = f"{message}: {upstream}"  # "Provider returned error" alone tells nobody anything
    is_html = parsed is None and bool(_HTML.search(text[:2048]))
    error_object = error is not None or message is not None
    if message is None:
        message = (_html_text(text) or "HTML page without text") if is_html else _trim(_redact(text), 10_000)
    else:
        message = _redact(message)
    lowered = _URL.sub(" ", " ".join([*codes, message[:_SCAN_CHARS]]).lower())
    return _Body(
        message=message,
        code=code,
        signals=lowered,
        json=parsed,
        google=_google_code(error),
        error_object=error_object,
        html=is_html,
    )


def _kind(status: int, body: _Body, hint: float | None, quota_hint: float = QUOTA_HINT) -> Kind | None:
    """The kind the body, code and headers point to; None when only the status is left to go by."""
    signals = body.signals
    if body.google is not None:
        return _google_kind(body.google, signals, hint, quota_hint)
    if status in (401, 403) or _AUTH.search(signals):
        return Kind.AUTH
    if status == 413 or _TOO_LARGE.search(signals):
        return Kind.TOO_LARGE
    if status == 402 or _QUOTA.search(signals):
        return Kind.QUOTA
    if status in (503, 529) or _CAPACITY.search(signals):
        return Kind.CAPACITY
    if status == 429 and hint is not None and hint >= quota_hint:
        return Kind.QUOTA
    if status == 429 or _RATE.search(signals):
        return Kind.RATE_LIMITED
    return None


def _google_code(error: Mapping[str, Any] | None) -> str | None:
    """Google's canonical code of an error object (its ``status``), when it has one."""
    code = error.get("status") if error is not None else None
    return code if isinstance(code, str) and code in _GOOGLE else None


def _google_kind(code: str, signals: str, hint: float | None, quota_hint: float) -> Kind:
    """The kind of one of Google's errors (:data:`_GOOGLE`): RESOURCE_EXHAUSTED is a quota
    when its quota ids or message say a day's or none (checked before its retryDelay, which
    a daily limit may come with), the shared pool's capacity on Vertex, else a rate limit;
    INVALID_ARGUMENT is auth for a key that is not valid (Google says so with a 400), too
    large for too many input tokens, else a bad request."""
    if code == "RESOURCE_EXHAUSTED":
        if _GOOGLE_QUOTA.search(signals):
            return Kind.QUOTA
        if _GOOGLE_POOL.search(signals):
            return Kind.CAPACITY
        return Kind.QUOTA if hint is not None and hint >= quota_hint else Kind.RATE_LIMITED
    if code == "INVALID_ARGUMENT":
        if _AUTH.search(signals):
            return Kind.AUTH
        return Kind.TOO_LARGE if _TOO_LARGE.search(signals) else Kind.BAD_REQUEST
    kind = _GOOGLE[code]
    assert kind is not None
    return kind


def _aws_name(headers: Mapping[str, str] | httpx.Headers | None, parsed: object) -> str | None:
    """The AWS exception an error response names (:data:`_AWS`), when it names one."""
    named = None
    if headers is not None:
        named = headers.get("x-amzn-errortype") or headers.get("x-amzn-ErrorType")
    if not isinstance(named, str) and isinstance(parsed, Mapping):
        named = parsed.get("__type")
    if not isinstance(named, str):
        return None
    name = named.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name if name in _AWS else None


def _aws_kind(name: str, signals: str, hint: float | None, quota_hint: float) -> tuple[Kind, str]:
    """The kind of an AWS exception (:data:`_AWS`) and the failure's code: a throttling that
    says a day's is a quota (as is one told to wait past ``quota_hint``), else a rate limit;
    a validation error is too large for too long an input, a configuration error for a model
    id that needs an inference profile (:data:`INFERENCE_PROFILE_REQUIRED`), a model not
    found for an id Bedrock does not know, else a bad request; a missing resource is a model
    not found."""
    kind = _AWS[name][1]
    if name == "ThrottlingException":
        quota = _AWS_QUOTA.search(signals) or (hint is not None and hint >= quota_hint)
        return (Kind.QUOTA if quota else Kind.RATE_LIMITED), name
    if name == "ValidationException":
        if _AWS_PROFILE.search(signals):
            return Kind.BAD_REQUEST, INFERENCE_PROFILE_REQUIRED
        if _AWS_NO_MODEL.search(signals):
            return Kind.BAD_REQUEST, MODEL_NOT_FOUND
        if unsupported_feature(signals) is not None:
            return Kind.BAD_REQUEST, UNSUPPORTED_FEATURE
        return (Kind.TOO_LARGE if _TOO_LARGE.search(signals) else Kind.BAD_REQUEST), name
    if name == "ResourceNotFoundException":
        return Kind.BAD_REQUEST, MODEL_NOT_FOUND
    assert kind is not None
    return kind, name


# What a person reads for a model id that needs an inference profile: the fix, not only the refusal.
_PROFILE_ADVICE = (
    "this model is served on demand only through an inference profile: use the profile's id"
    ' (such as "us.<model id>" or "global.<model id>") or ARN as the deployment\'s model'
)


def _aws_failure(
    status: int, name: str, body: _Body, hint: float | None, quota_hint: float, *, streamed: bool = False
) -> Failure:
    kind, code = _aws_kind(name, body.signals, hint, quota_hint)
    message = _trim(body.message) or "no message"
    where = "error inside the stream: " if streamed else f"{status} "
    reason = f"{where}{name}: {message}"
    if code == INFERENCE_PROFILE_REQUIRED:
        reason = f"{reason} ({_PROFILE_ADVICE})"
    feature = unsupported_feature(body.signals) if code == UNSUPPORTED_FEATURE else None
    return Failure(kind, reason, status, code, hint, _trim(body.message, MESSAGE_CHARS), feature=feature)


def classify_aws_event(name: str, data: str, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Failure:
    """An exception (``name``: its ``:exception-type``, lowerCamel, or an error frame's
    code) inside an AWS event stream, ``data`` its payload, classified by its type alone,
    as the HTTP error it names (its status, never the 400 a decoder gives every such
    frame). Never raises."""
    try:
        when = default_clock().wall() if now is None else float(now)
        upper = name[:1].upper() + name[1:]
        parsed = _read_body(data)
        hint = hint_from(None, parsed.json, parsed.message, now=when)
        if upper in _AWS:
            return _aws_failure(_AWS[upper][0], upper, parsed, hint, quota_hint, streamed=True)
        kind = _kind(0, parsed, hint, quota_hint) or Kind.TRANSIENT
        message = _trim(parsed.message) or "no message"
        return Failure(kind, f"error inside the stream: {name or 'an error'}: {message}", 200, name or None, hint)
    except Exception as exc:  # a classifier bug must not take down the request path
        return Failure(Kind.TRANSIENT, f"unclassifiable stream error ({type(exc).__name__})", 200)


def _status_kind(status: int) -> Kind:
    if status >= 500 or status == 408:
        return Kind.TRANSIENT
    return Kind.BAD_REQUEST


def _phrase(status: int) -> str:
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _reason(status: int, body: _Body, *, unread: bool = False) -> str:
    message = _trim(body.message)
    if not message:
        return f"{_phrase(status)} ({'body not read' if unread else 'empty body'})"
    if body.code:
        return f"{status} {_trim(body.code, 60)}: {message}"
    # An HTML title usually names the status already ("502 Bad Gateway", "host | 524: ...").
    if message.startswith(str(status)) or (body.html and str(status) in message[:80]):
        return message
    return f"{status} {message}" if body.html else f"{status}: {message}"


def parse_completion(status: int, body: bytes | str | None) -> Mapping[str, Any] | None:
    """The parsed answer when a plain (non-streaming) response is a success, else None:
    then ``classify_response`` says what it is. Never raises.

    The client's hot path: a success is parsed once and never goes through the error
    patterns. No choices (missing, null, []) is no answer: a 200 with a broken body.
    """
    if not 200 <= status < 300 or not body:
        return None
    try:
        parsed = json.loads(body)
    except Exception:  # not JSON, not UTF-8, nested too deep: classify_response says which
        return None
    if isinstance(parsed, Mapping) and isinstance(parsed.get("choices"), list) and parsed["choices"]:
        return parsed
    return None


def _broken_2xx(status: int, body: _Body, hint: float | None, quota_hint: float) -> Failure:
    # A gateway may wrap a provider error in a 200; its content still says what happened.
    if body.error_object:
        kind = _kind(status, body, hint, quota_hint) or Kind.TRANSIENT
        what = f"{_trim(body.code, 60)}: " if body.code else ""
        return Failure(kind, f"{status} with an error body: {what}{_trim(body.message)}", status, body.code, hint)
    if body.json is not None:
        what = "JSON without choices"
    elif not body.message:
        what = "empty"
    else:
        what = f"not JSON: {_trim(body.message, 80)}"
    return Failure(Kind.TRANSIENT, f"{status} with a broken body ({what})", status, None, hint)


def _classify_response(
    status: int,
    headers: Mapping[str, str] | httpx.Headers | None,
    body: bytes | str | None,
    *,
    now: float,
    streaming: bool,
    quota_hint: float = QUOTA_HINT,
) -> Failure | None:
    if 200 <= status < 300 and (streaming or parse_completion(status, body) is not None):
        return None  # a stream's own events are checked by whoever reads them
    parsed = _read_body(body)
    hint = hint_from(headers, parsed.json, parsed.message, now=now)
    if 200 <= status < 300:
        return _broken_2xx(status, parsed, hint, quota_hint)
    aws = _aws_name(headers, parsed.json)
    if aws is not None:
        return _aws_failure(status, aws, parsed, hint, quota_hint)
    kind = _kind(status, parsed, hint, quota_hint) or _status_kind(status)
    reason = _reason(status, parsed, unread=streaming and body is None)
    code = parsed.code
    if status == 404 and kind is Kind.BAD_REQUEST and _NO_MODEL.search(parsed.signals):
        code = MODEL_NOT_FOUND
    feature = unsupported_feature(parsed.signals) if 400 <= status < 500 and kind is Kind.BAD_REQUEST else None
    if feature is not None:
        code = UNSUPPORTED_FEATURE
    message = _trim(parsed.message, MESSAGE_CHARS)
    return Failure(kind, reason, status, code, hint, message, _param(parsed.json), feature)


def classify_response(
    status: int,
    headers: Mapping[str, str] | httpx.Headers | None,
    body: bytes | str | None,
    *,
    now: float | None = None,
    streaming: bool = False,
    quota_hint: float = QUOTA_HINT,
) -> Failure | None:
    """None for a success, else the :class:`Failure` the response describes. Never raises.

    ``now`` is wall-clock epoch seconds, for HTTP-date and reset-timestamp hints. A 429
    whose hint is ``quota_hint`` seconds or more (``[backoff] max_hint``) is a quota
    that resets later, not a rate limit worth retrying on this key now.
    """
    try:
        code = int(status)
    except Exception:
        code = 0
    try:
        when = default_clock().wall() if now is None else float(now)
        return _classify_response(code, headers, body, now=when, streaming=streaming, quota_hint=quota_hint)
    except Exception as exc:  # a classifier bug must not take down the request path
        return Failure(Kind.TRANSIENT, f"{code} unclassifiable response ({type(exc).__name__})", code)


def _embedded_status(obj: object) -> int | None:
    """The HTTP status an in-stream error names (OpenRouter's and Gemini's ``error.code``,
    vLLM's top-level ``code``), if it is one."""
    candidates: list[object] = []
    if isinstance(obj, Mapping):
        error = obj.get("error")
        if isinstance(error, Mapping):
            candidates += [error.get("code"), error.get("status")]
        candidates += [obj.get("code"), obj.get("status")]
    for c in candidates:
        if isinstance(c, str) and c.isdigit():
            c = int(c)
        if isinstance(c, int) and not isinstance(c, bool) and 400 <= c <= 599:
            return c
    return None


def _event_error(obj: object, event: str) -> object:
    """The error object of a stream event, whatever wraps it."""
    if isinstance(obj, list):
        return next((x for x in obj[:4] if isinstance(x, Mapping) and "error" in x), obj)
    if isinstance(obj, Mapping):
        response = obj.get("response")
        if isinstance(response, Mapping) and str(obj.get("type", "")).startswith("response."):
            # The Responses API: {"type": "response.failed", "response": {"error": {...}}}
            error = response.get("error")
            return {"error": error} if isinstance(error, Mapping) else {"error": {"message": f"{obj['type']}"}}
        if obj.get("type") == "error" and not isinstance(obj.get("error"), (Mapping, str)):
            # The Responses API's own error event: {"type": "error", "code": ..., "message": ...}
            return {"error": {k: v for k, v in obj.items() if k != "type"}}
    if obj is None:
        return {"error": {"message": f"{event or 'error'} event without data"}}
    return obj


def classify_event(
    obj: object, event: str = "", *, now: float | None = None, quota_hint: float = QUOTA_HINT
) -> Failure:
    """An error that arrived inside a 200 stream (a ``data:`` error object, an ``event:
    error`` frame, a Responses API ``response.failed``), classified exactly like the HTTP
    error it describes: its embedded status, code, type and message. Never raises."""
    try:
        when = default_clock().wall() if now is None else float(now)
        error = _event_error(obj, event)
        parsed = _read_body(error)
        status = _embedded_status(error)
        hint = hint_from(None, parsed.json, parsed.message, now=when)
        kind = _kind(status or 0, parsed, hint, quota_hint) or (_status_kind(status) if status else Kind.TRANSIENT)
        what = f"{_trim(parsed.code, 60)}: " if parsed.code else ""
        message = _trim(parsed.message) or "no message"
        return Failure(kind, f"error inside the stream: {what}{message}", status or 200, parsed.code, hint)
    except Exception as exc:  # a classifier bug must not take down the request path
        return Failure(Kind.TRANSIENT, f"unclassifiable stream error ({type(exc).__name__})", 200)


_ARGUMENTS_CHARS = 60  # of a broken call's arguments, in its reason


def classify_tool_call(name: object, call_id: object, arguments: str) -> Failure | None:
    """None when a tool call's ``arguments`` (the JSON text a chat answer carries, or a
    Messages ``input`` written out) are a JSON object, or none at all (``{}``); else the
    broken answer it is, its reason naming the call. A 200 whose call cannot be run is a
    broken body: transient, as another try may answer whole. Never raises."""
    if not arguments.strip():
        return None
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        what = "not JSON"
    else:
        if isinstance(parsed, dict):
            return None
        what = "JSON but not an object"
    who = _trim(_redact(f"{name} ({call_id})" if call_id else str(name)), 120)
    text = _trim(_redact(arguments), _ARGUMENTS_CHARS)
    return Failure(Kind.TRANSIENT, f"200 with a broken tool call {who}: its arguments are {what}: {text}", 200)


# --- exceptions -----------------------------------------------------------------------

_TIMEOUTS: tuple[tuple[type[BaseException], str], ...] = (
    (httpx.ConnectTimeout, "timeout: connect"),
    (httpx.ReadTimeout, "timeout: read"),
    (httpx.WriteTimeout, "timeout: write"),
    (httpx.PoolTimeout, "timeout: waiting for a pooled connection"),
    (httpx.TimeoutException, "timeout"),
)
# Most specific first: several of these subclass each other (TimeoutError is an OSError,
# ConnectionResetError a ConnectionError).
_EXCEPTIONS: tuple[tuple[type[BaseException], str], ...] = (
    (CredentialsError, "no credentials"),
    (httpx.ConnectError, "connection failed"),
    (httpx.ReadError, "connection error while reading"),
    (httpx.WriteError, "connection error while writing"),
    (httpx.RemoteProtocolError, "protocol error"),
    (httpx.ProxyError, "proxy error"),
    (httpx.NetworkError, "network error"),
    (httpx.DecodingError, "could not decode the response body"),
    (httpx.TransportError, "transport error"),
    (asyncio.TimeoutError, "timeout"),
    (ConnectionResetError, "connection reset"),
    (ConnectionRefusedError, "connection refused"),
    (ConnectionAbortedError, "connection aborted"),
    (BrokenPipeError, "broken pipe"),
    (ConnectionError, "connection error"),
    (socket.gaierror, "DNS lookup failed"),
    (ssl.SSLError, "TLS error"),
    (OSError, "OS error"),
    (json.JSONDecodeError, "invalid JSON in the response"),
)


_CHAIN_DEPTH = 8  # causes and contexts looked through for what an exception reports


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(out) < _CHAIN_DEPTH and seen not in out:
        out.append(seen)
        seen = seen.__cause__ or seen.__context__
    return out


def unreachable_cause(exc: BaseException) -> Cause | None:
    """Why no connection was made, when none was: a DNS failure, a refused connection, a TLS
    failure while connecting, a proxy's error, a connect timeout, or another connect error
    (no route). None when a connection was made (a reset, a read timeout): the server may
    have done work. The transports chain the OS or TLS error a connect failed with
    (capmon/core/routing/transport.py), so both read the same."""
    chain = _chain(exc)
    connecting = any(isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError)) for e in chain)
    if any(isinstance(e, httpx.ProxyError) for e in chain):
        return Cause.PROXY
    if any(isinstance(e, socket.gaierror) for e in chain):
        return Cause.DNS
    if connecting and any(isinstance(e, (ssl.SSLError, ssl.CertificateError)) for e in chain):
        return Cause.TLS
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return Cause.REFUSED
    if any(isinstance(e, httpx.ConnectTimeout) for e in chain):
        return Cause.TIMEOUT
    if connecting:
        return Cause.NETWORK
    return None


def _exception_text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break classification
        return ""
    return _trim(_redact(text), 160)


def classify_exception(exc: BaseException) -> Failure:
    """Every exception is a TRANSIENT failure with a readable reason, but one that made no
    connection (:func:`unreachable_cause`), which is UNREACHABLE with its :class:`Cause` as
    ``code``. Never raises.

    The reason names the failure and the exception's own message, never the request:
    its headers carry API keys and its URL may (Gemini's ``?key=``).
    """
    try:
        if isinstance(exc, httpx.HTTPStatusError):
            # raise_for_status(): the response says more than the exception.
            failure = classify(exc.response)
            if failure is not None:
                return failure
        detail = _exception_text(exc)
        name = type(exc).__name__
        cause = unreachable_cause(exc)
        if cause is not None:
            reason = f"{cause.label} ({name}: {detail})" if detail else f"{cause.label} ({name})"
            return Failure(Kind.UNREACHABLE, reason, code=cause.value)
        label = next((text for cls, text in _TIMEOUTS if isinstance(exc, cls)), None)
        if label is None:
            label = next((text for cls, text in _EXCEPTIONS if isinstance(exc, cls)), None)
        if label is None:
            label = "timeout" if "timeout" in type(exc).__name__.lower() else type(exc).__name__
            return Failure(Kind.TRANSIENT, f"{label}: {detail}" if detail else label)
        return Failure(Kind.TRANSIENT, f"{label} ({name}: {detail})" if detail else f"{label} ({name})")
    except Exception:
        return Failure(Kind.TRANSIENT, "unclassifiable exception")


def classify(obj: httpx.Response | BaseException, *, now: float | None = None) -> Failure | None:
    """Classify a response (None for a success) or an exception. Never raises.

    A response whose body has not been read is classified from status and headers.
    """
    if isinstance(obj, BaseException):
        return classify_exception(obj)
    if isinstance(obj, httpx.Response):
        try:
            body: bytes | None = obj.content
            streaming = False
        except httpx.ResponseNotRead:
            body, streaming = None, True
        except Exception:
            body, streaming = None, True
        return classify_response(obj.status_code, obj.headers, body, now=now, streaming=streaming)
    return Failure(Kind.TRANSIENT, f"cannot classify a {type(obj).__name__}")
