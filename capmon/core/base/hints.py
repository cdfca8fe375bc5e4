"""Read how long a server asks us to wait.

Providers say it in many ways: ``retry-after`` (seconds or an HTTP date),
``retry-after-ms``, OpenAI's ``x-ratelimit-reset-*`` Go durations (``6m0s``),
Anthropic's RFC 3339 reset timestamps, Gemini's ``RetryInfo.retryDelay`` and
prose such as "Please try again in 1.5s". Every parser here returns seconds as a
finite float in [0, one year], or None. A garbage hint is ignored, never raised:
a bad header must not turn a retryable failure into a crash.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_HINT",
    "hint_from",
    "hint_from_message",
    "parse_duration",
    "parse_reset",
    "parse_retry_after",
    "retry_delay_from_body",
]

# Anything longer is a bug or a joke on the server's side; waiting on it would park a
# key for good, so it is treated as no hint at all.
MAX_HINT = 365.0 * 86400.0

_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")
_UNITS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # Go prints the micro sign
    "μs": 1e-6,  # ... and people type the Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
# Longest units first so "ms" is not read as "m" followed by garbage.
_UNIT_ALT = "|".join(sorted((re.escape(u) for u in _UNITS), key=len, reverse=True))
_DURATION_PART = re.compile(rf"({_NUMBER.pattern})({_UNIT_ALT})")
_DURATION_FULL = re.compile(rf"(?:{_NUMBER.pattern}(?:{_UNIT_ALT}))+")
_RFC3339_START = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")

# "try again in 1.5s", "try again in 20ms", "Please retry in 6m0s", "retry after 30 seconds".
_MESSAGE_HINT = re.compile(
    r"(?:try\s+again|retry)\s+(?:in|after)\s+(?:about\s+|approximately\s+|~)?"
    r"(?P<value>[0-9][0-9.]*(?:[hms]+[0-9][0-9.]*)*[hms]*)"
    r"(?:\s*(?P<unit>milliseconds?|msecs?|seconds?|secs?|minutes?|mins?|hours?|hrs?)\b)?",
    re.IGNORECASE,
)
# Anthropic's spend limit: "You will regain access on 2026-02-01 at 00:00 UTC."
_REGAIN_ACCESS = re.compile(
    r"regain access on ([0-9]{4}-[0-9]{2}-[0-9]{2})(?:\s+at\s+([0-9]{1,2}:[0-9]{2}))?", re.IGNORECASE
)

# Rate-limit buckets whose reset headers are reported together; the one that ran out
# is the one that matters.
_OPENAI_BUCKETS = ("requests", "tokens")
_ANTHROPIC_BUCKETS = ("requests", "tokens", "input-tokens", "output-tokens")


def _sane(seconds: float) -> float | None:
    if not math.isfinite(seconds) or seconds < 0.0 or seconds > MAX_HINT:
        return None
    return float(seconds)


def _until(when: float, now: float) -> float | None:
    # A reset time already in the past means "go now", not "no hint".
    return _sane(max(0.0, when - now))


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str):
        return None
    value = value.strip()
    return value or None


def parse_duration(value: str | None) -> float | None:
    """A Go / OpenAI duration (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) or plain seconds."""
    text = _text(value)
    if text is None:
        return None
    text = text.lower()
    if _NUMBER.fullmatch(text):
        return _sane(float(text))
    if not _DURATION_FULL.fullmatch(text):
        return None
    return _sane(sum(float(number) * _UNITS[unit] for number, unit in _DURATION_PART.findall(text)))


def _http_date(text: str) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:  # "-0000" means UTC with unknown origin (RFC 5322)
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except Exception:  # the stdlib raises several types on garbage; all mean "not a date"
        return None


def _rfc3339(text: str) -> float | None:
    if not _RFC3339_START.match(text):
        return None
    try:
        when = datetime.fromisoformat(text.replace("z", "Z"))
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    except Exception:
        return None


def parse_retry_after(value: str | None, *, now: float) -> float | None:
    """``Retry-After``: delay seconds (fractions accepted) or an HTTP date.

    Negative or garbage -> None; a date in the past -> 0.0.
    """
    text = _text(value)
    if text is None:
        return None
    if _NUMBER.fullmatch(text):
        return _sane(float(text))
    when = _http_date(text)
    return None if when is None else _until(when, now)


def parse_reset(value: str | None, *, now: float) -> float | None:
    """A rate-limit reset header: RFC 3339 timestamp, epoch seconds or ms, delta seconds, or a duration."""
    text = _text(value)
    if text is None:
        return None
    if _NUMBER.fullmatch(text):
        number = float(text)
        # Providers disagree on what a bare number means; its size tells them apart.
        if number >= 1e11:
            return _until(number / 1000.0, now)
        if number >= 1e9:
            return _until(number, now)
        return _sane(number)
    when = _rfc3339(text)
    if when is not None:
        return _until(when, now)
    return parse_duration(text)


def _lower_headers(headers: Mapping[str, str] | httpx.Headers | None) -> dict[str, str]:
    if not headers:
        return {}
    out: dict[str, str] = {}
    try:
        for key, value in headers.items():
            key_text, value_text = _text(key), _text(value)
            if key_text is not None and value_text is not None:
                out.setdefault(key_text.lower(), value_text)
    except Exception:
        return out
    return out


def _bucket_reset(
    headers: Mapping[str, str],
    buckets: tuple[str, ...],
    reset_name: str,
    remaining_name: str,
    message: str,
    now: float,
) -> float | None:
    resets: dict[str, float] = {}
    for bucket in buckets:
        seconds = parse_reset(headers.get(reset_name.format(bucket)), now=now)
        if seconds is not None:
            resets[bucket] = seconds
    if not resets:
        return None
    # Every bucket reports a reset, but only an exhausted one is why we were refused.
    exhausted = [b for b in resets if _text(headers.get(remaining_name.format(b))) == "0"]
    if exhausted:
        return max(resets[b] for b in exhausted)
    lowered = message.lower()
    if "tokens per" in lowered or "(tpm)" in lowered:
        named = [b for b in resets if "tokens" in b]
    elif "requests per" in lowered or "(rpm)" in lowered:
        named = [b for b in resets if b == "requests"]
    else:
        named = []
    return max(resets[b] for b in (named or resets))


def _error_objects(body_json: object) -> list[Mapping[str, Any]]:
    # Gemini sometimes wraps its error in a list: [{"error": {...}}].
    items = body_json if isinstance(body_json, list) else [body_json]
    out = []
    for item in items[:4]:
        if isinstance(item, Mapping):
            error = item.get("error")
            out.append(error if isinstance(error, Mapping) else item)
    return out


def _proto_duration(value: object) -> float | None:
    if isinstance(value, str):
        return parse_duration(value)
    # The non-JSON proto form: {"seconds": 12, "nanos": 500000000}.
    if isinstance(value, Mapping):
        try:
            seconds = float(value.get("seconds", 0) or 0) + float(value.get("nanos", 0) or 0) / 1e9
        except (TypeError, ValueError, OverflowError):
            return None
        return _sane(seconds)
    return None


def retry_delay_from_body(body_json: object) -> float | None:
    """Gemini's ``error.details[]`` entry of type ``google.rpc.RetryInfo``: its ``retryDelay``."""
    for error in _error_objects(body_json):
        details = error.get("details")
        if not isinstance(details, list):
            continue
        for detail in details:
            if not isinstance(detail, Mapping):
                continue
            kind = detail.get("@type")
            if isinstance(kind, str) and kind.endswith("google.rpc.RetryInfo"):
                seconds = _proto_duration(detail.get("retryDelay"))
                if seconds is not None:
                    return seconds
    return None


def _word_unit_seconds(unit: str) -> float:
    if unit.startswith(("mil", "ms")):
        return 1e-3
    if unit.startswith("min"):
        return 60.0
    if unit.startswith("h"):
        return 3600.0
    return 1.0


def _message_match_seconds(match: re.Match[str]) -> float | None:
    value, unit = match.group("value").rstrip("."), match.group("unit")
    if unit:
        if not _NUMBER.fullmatch(value):
            return None
        return _sane(float(value) * _word_unit_seconds(unit.lower()))
    return parse_duration(value)


def hint_from_message(message: str | None, *, now: float) -> float | None:
    """A wait stated in prose: "try again in 1.5s", "retry after 30 seconds", "regain access on <date>"."""
    if not isinstance(message, str) or not message:
        return None
    text = message[:8192]  # hints sit near the start; do not scan megabytes of HTML
    for match in _MESSAGE_HINT.finditer(text):
        seconds = _message_match_seconds(match)
        if seconds is not None:
            return seconds
    regain = _REGAIN_ACCESS.search(text)
    if regain:
        when = _rfc3339(f"{regain.group(1)}T{(regain.group(2) or '00:00').zfill(5)}:00+00:00")
        if when is not None:
            return _until(when, now)
    return None


def hint_from(
    headers: Mapping[str, str] | httpx.Headers | None,
    body_json: object | None,
    message: str,
    *,
    now: float,
) -> float | None:
    """The server's hint in seconds, or None; the first source that parses wins.

    Order: ``retry-after-ms``, ``retry-after``, ``x-ratelimit-reset-{requests,tokens}``,
    ``anthropic-ratelimit-*-reset`` / ``x-ratelimit-reset`` / ``ratelimit-reset``,
    Gemini ``RetryInfo.retryDelay``, then the message.
    """
    h = _lower_headers(headers)
    message = message if isinstance(message, str) else ""

    retry_after_ms = _text(h.get("retry-after-ms"))
    if retry_after_ms is not None and _NUMBER.fullmatch(retry_after_ms):
        seconds = _sane(float(retry_after_ms) / 1000.0)
        if seconds is not None:
            return seconds
    for seconds in (
        parse_retry_after(h.get("retry-after"), now=now),
        _bucket_reset(h, _OPENAI_BUCKETS, "x-ratelimit-reset-{}", "x-ratelimit-remaining-{}", message, now),
        _bucket_reset(
            h, _ANTHROPIC_BUCKETS, "anthropic-ratelimit-{}-reset", "anthropic-ratelimit-{}-remaining", message, now
        ),
        parse_reset(h.get("x-ratelimit-reset"), now=now),
        parse_reset(h.get("ratelimit-reset"), now=now),
        retry_delay_from_body(body_json),
        hint_from_message(message, now=now),
    ):
        if seconds is not None:
            return seconds
    return None
