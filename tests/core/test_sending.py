"""The request path's shortcuts are httpx's own results: a request built from a target's
ready header block (``Sender.head`` / ``Sender.request``) is the request
``httpx.Request(content=...)`` builds, and a body read from the response's stream
(``capped.read_capped``, ``capped.body_pieces``) is what ``aiter_bytes()`` gives."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from capmon.core.routing.capped import Oversized, body_pieces, read_capped
from capmon.core.routing.transport import Sender

pytestmark = pytest.mark.unit

URL = httpx.URL("https://api.example.com/v1/chat/completions")
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
KEY = {"authorization": "Bearer sk-sending-test-0123456789"}


def _httpx_request(sender: Sender, url: httpx.URL, headers: list[tuple[bytes, bytes]], body: bytes) -> httpx.Request:
    # What Sender.request replaces: httpx encoding every header for each request.
    return httpx.Request(
        "POST",
        url,
        headers=[*headers, (b"content-type", b"application/json")],
        content=body,
        extensions={"timeout": sender._timeout},
    )


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"X-Team": "capmon", "OpenAI-Organization": "org-1"},
        {"Host": "gateway.internal"},  # an endpoint's own Host: httpx adds none
        {"Content-Length": "999"},  # an endpoint's own length: httpx keeps it
        {"x-note": "café"},  # not ascii: the block's encoding is utf-8
        {"user-agent": "mine"},  # the same name twice
    ],
)
@pytest.mark.parametrize("url", [URL, httpx.URL("http://127.0.0.1:8080/v1/responses?api-version=1")])
def test_a_request_from_the_ready_head_is_httpxs_own(extra: dict[str, str], url: httpx.URL) -> None:
    sender = Sender(httpx.AsyncHTTPTransport(), attempt_timeout=30.0, connect_timeout=5.0)
    headers = Sender.headers(extra, KEY)
    head = Sender.head(url, headers)
    for body in (BODY, b"{}"):
        want = _httpx_request(sender, url, headers, body)
        got = sender.request(url, head, body)
        assert got.method == want.method
        assert got.url == want.url
        assert got.headers.raw == want.headers.raw
        assert got.headers.encoding == want.headers.encoding
        assert got.content == want.content == body
        assert got.extensions == want.extensions
        assert isinstance(got.stream, httpx.ByteStream)
    # The ready block is copied, never changed by a request.
    assert head.headers.raw == Sender.head(url, headers).headers.raw


class _Pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes], fail: Exception | None = None) -> None:
        self.pieces = pieces
        self.fail = fail
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for p in self.pieces:
            yield p
        if self.fail is not None:
            raise self.fail

    async def aclose(self) -> None:
        self.closed = True


def _response(pieces: list[bytes], *, coding: str | None = None, fail: Exception | None = None) -> httpx.Response:
    headers = [("content-type", "application/json")] + ([("content-encoding", coding)] if coding else [])
    resp = httpx.Response(200, headers=headers, stream=_Pieces(pieces, fail))
    resp.request = httpx.Request("POST", URL)
    return resp


PIECES = [b'{"choices": ', b"", b'[{"index": 0}]', b"}"]


async def test_a_plain_body_read_from_the_stream_is_what_httpx_reads() -> None:
    ours, theirs = _response(PIECES), _response(PIECES)
    assert await read_capped(ours, 1 << 20) == b"".join([p async for p in theirs.aiter_bytes()]) == b"".join(PIECES)
    assert ours.is_stream_consumed and ours.is_closed
    assert isinstance(ours.stream, _Pieces) and ours.stream.closed
    ours, theirs = _response(PIECES), _response(PIECES)
    assert [p async for p in body_pieces(ours)] == [p async for p in theirs.aiter_bytes()]
    assert ours.is_stream_consumed and ours.is_closed


async def test_a_coded_or_already_read_body_goes_through_httpx() -> None:
    packed = gzip.compress(b"".join(PIECES))
    assert await read_capped(_response([packed[:10], packed[10:]], coding="gzip"), 1 << 20) == b"".join(PIECES)
    assert [p async for p in body_pieces(_response([packed], coding="gzip"))] == [b"".join(PIECES)]
    read = httpx.Response(200, content=b"".join(PIECES))
    assert await read_capped(read, 1 << 20) == b"".join(PIECES)


async def test_the_cap_and_a_broken_body_are_told_as_before() -> None:
    with pytest.raises(Oversized):
        await read_capped(_response([b"x" * 10, b"y" * 10]), 15)
    resp = _response([b"{"], fail=httpx.ReadError("cut"))
    with pytest.raises(httpx.ReadError) as raised:
        await read_capped(resp, 1 << 20)
    assert raised.value.request is resp.request  # as httpx's request_context names it
    resp = _response([b"{"], fail=httpx.ReadError("cut"))
    with pytest.raises(httpx.ReadError) as raised:
        _ = [p async for p in body_pieces(resp)]
    assert raised.value.request is resp.request
