"""Server-hint parsing, and the property that no response, however broken, makes
classification raise or produce a hint that is not a finite, non-negative number."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capmon.core.base.hints import (
    MAX_HINT,
    hint_from,
    hint_from_message,
    parse_duration,
    parse_reset,
    parse_retry_after,
    retry_delay_from_body,
)
from capmon.core.providers import classify as errors
from capmon.core.providers.classify import classify_response
from capmon.core.types.failure import Failure, Kind

pytestmark = pytest.mark.unit

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("  7 ", 7.0),
        (".25", 0.25),
        ("Thu, 01 Jan 2026 00:00:30 GMT", 30.0),
        ("Thursday, 01-Jan-26 00:00:30 GMT", 30.0),  # obsolete RFC 850 form, which RFC 9110 says to accept
        ("Wed, 31 Dec 2025 23:00:00 GMT", 0.0),  # in the past: go now
        ("-1", None),
        ("soon", None),
        ("", None),
        (None, None),
        ("nan", None),
        ("inf", None),
        ("1e3", None),
        ("999999999", None),  # more than a year
        ("9" * 400, None),  # overflows to inf
    ],
)
def test_parse_retry_after(value: str | None, expected: float | None) -> None:
    result = parse_retry_after(value, now=NOW)
    assert result == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("1h30m", 5400.0),
        ("0.5s", 0.5),
        ("2", 2.0),
        ("1h2m3.5s", 3723.5),
        ("1m30.172s", 90.172),
        ("500us", 0.0005),
        ("7.66S", 7.66),
        ("0s", 0.0),
        ("abc", None),
        ("1x", None),
        ("-1s", None),
        ("s", None),
        ("1.2.3s", None),
        ("1 s", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_duration(value: str | None, expected: float | None) -> None:
    result = parse_duration(value)
    assert result == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1767225630", 30.0),  # epoch seconds
        ("1767225660000", 60.0),  # epoch milliseconds
        ("1767225500", 0.0),  # epoch in the past
        ("2026-01-01T00:00:30Z", 30.0),  # RFC 3339
        ("2026-01-01T00:00:30.5+00:00", 30.5),
        ("2026-01-01T01:00:30+01:00", 30.0),
        ("2025-12-31T23:59:00Z", 0.0),
        ("12", 12.0),  # small numbers are delta seconds
        ("6m0s", 360.0),
        ("2026-13-45T00:00:00Z", None),
        ("garbage", None),
    ],
)
def test_parse_reset(value: str, expected: float | None) -> None:
    result = parse_reset(value, now=NOW)
    assert result == (None if expected is None else pytest.approx(expected))


def _retry_info(delay: Any) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"error": {"details": [_retry_info("12s")]}}, 12.0),
        ({"error": {"details": [_retry_info("1.5s")]}}, 1.5),
        ([{"error": {"details": [{"@type": "x.QuotaFailure"}, _retry_info("0.250s")]}}], 0.25),
        ({"error": {"details": [_retry_info({"seconds": 3, "nanos": 500000000})]}}, 3.5),
        ({"error": {"details": [_retry_info("bogus")]}}, None),
        ({"error": {"details": [_retry_info(None)]}}, None),
        ({"error": {"details": "nope"}}, None),
        ({"error": {"details": [{"@type": "google.rpc.Help", "retryDelay": "5s"}]}}, None),
        ("not json", None),
        (None, None),
    ],
)
def test_retry_delay_from_body(body: object, expected: float | None) -> None:
    assert retry_delay_from_body(body) == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Rate limit reached ... Please try again in 1.5s. Visit https://platform.openai.com", 1.5),
        ("Please try again in 20ms.", 0.02),
        ("Please retry in 6m0s", 360.0),
        ("Please retry in 54.856443723s.", 54.856443723),
        ("Please retry after 30 seconds.", 30.0),
        ("Try again in 2 minutes", 120.0),
        ("retry after 1 hour", 3600.0),
        ("try again in 250 milliseconds", 0.25),
        ("You will regain access on 2026-01-02 at 06:00 UTC.", 30 * 3600.0),
        ("Please try again later.", None),
        ("no hint here", None),
        ("", None),
    ],
)
def test_hint_from_message(message: str, expected: float | None) -> None:
    assert hint_from_message(message, now=NOW) == (None if expected is None else pytest.approx(expected))


GEMINI_BODY = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": [_retry_info("12s")]}}


@pytest.mark.parametrize(
    ("headers", "body", "message", "expected"),
    [
        pytest.param({"retry-after-ms": "1500", "retry-after": "9"}, None, "", 1.5, id="ms-beats-seconds"),
        pytest.param({"Retry-After": "9", "x-ratelimit-reset-requests": "1s"}, None, "", 9.0, id="retry-after-first"),
        pytest.param({"retry-after-ms": "junk", "retry-after": "9"}, None, "", 9.0, id="garbage-ms-falls-through"),
        pytest.param({"retry-after": "soon"}, GEMINI_BODY, "", 12.0, id="garbage-retry-after-falls-through"),
        pytest.param({"retry-after": "40000000"}, None, "try again in 2s", 2.0, id="absurd-falls-through"),
        pytest.param(
            {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, None, "", 360.0, id="bucket-max"
        ),
        pytest.param(
            {
                "x-ratelimit-reset-requests": "1s",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-tokens": "6m0s",
                "x-ratelimit-remaining-tokens": "100",
            },
            None,
            "",
            1.0,
            id="exhausted-bucket",
        ),
        pytest.param(
            {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "20ms"},
            None,
            "Rate limit reached on tokens per min (TPM)",
            0.02,
            id="bucket-named-in-message",
        ),
        pytest.param(
            {"anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:42Z"}, None, "", 42.0, id="anthropic-reset"
        ),
        pytest.param({"x-ratelimit-reset": "1767225630"}, None, "", 30.0, id="epoch-reset"),
        pytest.param({"ratelimit-reset": "5"}, None, "", 5.0, id="ietf-ratelimit-reset"),
        pytest.param({}, GEMINI_BODY, "Please retry in 11.6s.", 12.0, id="retry-info-beats-message"),
        pytest.param({}, None, "try again in 1.5s", 1.5, id="message"),
        pytest.param(httpx.Headers({"Retry-After": "3"}), None, "", 3.0, id="httpx-headers"),
        pytest.param(None, None, "", None, id="nothing"),
    ],
)
def test_hint_from(headers: Any, body: object, message: str, expected: float | None) -> None:
    assert hint_from(headers, body, message, now=NOW) == (None if expected is None else pytest.approx(expected))


# --- properties ---------------------------------------------------------------------

_PRINTABLE = st.characters(min_codepoint=32, max_codepoint=126)
_HINT_HEADERS = [
    "retry-after",
    "Retry-After",
    "retry-after-ms",
    "x-ratelimit-reset",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-tokens-remaining",
    "ratelimit-reset",
]
_TRICKY_VALUES = [
    "0",
    "-1",
    "1.5",
    "nan",
    "inf",
    "1e309",
    "9" * 40,
    "Thu, 01 Jan 2026 00:00:30 GMT",
    "Mon, 01 Jan 0001 00:00:00 GMT",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "2026-01-01T00:00:30Z",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00Z",
    "6m0s",
    "99999999999h",
    "1767225660000",
]
headers_strategy = st.dictionaries(
    st.one_of(st.sampled_from(_HINT_HEADERS), st.text(_PRINTABLE, min_size=1, max_size=20)),
    st.one_of(st.sampled_from(_TRICKY_VALUES), st.text(_PRINTABLE, max_size=40)),
    max_size=6,
)
_KEYS = st.sampled_from(
    [
        "error",
        "message",
        "code",
        "type",
        "status",
        "details",
        "@type",
        "retryDelay",
        "violations",
        "quotaId",
        "choices",
        "detail",
        "msg",
    ]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # includes nan and inf, which json.dumps writes as NaN / Infinity
    st.text(max_size=40),
    st.sampled_from(
        [
            "RESOURCE_EXHAUSTED",
            "overloaded_error",
            "type.googleapis.com/google.rpc.RetryInfo",
            "12s",
            "PerDay",
            "limit: 0",
        ]
    ),
)
json_strategy = st.recursive(
    _SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.one_of(_KEYS, st.text(max_size=8)), children, max_size=5)
    ),
    max_leaves=20,
)
body_strategy = st.one_of(
    st.none(),
    st.binary(max_size=300),
    st.text(max_size=300),
    json_strategy.map(lambda value: json.dumps(value).encode()),
)


def _check(failure: Failure | None) -> None:
    if failure is None:
        return
    assert isinstance(failure, Failure)
    assert isinstance(failure.kind, Kind)
    assert isinstance(failure.reason, str) and failure.reason
    if failure.retry_after is not None:
        assert isinstance(failure.retry_after, float)
        assert math.isfinite(failure.retry_after) and 0.0 <= failure.retry_after <= MAX_HINT


@settings(max_examples=300, deadline=None)
@given(
    status=st.integers(100, 599),
    headers=headers_strategy,
    body=body_strategy,
    streaming=st.booleans(),
)
def test_classify_response_never_raises(status: int, headers: dict[str, str], body: Any, streaming: bool) -> None:
    # The unguarded core: the public function's safety net must not hide a bug here.
    _check(errors._classify_response(status, headers, body, now=NOW, streaming=streaming))
    _check(classify_response(status, httpx.Headers(headers), body, now=NOW, streaming=streaming))


@settings(max_examples=300, deadline=None)
@given(headers=headers_strategy, body=json_strategy, message=st.text(max_size=200))
def test_hint_from_is_none_or_a_sane_number(headers: dict[str, str], body: Any, message: str) -> None:
    result = hint_from(headers, body, message, now=NOW)
    assert result is None or (isinstance(result, float) and 0.0 <= result <= MAX_HINT)


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.sampled_from(_TRICKY_VALUES), st.text(max_size=40)))
def test_parsers_are_total(value: str) -> None:
    for result in (parse_retry_after(value, now=NOW), parse_duration(value), parse_reset(value, now=NOW)):
        assert result is None or (math.isfinite(result) and 0.0 <= result <= MAX_HINT)
