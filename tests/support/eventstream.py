"""AWS's event stream messages made for tests (``application/vnd.amazon.eventstream``), as
Bedrock's ConverseStream sends them: ``[total length][headers length][prelude CRC][headers]
[payload][message CRC]``, big-endian, CRC32s; each header ``[name length u8][name][7: a
string][value length u16][value]``. botocore only decodes these; the simulator has its own
encoder (capmon/sim), this one is the tests' own, written from the format's description."""

from __future__ import annotations

import json
import random
import struct
import zlib
from typing import Any

_STRING = 7


def _headers(headers: dict[str, str]) -> bytes:
    out = b""
    for name, value in headers.items():
        n, v = name.encode(), value.encode()
        out += struct.pack(">B", len(n)) + n + struct.pack(">BH", _STRING, len(v)) + v
    return out


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message with both of its CRCs right."""
    head = _headers(headers)
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body))


def padded(payload: dict[str, Any], rng: random.Random | None = None) -> bytes:
    """``payload`` as JSON with Bedrock's random padding field ``p`` (letters, some length)."""
    rng = rng or random.Random(0)
    return json.dumps({**payload, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"[: rng.randint(1, 36)]}).encode()


def event(kind: str, payload: dict[str, Any], *, pad: bool = True) -> bytes:
    """An event message (``:event-type`` ``kind``), its payload padded as Bedrock pads it."""
    data = padded(payload) if pad else json.dumps(payload).encode()
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return message(headers, data)


def exception(kind: str, text: str, **more: Any) -> bytes:
    """An exception message (``kind`` in lowerCamel case: ``throttlingException``)."""
    headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return message(headers, json.dumps({"message": text, **more}).encode())


def error(code: str, text: str) -> bytes:
    """An error message (``:error-code`` and ``:error-message``, no payload)."""
    return message({":error-code": code, ":error-message": text, ":message-type": "error"}, b"")


def converse_stream(text: str = "Hello there", *, pieces: int = 2, stop: str = "end_turn") -> list[bytes]:
    """A whole ConverseStream answer: its text in ``pieces`` deltas, its stop, its metadata."""
    size = max(1, -(-len(text) // pieces))
    out = [event("messageStart", {"role": "assistant"})]
    for i in range(0, len(text), size):
        out.append(event("contentBlockDelta", {"delta": {"text": text[i : i + size]}, "contentBlockIndex": 0}))
    out.append(event("contentBlockStop", {"contentBlockIndex": 0}))
    out.append(event("messageStop", {"stopReason": stop}))
    usage = {"inputTokens": 5, "outputTokens": 3, "totalTokens": 8}
    out.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 120}}))
    return out


def tool_stream(name: str = "weather", arguments: str = '{"city": "Paris"}', tool_id: str = "tooluse_1") -> list[bytes]:
    """A ConverseStream answer that says a little, then calls ``name`` (its input in two pieces)."""
    half = len(arguments) // 2
    start = {"start": {"toolUse": {"toolUseId": tool_id, "name": name}}, "contentBlockIndex": 1}
    return [
        event("messageStart", {"role": "assistant"}),
        event("contentBlockDelta", {"delta": {"text": "Let me look."}, "contentBlockIndex": 0}),
        event("contentBlockStop", {"contentBlockIndex": 0}),
        event("contentBlockStart", start),
        event("contentBlockDelta", {"delta": {"toolUse": {"input": arguments[:half]}}, "contentBlockIndex": 1}),
        event("contentBlockDelta", {"delta": {"toolUse": {"input": arguments[half:]}}, "contentBlockIndex": 1}),
        event("contentBlockStop", {"contentBlockIndex": 1}),
        event("messageStop", {"stopReason": "tool_use"}),
        event(
            "metadata",
            {"usage": {"inputTokens": 9, "outputTokens": 7, "totalTokens": 16}, "metrics": {"latencyMs": 80}},
        ),
    ]
