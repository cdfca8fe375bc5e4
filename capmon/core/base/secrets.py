"""Secrets, in one place: the key type, the registry of the keys this process holds,
the one redactor, and the log filter that applies it.

Keys never reach a log, an event, a store, a screen or an exception. Everything that
shows text from outside (a provider's message, an exception's text, an HTTP library's
debug line) passes :func:`redact` first: it removes every key capmon holds, whatever
its shape (an Azure key is 32 hex digits, which no pattern tells from a request id),
and anything shaped like a key that it does not hold (a provider may echo another).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

# Shorter values are too likely to be ordinary words to be replaced wherever they occur.
MIN_SECRET_CHARS = 8

_VALUES: set[str] = set()

# Key shapes: OpenAI-style sk- / pk- / rk- / key-, Google's AIza..., bearer tokens, key=
# in a query, and long opaque tokens. A match keeps its first six characters, so a
# person can still tell which key a provider complained about.
_SHAPES = re.compile(
    r"(?:sk|pk|rk)-[A-Za-z0-9_\-]{12,}|\bkey-[A-Za-z0-9_\-]{12,}|AIza[0-9A-Za-z_\-]{20,}"
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/\-]{12,}=*|(?i:(?:api[_-]?key|key)=)[^&\s\"']{8,}|\b[A-Za-z0-9]{40,}\b"
)
_KEEP = 6
# A key in the header Azure (``api-key``) or Anthropic (``x-api-key``) reads, as an HTTP
# library or a provider may print it (``api-key: ...``, ``'x-api-key': '...'``): its value
# goes whole, as no shape tells an Azure key (32 hex digits) from a request id.
_KEY_HEADER = re.compile(r"""(?i)(\b(?:x-)?api[-_]key["']?\s*[:=]\s*["']?)[A-Za-z0-9._~+/\-]{8,}""")
# A key a provider already masked when it echoed it (OpenAI's ``sk-abc****wxyz``, the
# simulator's ``CAN****Q777``): its visible ends are still part of the key.
_MASKED = re.compile(r"[A-Za-z0-9_\-]*\*{3,}[A-Za-z0-9_\-]*")


def register(value: str) -> None:
    if len(value) >= MIN_SECRET_CHARS:
        _VALUES.add(value)


def values() -> frozenset[str]:
    """Every key value this process holds (for redaction only)."""
    return frozenset(_VALUES)


class Secret:
    """An API key (or any credential). Its repr and str never show the value."""

    __slots__ = ("_value", "alias")

    def __init__(self, value: str, alias: str) -> None:
        self._value = value
        self.alias = alias
        register(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(alias={self.alias!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:  # never pickled with its value
        raise TypeError("a Secret cannot be pickled")


def _mask(match: re.Match[str], keep: int = _KEEP) -> str:
    text = match.group(0)
    if text[:6].lower() == "bearer":
        return "Bearer ****"
    head, sep, _ = text.partition("=")
    if sep:  # key=...: keep the name, not the value
        return f"{head}=****"
    return text[:keep] + "****"


def redact(text: str, *, hints: bool = True) -> str:
    """``text`` without keys: the ones this process holds become ``[redacted]``, other
    key-shaped strings keep their first characters (``sk-pro****``) so that an operator
    can tell which key a provider complained about. ``hints=False`` (for whoever may
    not see any part of a key: a client of the gateway) keeps none of them, and masks
    what a provider already masked (``CAN****Q777``) whole."""
    if not text:
        return text
    for value in sorted(_VALUES, key=len, reverse=True):  # longest first: one key may hold another
        if value in text:
            text = text.replace(value, "[redacted]")
    text = _KEY_HEADER.sub(r"\1****", text)
    if hints:
        return _SHAPES.sub(_mask, text)
    return _MASKED.sub("****", _SHAPES.sub(functools.partial(_mask, keep=0), text))


def carries_key(text: str) -> bool:
    """Whether :func:`redact` would take anything out of ``text`` (for what is kept whole or
    not at all, such as a caller's request id: a redacted id would no longer be its own)."""
    return redact(text, hints=False) != text


class RedactSecrets(logging.Filter):
    """A logging filter that redacts a record's message: HTTP libraries log headers at
    DEBUG, and a provider may echo a key in one."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot format is not ours to fix
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


# Filters on a logger see only records logged to that very logger, so each of the HTTP
# stack's loggers gets one.
_HTTP_LOGGERS = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.connection_pool",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "aiohttp",
    "aiohttp.client",
    "aiohttp.internal",
    "aiohttp.access",
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
)


def protect_logs() -> None:
    """Redact keys from what capmon and its HTTP stack log. Idempotent; done on import."""
    for name in _HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())


protect_logs()
