"""Request smuggling, over raw sockets, for both HTTP parsers the gateway serves with
(``[gateway] http``): a request whose framing two parsers could read two ways (a proxy in
front one way, the gateway the other) is refused whole, one 400 in the API's JSON error
shape and the connection closed, so that a request hidden behind it is never answered.

Every case sends an outer request and, behind it, a hidden one (``HIDDEN``). httptools
(llhttp) refused most of these already; h11 read most of them its own lenient way (it folds
continuation lines, takes a bare LF for CRLF, prefers Transfer-Encoding to Content-Length
rather than refusing both) and answered the hidden request too. A few the gateway adds for
both: a transfer coding other than chunked (httptools passed ``gzip, chunked`` through
undecoded), an HTTP version other than 1.0 and 1.1, CONNECT; and a request that asks to
upgrade to a protocol the gateway does not speak is answered and its connection closed."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.helpers import running
from tests.gateway.sockets import Received, answers, connect, receive
from tests.gateway.test_connections import assert_api_error

pytestmark = pytest.mark.looptime

HOST = b"Host: 127.0.0.1\r\n"
HIDDEN = b"GET /health?hidden=1 HTTP/1.1\r\n" + HOST + b"\r\n"
GET = b"GET /health HTTP/1.1\r\n" + HOST  # a head not yet ended: the case adds its lines
CHUNKED = GET + b"Transfer-Encoding: chunked\r\n\r\n"  # a whole head: the case adds the body
LAST = b"0\r\n\r\n"  # an empty chunked body (and 5 bytes, for a Content-Length: 5 to cover)

REFUSED = {
    # Content-Length and Transfer-Encoding together: which one ends the body?
    "cl-then-te": GET + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + LAST + HIDDEN,
    "te-then-cl": GET + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    "te-and-cl-0": GET + b"Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n" + LAST + HIDDEN,
    "te-and-cl-http-1.0": b"GET /health HTTP/1.0\r\n" + HOST + b"Connection: keep-alive\r\n"
    b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    # obs-fold: a line starting with whitespace continues the one before (h11) or is refused
    "te-folded-and-cl": GET + b"Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" + LAST + HIDDEN,
    "te-tab-folded-and-cl": GET + b"Content-Length: 5\r\nTransfer-Encoding:\r\n\tchunked\r\n\r\n" + LAST + HIDDEN,
    "fold-hides-te": GET + b"X-Padding: a\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    "folded-header": GET + b"X-Padding: a\r\n b\r\n\r\n" + HIDDEN,
    # a bare LF where CRLF belongs: where does the head end?
    "bare-lf-head": b"GET /health HTTP/1.1\nHost: 127.0.0.1\n\n" + HIDDEN,
    "bare-lf-request-line": b"GET /health HTTP/1.1\n" + HOST + b"\r\n" + HIDDEN,
    "bare-lf-header-line": GET + b"X-Padding: a\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    "bare-lf-blank-line": GET + b"\n" + HIDDEN,
    "bare-cr": GET + b"X-Padding: a\rTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    # Content-Length: one, and digits only
    "cl-twice-same": GET + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
    "cl-twice-different": GET + b"Content-Length: 5\r\nContent-Length: 0\r\n\r\n" + LAST + HIDDEN,
    "cl-list-same": GET + b"Content-Length: 5, 5\r\n\r\n" + LAST + HIDDEN,
    "cl-list-different": GET + b"Content-Length: 5, 0\r\n\r\n" + LAST + HIDDEN,
    "cl-plus-sign": GET + b"Content-Length: +5\r\n\r\n" + LAST + HIDDEN,
    "cl-space-inside": GET + b"Content-Length: 0 5\r\n\r\n" + LAST + HIDDEN,
    "cl-overflow": GET + b"Content-Length: 99999999999999999999999\r\n\r\n" + LAST + HIDDEN,
    "cl-past-64-bits": GET + b"Content-Length: 99999999999999999999\r\n\r\n" + LAST + HIDDEN,  # 20 digits
    # whitespace before the colon: is it the same field?
    "space-before-colon-cl": GET + b"Content-Length : 5\r\n\r\n" + LAST + HIDDEN,
    "space-before-colon-te": GET + b"Transfer-Encoding : chunked\r\n\r\n" + LAST + HIDDEN,
    "tab-before-colon-te": GET + b"Transfer-Encoding\t: chunked\r\n\r\n" + LAST + HIDDEN,
    # transfer codings: chunked alone, once
    "te-gzip-chunked": GET + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + LAST + HIDDEN,
    "te-gzip-then-chunked": GET + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n" + LAST + HIDDEN,
    "te-chunked-identity": GET + b"Transfer-Encoding: chunked, identity\r\n\r\n" + LAST + HIDDEN,
    "te-identity": GET + b"Transfer-Encoding: identity\r\n\r\n" + HIDDEN,
    "te-chunked-chunked": GET + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + LAST + HIDDEN,
    "te-twice": GET + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + LAST + HIDDEN,
    "te-leading-comma": GET + b"Transfer-Encoding: , chunked\r\n\r\n" + LAST + HIDDEN,
    "te-vertical-tab": GET + b"Transfer-Encoding: \x0bchunked\r\n\r\n" + LAST + HIDDEN,
    # control characters in a value
    "control-in-value": GET + b"X-Padding: a\x01b\r\n\r\n" + HIDDEN,
    "del-in-value": GET + b"X-Padding: a\x7fb\r\n\r\n" + HIDDEN,
    # the request line: HTTP/1.0 and 1.1 only; no tunnels
    "http-2.0": b"GET /health HTTP/2.0\r\n" + HOST + b"\r\n" + HIDDEN,
    "http-1.2": b"GET /health HTTP/1.2\r\n" + HOST + b"\r\n" + HIDDEN,
    "http-0.9": b"GET /health\r\n\r\n" + HIDDEN,
    "http2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + HIDDEN,
    "connect": b"CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + HOST + b"\r\n" + HIDDEN,
    "connect-path": b"CONNECT /health HTTP/1.1\r\n" + HOST + b"\r\n" + HIDDEN,
    # Host: one (which of two would a proxy have routed by?), and one there must be in HTTP/1.1
    "two-hosts": GET + b"Host: 10.0.0.1\r\n\r\n" + HIDDEN,
    "no-host": b"GET /health HTTP/1.1\r\n\r\n" + HIDDEN,
    # a chunk's size line
    "chunk-size-space": CHUNKED + b"1 \r\nA\r\n" + LAST + HIDDEN,
    "chunk-size-tab": CHUNKED + b"1\t\r\nA\r\n" + LAST + HIDDEN,
    "chunk-size-overflow": CHUNKED + b"10000000000000001\r\nA\r\n" + LAST + HIDDEN,
    "chunk-size-bare-lf": CHUNKED + b"1\nA\r\n" + LAST + HIDDEN,
    "chunk-data-bare-lf": CHUNKED + b"1\r\nA\n" + LAST + HIDDEN,
    "chunk-ext-empty": CHUNKED + b"1;\r\nA\r\n" + LAST + HIDDEN,
    "chunk-ext-space": CHUNKED + b"1;a \r\nA\r\n" + LAST + HIDDEN,
    "chunk-ext-control": CHUNKED + b"1;a\x01\r\nA\r\n" + LAST + HIDDEN,
    "chunk-ext-obs-text": CHUNKED + b"1;a=\xe9\r\nA\r\n" + LAST + HIDDEN,
    # trailers: the same lines as a head's, and no framing
    "trailer-cl": CHUNKED + b"0\r\nContent-Length: 5\r\n\r\n" + HIDDEN,
    "trailer-te": CHUNKED + b"0\r\nTransfer-Encoding: chunked\r\n\r\n" + HIDDEN,
    "trailer-folded": CHUNKED + b"0\r\nX-Trailer: 1\r\n 2\r\n\r\n" + HIDDEN,
    "trailer-bare-lf": CHUNKED + b"0\r\nX-Trailer: 1\n\r\n" + HIDDEN,
    "last-chunk-bare-lf": CHUNKED + b"0\r\n\n" + HIDDEN,
    "trailer-control": CHUNKED + b"0\r\nX-Trailer: a\x01\r\n\r\n" + HIDDEN,
}

# Asking to upgrade to a protocol the gateway does not speak: llhttp reads nothing after
# such a request, h11 went on to the next one; now both answer it and close.
UPGRADES = {
    "upgrade": GET + b"Upgrade: foo\r\nConnection: Upgrade\r\n\r\n" + HIDDEN,
    # what curl --http2 sends to an http:// URL
    "upgrade-h2c": GET + b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"
    b"\r\n" + HIDDEN,
    "upgrade-with-body": GET + b"Upgrade: foo\r\nConnection: Upgrade\r\nContent-Length: 5\r\n\r\n" + LAST + HIDDEN,
}

# Well framed: both parsers answer the outer request and the one behind it (this is what
# makes the count of answers above mean something).
ANSWERED = {
    "pipelined": GET + b"\r\n" + HIDDEN,
    "content-length-body": GET + b"Content-Length: 5\r\n\r\nhello" + HIDDEN,
    "chunked-ext-and-trailer": CHUNKED + b'1;a=b;c="d e"\r\nA\r\n0\r\nX-Trailer: 1\r\n\r\n' + HIDDEN,
    "empty-line-before-request": GET + b"\r\n\r\n" + HIDDEN,  # RFC 9112 2.2: a server ignores it
    "te-uppercase": GET + b"Transfer-Encoding: CHUNKED\r\n\r\n" + LAST + HIDDEN,
    "cl-spaces-around": GET + b"Content-Length: \t 5 \r\n\r\n" + LAST + HIDDEN,
    "tab-and-obs-text-in-value": GET + b"X-Padding: a\tb\xe9\r\n\r\n" + HIDDEN,
    "upgrade-without-connection-upgrade": GET + b"Upgrade: foo\r\n\r\n" + HIDDEN,
}


async def exchange(gateway: str, raw: bytes) -> Received:
    """Send ``raw`` in one write on a new connection; what comes back until the gateway
    closes (or 5 s pass: a connection kept alive)."""
    async with running(gateway=gateway) as gw:
        sock = await connect(gw.server.port)
        try:
            await asyncio.get_running_loop().sock_sendall(sock, raw)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = await receive(sock, 5.0)
        sock.close()
    return got


@pytest.mark.parametrize("raw", REFUSED.values(), ids=REFUSED.keys())
async def test_ambiguous_framing_gets_one_400_and_the_hidden_request_is_never_answered(
    raw: bytes, parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    got = await exchange(parser, raw)
    found = answers(got.data)
    assert len(found) == 1, found  # before: h11 answered the outer request and the hidden one
    assert_api_error(Received(found[0], got.closed), 400, "malformed_http")
    # A refusal found in a body (a chunk, a trailer) once the request's app had begun: its
    # answer is dropped quietly (before: a traceback, its write after the 400's close).
    assert not [r for r in caplog.records if r.exc_info], caplog.text


@pytest.mark.parametrize("raw", UPGRADES.values(), ids=UPGRADES.keys())
async def test_a_request_to_upgrade_is_answered_and_its_connection_closed(raw: bytes, parser: str) -> None:
    got = await exchange(parser, raw)
    found = answers(got.data)
    assert len(found) == 1, found
    answer = Received(found[0], got.closed)
    assert answer.status == 200 and answer.headers["connection"] == "close"
    assert got.closed  # before: httptools held the connection open reading nothing; h11 answered the hidden request


@pytest.mark.parametrize("raw", ANSWERED.values(), ids=ANSWERED.keys())
async def test_well_framed_requests_one_behind_the_other_are_all_answered(raw: bytes, parser: str) -> None:
    got = await exchange(parser, raw)
    assert [Received(a, False).status for a in answers(got.data)] == [200, 200]


async def test_a_body_found_malformed_after_its_answer_gets_no_second_answer(parser: str) -> None:
    # /health answers without reading the body; the bad chunk comes after. A 400 now would be
    # read as the answer to the client's next request (or a proxy's next client's).
    async with running(gateway=parser) as gw:
        loop = asyncio.get_running_loop()
        sock = await connect(gw.server.port)
        await loop.sock_sendall(sock, CHUNKED)
        first = await receive(sock, 2.0)
        try:
            await loop.sock_sendall(sock, b"zz\r\n" + HIDDEN)
        except (BrokenPipeError, ConnectionResetError):
            pass
        then = await receive(sock, 5.0)
        sock.close()
    assert [Received(a, False).status for a in answers(first.data)] == [200]
    assert then.data == b"" and then.closed  # before: a 400 after the 200, on both parsers
