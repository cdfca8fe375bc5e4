"""Huge answers for the ``huge`` fault: bodies of any size produced piece by piece from one
constant block, so the server's memory stays flat however many bytes it sends (a client
that buffers the whole body is what such a test is meant to catch).

valid: a real chat completion whose content is ``size`` bytes long (or, streamed, chunks
whose contents add up to ``size`` bytes, then the finish chunk and [DONE]).
invalid: exactly ``size`` bytes that are not JSON (streamed: one endless ``data:`` line
with no newline at all, which a line-buffering parser must refuse to hold).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from capmon.sim.model import Ticket
from capmon.sim.streams import FINGERPRINT, sse, usage

BLOCK = 64 * 1024  # bytes handed to the server per write
STREAM_CONTENT = 16 * 1024  # content bytes per SSE chunk
_FILLER = (b"capacity " * (BLOCK // 9 + 1))[:BLOCK]  # plain ASCII: no JSON escaping needed
_NOT_JSON = (b"not json " * (BLOCK // 9 + 1))[:BLOCK]
_MARK = "\x00CONTENT\x00"


async def _repeat(block: bytes, size: int) -> AsyncIterator[bytes]:
    whole, rest = divmod(size, len(block))
    for _ in range(whole):
        yield block  # the same object every time: nothing new is held
    if rest:
        yield block[:rest]


def _completion_parts(ticket: Ticket, created: int, size: int) -> tuple[bytes, bytes]:
    body = {
        "id": f"chatcmpl-sim{ticket.id:010d}",
        "object": "chat.completion",
        "created": created,
        "model": ticket.model,
        "system_fingerprint": FINGERPRINT,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": _MARK, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage(ticket, max(1, size // 4)),
    }
    head, tail = json.dumps(body).split(json.dumps(_MARK)[1:-1])
    return head.encode(), tail.encode()


def huge_body(ticket: Ticket, created: int, size: int, valid: bool) -> tuple[AsyncIterator[bytes], int]:
    """(body pieces, content length) of a plain answer."""
    if not valid:
        return _repeat(_NOT_JSON, size), size
    head, tail = _completion_parts(ticket, created, size)

    async def pieces() -> AsyncIterator[bytes]:
        yield head
        async for block in _repeat(_FILLER, size):
            yield block
        yield tail

    return pieces(), len(head) + size + len(tail)


async def huge_stream(ticket: Ticket, created: int, size: int, valid: bool) -> AsyncIterator[bytes]:
    """A streamed answer: SSE chunks carrying ``size`` content bytes, or ``size`` bytes of one
    line that never ends."""
    if not valid:
        yield b"data: "
        async for block in _repeat(_NOT_JSON, max(0, size - len(b"data: "))):
            yield block
        return
    base = {
        "id": f"chatcmpl-sim{ticket.id:010d}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": ticket.model,
        "system_fingerprint": FINGERPRINT,
    }
    yield sse(
        {
            **base,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
        }
    )
    content = _FILLER[:STREAM_CONTENT].decode()
    frame = sse(
        {**base, "choices": [{"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}]}
    )
    whole, rest = divmod(size, STREAM_CONTENT)
    for _ in range(whole):
        yield frame  # one frame object, sent again and again
    if rest:
        yield sse(
            {
                **base,
                "choices": [
                    {"index": 0, "delta": {"content": content[:rest]}, "logprobs": None, "finish_reason": None}
                ],
            }
        )
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
    yield b"data: [DONE]\n\n"
