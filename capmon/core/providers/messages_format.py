"""The messages format: Anthropic's Messages (/v1/messages). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capmon.core.providers import hub
from capmon.core.types import canon

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

_STOPS: Mapping[str, canon.Stop] = {s.value: s for s in canon.Stop}  # Messages' stop reasons are the hub's


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _stop(value: object) -> tuple[canon.Stop | None, str | None]:
    """A stop reason the hub knows, else None and the one given (newer than the hub), if any."""
    if not isinstance(value, str):
        return None, None
    stop = _STOPS.get(value)
    return stop, None if stop is not None else value


def _stop_reason(stop: canon.Stop | None, other: str | None) -> str | None:
    return other if stop is None else stop.value


def decode_usage(usage: object) -> canon.Usage | None:
    """Messages usage as the hub's: the same split (fresh input, cache writes, cache reads);
    a count not given (or no count) is None."""
    if not isinstance(usage, Mapping):
        return None
    return canon.Usage(
        input=_count(usage.get("input_tokens")),
        cache_write=_count(usage.get("cache_creation_input_tokens")),
        cache_read=_count(usage.get("cache_read_input_tokens")),
        output=_count(usage.get("output_tokens")),
    )


def encode_usage(usage: canon.Usage) -> dict[str, Any]:
    """The counts the usage has (a count not told is left out)."""
    pairs = (
        ("input_tokens", usage.input),
        ("output_tokens", usage.output),
        ("cache_read_input_tokens", usage.cache_read),
        ("cache_creation_input_tokens", usage.cache_write),
    )
    return {name: count for name, count in pairs if count is not None}


def decode_part(block: Mapping[str, Any]) -> canon.Part:
    """One content block of an answer (or a stream's block as it starts)."""
    kind = block.get("type")
    if kind == "text":
        cited = block.get("citations")
        citations = tuple(c for c in cited if isinstance(c, Mapping)) if isinstance(cited, list) else ()
        return canon.Text(str(block.get("text", "")), citations=citations)
    if kind == "tool_use":
        given = block.get("input", {})
        return canon.ToolCall(
            id=str(block.get("id", "")),
            name=str(block.get("name", "")),
            arguments=json.dumps(given),
            input=given if isinstance(given, Mapping) else None,
        )
    if kind == "thinking":
        signature = block.get("signature")
        return canon.Thinking(str(block.get("thinking", "")), signature if isinstance(signature, str) else None)
    if kind == "redacted_thinking":
        return canon.Thinking(str(block.get("data", "")), redacted=True)
    return canon.Opaque("messages", str(kind), block)  # a server tool's use or result, ...


def _tool_input(call: canon.ToolCall) -> Mapping[str, Any]:
    """A call's ``input``: the object its arguments are (Anthropic's must be one)."""
    if call.input is not None:
        return call.input
    try:
        json.loads(call.arguments)
    except (ValueError, RecursionError):
        raise hub.Incapable("the answer: tool call arguments that are not JSON") from None
    raise hub.Incapable("the answer: tool call arguments that are not a JSON object")


def encode_part(part: canon.Part) -> dict[str, Any]:
    """One part of an answer as a content block."""
    if isinstance(part, canon.Text):
        block: dict[str, Any] = {"type": "text", "text": part.text}
        if part.citations:
            block["citations"] = [dict(c) for c in part.citations]
        return block
    if isinstance(part, canon.ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": _tool_input(part)}
    if isinstance(part, canon.Thinking):
        if part.redacted:
            return {"type": "redacted_thinking", "data": part.text}
        block = {"type": "thinking", "thinking": part.text}
        if part.signature is not None:
            block["signature"] = part.signature
        return block
    if isinstance(part, canon.Opaque) and part.format == "messages":
        return dict(part.raw)
    kind = part.kind if isinstance(part, canon.Opaque) else type(part).__name__.lower()
    raise hub.Incapable(f"a {kind} part in an answer (Messages answers carry text, tool calls and thinking)")


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    """A Messages answer in the hub's terms: every block a part, in order (so a part's
    index is its block's)."""
    content = answer.get("content", [])
    if isinstance(content, str):
        blocks: list[Mapping[str, Any]] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and all(type(b) is dict or isinstance(b, Mapping) for b in content):
        blocks = content
    else:
        raise hub.Incapable("content that is neither text nor blocks")
    sequence = answer.get("stop_sequence")
    stop, other = _stop(answer.get("stop_reason"))
    return canon.Answer(
        id=str(answer.get("id", "")),
        model=str(answer.get("model", "")),
        parts=tuple(decode_part(b) for b in blocks),
        stop=stop,
        usage=decode_usage(answer.get("usage")),
        stop_sequence=sequence if isinstance(sequence, str) else None,
        stop_other=other,
    )


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Messages one (``created``: Messages answers carry no time).
    Raises :class:`~capmon.core.providers.hub.Incapable` for a tool call whose arguments
    are no JSON object."""
    out: dict[str, Any] = {
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": [encode_part(p) for p in answer.parts],
        "stop_reason": _stop_reason(answer.stop, answer.stop_other),
        "stop_sequence": answer.stop_sequence,
    }
    if answer.usage is not None:
        out["usage"] = encode_usage(answer.usage)
    return out


class _Decoder:
    """Messages events in, the hub's out: they are the same sequence (``ping`` and
    ``error`` aside: keep-alives, and errors the reader classifies before any decoder)."""

    def feed(self, event: Mapping[str, Any]) -> list[canon.Event]:
        kind, index = event.get("type"), event.get("index")
        if kind == "message_start":
            message = _object(event, "message")
            usage = decode_usage(message.get("usage"))
            return [canon.Started(str(message.get("id", "")), str(message.get("model", "")), usage)]
        if kind == "message_delta":
            delta = _object(event, "delta")
            sequence = delta.get("stop_sequence")
            (stop, other), usage = _stop(delta.get("stop_reason")), decode_usage(event.get("usage"))
            return [canon.Ended(stop, usage, sequence if isinstance(sequence, str) else None, other)]
        if kind == "message_stop":
            return [canon.Done()]
        if not isinstance(index, int):
            return []
        if kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            return [canon.PartStarted(index, decode_part(event["content_block"]))]
        if kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            return self._delta(index, event["delta"])
        if kind == "content_block_stop":
            return [canon.PartStopped(index)]
        return []

    @staticmethod
    def _delta(index: int, delta: Mapping[str, Any]) -> list[canon.Event]:
        kind = delta.get("type")
        if kind in ("text_delta", "thinking_delta"):
            text = delta.get("text" if kind == "text_delta" else "thinking")
            return [canon.PartDelta(index, text=text)] if isinstance(text, str) else []
        if kind == "input_json_delta":
            piece = delta.get("partial_json")
            return [canon.PartDelta(index, arguments=piece)] if isinstance(piece, str) else []
        if kind == "signature_delta":
            signature = delta.get("signature")
            return [canon.PartDelta(index, signature=signature)] if isinstance(signature, str) else []
        if kind == "citations_delta":
            citation = delta.get("citation")
            return [canon.PartDelta(index, citation=citation)] if isinstance(citation, Mapping) else []
        return []

    def close(self) -> list[canon.Event]:
        return []  # the Messages stream ends with its own event (message_stop)


def stream_decoder() -> hub.StreamDecoder:
    return _Decoder()


class _Encoder:
    """The hub's events in, Messages events out (one for one)."""

    def __init__(self) -> None:
        self._parts: dict[int, canon.Part] = {}  # index -> the part as it started

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            usage = {"input_tokens": 0, "output_tokens": 0} if event.usage is None else encode_usage(event.usage)
            message: dict[str, Any] = {
                "id": event.id,
                "type": "message",
                "role": "assistant",
                "model": event.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            }
            return [{"type": "message_start", "message": message}]
        if isinstance(event, canon.PartStarted):
            self._parts[event.index] = part = event.part
            if isinstance(part, canon.ToolCall):  # its input comes in pieces
                block = {"type": "tool_use", "id": part.id, "name": part.name, "input": dict(part.input or {})}
            else:
                block = encode_part(part)
            return [{"type": "content_block_start", "index": event.index, "content_block": block}]
        if isinstance(event, canon.PartDelta):
            return [{"type": "content_block_delta", "index": event.index, "delta": d} for d in self._deltas(event)]
        if isinstance(event, canon.PartStopped):
            return [{"type": "content_block_stop", "index": event.index}]
        if isinstance(event, canon.Ended):
            delta = {"stop_reason": _stop_reason(event.stop, event.stop_other), "stop_sequence": event.stop_sequence}
            out: dict[str, Any] = {"type": "message_delta", "delta": delta}
            if event.usage is not None:
                out["usage"] = encode_usage(event.usage)
            return [out]
        if isinstance(event, canon.Done):
            return [{"type": "message_stop"}]
        return []

    def _deltas(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if event.text is not None:
            if isinstance(self._parts.get(event.index), canon.Thinking):
                out.append({"type": "thinking_delta", "thinking": event.text})
            else:
                out.append({"type": "text_delta", "text": event.text})
        if event.arguments is not None:
            out.append({"type": "input_json_delta", "partial_json": event.arguments})
        if event.signature is not None:
            out.append({"type": "signature_delta", "signature": event.signature})
        if event.citation is not None:
            out.append({"type": "citations_delta", "citation": dict(event.citation)})
        return out


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``created`` and ``include_usage``: Messages events carry no time and always their usage."""
    return _Encoder()


# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#
