"""Server-sent events, the stream framing of every HTTP API capmon speaks today (OpenAI's,
Azure's, Anthropic's): bytes in, :class:`Frame` s out. A dialect names its framing
(:mod:`capmon.core.providers.dialect`); a format reads each frame
(``read_frame`` of capmon/core/providers/*_format.py). The gateway's control API uses the
same parser for its own event stream (capmon/connect.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Frame:
    """One server-sent event: its ``event:`` name (``""`` when none), its data, and its
    own ``id:`` (``""`` when none; the gateway's control API numbers its events so)."""

    event: str
    data: str
    id: str = ""


class SSEParser:
    """Bytes in, frames out, as the SSE spec reads them: ``data:`` lines join until a
    blank line; ``event:`` names the frame and ``id:`` numbers it; comment lines
    (``: keep-alive``, ``: OPENROUTER PROCESSING``) and ``retry:`` are dropped.

    One leniency: servers that forget the blank line between two ``data:`` lines each
    holding a whole JSON object get two frames, not one unparseable one.
    """

    __slots__ = ("_buffer", "_event", "_data", "_id")

    def __init__(self) -> None:
        self._buffer = b""
        self._event = ""
        self._id = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Frame]:
        out: list[Frame] = []
        buf = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._buffer = buf.split(b"\n")
        for raw in lines:
            self._line(raw.decode("utf-8", "replace"), out)
        return out

    def close(self) -> list[Frame]:
        """Frames still held when the stream ends (a last frame with no blank line)."""
        out: list[Frame] = []
        if self._buffer:
            self._line(self._buffer.decode("utf-8", "replace"), out)
            self._buffer = b""
        self._dispatch(out)
        return out

    def _line(self, line: str, out: list[Frame]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line[0] == ":":
            return
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            if self._data and _whole_json(self._data[-1]) and value[:1] in ("{", "["):
                self._dispatch(out)
            self._data.append(value)
        elif name == "event":
            if self._data:  # an event line after data with no blank line: a new frame
                self._dispatch(out)
            self._event = value.strip()
        elif name == "id" and "\0" not in value:
            self._id = value

    def _dispatch(self, out: list[Frame]) -> None:
        if self._data:
            out.append(Frame(self._event, "\n".join(self._data), self._id))
        elif self._event:
            out.append(Frame(self._event, "", self._id))
        self._event = ""
        self._id = ""
        self._data = []


def _whole_json(text: str) -> bool:
    text = text.strip()
    if not text or text[0] not in "{[" or text[-1] not in "}]":
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
