"""Both transports (httpcore and aiohttp) against a real HTTP server on loopback.

The server is a small raw asyncio HTTP/1.1 server in the test's own event loop, so it
can misbehave on purpose at the byte level: hold a stream open, hang, hang up before or
in the middle of an answer, reset the connection, or answer with garbage. Every test
runs on both transports, and every failure must come out as the httpx exception that
capmon.core.providers.classify classifies as a transient failure (timeouts as "timeout: ...", a
refused connection as UNREACHABLE, its cause read from either), with no key in its text or in any log.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import socket
import struct
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from capmon.core.providers.classify import classify_exception
from capmon.core.routing import transport as transport_module
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.transport import HttpcoreTransport, TransportKind, make_transport, resolve
from capmon.core.routing.transport_aiohttp import AiohttpTransport
from capmon.core.types.failure import Cause, Kind
from capmon.core.types.result import Request as ClientRequest
from capmon.sim.server import running_simulator
from tests.reliability.helpers import ENV, scenario, set_fault, sim_config
from tests.support import pools
from tests.support.pools import PoolStats

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

KINDS = [k.value for k in TransportKind if k is not TransportKind.AUTO]
KEY = "sk-transport-test-0123456789abcdefghij"
URL_KEY = "AIzaTransportTestQueryKey0123456789"
HEADERS = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY}


# ---------------------------------------------------------------- a raw HTTP server


@dataclass
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass(eq=False)
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(
        self,
        status: str = "200 OK",
        headers: tuple[tuple[str, str], ...] = (),
        chunked: bool = False,
        length: int | None = None,
    ) -> None:
        lines = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers]
        if chunked:
            lines.append("transfer-encoding: chunked")
        if length is not None:
            lines.append(f"content-length: {length}")
        await self.send(("\r\n".join(lines) + "\r\n\r\n").encode())

    async def chunk(self, data: bytes) -> None:
        await self.send(b"%x\r\n%s\r\n" % (len(data), data))

    async def until_closed(self) -> None:
        """Wait for the client to close the connection."""
        with contextlib.suppress(ConnectionError):
            while await self.reader.read(65536):
                pass

    def reset(self) -> None:
        """Close with an RST instead of a FIN."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()


Handler = Callable[[Conn, Request], Awaitable[bool]]  # returns True to keep the connection for the next request


@dataclass
class RawServer:
    handlers: dict[str, Handler]
    open: int = 0
    peak: int = 0
    accepted: int = 0
    requests: list[Request] = field(default_factory=list)
    _server: asyncio.base_events.Server | None = None
    _conns: set[Conn] = field(default_factory=set)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}?key={URL_KEY}"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Cut what is still open; each handler then ends by itself (cancelling them would
        # make asyncio's stream callback log the cancellation as an error).
        for conn in list(self._conns):
            conn.writer.transport.abort()
        while self.open:
            self._idle.clear()
            await self._idle.wait()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open += 1
        self.peak = max(self.peak, self.open)
        conn = Conn(reader, writer)
        self._conns.add(conn)
        try:
            while True:
                req = await self._read(reader)
                if req is None:
                    return
                self.requests.append(req)
                handler = self.handlers[req.path.partition("?")[0]]
                if not await handler(conn, req):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self.open -= 1
            self._conns.discard(conn)
            self._idle.set()
            if not writer.transport.is_closing():
                writer.close()

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        first, *lines = head.decode("latin-1").split("\r\n")
        method, path, _ = first.split(" ", 2)
        headers = [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines if line)]
        length = int(dict(headers).get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        return Request(method, path, headers, body)


ANSWER = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}).encode()


async def answer(conn: Conn, req: Request) -> bool:
    await conn.head(headers=(("content-type", "application/json"),), length=len(ANSWER))
    await conn.send(ANSWER)
    return True


@contextlib.asynccontextmanager
async def serving(**handlers: Handler) -> AsyncIterator[RawServer]:
    async with RawServer({"/" + k.replace("_", "-"): v for k, v in handlers.items()}) as srv:
        yield srv


@contextlib.asynccontextmanager
async def client(
    kind: str, *, max_connections: int = 8, timeout: httpx.Timeout | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = make_transport(kind, max_connections=max_connections, connect_timeout=5.0)
    async with httpx.AsyncClient(transport=transport, timeout=timeout or httpx.Timeout(30.0, connect=5.0)) as c:
        yield c


def pool_stats(c: httpx.AsyncClient) -> PoolStats:
    transport = c._transport  # the client's one transport (httpx keeps it private)
    assert isinstance(transport, (HttpcoreTransport, AiohttpTransport))
    return pools.pool_stats(transport)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


def no_secret_in(exc: BaseException) -> None:
    """Neither the exception nor anything chained to it names a key."""
    texts = ["".join(traceback.format_exception(exc))]
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen), repr(seen.args)]
        seen = seen.__cause__ or seen.__context__
    for text in texts:
        assert KEY not in text and URL_KEY not in text, text


# ---------------------------------------------------------------- make_transport


def test_make_transport_builds_each_kind_and_refuses_others() -> None:
    assert isinstance(make_transport("httpx", max_connections=4, connect_timeout=1.0), HttpcoreTransport)
    assert isinstance(make_transport(TransportKind.AIOHTTP, max_connections=4, connect_timeout=1.0), AiohttpTransport)
    # auto (the default): aiohttp, its extra being installed here (tests/test_extras.py: httpx without it)
    assert isinstance(make_transport("auto", max_connections=4, connect_timeout=1.0), AiohttpTransport)
    assert resolve("auto") is TransportKind.AIOHTTP and resolve("httpx") is TransportKind.HTTPX
    with pytest.raises(ValueError, match=r"client.transport: expected one of auto, httpx, aiohttp, got 'curl'"):
        make_transport("curl", max_connections=4, connect_timeout=1.0)
    with pytest.raises(ValueError, match=r"client.max_connections: expected at least 1, got 0"):
        make_transport("aiohttp", max_connections=0, connect_timeout=1.0)


# ---------------------------------------------------------------- what goes on the wire


async def test_a_request_and_its_answer_are_the_same_on_both_transports(kind: str) -> None:
    async with serving(chat=answer) as srv, client(kind) as c:
        r = await c.post(srv.url("/chat"), json={"model": "m", "stream": False}, headers=HEADERS)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
        assert r.headers["content-type"] == "application/json"
    [req] = srv.requests
    names = [k for k, _ in req.headers]
    assert req.method == "POST" and req.path == f"/chat?key={URL_KEY}"
    assert json.loads(req.body) == {"model": "m", "stream": False}
    got = dict(req.headers)
    assert got["authorization"] == f"Bearer {KEY}" and got["x-api-key"] == KEY
    assert got["content-type"] == "application/json" and got["content-length"] == str(len(req.body))
    assert got["user-agent"].startswith("python-httpx/")  # httpx's headers, not aiohttp's
    assert names.count("host") == 1 and "cookie" not in names


async def test_httpx_decodes_a_compressed_answer_once(kind: str) -> None:
    body = gzip.compress(ANSWER)

    async def gzipped(conn: Conn, req: Request) -> bool:
        await conn.head(headers=(("content-type", "application/json"), ("content-encoding", "gzip")), length=len(body))
        await conn.send(body)
        return True

    async with serving(gz=gzipped) as srv, client(kind) as c:
        r = await c.get(srv.url("/gz"))
        assert r.json()["choices"][0]["message"]["content"] == "ok"


async def test_cookies_are_kept_by_httpx_alone(kind: str) -> None:
    async def set_cookie(conn: Conn, req: Request) -> bool:
        await conn.head(headers=(("set-cookie", "session=abc; Path=/"),), length=2)
        await conn.send(b"ok")
        return True

    async with serving(chat=set_cookie) as srv, client(kind) as c:
        await c.get(srv.url("/chat"))
        await c.get(srv.url("/chat"))
    cookies = [v for k, v in srv.requests[1].headers if k == "cookie"]
    assert cookies == ["session=abc"]  # kept by httpx, sent back exactly once


# ---------------------------------------------------------------- streaming


async def test_a_stream_arrives_chunk_by_chunk(kind: str) -> None:
    go = asyncio.Event()
    finished = asyncio.Event()

    async def sse(conn: Conn, req: Request) -> bool:
        await conn.head(headers=(("content-type", "text/event-stream"),), chunked=True)
        await conn.chunk(b'data: {"n": 1}\n\n')
        await go.wait()  # the rest only once the client has the first chunk
        await conn.chunk(b'data: {"n": 2}\n\n')
        await conn.chunk(b"data: [DONE]\n\n")
        await conn.send(b"0\r\n\r\n")
        finished.set()
        return True

    async with serving(sse=sse) as srv, client(kind) as c:
        async with c.stream("POST", srv.url("/sse"), json={"stream": True}, headers=HEADERS) as r:
            lines = r.aiter_lines()
            first = await lines.__anext__()
            assert first == 'data: {"n": 1}' and not finished.is_set()
            go.set()
            rest = [line async for line in lines if line]
        assert rest == ['data: {"n": 2}', "data: [DONE]"] and finished.is_set()


async def hold_stream(conn: Conn, req: Request) -> bool:
    """One chunk, then nothing until the client goes away."""
    await conn.head(headers=(("content-type", "text/event-stream"),), chunked=True)
    await conn.chunk(b'data: {"n": 1}\n\n')
    await conn.until_closed()
    return False


async def hang(conn: Conn, req: Request) -> bool:
    await conn.until_closed()
    return False


async def test_streams_closed_or_cancelled_midway_release_their_connections(kind: str) -> None:
    limit = 3
    timeout = httpx.Timeout(30.0, connect=5.0, pool=5.0)
    async with (
        serving(hold=hold_stream, hang=hang, chat=answer) as srv,
        client(kind, max_connections=limit, timeout=timeout) as c,
    ):
        for _ in range(15):  # closed by leaving the block after the first chunk
            async with c.stream("POST", srv.url("/hold"), headers=HEADERS) as r:
                chunks = r.aiter_raw()  # held: a dropped iterator may close the response when collected
                assert (await chunks.__anext__()).startswith(b"data:")

        got_first = asyncio.Event()

        async def read_forever() -> None:
            async with c.stream("POST", srv.url("/hold"), headers=HEADERS) as r:
                async for _ in r.aiter_raw():
                    got_first.set()

        for _ in range(15):  # cancelled while waiting for the next chunk
            got_first.clear()
            task = asyncio.create_task(read_forever())
            await got_first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        # Many at once, cancelled together: the pool holds at most `limit` of them.
        tasks = [asyncio.create_task(read_forever()) for _ in range(2 * limit)]
        await asyncio.sleep(1.0)
        assert pool_stats(c) == PoolStats(open=limit, in_use=limit)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

        # Cancelled before any answer came (the server never sends one).
        posts = [asyncio.create_task(c.post(srv.url("/hang"), headers=HEADERS)) for _ in range(2 * limit)]
        await asyncio.sleep(1.0)
        assert pool_stats(c).in_use == limit
        for p in posts:
            p.cancel()
        await asyncio.gather(*posts, return_exceptions=True)
        assert pool_stats(c).in_use == 0

        # A leaked connection would hold a slot for ever: these would run into PoolTimeout.
        answers = await asyncio.gather(*[c.post(srv.url("/chat"), headers=HEADERS) for _ in range(2 * limit)])
        assert all(a.status_code == 200 for a in answers)
        stats = pool_stats(c)
        assert stats.in_use == 0 and 1 <= stats.open <= limit  # the answered ones are kept for reuse
        await asyncio.sleep(0.1)
    assert srv.peak <= limit
    assert srv.accepted >= 30 + limit  # a half-read stream or unanswered request is never reused
    # of the 2 x limit at once, only `limit` got a connection before they were cancelled
    assert len([r for r in srv.requests if r.path.startswith("/hold")]) == 30 + limit


async def slow_answer(conn: Conn, req: Request) -> bool:
    await asyncio.sleep(0.1)  # long enough for a burst to need a connection each
    return await answer(conn, req)


@pytest.mark.looptime(False)  # aiohttp's pool ages connections by the monotonic clock: real time, ~1.5 s
async def test_a_bursts_extra_connections_expire_under_steady_traffic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "KEEPALIVE_EXPIRY", 0.3)
    async with serving(slow=slow_answer, chat=answer) as srv, client("aiohttp", max_connections=8) as c:
        answers = await asyncio.gather(*[c.post(srv.url("/slow"), headers=HEADERS) for _ in range(8)])
        assert all(a.status_code == 200 for a in answers) and pool_stats(c).open == 8
        # Then one request every 20 ms: each of the 8 would be reused within the 0.3 s
        # keep-alive if the pool took the oldest first, and none would ever expire.
        for _ in range(60):
            assert (await c.post(srv.url("/chat"), headers=HEADERS)).status_code == 200
            await asyncio.sleep(0.02)
        assert pool_stats(c).open <= 2


# ---------------------------------------------------------------- timeouts


async def test_a_silent_server_is_a_read_timeout(kind: str) -> None:
    async with serving(hang=hang) as srv, client(kind, timeout=httpx.Timeout(2.0, connect=5.0)) as c:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(httpx.ReadTimeout) as info:
            await c.post(srv.url("/hang"), json={}, headers=HEADERS)
        assert 2.0 <= loop.time() - t0 < 3.5
    failure = classify_exception(info.value)
    assert failure.kind is Kind.TRANSIENT and failure.reason.startswith("timeout: read") and failure.code is None
    no_secret_in(info.value)


async def test_a_stream_that_stalls_is_a_read_timeout(kind: str) -> None:
    async with (
        serving(hold=hold_stream) as srv,
        client(kind, timeout=httpx.Timeout(2.0, connect=5.0)) as c,
        c.stream("POST", srv.url("/hold"), headers=HEADERS) as r,
    ):
        chunks = r.aiter_raw()
        await chunks.__anext__()
        with pytest.raises(httpx.ReadTimeout) as info:
            await chunks.__anext__()
    assert classify_exception(info.value).reason.startswith("timeout: read")
    no_secret_in(info.value)


@pytest.fixture
def unanswered_port() -> Any:
    """A port whose accept queue is full: connection attempts get no answer at all."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    yield port
    for s in fillers:
        s.close()
    listener.close()


async def test_a_connect_that_gets_no_answer_is_a_connect_timeout(kind: str, unanswered_port: int) -> None:
    async with client(kind, timeout=httpx.Timeout(30.0, connect=1.0)) as c:
        with pytest.raises(httpx.ConnectTimeout) as info:
            await c.post(f"http://127.0.0.1:{unanswered_port}/v1?key={URL_KEY}", json={}, headers=HEADERS)
    failure = classify_exception(info.value)
    assert failure.reason.startswith("timeout: connect") and failure.code == Cause.TIMEOUT
    assert failure.kind is Kind.UNREACHABLE
    no_secret_in(info.value)


async def test_the_transports_own_connect_timeout_applies_without_a_request_timeout(
    kind: str, unanswered_port: int
) -> None:
    transport = make_transport(kind, max_connections=2, connect_timeout=1.5)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(httpx.ConnectTimeout):
        await transport.handle_async_request(httpx.Request("GET", f"http://127.0.0.1:{unanswered_port}/"))
    assert 1.5 <= loop.time() - t0 < 3.0
    await transport.aclose()


async def test_waiting_too_long_for_a_pooled_connection_is_a_pool_timeout(kind: str) -> None:
    timeout = httpx.Timeout(30.0, connect=5.0, pool=1.0)
    async with serving(hold=hold_stream, chat=answer) as srv, client(kind, max_connections=1, timeout=timeout) as c:
        async with c.stream("POST", srv.url("/hold"), headers=HEADERS) as r:
            chunks = r.aiter_raw()  # held: a dropped iterator may close the response when collected
            await chunks.__anext__()
            with pytest.raises(httpx.PoolTimeout) as info:
                await c.post(srv.url("/chat"), headers=HEADERS)
        assert (await c.post(srv.url("/chat"), headers=HEADERS)).status_code == 200  # the slot is back
    failure = classify_exception(info.value)
    assert failure.reason.startswith("timeout: waiting for a pooled connection") and failure.code is None
    no_secret_in(info.value)


# ---------------------------------------------------------------- broken connections and answers


async def test_a_refused_connection_is_a_connect_error(kind: str) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection attempt is refused
    try:
        async with client(kind) as c:
            with pytest.raises(httpx.ConnectError) as info:
                await c.post(f"http://127.0.0.1:{closed.getsockname()[1]}/v1?key={URL_KEY}", json={}, headers=HEADERS)
    finally:
        closed.close()
    failure = classify_exception(info.value)
    assert failure.kind is Kind.UNREACHABLE and failure.code == Cause.REFUSED, failure
    assert failure.reason.startswith("connection refused (ConnectError: ")
    no_secret_in(info.value)


async def hang_up(conn: Conn, req: Request) -> bool:
    return False  # closes without a word


async def half_body(conn: Conn, req: Request) -> bool:
    await conn.head(length=100)
    await conn.send(b'{"id": "chatcmpl-')
    return False


async def reset_mid_body(conn: Conn, req: Request) -> bool:
    await conn.head(length=100)
    await conn.send(b'{"id": "chatcmpl-')
    conn.reset()
    return False


async def reset_at_once(conn: Conn, req: Request) -> bool:
    conn.reset()
    return False


async def garbage(conn: Conn, req: Request) -> bool:
    await conn.send(b"HELLO THIS IS NOT HTTP\r\n\r\n")
    return False


async def bad_header(conn: Conn, req: Request) -> bool:
    await conn.send(b"HTTP/1.1 200 OK\r\nthis line is no header\r\ncontent-length: 2\r\n\r\nok")
    return False


async def bad_chunk(conn: Conn, req: Request) -> bool:
    await conn.head(chunked=True)
    await conn.send(b"zz\r\nnot a chunk size\r\n")
    return False


async def stream_cut(conn: Conn, req: Request) -> bool:
    await conn.head(headers=(("content-type", "text/event-stream"),), chunked=True)
    await conn.chunk(b'data: {"n": 1}\n\n')
    await conn.send(b'40\r\ndata: {"n"')  # a chunk promised, cut short
    return False


BROKEN = {
    "hang-up": (
        hang_up,
        (httpx.RemoteProtocolError,),
        "protocol error (RemoteProtocolError: Server disconnected without sending a response.",
    ),
    "half-body": (
        half_body,
        (httpx.RemoteProtocolError,),
        "protocol error (RemoteProtocolError: peer closed connection without sending complete message body",
    ),
    "reset-mid-body": (reset_mid_body, (httpx.ReadError, httpx.RemoteProtocolError), ""),
    "reset-at-once": (reset_at_once, (httpx.ReadError, httpx.RemoteProtocolError), ""),
    "garbage": (garbage, (httpx.RemoteProtocolError,), "protocol error (RemoteProtocolError: "),
    "bad-header": (bad_header, (httpx.RemoteProtocolError,), "protocol error (RemoteProtocolError: "),
    "bad-chunk": (bad_chunk, (httpx.RemoteProtocolError,), "protocol error (RemoteProtocolError: "),
}


@pytest.mark.parametrize("fault", list(BROKEN))
async def test_a_broken_connection_or_answer_is_a_transient_httpx_error(
    kind: str, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    handler, expected, reason = BROKEN[fault]
    caplog.set_level(logging.DEBUG)
    async with serving(broken=handler) as srv, client(kind) as c:
        with pytest.raises(httpx.TransportError) as info:
            await c.post(srv.url("/broken"), json={"model": "m"}, headers=HEADERS)
    assert isinstance(info.value, expected), repr(info.value)
    failure = classify_exception(info.value)
    assert failure.kind is Kind.TRANSIENT and failure.code is None, failure  # it reached the server
    assert failure.reason.startswith(reason), failure.reason
    no_secret_in(info.value)
    assert KEY not in caplog.text and URL_KEY not in caplog.text


async def test_a_stream_cut_midway_raises_a_transient_httpx_error(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        serving(cut=stream_cut) as srv,
        client(kind) as c,
        c.stream("POST", srv.url("/cut"), headers=HEADERS) as r,
    ):
        chunks = r.aiter_raw()
        assert (await chunks.__anext__()).startswith(b"data:")
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)) as info:
            async for _ in chunks:
                pass
    failure = classify_exception(info.value)
    assert failure.kind is Kind.TRANSIENT and failure.code is None
    no_secret_in(info.value)
    assert KEY not in caplog.text and URL_KEY not in caplog.text


# ---------------------------------------------------------------- under the FallbackClient


async def test_the_fallback_client_chats_and_streams_on_either_transport(kind: str) -> None:
    async with running_simulator(scenario()) as sim:
        cfg = sim_config(sim.base_url)
        transport = make_transport(
            kind, max_connections=cfg.client.max_connections, connect_timeout=cfg.client.connect_timeout
        )
        async with FallbackClient(cfg, environ=ENV, transport=transport) as fc:
            results = await asyncio.gather(*[fc.chat(ClientRequest.of(f"item {i}")) for i in range(20)])
            assert all(r.content for r in results) and {r.model for r in results} <= {"flagship", "medium", "small"}
            pieces = [p async for p in fc.stream("Count to five.")]
            assert len(pieces) > 1
            await set_fault(sim, mode="reset", count=1, model="sim-flagship")
            r = await fc.chat("after a reset")
        if kind == TransportKind.AIOHTTP:
            assert transport.client.closed  # type: ignore[attr-defined]  # closed with the FallbackClient
    [failed] = [a for a in r.attempts if a.kind is not None]
    assert failed.kind is Kind.TRANSIENT and failed.decision == "retry"
    assert failed.reason.startswith("protocol error (RemoteProtocolError: peer closed connection"), failed.reason
