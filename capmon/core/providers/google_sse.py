"""The framing of Google's streams (``:streamGenerateContent?alt=sse``, on the Gemini API and
Vertex AI): server-sent events (``sse.SSEParser``; Google ends each with ``\\r\\n\\r\\n``),
and the raw error Google writes into a stream that already began: a pretty-printed JSON
object with no ``data:`` before it, after some chunks::

    data: {"candidates": [...]}\\r\\n\\r\\n
    {
      "error": {
        "code": 503,
        "message": "The model is overloaded. Please try again later.",
        "status": "UNAVAILABLE"
      }
    }

An SSE reader would drop those lines (each is a field it does not know); google-genai counts
braces to find the object, and so does :class:`GoogleFraming`: the object is one
:class:`~capmon.core.providers.sse.Frame` whose data is its JSON, which the format reads as the
error it is (``gemini_format.read_frame``). An object that never closes (a stream cut inside
it, or a fragment that is only ``{``) is one frame of what came at :meth:`GoogleFraming.close`:
garbage to the format, never an exception. The dialects of Google's APIs return this reader
from ``framing()`` (the ``FrameReader`` protocol of dialect.py).
"""

from __future__ import annotations

from capmon.core.providers.sse import Frame, SSEParser

_OPEN = frozenset(b"{[")
_CLOSE = frozenset(b"}]")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_BLANK = b" \t\r"


class GoogleFraming:
    """Bytes in, frames out: SSE lines to the SSE parser, a line that begins with ``{`` or
    ``[`` a raw JSON value, read to its matching close (brackets inside strings not counted)."""

    __slots__ = ("_sse", "_held", "_mid_line", "_raw", "_depth", "_in_string", "_escaped")

    def __init__(self) -> None:
        self._sse = SSEParser()
        self._held = b""  # the start of a line not yet known to be SSE or raw (blanks only)
        self._mid_line = False  # the SSE parser holds the start of the current line
        self._raw: list[bytes] | None = None  # a raw value's pieces while it is open
        self._depth = 0
        self._in_string = False
        self._escaped = False

    def feed(self, chunk: bytes) -> list[Frame]:
        out: list[Frame] = []
        data = self._held + chunk if self._held else chunk
        self._held = b""
        pos, end = 0, len(data)
        while pos < end:
            if self._raw is not None:
                pos = self._scan(data, pos, out)
                continue
            newline = data.find(b"\n", pos)
            stop = end if newline < 0 else newline + 1
            if self._mid_line:  # the rest of an SSE line
                out += self._sse.feed(data[pos:stop])
                self._mid_line = newline < 0
                pos = stop
                continue
            line = data[pos:stop]
            first = len(line) - len(line.lstrip(_BLANK))
            if first < len(line) and line[first] in _OPEN:
                self._raw = []
                pos += first
            elif newline < 0 and first == len(line):
                self._held = line  # blanks so far: what the line is comes later
                pos = stop
            else:
                out += self._sse.feed(line)
                self._mid_line = newline < 0
                pos = stop
        return out

    def _scan(self, data: bytes, pos: int, out: list[Frame]) -> int:
        """Reads the open raw value from ``pos``: to its close (one frame; the position after
        it returned) or to the end of ``data`` (held)."""
        assert self._raw is not None
        depth, in_string, escaped = self._depth, self._in_string, self._escaped
        i, end = pos, len(data)
        while i < end:
            c = data[i]
            i += 1
            if in_string:
                if escaped:
                    escaped = False
                elif c == _BACKSLASH:
                    escaped = True
                elif c == _QUOTE:
                    in_string = False
            elif c == _QUOTE:
                in_string = True
            elif c in _OPEN:
                depth += 1
            elif c in _CLOSE:
                depth -= 1
                if depth == 0:
                    self._raw.append(data[pos:i])
                    out.append(Frame("", b"".join(self._raw).decode("utf-8", "replace")))
                    self._raw, self._depth, self._in_string, self._escaped = None, 0, False, False
                    return i
        self._raw.append(data[pos:])
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        return end

    def close(self) -> list[Frame]:
        """Frames still held when the stream ends: a raw value never closed is one frame of
        what came of it (garbage to the format that reads it)."""
        out: list[Frame] = []
        if self._raw is not None:
            out.append(Frame("", b"".join(self._raw).decode("utf-8", "replace")))
            self._raw = None
        if self._held:
            out += self._sse.feed(self._held)
            self._held = b""
        return out + self._sse.close()
