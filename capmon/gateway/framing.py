"""What the gateway refuses in a request's framing, whichever parser reads it.

A request whose end two HTTP parsers could place differently (a proxy in front reads it
one way, the gateway another) lets a client hide a second request inside the first: the
proxy forwards one request, the gateway answers two. So a request whose framing is
ambiguous is refused whole, with a 400, and its connection closed (capmon/gateway/connections.py).

llhttp (httptools, the default parser) refuses most of it itself. h11 reads a request's head
with the leniency of RFC 7230's robustness advice: it folds a line that starts with
whitespace into the one before (obs-fold), takes a bare LF for CRLF, prefers
Transfer-Encoding to Content-Length when both come, merges repeated equal Content-Lengths,
and allows whitespace after a chunk's size and anything in its extensions. :class:`StrictBuffer`
gives h11 only what llhttp would read too. A few rules are the gateway's own, for both
parsers (:func:`check_request_line`, :func:`check_transfer_encoding`), or h11's that llhttp
lacks (:func:`check_hosts`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import h11

# h11's receive buffer is not public API, but it is where h11's readers cut a head's lines,
# a chunk's size line and a body's trailers out of the bytes received: the one place to read
# them strictly. pyproject.toml holds h11 to the minor version tested; this module refuses to
# load, and tests/gateway/test_smuggling.py fails, if the buffer moves.
from h11._receivebuffer import ReceiveBuffer

if not isinstance(getattr(h11.Connection(h11.SERVER), "_receive_buffer", None), ReceiveBuffer):
    raise ImportError("this h11 keeps its receive buffer elsewhere: the gateway cannot read requests strictly")

_VERSIONS = (b"1.0", b"1.1")

# Control characters but HTAB: llhttp refuses them in a head. A CR or LF left once every
# CRLF is taken out is a bare one.
_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
# RFC 9112 7.1 without its optional whitespace (which llhttp refuses): size, extensions, CRLF.
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]+)(?:;" + _TOKEN + rb"(?:=(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?)*\r\n")
_MAX_SIZE_DIGITS = 16  # a chunk size past 2**64 - 1 overflows llhttp's: refused
_MAX_LENGTH = 2**64 - 1  # and so does a Content-Length past it (h11 takes 20 digits of any value)
_FRAMING = (b"content-length", b"transfer-encoding")


class Refused(Exception):
    """A request the gateway will not read: why, for the client's 400."""


def check_request_line(method: bytes, version: bytes) -> None:
    """``version``: the digits after ``HTTP/``. Anything but 1.0 and 1.1 is refused: their
    framing and keep-alive rules are the only ones both parsers read alike (HTTP/0.9 has no
    headers; ``PRI * HTTP/2.0`` opens HTTP/2, which the gateway does not speak on this
    port). CONNECT is refused: what follows it is a tunnel, and the gateway is no proxy."""
    if version not in _VERSIONS:
        raise Refused(f"HTTP/{version.decode('latin-1')[:16]}: the gateway reads HTTP/1.0 and HTTP/1.1")
    if method == b"CONNECT":
        raise Refused("CONNECT: the gateway is not a proxy")


def check_hosts(count: int, version: bytes) -> None:
    """One ``Host`` field at most, and one there must be but in HTTP/1.0 (RFC 9112 3.2): of
    two, which names the request's target, the one a proxy checked or the other? h11
    refuses both cases itself."""
    if count > 1:
        raise Refused("more than one Host")
    if count == 0 and version != b"1.0":
        raise Refused("no Host (HTTP/1.1 requires one)")


def check_transfer_encoding(value: bytes) -> None:
    """One field, its value ``chunked``: any other coding would reach the app still coded
    (neither parser decodes one), and a list is a framing two parsers can read two ways."""
    if value.strip(b" \t").lower() != b"chunked":
        raise Refused("Transfer-Encoding other than chunked")


def asks_upgrade(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request (its lower-case header names) asks to switch protocols, as llhttp
    sees it: an ``Upgrade`` field and ``upgrade`` among ``Connection``'s options. llhttp reads
    nothing after such a request; the gateway, which switches only to a WebSocket (uvicorn's),
    answers it and closes."""
    upgrade = connection_upgrade = False
    for name, value in headers:
        if name == b"upgrade":
            upgrade = True
        elif name == b"connection":
            connection_upgrade |= b"upgrade" in (option.strip().lower() for option in value.split(b","))
    return upgrade and connection_upgrade


def read_strictly(conn: h11.Connection) -> None:
    """Have ``conn``, a server's connection not yet given any bytes, read through a
    :class:`StrictBuffer`."""
    conn._receive_buffer = StrictBuffer(lambda: conn.their_state is h11.IDLE)


class StrictBuffer(ReceiveBuffer):
    """h11's receive buffer, cutting out only what llhttp would read: head and trailer
    lines that end in CRLF, none folded, no control characters, one Content-Length of digits
    and never with Transfer-Encoding, no framing field among the trailers; chunk size lines
    without whitespace, with well-formed extensions and a size that fits 64 bits; and the
    gateway's own rules. ``reading_head``: whether the connection waits for a request's head
    (else the lines asked for are a chunked body's trailers)."""

    def __init__(self, reading_head: Callable[[], bool]) -> None:
        super().__init__()
        self._reading_head = reading_head

    def maybe_extract_lines(self) -> list[bytearray] | None:
        try:
            return self._lines(self._reading_head())
        except Refused as e:
            raise h11.RemoteProtocolError(str(e)) from e

    def maybe_extract_next_line(self) -> bytearray | None:
        line = super().maybe_extract_next_line()
        if line is not None:
            size = _CHUNK_LINE.fullmatch(line)
            if size is None:
                raise h11.RemoteProtocolError("a malformed chunk size line")
            if len(size[1].lstrip(b"0")) > _MAX_SIZE_DIGITS:
                raise h11.RemoteProtocolError("a chunk size past 64 bits")
        return line

    def is_next_line_obviously_invalid_request_line(self) -> bool:
        # h11 refuses a head's first byte below "!" at once; a CR may start the CRLF skipped below.
        return self._data != b"\r" and super().is_next_line_obviously_invalid_request_line()

    def _lines(self, head: bool) -> list[bytearray] | None:
        if head:
            skip = 0
            while self._data.startswith(b"\r\n", skip):  # empty lines before a request line (RFC 9112 2.2)
                skip += 2
            if skip:
                self._extract(skip)
        elif self._data.startswith(b"\r\n"):
            self._extract(2)
            return []  # no trailers
        data = self._data
        end = data.find(b"\r\n\r\n")
        if end < 0:
            # Refused as soon as it comes, as llhttp does, rather than when a head that may
            # never end (it has no CRLF CRLF) does. What is searched stays under h11's limit
            # on an incomplete head (MAX_HEAD), past which it refuses the head with a 431.
            _check_characters(data[:-1] if data.endswith(b"\r") else data)
            return None
        _check_characters(data[: end + 2])
        lines = self._extract(end + 4)[:end].split(b"\r\n")
        for line in lines:
            if line.startswith((b" ", b"\t")):
                raise Refused("a line of its head starts with whitespace (obsolete line folding)")
        if head:
            _check_head(lines)
        else:
            _check_trailers(lines)
        return lines


def _check_characters(section: bytes | bytearray) -> None:
    bad = _CONTROL.search(section.replace(b"\r\n", b""))
    if bad is None:
        return
    if bad[0] == b"\n":
        raise Refused("a line of its head ends in a bare LF, not CRLF")
    if bad[0] == b"\r":
        raise Refused("a bare CR in its head")
    raise Refused("a control character in its head")


def _check_head(lines: list[bytearray]) -> None:
    parts = lines[0].split(b" ")
    if len(parts) == 3 and parts[2].startswith(b"HTTP/"):  # else h11 refuses the line itself
        check_request_line(bytes(parts[0]), bytes(parts[2][len(b"HTTP/") :]))
    lengths = 0
    chunked = False
    for name, value in _fields(lines[1:]):
        if name == b"content-length":
            lengths += 1
            if not value.isdigit():
                raise Refused("a Content-Length that is not one number")
            if len(value.lstrip(b"0")) > len(str(_MAX_LENGTH)) or int(value) > _MAX_LENGTH:
                raise Refused("a Content-Length past 64 bits")
        elif name == b"transfer-encoding":
            chunked = True
            check_transfer_encoding(value)
    if lengths > 1:
        raise Refused("more than one Content-Length")
    if lengths and chunked:
        raise Refused("both Content-Length and Transfer-Encoding")


def _check_trailers(lines: list[bytearray]) -> None:
    for name, _ in _fields(lines):
        if name in _FRAMING:
            raise Refused(f"a trailer field may not say how the message is framed ({name.decode()})")


def _fields(lines: list[bytearray]) -> Iterable[tuple[bytes, bytes]]:
    """Each line's name (lower case) and value (without the whitespace around it); a line
    without a colon is left to h11, which refuses it."""
    for line in lines:
        name, colon, value = line.partition(b":")
        if colon:
            yield bytes(name).lower(), bytes(value).strip(b" \t")
