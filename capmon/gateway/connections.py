"""The gateway's HTTP/1.1 connections: uvicorn's h11 protocol with the limits it lacks.

uvicorn closes a connection only when it has been idle after an answer
(``timeout_keep_alive``); it has no limit on how long a client may take to send its
headers, on how many connections are open (``limit_concurrency`` answers 503 per
*request*, once headers came), or on how long a client may leave an answer unread
(a stream then waits on a full socket for ever, its slot and upstream held). And its
answer to malformed HTTP is plain text. This protocol adds, per connection:

- a header timeout: from the connection's opening, or the first byte of a next request,
  to the end of the request's headers (408 in JSON when part of a request came, else
  a quiet close);
- a connection cap: a connection past it gets a 503 in JSON (``Retry-After: 1``,
  ``Connection: close``) before anything is read, then a short lingering close so the
  client reads the answer rather than a reset; said in the log once a second at most;
- a write timeout: when the answer's bytes stay unsent past the transport's high-water
  mark for that long, the connection is aborted; the app sees the client gone, which
  cancels its work, upstream included, and frees its slot (capmon/gateway/disconnect.py);
- malformed HTTP answered in the API's JSON error shape (h11's status: 400, or 431 for a
  header section too large).

The gateway always serves with this protocol (``uvicorn.Config(http=...)``), so
whether httptools is installed makes no difference.
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
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from capmon.gateway.errors import ApiError, json_bytes
from capmon.serving import Throttled

log = logging.getLogger("capmon.gateway")

LINGER = 1.0  # seconds a refused connection may take to read its 503 and close
# Bytes of a connection's answer the kernel may hold (it doubles the figure). Left to
# autotuning, a client that reads nothing gets up to 4 MiB of kernel memory, and a
# stream that size is written before the write timeout even starts; a fixed buffer
# keeps both small and still carries about 2.5 MB/s per connection at a 100 ms round trip.
SEND_BUFFER = 128 * 1024
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # Linux: a socket's unacknowledged bytes (SIOCOUTQ)


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
    """h11's connection, telling its protocol when a request's headers are complete and
    keeping the parse error that uvicorn's protocol drops."""

    def __init__(self, protocol: GatewayProtocol, max_incomplete_event_size: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size)
        self.protocol = protocol
        self.error: h11.RemoteProtocolError | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as e:
            self.error = e
            raise
        if isinstance(event, h11.Request):
            self.protocol.headers_complete()
        return event


class GatewayProtocol(H11Protocol):
    """Bound to one server's limits by :func:`protocol_for` (uvicorn builds a protocol
    per connection from a class)."""

    limits: ClassVar[ConnectionLimits]
    refusals: ClassVar[Throttled]
    stalls: ClassVar[Throttled]

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.parser = _Parser(self, self.conn._max_incomplete_event_size)
        self.conn = self.parser
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]  # uvicorn's is whole seconds
        self._refused = False  # past the cap: never counted among the connections
        self._lingering = False  # answered and closing: what still comes is dropped
        self._header_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes waiting in the transport when the write timer was armed

    # the cap
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
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
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request came: say why it is closed
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
        if self.conn.their_state is h11.IDLE:
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
        return self.transport.get_write_buffer_size() + queued

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
    def send_400_response(self, msg: str) -> None:
        error = self.parser.error
        status = error.error_status_hint if error is not None and 400 <= error.error_status_hint < 500 else 400
        detail = str(error) if error is not None and str(error) else msg
        if status == 431:
            limit = self.conn._max_incomplete_event_size
            detail = f"its request line and headers are longer than the {limit} bytes the gateway reads"
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


def protocol_for(limits: ConnectionLimits) -> type[GatewayProtocol]:
    """A protocol class for one server: its limits, and its own log throttles."""
    return type(
        "BoundGatewayProtocol",
        (GatewayProtocol,),
        {"limits": limits, "refusals": Throttled(log), "stalls": Throttled(log, logging.INFO)},
    )
