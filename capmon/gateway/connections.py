"""The gateway's HTTP/1.1 connections: uvicorn's protocols (httptools, the default, or
h11: ``[gateway] http``) with the limits they lack.

uvicorn closes a connection only when it has been idle after an answer
(``timeout_keep_alive``); it has no limit on how long a client may take to send its
headers, on how many connections are open (``limit_concurrency`` answers 503 per
*request*, once headers came), or on how long a client may leave an answer unread
(a stream then waits on a full socket for ever, its slot and upstream held). And its
answer to malformed HTTP is plain text. Both protocols here add, per connection:

- a header timeout: from the connection's opening, or the first byte of a next request,
  to the end of the request's headers (408 in JSON when part of a request came, else
  a quiet close);
- a connection cap: a connection past it gets a 503 in JSON (``Retry-After: 1``,
  ``Connection: close``) before anything is read, then a short lingering close so the
  client reads the answer rather than a reset; said in the log once a second at most;
- a write timeout: when the answer's bytes stay unsent past the transport's high-water
  mark for that long, the connection is aborted; the app sees the client gone, which
  cancels its work, upstream included, and frees its slot (capmon/gateway/disconnect.py);
- malformed HTTP answered in the API's JSON error shape (400, or 431 for a request line
  and headers over MAX_HEAD), ambiguous framing included: both parsers refuse what
  capmon/gateway/framing.py says, so a request hidden inside another is never answered;
- a request that asks to upgrade to a protocol the gateway does not speak answered and its
  connection closed (llhttp reads nothing after it; h11 read on).

The gateway always serves with one of these (``uvicorn.Config(http=...)``); the limits
live in one mixin (``_Guarded``), and each parser's protocol says only when a request's
headers are complete and whether it waits for a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http
import logging
import socket
import struct
import termios
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import h11
import httptools
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from capmon.gateway.disconnect import DEPARTURE, Departure, departure_of
from capmon.gateway.errors import ApiError, json_bytes
from capmon.gateway.framing import (
    Refused,
    asks_upgrade,
    check_hosts,
    check_request_line,
    check_transfer_encoding,
    read_strictly,
)
from capmon.serving import Throttled

log = logging.getLogger("capmon.gateway")

LINGER = 1.0  # seconds a refused connection may take to read its 503 and close
# Bytes of a connection's answer the kernel may hold (it doubles the figure). Left to
# autotuning, a client that reads nothing gets up to 4 MiB of kernel memory, and a
# stream that size is written before the write timeout even starts; a fixed buffer
# keeps both small and still carries about 2.5 MB/s per connection at a 100 ms round trip.
SEND_BUFFER = 128 * 1024
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: a socket's unacknowledged bytes (SIOCOUTQ)
MAX_HEAD = 16 * 1024  # bytes of a request's line and headers the gateway reads (h11's own default)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float
    keep_alive_timeout: float
    write_timeout: float
    max_connections: int


def raw_answer(err: ApiError, headers: Mapping[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, written below h11 (which has
    no request to answer yet, or is in its error state)."""
    body = json_bytes(err.body())
    try:
        reason = http.HTTPStatus(err.status).phrase
    except ValueError:
        reason = ""
    fields = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        **err.headers,
        **(headers or {}),
    }
    head = f"HTTP/1.1 {err.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items()) + "\r\n"
    return head.encode("latin-1") + body


class _Parser(h11.Connection):
    """h11's connection, reading requests as strictly as llhttp (framing.StrictBuffer),
    telling its protocol when a request's headers are complete and keeping the parse error
    that uvicorn's protocol drops."""

    def __init__(self, protocol: H11GatewayProtocol, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size)
        read_strictly(self)
        self.protocol = protocol
        self.error: h11.RemoteProtocolError | None = None
        self.in_body = False  # whether the last event read (or failed to read) was of a request's body

    def send(self, event: Any) -> Any:
        cycle = self.protocol.cycle
        if isinstance(event, h11.Response) and cycle is not None and not cycle.keep_alive:
            # The answer after which the connection closes says so, as uvicorn's httptools
            # protocol has it say (h11 adds it only when it decides the close itself).
            fields = [(k, v) for k, v in event.headers.raw_items() if k.lower() != b"connection"]
            event = h11.Response(
                status_code=event.status_code, headers=[*fields, (b"connection", b"close")], reason=event.reason
            )
        return super().send(event)

    def next_event(self) -> Any:
        self.in_body = self.their_state is h11.SEND_BODY
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            self.error = e
            raise
        if isinstance(event, h11.Request):
            self.protocol.headers_complete()
        return event


class _Guarded(asyncio.Protocol):
    """The limits, whichever parser reads the requests: mixed in before uvicorn's protocol
    (whose methods ``super()`` reaches). A parser's protocol says when a request's headers
    are complete (:meth:`headers_complete`) and when a request's answer begins
    (:meth:`_request_began`), whether it waits for the next request's first byte
    (:meth:`_between_requests`), whether part of one came (:meth:`_partial`) and whether a
    parse error is in the body of the request being answered (:meth:`_reading_body`)."""

    limits: ClassVar[ConnectionLimits]
    refusals: ClassVar[Throttled]
    stalls: ClassVar[Throttled]
    # uvicorn's protocols have these
    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    cycle: Any  # the request being answered (uvicorn's RequestResponseCycle), or None

    def _guard(self) -> None:
        self._refused = False  # past the cap: never counted among the connections
        self._lingering = False  # answered and closing: what still comes is dropped
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes waiting in the transport when the write timer was armed
        self._told: Any = None  # the request cycle whose scope has its Departure

    def _between_requests(self) -> bool:
        raise NotImplementedError

    def _partial(self) -> bool:
        raise NotImplementedError

    def _reading_body(self) -> bool:
        raise NotImplementedError

    def _request_began(self) -> None:
        """A new request's cycle is made: its task has not run, so its scope can still carry
        the departure it will watch (capmon/gateway/disconnect.py)."""
        cycle = self.cycle
        if cycle is None or cycle is self._told:
            return
        self._told = cycle
        cycle.scope.setdefault("extensions", {})[DEPARTURE] = Departure()
        if asks_upgrade(cycle.scope["headers"]):
            cycle.keep_alive = False  # answered, then closed: what follows it is not read as HTTP

    # the cap
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike: no isinstance.
        transport = cast(asyncio.Transport, transport)
        if len(self.connections) >= self.limits.max_connections:
            self._refuse(transport)
            return
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._arm_header_timer()

    def _refuse(self, transport: asyncio.Transport) -> None:
        self._refused = True
        self.transport = transport
        cap = self.limits.max_connections
        err = ApiError(
            503,
            f"the gateway has {cap} open connections, its cap (gateway.max_connections); try again shortly",
            "server_error",
            "too_many_connections",
            headers={"retry-after": "1"},
        )
        self._answer_and_close(raw_answer(err))
        self.refusals.note(f"refused a connection: {cap} open, the cap (gateway.max_connections)")

    def _answer_and_close(self, answer: bytes) -> None:
        """Write a last answer and close. Closing at once, with the client's bytes unread,
        would send a reset that can destroy the answer before the client reads it: so
        half-close, drop what still comes, and close on the client's EOF or after LINGER."""
        self.headers_complete()  # no header timeout any more: this connection is done
        self.transport.write(answer)
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(LINGER, self.transport.abort)
        else:
            self.transport.close()

    # the header timeout
    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout, self._headers_late)

    def headers_complete(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._between_requests():
            return
        if self._partial():  # part of a request came: say why it is closed
            seconds = f"{self.limits.header_timeout:g}"
            err = ApiError(
                408,
                f"the request's headers did not arrive within {seconds}s (gateway.header_timeout)",
                "invalid_request_error",
                "request_timeout",
            )
            self._answer_and_close(raw_answer(err))
        else:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # a refused or answered connection's bytes are not read
        if self._between_requests():
            self._arm_header_timer()  # the first byte of a next request on a kept-alive connection
        super().data_received(data)

    # the write timeout
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None and not self._lingering:
            self._arm_write_timer()

    def _unsent_bytes(self) -> int:
        """The answer's bytes the client has not acknowledged: the transport's buffer and
        the kernel's send queue (which takes the client's reading in large steps: the
        transport's buffer alone can stand still for seconds while the client reads)."""
        queued = 0
        sock = self.transport.get_extra_info("socket")
        if sock is not None and _OUTQ is not None:
            with contextlib.suppress(OSError, ValueError):
                queued = struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
        return int(self.transport.get_write_buffer_size()) + queued

    def _arm_write_timer(self) -> None:
        self._unsent = self._unsent_bytes()
        self._write_timer = self.loop.call_later(self.limits.write_timeout, self._write_check)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_check(self) -> None:
        """While writing is paused nothing is added: what is unsent shrinks only as the
        client takes bytes. A slow reader keeps its answer; one that took nothing in a
        whole write timeout loses it."""
        self._write_timer = None
        if self.transport.is_closing():
            return
        if self._unsent_bytes() < self._unsent:
            self._arm_write_timer()
            return
        seconds = f"{self.limits.write_timeout:g}"
        self.stalls.note(
            f"closed a connection whose client took none of its answer for {seconds}s (gateway.write_timeout)"
        )
        self.transport.abort()  # buffered bytes dropped: a close would wait for the client to read them

    # malformed HTTP
    def _malformed(self, status: int, detail: str) -> None:
        cycle = self.cycle if self._reading_body() else None  # the malformed request's own answer
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # its app's answer goes nowhere: the connection ends here
            cycle.message_event.set()
        if cycle is not None and cycle.response_started:
            # Its answer went (or began) before the body proved malformed: a 400 after it would
            # be read as the answer to the client's next request, or a proxy's next client's.
            self._answer_and_close(b"")
            return
        if status == 431:
            detail = f"its request line and headers are longer than the {MAX_HEAD} bytes the gateway reads"
        err = ApiError(status, f"malformed HTTP request: {detail}", "invalid_request_error", "malformed_http")
        self._answer_and_close(raw_answer(err))

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._header_timer, self._write_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._write_timer = self._linger_timer = None
        if self._refused:
            return  # never counted among the connections, never given a request
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            departure = departure_of(cycle.scope)
            if departure is not None:
                departure.gone()


class H11GatewayProtocol(_Guarded, H11Protocol):
    """uvicorn's h11 protocol (pure Python) with the limits."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.parser = _Parser(self, MAX_HEAD)
        self.conn = self.parser
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]  # uvicorn's: whole s
        self._guard()

    def _between_requests(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _partial(self) -> bool:
        return bool(self.conn.trailing_data[0])

    def _reading_body(self) -> bool:
        return self.parser.in_body

    def handle_events(self) -> None:
        super().handle_events()  # from data_received, and from on_response_complete for a pipelined request
        self._request_began()

    def send_400_response(self, msg: str) -> None:
        error = self.parser.error
        status = error.error_status_hint if error is not None and 400 <= error.error_status_hint < 500 else 400
        self._malformed(status, str(error) if error is not None and str(error) else msg)


class _TooLarge(Exception):
    """A request's line and headers went past MAX_HEAD (raised in httptools' callbacks)."""


class _Recording:
    """httptools' parser, keeping the text of the parse error that uvicorn's protocol drops
    (or why the gateway refused the request, from a callback: httptools raises that again as
    a parse error)."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        self.error = ""

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self.error = str(e.__context__) if isinstance(e.__context__, Refused) else str(e)
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


class _Corked:
    """The transport as one answer's cycle sees it: the answer's head (status line and
    headers) is held until its first body part, and both go out in one write. uvicorn
    writes them apart, and on loopback each write is a send that costs the gateway more
    than anything else it does for a request. Every answer sends its first body part
    right after its head (a stream's head waits for its first chunk: capmon/gateway/replies.py),
    but an answer to HEAD, which is a head alone and is not corked."""

    def __init__(self, transport: asyncio.Transport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._headed = False

    def write(self, data: bytes) -> None:
        if not self._headed and self._cycle.response_started:
            self._headed = True  # the head: uvicorn marks the answer started, then writes it
            self._head = data
            return
        if self._head is not None:
            data, self._head = self._head + data, None
        self._transport.write(data)

    def close(self) -> None:
        if self._head is not None:
            self._transport.write(self._head)
            self._head = None
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HttpToolsGatewayProtocol(_Guarded, HttpToolsProtocol):
    """uvicorn's httptools protocol (llhttp, in C: a fraction of h11's CPU per request)
    with the limits. llhttp has no limit of its own on a request's head, so it is counted
    here, twice: the bytes that came while a head was incomplete (a line that never ends)
    and the line and headers as parsed (a head that came in one read)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.parser = _Recording(self.parser)  # type: ignore[assignment]  # the parser, with its error kept
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]  # uvicorn's: whole s
        self._guard()
        self._in_head = True  # waiting for (the rest of) a request's line and headers
        self._head = 0  # bytes received since the last request ended
        self._parsed = 0  # bytes of this request's line and headers parsed
        self._hosts = 0  # this request's Host fields
        self._too_large = False

    def _between_requests(self) -> bool:
        return self._in_head and (self.cycle is None or self.cycle.response_complete)

    def _partial(self) -> bool:
        return self._head > 0

    def _reading_body(self) -> bool:
        return not self._in_head

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head += len(data)
        super().data_received(data)
        if self._in_head and self._head > MAX_HEAD and not self._lingering:
            self._too_large = True
            self.send_400_response("")

    def on_message_begin(self) -> None:
        self._parsed = 0
        self._hosts = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # "name: value\r\n"
        field = name.lower()
        if field == b"transfer-encoding":
            check_transfer_encoding(value)  # llhttp takes any list that ends in chunked
        elif field == b"host":
            self._hosts += 1
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._parsed += n
        if self._parsed > MAX_HEAD:
            self._too_large = True
            raise _TooLarge()  # httptools raises it again as a parse error: send_400_response

    def on_headers_complete(self) -> None:
        # Before a cycle is made, and while a refusal is still of a head (not of a body whose answer began).
        version = self.parser.get_http_version().encode()
        check_request_line(self.parser.get_method(), version)
        check_hosts(self._hosts, version)
        self._in_head = False
        self.headers_complete()
        super().on_headers_complete()
        self._request_began()
        cycle = self.cycle
        # The answer to HEAD is its head alone: nothing comes after to carry it.
        if cycle is not None and cycle.scope["method"] != "HEAD" and not isinstance(cycle.transport, _Corked):
            cycle.transport = _Corked(self.transport, cycle)

    def on_message_complete(self) -> None:
        self._in_head = True
        self._head = 0
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._lingering:
            return
        if self._too_large:
            self._malformed(431, "")
            return
        error = self.parser.error if isinstance(self.parser, _Recording) else ""
        self._malformed(400, error or msg)


PROTOCOLS: dict[str, type[_Guarded]] = {"httptools": HttpToolsGatewayProtocol, "h11": H11GatewayProtocol}


def protocol_for(limits: ConnectionLimits, http: str = "httptools") -> type[_Guarded]:
    """A protocol class for one server: its parser, its limits, and its own log throttles."""
    return type(
        "BoundGatewayProtocol",
        (PROTOCOLS[http],),
        {"limits": limits, "refusals": Throttled(log), "stalls": Throttled(log, logging.INFO)},
    )
