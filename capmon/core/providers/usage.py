"""Token counts as a provider reports them, bounded before anyone reads them.

A provider's ``usage`` reaches the caller (the answer, every stream chunk that carries it),
the gateway's access log, its spans (OTLP's integers are int64), a job's database (SQLite's
too) and the tpm buckets' refunds. So each wire's answers and stream events are bounded
where they are read (capmon/core/providers/formats.py: ``parse_plain`` and ``WireReader.read``), and
everything after reads sane counts: a count (a field named ``*_tokens`` or ``*_requests``,
at any depth of the usage object: chat's ``prompt_tokens``, Responses' and Messages'
``input_tokens``, ``cached_tokens`` in a ``*_details`` object, Anthropic's
``server_tool_use.web_search_requests``; Gemini's ``*TokenCount`` in ``usageMetadata``, and
``tokenCount`` in its lists of details per modality) is an int from 0 to :data:`MAX_COUNT`, or it is
left out. Left out, not 0: a reader takes an absent count as unknown (the access log's
null, no span attribute, no refund), where 0 would be believed. A usage that is no object
at all is left out whole. Fields that are no counts (``service_tier``, a router's ``cost``)
pass as they came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# 2^53 - 1: what every JSON reader holds exactly (JavaScript's numbers too); the few counts a
# translation adds together stay far inside OTLP's and the databases' int64.
MAX_COUNT = 2**53 - 1
_COUNTS = ("_tokens", "_requests", "TokenCount", "tokenCount")
# The key of an answer's usage: every wire's, but Gemini's.
_USAGE = ("usage", "usageMetadata")
# Where an answer or a stream event carries its usage: at its top (chat answers and chunks,
# Responses and Messages answers, Anthropic's message_delta), or in the object it wraps
# (the Responses events' ``response``, Anthropic's message_start's ``message``).
_WRAPPERS = ("response", "message")


def count(value: object) -> int | None:
    """``value`` as a token count, or None when it is none (not an int, a bool, negative, huge)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT:
        return value
    return None


def _sane(usage: Mapping[str, Any]) -> bool:
    for name, value in usage.items():
        if isinstance(value, Mapping):
            if not _sane(value):
                return False
        elif isinstance(value, list):
            if not all(_sane(v) for v in value if isinstance(v, Mapping)):
                return False
        elif name.endswith(_COUNTS) and count(value) is None:
            return False
    return True


def _bounded(usage: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in usage.items():
        if isinstance(value, Mapping):
            out[name] = _bounded(value)
        elif isinstance(value, list):
            out[name] = [_bounded(v) if isinstance(v, Mapping) else v for v in value]
        elif not name.endswith(_COUNTS) or count(value) is not None:
            out[name] = value
    return out


def _with_usage(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in _USAGE:
        if key not in obj:
            continue
        usage = obj[key]
        if usage is None or (isinstance(usage, Mapping) and _sane(usage)):
            continue  # the common case: nothing to copy
        rest = {k: v for k, v in obj.items() if k != key}
        obj = {**rest, key: _bounded(usage)} if isinstance(usage, Mapping) else rest
    return obj


def bounded(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An answer or a stream event of any wire with its usage bounded (``obj`` itself when
    its counts are sane already, else a copy)."""
    out = _with_usage(obj)
    for wrapper in _WRAPPERS:
        inner = out.get(wrapper)
        if isinstance(inner, Mapping):
            fixed = _with_usage(inner)
            if fixed is not inner:
                out = {**out, wrapper: fixed}
    return out
