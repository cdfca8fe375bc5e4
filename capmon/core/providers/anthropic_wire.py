"""Anthropic's Messages API wire: request bodies and headers, the two API versions and
what each refuses, plain answers, stream events and the answer they assemble into.

The counterpart of :mod:`capmon.core.providers.openai_wire` (OpenAI's wire), in the same vocabulary: a
stream frame becomes an :class:`~capmon.core.providers.openai_wire.Event` with a
:class:`~capmon.core.providers.openai_wire.FrameKind`, so the attempt reads either wire with one loop.
Field names follow the anthropic SDK's types (``anthropic/types``). The attempt reaches it
through capmon/core/providers/formats.py (see ARCHITECTURE.md, "Across formats").

Pure functions on dicts and one small class; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_event
from capmon.core.providers.openai_wire import Event, Frame, FrameKind, owned_body, typed_event
from capmon.core.types.config import DEFAULT_VERSION as DEFAULT_VERSION  # re-exported: the wire's default
from capmon.core.types.config import AnthropicVersion as AnthropicVersion  # re-exported: the wire's versions
from capmon.core.types.failure import Failure, Kind

MESSAGES_PATH = "/v1/messages"


SAMPLING_PARAMS = ("temperature", "top_p", "top_k")


def request_headers(secret: str, version: AnthropicVersion = DEFAULT_VERSION) -> dict[str, str]:
    """The key and version headers. capmon sends ``x-api-key``: every version of the API
    and every Anthropic-compatible server takes it, while Bearer is only the 2026 SDKs'
    habit; one header for both versions keeps an endpoint's version a one-word change."""
    return {"x-api-key": secret, "anthropic-version": version.value}


def messages_body(extra: Mapping[str, Any], *, model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A Messages body (see :func:`capmon.core.providers.openai_wire.owned_body`); the cap is required by the
    API: the model's cap when the caller gave none."""
    return owned_body(extra, model=model, cap_field="max_tokens", cap=max_tokens, stream=stream)


def refused_sampling(body: Mapping[str, Any], version: AnthropicVersion) -> tuple[str, ...]:
    """The sampling fields of ``body`` that ``version`` answers 400 to. Whether the target
    is then skipped or sent without them is the config's rule, not decided here."""
    if not version.refuses_sampling:
        return ()
    return tuple(name for name in SAMPLING_PARAMS if name in body)


def without(body: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """``body`` with ``fields`` left out (the "send without them" rule)."""
    drop = frozenset(fields)
    return {k: v for k, v in body.items() if k not in drop}


def version_incapable(body: Mapping[str, Any], version: AnthropicVersion) -> str | None:
    """Why ``version`` cannot take ``body`` whatever is left out, or None: 2026-10-21
    refuses document blocks in assistant messages and citations on user text blocks."""
    if not version.refuses_assistant_documents_and_user_citations:
        return None
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if type(block) is not dict and not isinstance(block, Mapping):  # dict first: the cheap check
                continue
            if message.get("role") == "assistant" and block.get("type") == "document":
                return f"messages[{i}]: a document block in an assistant message (refused by {version.value})"
            if message.get("role") == "user" and block.get("type") == "text" and block.get("citations"):
                return f"messages[{i}]: citations on a user text block (refused by {version.value})"
    return None


# ---------------------------------------------------------------- errors

# What each error type of Anthropic's says as an HTTP status: an in-stream error carries
# only its type, and the classifier reads kinds from statuses (404 is a bad request, not
# a transient failure; 402 a quota).
ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "conflict_error": 409,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_KIND_ERROR: Mapping[Kind, str] = {
    Kind.CAPACITY: "overloaded_error",
    Kind.RATE_LIMITED: "rate_limit_error",
    Kind.QUOTA: "billing_error",
    Kind.AUTH: "authentication_error",
    Kind.TOO_LARGE: "request_too_large",
    Kind.BAD_REQUEST: "invalid_request_error",
    Kind.TRANSIENT: "api_error",
    Kind.OVERSIZED: "api_error",
}


def event_failure(obj: object, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Failure:
    """An ``event: error`` of a Messages stream, classified like the HTTP error its type
    stands for (``overloaded_error`` is capacity, whatever the message says). Never raises."""
    error = obj.get("error") if isinstance(obj, Mapping) else None
    if isinstance(error, Mapping):
        status = ERROR_STATUS.get(str(error.get("type")))
        if status is not None and "status" not in error:
            obj = {**obj, "error": {**error, "status": status}}  # type: ignore[dict-item]
    return classify_event(obj, "error", now=now, quota_hint=quota_hint)


def error_type(failure: Failure) -> str:
    """The Anthropic error type a failure is told to an Anthropic client as: Anthropic's
    own when it said one, else the one its kind stands for."""
    if failure.code in ERROR_STATUS:
        return str(failure.code)
    if failure.kind is Kind.AUTH and failure.status == 403:
        return "permission_error"
    if failure.kind is Kind.TOO_LARGE and failure.status != 413:
        return "invalid_request_error"  # "prompt is too long" is a 400 on Anthropic's API
    return _KIND_ERROR[failure.kind]


def error_body(failure: Failure, message: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape, for a reply body and for an in-stream ``event: error``."""
    return {"type": "error", "error": {"type": error_type(failure), "message": message or failure.reason}}


# ---------------------------------------------------------------- plain answers


def parse_message(status: int, body: bytes | str | None) -> Mapping[str, Any] | None:
    """A Messages answer when a plain response is one, else None (then the classifier
    says what it is). Never raises."""
    if not 200 <= status < 300 or not body:
        return None
    try:
        parsed = json.loads(body)
    except Exception:
        return None
    if isinstance(parsed, Mapping) and parsed.get("type") == "message" and isinstance(parsed.get("content"), list):
        return parsed
    return None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a Messages answer: its text blocks, in order."""
    blocks = message.get("content")
    return "".join(
        b["text"]
        for b in (blocks if isinstance(blocks, list) else [])
        if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def _count(usage: Mapping[str, Any], name: str) -> int:
    return counts.count(usage.get(name)) or 0


def usage_total(usage: Mapping[str, Any] | None) -> int | None:
    """All the tokens a usage counts: input (fresh, cache writes and cache reads) and output."""
    if not isinstance(usage, Mapping) or not any(
        isinstance(usage.get(k), int) for k in ("input_tokens", "output_tokens")
    ):
        return None
    return sum(
        _count(usage, k)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    )


# ---------------------------------------------------------------- stream events

# Events that carry no answer yet: held back, so an error after them can still fall back.
_PREAMBLE = frozenset({"message_start", "content_block_start", "content_block_stop"})
_DELTA_FIELDS = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking"}


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one SSE frame of a Messages stream is. Never raises.

    ``message_stop`` is DONE; ``error`` is an error classified by its type; ``ping`` and
    unknown event types (Anthropic says new ones may appear) are ignored; a delta that
    carries text, tool input or thinking, and ``message_delta`` (the stop reason), are output.
    """
    decoded = typed_event(frame)
    if isinstance(decoded, Event):
        return decoded
    obj, kind, name = decoded
    if name == "error" or kind == "error":
        return Event(FrameKind.ERROR, failure=event_failure(obj, now=now, quota_hint=quota_hint))
    if name == "ping":
        return Event(FrameKind.IGNORE)
    if not isinstance(obj, dict) or not isinstance(kind, str):
        return Event(FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream event", 200))
    if kind == "message_stop":
        return Event(FrameKind.DONE, chunk=obj)
    if kind in _PREAMBLE:
        return Event(FrameKind.CHUNK, chunk=obj)
    if kind == "message_delta":
        return Event(FrameKind.CHUNK, chunk=obj, output=True)
    if kind == "content_block_delta":
        delta = obj.get("delta")
        dtype = delta.get("type") if isinstance(delta, dict) else None
        piece = delta.get(_DELTA_FIELDS.get(str(dtype), "")) if isinstance(delta, dict) else None
        return Event(FrameKind.CHUNK, chunk=obj, output=bool(piece) or dtype == "signature_delta")
    return Event(FrameKind.IGNORE)


@dataclass
class _Block:
    block: dict[str, Any]
    pieces: list[str] = field(default_factory=list)  # input_json_delta pieces of a tool_use block


class MessageAssembler:
    """Builds the plain answer from a Messages stream's events: text, tool_use blocks with
    their input put together from ``input_json_delta`` pieces, thinking with its
    signature, the stop reason and the usage, so a streamed answer reads like a plain one."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: dict[str, Any] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            start = event["message"]
            self.head = {k: start[k] for k in ("id", "model", "role") if k in start}
            if isinstance(start.get("usage"), Mapping):
                self.usage.update(start["usage"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            index = event.get("index", len(self.blocks))
            self.blocks[index if isinstance(index, int) else len(self.blocks)] = _Block(dict(event["content_block"]))
        elif kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            self._delta(event.get("index"), event["delta"])
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self.stop_reason = delta.get("stop_reason") or self.stop_reason
                self.stop_sequence = delta.get("stop_sequence") or self.stop_sequence
            if isinstance(event.get("usage"), Mapping):
                # Counts in message_delta are cumulative: they replace, not add.
                self.usage.update({k: v for k, v in event["usage"].items() if v is not None})

    def _delta(self, index: object, delta: Mapping[str, Any]) -> None:
        b = self.blocks.get(index) if isinstance(index, int) else None
        if b is None:
            return
        dtype = delta.get("type")
        if dtype == "text_delta" and isinstance(delta.get("text"), str):
            b.block["text"] = b.block.get("text", "") + delta["text"]
        elif dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            b.pieces.append(delta["partial_json"])
        elif dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
            b.block["thinking"] = b.block.get("thinking", "") + delta["thinking"]
        elif dtype == "signature_delta" and isinstance(delta.get("signature"), str):
            b.block["signature"] = b.block.get("signature", "") + delta["signature"]

    @property
    def text(self) -> str:
        return "".join(b.block.get("text", "") for _, b in sorted(self.blocks.items()) if b.block.get("type") == "text")

    def message(self) -> dict[str, Any]:
        """The answer as a plain Messages response. Tool input that is not JSON is kept as
        the text it was (under ``input``'s ``_raw``) rather than lost: the caller sees it."""
        content = []
        for _, b in sorted(self.blocks.items()):
            block = dict(b.block)
            if b.pieces or block.get("type") == "tool_use":
                raw = "".join(b.pieces)
                try:
                    block["input"] = json.loads(raw) if raw.strip() else block.get("input") or {}
                except ValueError:
                    block["input"] = {"_raw": raw}
            content.append(block)
        return {
            "id": self.head.get("id", ""),
            "type": "message",
            "role": "assistant",
            "model": self.head.get("model", ""),
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": {"input_tokens": 0, "output_tokens": 0, **self.usage},
        }
