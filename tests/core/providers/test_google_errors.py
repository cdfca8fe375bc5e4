"""Google's errors (the Gemini API's and Vertex AI's) in their real wordings: each as the HTTP
error it is, array-wrapped as both APIs sometimes send it, and inside a stream (a ``data:``
frame, or the raw object google_sse.py reads), classified alike."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from capmon.core.providers import gemini_format
from capmon.core.providers.classify import classify_response
from capmon.core.providers.google_sse import GoogleFraming
from capmon.core.types.failure import MODEL_NOT_FOUND, Kind
from tests.core.test_errors import _GEMINI_HELP as HELP
from tests.core.test_errors import CASES as ERROR_CASES
from tests.core.test_errors import _gemini
from tests.core.test_errors import _quota_failure as quota_failure
from tests.core.test_errors import _retry_info as retry_info

NOW = 1_767_225_600.0

QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more information on this "
    "error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. To monitor your current usage, head to: "
    "https://ai.dev/usage?tab=rate-limit. \n* Quota exceeded for metric: "
    "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: {limit}, model: gemini-2.5-flash"
    "\nPlease retry in 25.46s."
)


def error(code: int, status: str, message: str, *details: dict[str, Any]) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(_gemini(code, status, message, list(details) if details else None))
    return parsed


@dataclass(frozen=True)
class Case:
    name: str
    body: dict[str, Any]
    kind: Kind
    hint: float | None = None


CASES = [
    Case("overloaded", error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."), Kind.CAPACITY),
    Case(
        "high-demand",
        error(
            503,
            "UNAVAILABLE",
            "This model is currently experiencing high demand. Spikes in demand are usually temporary. "
            "Please try again later.",
        ),
        Kind.CAPACITY,
    ),
    Case(
        "per-minute-retry-info",
        error(
            429,
            "RESOURCE_EXHAUSTED",
            QUOTA_MESSAGE.format(limit=10),
            quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "10"),
            HELP,
            retry_info("47s"),
        ),
        Kind.RATE_LIMITED,
        47.0,
    ),
    Case(
        "per-minute-message-hint",
        error(429, "RESOURCE_EXHAUSTED", QUOTA_MESSAGE.format(limit=10)),
        Kind.RATE_LIMITED,
        25.46,
    ),
    Case(
        "fractional-retry-delay",
        error(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).", retry_info("25.46s")),
        Kind.RATE_LIMITED,
        25.46,
    ),
    Case(  # a daily limit with a retryDelay of seconds: the quota id says a day
        "per-day-with-retry-info",
        error(
            429,
            "RESOURCE_EXHAUSTED",
            QUOTA_MESSAGE.format(limit=250),
            quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "250"),
            HELP,
            retry_info("47s"),
        ),
        Kind.QUOTA,
        47.0,
    ),
    Case(
        "limit-zero",
        error(
            429,
            "RESOURCE_EXHAUSTED",
            QUOTA_MESSAGE.format(limit=0),
            quota_failure("GenerateContentInputTokensPerModelPerMinute-FreeTier", "0"),
            retry_info("25s"),
        ),
        Kind.QUOTA,
        25.0,
    ),
    Case(
        "vertex-shared-pool",
        error(
            429,
            "RESOURCE_EXHAUSTED",
            "Resource exhausted, please try again later. Please refer to "
            "https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.",
        ),
        Kind.CAPACITY,
    ),
    Case(
        "vertex-shared-pool-stop",
        error(429, "RESOURCE_EXHAUSTED", "Resource exhausted. Please try again later."),
        Kind.CAPACITY,
    ),
    Case(
        "vertex-per-minute-quota",
        error(
            429,
            "RESOURCE_EXHAUSTED",
            "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model with base model: "
            "gemini-2.5-pro. Please submit a quota increase request. "
            "https://cloud.google.com/vertex-ai/docs/generative-ai/quotas-genai.",
        ),
        Kind.RATE_LIMITED,
    ),
    Case(
        "api-key-invalid",
        json.loads(next(c.body or "" for c in ERROR_CASES if c.id == "gemini-400-api-key-invalid")),
        Kind.AUTH,
    ),
    Case(
        "input-token-count",
        error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1572173) exceeds the maximum number of tokens allowed (1048576).",
        ),
        Kind.TOO_LARGE,
    ),
    Case(
        "invalid-argument",
        error(400, "INVALID_ARGUMENT", 'Invalid JSON payload received. Unknown name "foo": Cannot find field.'),
        Kind.BAD_REQUEST,
    ),
    Case(
        "permission-denied",
        error(403, "PERMISSION_DENIED", "Your API key was reported as leaked. Please use another API key."),
        Kind.AUTH,
    ),
    Case(
        "vertex-unauthenticated",
        error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
            "valid authentication credential.",
        ),
        Kind.AUTH,
    ),
    Case(
        "region",
        error(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
        Kind.BAD_REQUEST,
    ),
    Case(  # billing, but no key's quota: no retry and no parking mends a region's plan
        "free-tier-not-in-country",
        error(
            400,
            "FAILED_PRECONDITION",
            "Gemini API free tier is not available in your country. Please enable billing on your project in "
            "Google AI Studio.",
        ),
        Kind.BAD_REQUEST,
    ),
    Case(
        "not-found",
        error(
            404,
            "NOT_FOUND",
            "models/gemini-1.0-pro is not found for API version v1beta, or is not supported for generateContent. "
            "Call ListModels to see the list of available models and their supported methods.",
        ),
        Kind.BAD_REQUEST,
    ),
    Case(
        "internal",
        error(
            500,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in "
            "https://developers.generativeai.google/guide/troubleshooting",
        ),
        Kind.TRANSIENT,
    ),
    Case(
        "deadline",
        error(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
        Kind.TRANSIENT,
    ),
]


def status(case: Case) -> int:
    return int(case.body["error"]["code"])


@pytest.mark.parametrize("wrapped", [False, True], ids=["object", "array"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_googles_http_errors(case: Case, wrapped: bool) -> None:
    body = [case.body] if wrapped else case.body
    failure = classify_response(status(case), {}, json.dumps(body).encode(), now=NOW)
    assert failure is not None
    assert (failure.kind, failure.retry_after) == (case.kind, case.hint)
    # a 404 that says the model is not there has its own code: its target is parked (policy.py)
    code = MODEL_NOT_FOUND if case.name == "not-found" else case.body["error"]["status"]
    assert failure.status == status(case) and failure.code == code


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_googles_errors_inside_a_stream_count_as_the_http_error(case: Case) -> None:
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}, "index": 0}]}
    stream = f"data: {json.dumps(chunk)}\r\n\r\n{json.dumps(case.body, indent=2)}\n".encode()
    framing = GoogleFraming()
    frames = framing.feed(stream) + framing.close()
    as_data = gemini_format.read_frame(framing.feed(f"data: {json.dumps(case.body)}\r\n\r\n".encode())[0], now=NOW)
    events = [gemini_format.read_frame(f, now=NOW) for f in frames]
    assert [e.kind.value for e in events] == ["chunk", "error"]
    for event in (events[1], as_data):
        assert event.failure is not None
        assert (event.failure.kind, event.failure.retry_after, event.failure.status) == (
            case.kind,
            case.hint,
            status(case),
        )


def test_a_2xx_body_that_is_an_error_is_no_answer_and_is_classified() -> None:
    body = json.dumps(CASES[0].body).encode()
    assert gemini_format.parse(200, body) is None
    failure = classify_response(200, {}, body, now=NOW)
    assert failure is not None and failure.kind is Kind.CAPACITY
