"""A response's body read within a byte cap (``client.max_response_bytes``): the whole
body (:func:`read_capped`), or its pieces as they arrive (:func:`body_pieces`, which a
stream's reads count against the cap in capmon/core/routing/attempt.py, between its per-read
timeouts), and :class:`Oversized` as soon as the cap is passed.

The body is read from the transport's own stream where httpx would add nothing but cost
(no content coding, not read yet): see :func:`_raw`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

import httpx

from capmon.core.types.failure import Failure, Kind


class Oversized(Exception):
    """A body or stream went past the configured cap; reading stopped there."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"response larger than {cap} bytes")
        self.cap = cap


def oversized_failure(cap: int, status: int | None, streaming: bool) -> Failure:
    what = "stream" if streaming else "body"
    return Failure(
        Kind.OVERSIZED, f"response {what} larger than the {cap:,}-byte cap (client.max_response_bytes)", status
    )


async def read_capped(resp: httpx.Response, cap: int) -> bytes:
    """The whole body, or :class:`Oversized` as soon as more than ``cap`` bytes arrive."""
    length = resp.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise Oversized(cap)
    if not _raw(resp):
        return await _collect(resp.aiter_bytes(), cap)
    resp.is_stream_consumed = True  # what aiter_raw does, and then reads as it is read here
    try:
        body = await _collect(resp.stream, cap)  # type: ignore[arg-type]  # an async stream (_raw)
    except httpx.RequestError as e:
        _name_request(e, resp)
        raise
    await resp.aclose()
    return body


async def _collect(pieces: AsyncIterable[bytes], cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for piece in pieces:
        size += len(piece)
        if size > cap:
            raise Oversized(cap)
        parts.append(piece)
    return b"".join(parts)


def body_pieces(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it arrives, what ``resp.aiter_bytes()`` yields (but its empty pieces)."""
    return _raw_pieces(resp) if _raw(resp) else resp.aiter_bytes()


def _raw(resp: httpx.Response) -> bool:
    """Whether the body is the transport's own bytes, to be read from the response's stream
    as httpx's ``aiter_raw`` reads it, without the decoder and chunker layers around it (a
    fifth of a small answer's CPU on the aiohttp transport): no content coding, not read
    yet. Everything else, a coded body or one already read, goes through httpx."""
    return not (
        resp.is_stream_consumed
        or resp.is_closed
        or not isinstance(resp.stream, httpx.AsyncByteStream)
        or resp.headers.get_list("content-encoding")
    )


async def _raw_pieces(resp: httpx.Response) -> AsyncIterator[bytes]:
    # httpx's aiter_raw, but the chunker (with no chunk size it only drops empty pieces).
    resp.is_stream_consumed = True
    stream = resp.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    try:
        async for piece in stream:
            if piece:
                yield piece
    except httpx.RequestError as e:
        _name_request(e, resp)
        raise
    await resp.aclose()


def _name_request(e: httpx.RequestError, resp: httpx.Response) -> None:
    """As httpx's ``request_context``: an error while reading names its request."""
    try:
        e.request = resp.request
    except RuntimeError:  # a response made without one
        pass
