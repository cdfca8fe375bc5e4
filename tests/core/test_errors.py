"""Failure classification against real-world provider responses.

Each case is a response shape seen from a real provider (or a gateway in front of
one); what matters is that the body, code and headers decide the kind, not the status.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from capmon.core.providers.classify import classify, classify_exception, classify_response, classify_tool_call
from capmon.core.types.failure import Cause, Failure, Kind

pytestmark = pytest.mark.unit

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
REQUEST = httpx.Request(
    "POST",
    "https://api.example.test/v1/chat/completions",
    headers={"Authorization": "Bearer sk-live-0123456789abcdefghijklmnop"},
)


def _openai(message: str, type_: str | None, code: str | None, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}}).encode()


def _anthropic(type_: str, message: str) -> bytes:
    return json.dumps(
        {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011CVq8ZyX1"}
    ).encode()


def _gemini(code: int, status: str, message: str, details: list[Any] | None = None, *, wrap: bool = False) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details is not None:
        error["details"] = details
    return json.dumps([{"error": error}] if wrap else {"error": error}).encode()


def _quota_failure(quota_id: str, value: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                "quotaValue": value,
            }
        ],
    }


def _retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


_GEMINI_HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}
_GEMINI_QUOTA_MESSAGE = (
    "You exceeded your current quota, please check your plan and billing details. For more information on this "
    "error, head to: https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for metric: "
    "generativelanguage.googleapis.com/generate_content_free_tier_requests, limit: {limit}, model: gemini-2.0-flash\n"
    "Please retry in 11.6s."
)
_OPENAI_RPM = (
    "Rate limit reached for gpt-4o in organization org-abc123 on requests per min (RPM): Limit 500, Used 500, "
    "Requested 1. Please try again in 120ms. Visit https://platform.openai.com/account/rate-limits to learn more. "
    "You can increase your rate limit by adding a payment method to your account at "
    "https://platform.openai.com/account/billing."
)
_OPENAI_TPM = (
    "Rate limit reached for gpt-4o in organization org-abc123 on tokens per min (TPM): Limit 30000, Used 29500, "
    "Requested 1200. Please try again in 1.4s. Visit https://platform.openai.com/account/rate-limits to learn more."
)
_NGINX_502 = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>"
    b"\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
_NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n<center><h1>413 Request "
    b"Entity Too Large</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)
_ELB_503 = (
    b"<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n<center><h1>503 "
    b"Service Temporarily Unavailable</h1></center>\r\n</body>\r\n</html>\r\n"
)
_CLOUDFLARE_504 = (
    b'<!DOCTYPE html>\n<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->\n<head>\n'
    b'<title>api.example.test | 504: Gateway time-out</title>\n<meta charset="UTF-8" />\n'
    b"<style>body{font-family:sans-serif}</style>\n<script>window.cf=1;</script>\n</head>\n<body>\n"
    b'<div id="cf-wrapper"><h1><span class="inline-block">Gateway time-out</span> <span class="code-label">'
    b"Error code 504</span></h1><p>The web server reported a gateway time-out error.</p>"
    b"<p>Cloudflare Ray ID: <strong>8f1c2d3e4a5b6c7d</strong></p></div>\n</body>\n</html>\n"
)
_CLOUDFLARE_524 = _CLOUDFLARE_504.replace(b"504: Gateway time-out", b"524: A timeout occurred")


@dataclass(frozen=True)
class Case:
    id: str
    status: int
    body: bytes | str | None
    kind: Kind | None
    retry_after: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None  # checked only when given
    reason: str | None = None  # exact reason, checked only when given


CASES = [
    # --- OpenAI --------------------------------------------------------------------
    Case(
        "openai-429-rate-limit-exceeded-rpm",
        429,
        _openai(_OPENAI_RPM, "requests", "rate_limit_exceeded"),
        Kind.RATE_LIMITED,
        0.12,  # the exhausted bucket (requests) decides, not the longer tokens reset
        headers={
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29000",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        code="rate_limit_exceeded",
    ),
    Case(
        "openai-429-rate-limit-exceeded-tpm-by-message",
        429,
        _openai(_OPENAI_TPM, "tokens", "rate_limit_exceeded"),
        Kind.RATE_LIMITED,
        7.66,  # no remaining-* headers: the message names the tokens bucket
        headers={"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "7.66s"},
    ),
    Case(
        "openai-429-insufficient-quota",
        429,
        _openai(
            "You exceeded your current quota, please check your plan and billing details. For more information on "
            "this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        Kind.QUOTA,
        None,
        code="insufficient_quota",
    ),
    Case(
        "openai-429-request-too-large-for-tpm",
        429,
        _openai(
            "Request too large for gpt-4o in organization org-xxx on tokens per min (TPM): Limit 30000, Requested "
            "50000. The input or output tokens must be reduced in order to run successfully. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "tokens",
            "rate_limit_exceeded",
        ),
        Kind.TOO_LARGE,
    ),
    Case(
        "openai-429-requests-per-day",
        429,
        _openai(
            "Rate limit reached for gpt-4o-mini in organization org-abc123 on requests per day (RPD): Limit 200, "
            "Used 200, Requested 1. Please try again in 7m12s.",
            "requests",
            "rate_limit_exceeded",
        ),
        Kind.QUOTA,
        432.0,
    ),
    Case(
        "openai-503-server-is-overloaded",
        503,
        _openai("The server is overloaded or not ready yet.", "server_error", "server_is_overloaded"),
        Kind.CAPACITY,
        code="server_is_overloaded",
        reason="503 server_is_overloaded: The server is overloaded or not ready yet.",
    ),
    Case(
        "openai-503-slow-down",
        503,
        _openai(
            "A sudden increase in your request rate is impacting service reliability. Please reduce your request "
            "rate to its original level.",
            "server_error",
            "slow_down",
        ),
        Kind.CAPACITY,
        code="slow_down",
    ),
    Case(
        "openai-503-engine-overloaded",
        503,
        _openai("The engine is currently overloaded, please try again later", "server_error", None),
        Kind.CAPACITY,
        code="server_error",
    ),
    Case(
        "openai-500-server-error",
        500,
        _openai("The server had an error while processing your request. Sorry about that!", "server_error", None),
        Kind.TRANSIENT,
    ),
    Case(
        "openai-401-invalid-api-key",
        401,
        _openai(
            "Incorrect API key provided: sk-proj-****abcd. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            "invalid_api_key",
        ),
        Kind.AUTH,
        code="invalid_api_key",
    ),
    Case(
        "openai-403-unsupported-region",
        403,
        _openai(
            "Country, region, or territory not supported", "request_forbidden", "unsupported_country_region_territory"
        ),
        Kind.AUTH,
    ),
    Case(
        "openai-404-model-not-found",
        404,
        _openai(
            "The model `gpt-9` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        ),
        Kind.BAD_REQUEST,
        code="model_not_found",
    ),
    Case(
        "openai-400-context-length-exceeded",
        400,
        _openai(
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 130415 "
            "tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        ),
        Kind.TOO_LARGE,
        code="context_length_exceeded",
    ),
    Case(
        "openai-400-string-above-max-length",
        400,
        _openai(
            "Invalid 'messages[0].content': string too long. Expected a string with maximum length 10485760, but "
            "got a string with length 12000000 instead.",
            "invalid_request_error",
            "string_above_max_length",
            "messages[0].content",
        ),
        Kind.TOO_LARGE,
    ),
    Case(
        "openai-400-invalid-request",
        400,
        _openai("'temperature' must be between 0 and 2.", "invalid_request_error", None, "temperature"),
        Kind.BAD_REQUEST,
        code="invalid_request_error",
    ),
    # --- Anthropic -----------------------------------------------------------------
    Case(
        "anthropic-529-overloaded-error",
        529,
        _anthropic("overloaded_error", "Overloaded"),
        Kind.CAPACITY,
        code="overloaded_error",
        reason="529 overloaded_error: Overloaded",
    ),
    Case(
        "anthropic-500-overloaded-error",
        500,
        _anthropic("overloaded_error", "Overloaded"),
        Kind.CAPACITY,
    ),
    Case(
        "anthropic-429-rate-limit-error-retry-after",
        429,
        _anthropic(
            "rate_limit_error",
            "This request would exceed the rate limit for your organization (4a1b) of 50,000 input tokens per "
            "minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response "
            "headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try "
            "again later.",
        ),
        Kind.RATE_LIMITED,
        17.0,
        headers={
            "retry-after": "17",
            "anthropic-ratelimit-input-tokens-remaining": "0",
            "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:17Z",
        },
        code="rate_limit_error",
    ),
    Case(
        "anthropic-429-reset-timestamps-only",
        429,
        _anthropic("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
        Kind.RATE_LIMITED,
        42.0,
        headers={
            "anthropic-ratelimit-requests-remaining": "40",
            "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:05Z",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:42Z",
        },
    ),
    Case(
        "anthropic-400-usage-limits-spend-limit",
        400,
        _anthropic(
            "invalid_request_error",
            "You have reached your specified API usage limits. You will regain access on 2026-02-01 at 00:00 UTC.",
        ),
        Kind.QUOTA,
        31 * 86400.0,
    ),
    Case(
        "anthropic-400-credit-balance-too-low",
        400,
        _anthropic(
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade "
            "or purchase credits.",
        ),
        Kind.QUOTA,
    ),
    Case(
        "anthropic-400-prompt-too-long",
        400,
        _anthropic("invalid_request_error", "prompt is too long: 215000 tokens > 200000 maximum"),
        Kind.TOO_LARGE,
    ),
    Case(
        "anthropic-413-request-too-large",
        413,
        _anthropic("request_too_large", "Request exceeds the maximum allowed number of bytes."),
        Kind.TOO_LARGE,
    ),
    Case(
        "anthropic-401-authentication-error",
        401,
        _anthropic("authentication_error", "invalid x-api-key"),
        Kind.AUTH,
        code="authentication_error",
    ),
    Case(
        "anthropic-500-api-error",
        500,
        _anthropic("api_error", "Internal server error"),
        Kind.TRANSIENT,
    ),
    # --- Gemini --------------------------------------------------------------------
    Case(
        "gemini-429-per-minute-retry-info",
        429,
        _gemini(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA_MESSAGE.format(limit=15),
            [
                _quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "15"),
                _GEMINI_HELP,
                _retry_info("12s"),
            ],
        ),
        Kind.RATE_LIMITED,
        12.0,
        code="RESOURCE_EXHAUSTED",
    ),
    Case(
        "gemini-429-per-day-quota",
        429,
        _gemini(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA_MESSAGE.format(limit=50),
            [
                _quota_failure("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "50"),
                _GEMINI_HELP,
                _retry_info("40s"),
            ],
        ),
        Kind.QUOTA,
        40.0,
    ),
    Case(
        "gemini-429-limit-zero-is-quota",
        429,
        _gemini(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA_MESSAGE.format(limit=0),
            [_quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "0"), _retry_info("30s")],
        ),
        Kind.QUOTA,
        30.0,
    ),
    Case(
        "gemini-openai-compat-429-list-wrapped",
        429,
        _gemini(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA_MESSAGE.format(limit=15),
            [_retry_info("1.5s")],
            wrap=True,
        ),
        Kind.RATE_LIMITED,
        1.5,
    ),
    Case(
        "gemini-429-message-hint-only",
        429,
        _gemini(429, "RESOURCE_EXHAUSTED", _GEMINI_QUOTA_MESSAGE.format(limit=15)),
        Kind.RATE_LIMITED,
        11.6,
    ),
    Case(
        "gemini-503-unavailable-overloaded",
        503,
        _gemini(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
        Kind.CAPACITY,
        code="UNAVAILABLE",
        reason="503 UNAVAILABLE: The model is overloaded. Please try again later.",
    ),
    Case(
        "gemini-400-api-key-invalid",
        400,
        _gemini(
            400,
            "INVALID_ARGUMENT",
            "API key not valid. Please pass a valid API key.",
            [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "API_KEY_INVALID",
                    "domain": "googleapis.com",
                    "metadata": {"service": "generativelanguage.googleapis.com"},
                }
            ],
        ),
        Kind.AUTH,
    ),
    Case(
        "gemini-403-permission-denied",
        403,
        _gemini(
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity).",
        ),
        Kind.AUTH,
        code="PERMISSION_DENIED",
    ),
    Case(
        "gemini-400-input-token-count",
        400,
        _gemini(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        ),
        Kind.TOO_LARGE,
    ),
    # --- Azure OpenAI --------------------------------------------------------------
    Case(
        "azure-429-retry-after-ms",
        429,
        json.dumps(
            {
                "error": {
                    "code": "429",
                    "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
                    "2024-06-01 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry "
                    "after 2 seconds. Please go here: https://aka.ms/oai/quotaincrease if you would like to further "
                    "increase the default rate limit.",
                }
            }
        ),
        Kind.RATE_LIMITED,
        1.5,
        headers={"retry-after-ms": "1500", "retry-after": "2", "x-ms-region": "East US"},
        code=None,
    ),
    Case(
        "azure-429-retry-after-86400-is-quota",
        429,
        json.dumps(
            {
                "error": {
                    "code": "429",
                    "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
                    "2024-02-01 have exceeded call rate limit of your current AIServices S0 pricing tier. Please "
                    "retry after 86400 seconds. Please contact Azure support service if you would like to further "
                    "increase the default rate limit.",
                }
            }
        ),
        Kind.QUOTA,
        86400.0,
    ),
    # --- "Selected model is at capacity" -----------------------------------------------
    Case(
        "at-capacity-json-503",
        503,
        _openai("Selected model is at capacity. Please try a different model.", "server_error", None),
        Kind.CAPACITY,
    ),
    Case(
        "at-capacity-plain-text-429",
        429,
        "Selected model is at capacity. Please try a different model.",
        Kind.CAPACITY,
        reason="429: Selected model is at capacity. Please try a different model.",
    ),
    Case(
        "hf-tgi-503-error-string",
        503,
        b'{"error":"Model is overloaded","error_type":"overloaded"}',
        Kind.CAPACITY,
    ),
    # --- Mistral, Bedrock ------------------------------------------------------------
    Case(
        "mistral-429-service-tier-capacity-exceeded",
        429,
        b'{"object":"error","message":"Service tier capacity exceeded for this model.",'
        b'"type":"service_tier_capacity_exceeded","param":null,"code":"3505"}',
        Kind.CAPACITY,
        code="service_tier_capacity_exceeded",
    ),
    Case(
        "mistral-429-rate-limited",
        429,
        b'{"object":"error","message":"Requests rate limit exceeded","type":"rate_limited","param":null,"code":"1300"}',
        Kind.RATE_LIMITED,
        code="rate_limited",
    ),
    Case(
        "bedrock-429-throttling-too-many-tokens",
        429,
        b'{"message":"Too many tokens, please wait before trying again."}',
        Kind.RATE_LIMITED,  # throttling, not an oversized request
        headers={"x-amzn-errortype": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
    ),
    Case(
        "bedrock-400-input-too-long",
        400,
        b'{"message":"Input is too long for requested model."}',
        Kind.TOO_LARGE,
    ),
    # --- gateways, HTML and empty bodies ---------------------------------------------
    Case("nginx-502-html", 502, _NGINX_502, Kind.TRANSIENT, reason="502 Bad Gateway (nginx)"),
    Case("nginx-413-html", 413, _NGINX_413, Kind.TOO_LARGE),
    Case("elb-503-html", 503, _ELB_503, Kind.CAPACITY),
    Case("empty-503", 503, b"", Kind.CAPACITY, reason="503 Service Unavailable (empty body)"),
    Case("cloudflare-504-html", 504, _CLOUDFLARE_504, Kind.TRANSIENT),
    Case("cloudflare-524-html", 524, _CLOUDFLARE_524, Kind.TRANSIENT),
    Case("generic-429-no-body", 429, None, Kind.RATE_LIMITED),
    Case(
        "deepseek-402-insufficient-balance",
        402,
        _openai("Insufficient Balance", "unknown_error", "invalid_request_error"),
        Kind.QUOTA,
    ),
    Case(
        "fastapi-422-validation",
        422,
        b'{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}',
        Kind.BAD_REQUEST,
        reason="422: Field required",
    ),
    Case("plain-408", 408, b"Request Timeout", Kind.TRANSIENT),
    Case("teapot-418", 418, b"I'm a teapot", Kind.BAD_REQUEST),
    Case("redirect-301", 301, b"", Kind.BAD_REQUEST),
    Case("unknown-599", 599, b"", Kind.TRANSIENT),
    Case(
        "openrouter-429-epoch-ms-reset",
        429,
        b'{"error":{"message":"Rate limit exceeded: free-models-per-min.","code":429}}',
        Kind.RATE_LIMITED,
        60.0,
        headers={"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1767225660000"},
    ),
    # --- retry-after forms ---------------------------------------------------------
    Case(
        "retry-after-http-date",
        429,
        b'{"error":{"message":"Too many requests"}}',
        Kind.RATE_LIMITED,
        30.0,
        headers={"Retry-After": "Thu, 01 Jan 2026 00:00:30 GMT"},
    ),
    Case("retry-after-fraction", 503, b"", Kind.CAPACITY, 1.5, headers={"Retry-After": "1.5"}),
    Case(
        "retry-after-garbage-ignored",
        429,
        b'{"error":{"message":"Too many requests"}}',
        Kind.RATE_LIMITED,
        None,
        headers={"Retry-After": "soon"},
    ),
    Case(
        "retry-after-absurd-ignored",
        503,
        b"",
        Kind.CAPACITY,
        None,
        headers={"Retry-After": "999999999"},
    ),
    # --- 2xx with a broken body ------------------------------------------------------
    Case("200-not-json", 200, b"<html><body>Please log in</body></html>", Kind.TRANSIENT),
    Case("200-json-without-choices", 200, b'{"id":"chatcmpl-1","object":"chat.completion"}', Kind.TRANSIENT),
    Case("200-truncated-json", 200, b'{"id":"chatcmpl-1","choices":[{"index":0,"mess', Kind.TRANSIENT),
    Case("200-empty", 200, b"", Kind.TRANSIENT),
    Case(
        "200-gateway-wrapped-overloaded",
        200,
        b'{"error":{"message":"Upstream model is overloaded","code":502}}',
        Kind.CAPACITY,
    ),
    Case(
        "200-ok",
        200,
        b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant",'
        b'"content":"hi"},"finish_reason":"stop"}]}',
        None,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_classify_response(case: Case) -> None:
    failure = classify_response(case.status, case.headers, case.body, now=NOW)
    if case.kind is None:
        assert failure is None
        return
    assert failure is not None
    assert failure.kind is case.kind, failure.reason
    assert failure.status == case.status
    if case.retry_after is None:
        assert failure.retry_after is None
    else:
        assert failure.retry_after == pytest.approx(case.retry_after)
    if case.code is not None or case.id.startswith("azure-429-retry-after-ms"):
        assert failure.code == case.code
    if case.reason is not None:
        assert failure.reason == case.reason
    assert failure.reason and len(failure.reason) <= 300


def test_enough_real_world_cases() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES)


def test_httpx_headers_are_accepted() -> None:
    headers = httpx.Headers({"Retry-After": "3", "Content-Type": "application/json"})
    failure = classify_response(429, headers, b'{"error":{"message":"slow down please"}}', now=NOW)
    assert failure is not None and failure.retry_after == 3.0


def test_streaming_2xx_is_success_without_reading_the_body() -> None:
    assert classify_response(200, {}, None, now=NOW, streaming=True) is None
    assert classify_response(200, {}, b"data: {not json", now=NOW, streaming=True) is None


def test_default_clock_is_used_when_now_is_omitted() -> None:
    # A date long past: whatever the real clock says, the wait is 0.
    failure = classify_response(429, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, b"")
    assert failure is not None and failure.retry_after == 0.0


def test_reason_trims_long_messages_and_redacts_keys() -> None:
    body = _openai(
        "Key sk-abcdefghijklmnopqrstuvwxyz0123456789 rejected. " + "x" * 5000, "invalid_request_error", "bad"
    )
    failure = classify_response(400, {}, body, now=NOW)
    assert failure is not None
    assert "sk-abcdefghijklmnop" not in failure.reason
    assert len(failure.reason) <= 220


def test_reason_for_long_plain_text_is_a_snippet() -> None:
    failure = classify_response(500, {}, "Internal error\n" * 1000, now=NOW)
    assert failure is not None and failure.kind is Kind.TRANSIENT
    assert failure.reason.startswith("500: Internal error Internal error")
    assert len(failure.reason) <= 220


def test_undecodable_bytes_are_still_classified() -> None:
    failure = classify_response(503, {}, b"\xff\xfe\x00overloaded\x80", now=NOW)
    assert failure is not None and failure.kind is Kind.CAPACITY


# --- exceptions ---------------------------------------------------------------------


class _BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


EXCEPTION_CASES = [
    pytest.param(
        httpx.ReadTimeout("The read operation timed out", request=REQUEST), "timeout: read", id="read-timeout"
    ),
    pytest.param(httpx.WriteTimeout("", request=REQUEST), "timeout: write", id="write-timeout"),
    pytest.param(httpx.PoolTimeout("", request=REQUEST), "timeout: waiting for a pooled connection", id="pool-timeout"),
    pytest.param(httpx.ReadError("", request=REQUEST), "connection error while reading", id="read-error"),
    pytest.param(
        httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body (incomplete chunked read)", request=REQUEST
        ),
        "protocol error",
        id="remote-protocol-error",
    ),
    pytest.param(ConnectionResetError(104, "Connection reset by peer"), "connection reset", id="connection-reset"),
    pytest.param(TimeoutError(), "timeout", id="asyncio-timeout"),
    pytest.param(OSError(101, "Network is unreachable"), "OS error", id="os-error"),
    pytest.param(json.JSONDecodeError("Expecting value", "<html>", 0), "invalid JSON", id="json-decode-error"),
    pytest.param(ValueError("boom"), "ValueError: boom", id="unknown-exception"),
    pytest.param(_BrokenStr(), "_BrokenStr", id="broken-str"),
    pytest.param(asyncio.CancelledError(), "CancelledError", id="cancelled"),
]


def _chained(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


# No connection was made: UNREACHABLE, the cause read from the chain (httpcore chains the OS
# or TLS error; capmon's aiohttp transport chains a fresh copy of it).
UNREACHABLE_CASES = [
    pytest.param(httpx.ConnectTimeout("", request=REQUEST), Cause.TIMEOUT, "timeout: connect", id="connect-timeout"),
    pytest.param(
        httpx.ConnectError("All connection attempts failed", request=REQUEST),
        Cause.NETWORK,
        "connection failed",
        id="connect-error",
    ),
    pytest.param(
        _chained(
            httpx.ConnectError("[Errno -2] Name or service not known", request=REQUEST),
            socket.gaierror(-2, "Name or service not known"),
        ),
        Cause.DNS,
        "DNS lookup failed",
        id="dns",
    ),
    pytest.param(
        _chained(
            httpx.ConnectError("Cannot connect to host", request=REQUEST),
            ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)"),
        ),
        Cause.REFUSED,
        "connection refused",
        id="refused-chained",
    ),
    pytest.param(ConnectionRefusedError(111, "Connection refused"), Cause.REFUSED, "connection refused", id="refused"),
    pytest.param(
        _chained(
            httpx.ConnectError("[SSL: WRONG_VERSION_NUMBER] wrong version number", request=REQUEST),
            ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"),
        ),
        Cause.TLS,
        "TLS handshake failed",
        id="tls",
    ),
    pytest.param(
        _chained(
            httpx.ConnectError("certificate verify failed", request=REQUEST),
            ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate"),
        ),
        Cause.TLS,
        "TLS handshake failed",
        id="tls-certificate",
    ),
    pytest.param(httpx.ProxyError("407 Proxy Authentication Required"), Cause.PROXY, "proxy error", id="proxy"),
    pytest.param(
        _chained(httpx.ConnectError("[Errno 113] No route to host", request=REQUEST), OSError(113, "No route to host")),
        Cause.NETWORK,
        "connection failed",
        id="no-route",
    ),
]


@pytest.mark.parametrize(("exc", "cause", "reason_start"), UNREACHABLE_CASES)
def test_a_connection_never_made_is_unreachable_with_its_cause(
    exc: BaseException, cause: Cause, reason_start: str
) -> None:
    failure = classify_exception(exc)
    assert failure.kind is Kind.UNREACHABLE and failure.code == cause.value, failure
    assert failure.reason.startswith(reason_start), failure.reason
    assert failure.retry_after is None


@pytest.mark.parametrize(
    "exc",
    [
        # A connection was made: the server may have done work, so it is no unreachable endpoint.
        _chained(httpx.ReadError("", request=REQUEST), ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")),
        _chained(httpx.ReadError("", request=REQUEST), ConnectionResetError(104, "Connection reset by peer")),
        httpx.ReadTimeout("", request=REQUEST),
    ],
    ids=["tls-while-reading", "reset", "read-timeout"],
)
def test_a_failure_after_the_connection_was_made_is_not_unreachable(exc: BaseException) -> None:
    assert classify_exception(exc).kind is Kind.TRANSIENT


@pytest.mark.parametrize(("exc", "reason_start"), EXCEPTION_CASES)
def test_classify_exception(exc: BaseException, reason_start: str) -> None:
    failure = classify_exception(exc)
    assert isinstance(failure, Failure)
    assert failure.kind is Kind.TRANSIENT
    assert failure.reason.startswith(reason_start), failure.reason
    assert failure.retry_after is None
    assert "sk-live" not in failure.reason


def test_exception_reason_never_carries_a_key() -> None:
    gemini_url = "https://generativelanguage.googleapis.com/v1beta/models/x:generateContent?key=AIzaSyA1234567890abcdefghijklmnopqrs"
    exc = httpx.ConnectError(f"failed to reach {gemini_url} with Bearer sk-live-0123456789abcdefghijklmnop")
    failure = classify_exception(exc)
    assert "AIzaSy" not in failure.reason
    assert "sk-live" not in failure.reason
    assert failure.reason.startswith("connection failed")


def test_http_status_error_is_classified_from_its_response() -> None:
    response = httpx.Response(529, content=_anthropic("overloaded_error", "Overloaded"), request=REQUEST)
    exc = httpx.HTTPStatusError("Server error '529'", request=REQUEST, response=response)
    failure = classify_exception(exc)
    assert failure.kind is Kind.CAPACITY and failure.status == 529


# --- classify() dispatch ----------------------------------------------------------------


def test_classify_read_response() -> None:
    response = httpx.Response(
        429, headers={"retry-after": "4"}, content=_anthropic("rate_limit_error", "Too many"), request=REQUEST
    )
    failure = classify(response, now=NOW)
    assert failure is not None and failure.kind is Kind.RATE_LIMITED and failure.retry_after == 4.0


def test_classify_ok_response() -> None:
    response = httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]}, request=REQUEST)
    assert classify(response, now=NOW) is None


def test_classify_unread_streaming_response() -> None:
    ok = httpx.Response(200, stream=httpx.ByteStream(b"data: x\n\n"), request=REQUEST)
    assert classify(ok, now=NOW) is None
    busy = httpx.Response(503, headers={"retry-after": "2"}, stream=httpx.ByteStream(b"{}"), request=REQUEST)
    failure = classify(busy, now=NOW)
    assert failure is not None and failure.kind is Kind.CAPACITY and failure.retry_after == 2.0
    assert failure.reason == "503 Service Unavailable (body not read)"


def test_classify_exception_dispatch() -> None:
    failure = classify(httpx.ReadTimeout("", request=REQUEST))
    assert failure is not None and failure.reason.startswith("timeout: read")


def test_classify_something_else_does_not_raise() -> None:
    failure = classify("not a response")  # type: ignore[arg-type]
    assert failure is not None and failure.kind is Kind.TRANSIENT


def test_the_quota_threshold_is_backoff_max_hint() -> None:
    body = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}'
    headers = {"retry-after": "600"}
    assert classify_response(429, headers, body, now=NOW).kind is Kind.RATE_LIMITED  # default: an hour
    assert classify_response(429, headers, body, now=NOW, quota_hint=300.0).kind is Kind.QUOTA


async def test_the_client_sends_its_configs_quota_threshold_with_every_attempt() -> None:
    from capmon.core.providers.token_param import TokenParam
    from capmon.core.routing.attempt import chat_request
    from capmon.core.routing.client import FallbackClient
    from capmon.core.types.result import Request
    from tests.support.configs import ENV, three_models

    cfg = three_models("http://127.0.0.1:9/v1", extra="[backoff]\nmax_hint = 300.0\n")
    async with FallbackClient(cfg, environ=ENV) as client:
        req = chat_request(client.targets[0], Request.of("hi"), TokenParam.MAX_TOKENS, cfg, False)
    assert req.quota_hint == 300.0


def test_a_failure_keeps_the_providers_message_and_param_for_passing_it_through() -> None:
    body = {
        "error": {
            "message": "Invalid value for 'temperature': sk-abcdefghijklmnopqrstuvwx " + "word " * 80,
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    failure = classify_response(400, {}, json.dumps(body).encode(), now=NOW)
    assert failure is not None and failure.param == "temperature"
    assert failure.message.startswith("Invalid value for 'temperature':") and len(failure.message) > 300
    assert "abcdefghijklmnop" not in failure.message


@pytest.mark.parametrize(
    ("arguments", "what"),
    [
        ('{"city": "Par', "not JSON"),
        ("[1, 2]", "JSON but not an object"),
        ('"Paris"', "JSON but not an object"),
        ("[" * 100_000, "not JSON"),  # nested too deep for the parser: still just broken
    ],
)
def test_a_tool_call_whose_arguments_are_no_json_object_is_a_broken_answer_naming_the_call(
    arguments: str, what: str
) -> None:
    failure = classify_tool_call("get_weather", "call_1", arguments)
    assert failure is not None and (failure.kind, failure.status) == (Kind.TRANSIENT, 200)
    assert failure.reason.startswith(f"200 with a broken tool call get_weather (call_1): its arguments are {what}: ")
    assert len(failure.reason) < 200


def test_whole_tool_call_arguments_are_no_failure_and_a_key_in_broken_ones_is_redacted() -> None:
    assert classify_tool_call("f", "c", '{"a": [1, {"b": null}]}') is None
    assert classify_tool_call("f", "c", "") is None and classify_tool_call("f", None, "  ") is None  # none: {}
    key = "sk-live-0123456789abcdefghijklmnop"
    failure = classify_tool_call("f", None, f'{{"key": "{key}')
    assert (
        failure is not None
        and key not in failure.reason
        and failure.reason.startswith("200 with a broken tool call f:")
    )
