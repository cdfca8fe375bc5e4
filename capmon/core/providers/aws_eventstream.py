"""The framing of AWS's event streams (``application/vnd.amazon.eventstream``: Bedrock's
ConverseStream): binary messages, each ``[total length][headers length][prelude CRC]
[headers][payload][message CRC]``, decoded by botocore's maintained decoder
(``botocore.eventstream.EventStreamBuffer``: the ``aws`` extra), both CRCs checked.

:class:`EventStreamFraming` is a ``dialect.FrameReader``: each message is one
:class:`~capmon.core.providers.sse.Frame`, read by the format (``converse_format.read_frame``):

* an event (``:message-type: event``): ``event`` its ``:event-type`` (``messageStart``,
  ``contentBlockDelta``, ...), ``data`` its payload's text;
* an exception (``:message-type: exception``, ``:exception-type`` in lowerCamel case:
  ``throttlingException``): ``event`` is ``:exception:`` and the type, ``data`` its
  payload (``{"message": ...}``). boto3 gives every such frame the status 400; the format
  classifies it by its type alone;
* an error (``:message-type: error``): ``event`` is ``:error:`` and its ``:error-code``,
  ``data`` ``{"message": <its :error-message>}``;
* a stream that cannot be read on (a CRC that does not match, a length past the limits, a
  header that cannot be parsed; at :meth:`EventStreamFraming.close`, a message cut short):
  one frame whose ``event`` is ``:broken`` and whose ``data`` says why, then nothing more
  (what follows a bad message cannot be found). Garbage to the format, never data, never
  an exception.

No AWS event type begins with ``:`` (its headers' names do), so these names cannot be an
event's. :func:`special` reads them.
"""

from __future__ import annotations

import enum
import json
from typing import TYPE_CHECKING

from capmon.core.base.extras import Extra, require
from capmon.core.providers.sse import Frame

if TYPE_CHECKING:
    from botocore.eventstream import EventStreamBuffer

EXCEPTION = ":exception:"
ERROR = ":error:"
BROKEN = ":broken"


class Special(enum.Enum):
    """A frame that is no event of the answer (see the module's docstring)."""

    EXCEPTION = "exception"
    ERROR = "error"
    BROKEN = "broken"


def special(frame: Frame) -> tuple[Special, str] | None:
    """What ``frame`` is when it is no event: an exception (and its type), an error (and its
    code) or a broken stream (""); None for an event."""
    name = frame.event
    if not name.startswith(":"):
        return None
    if name.startswith(EXCEPTION):
        return Special.EXCEPTION, name.removeprefix(EXCEPTION)
    if name.startswith(ERROR):
        return Special.ERROR, name.removeprefix(ERROR)
    return Special.BROKEN, ""


def require_aws(what: str) -> None:
    """Raise MissingExtra unless botocore is installed (``what``: who asks for it)."""
    require(Extra.AWS, what)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


class EventStreamFraming:
    """Bytes in, frames out: one frame per message botocore's buffer decodes whole."""

    __slots__ = ("_buffer", "_pending", "_broken")

    def __init__(self) -> None:
        from botocore.eventstream import EventStreamBuffer

        self._buffer: EventStreamBuffer = EventStreamBuffer()
        self._pending = 0  # bytes fed that no whole message has taken yet
        self._broken = False

    def feed(self, chunk: bytes) -> list[Frame]:
        if self._broken or not chunk:
            return []
        from botocore.eventstream import ParserError

        self._buffer.add_data(chunk)
        self._pending += len(chunk)
        out: list[Frame] = []
        try:
            for message in self._buffer:
                self._pending -= message.prelude.total_length
                out.append(_frame(message.headers, message.payload))
        except ParserError as e:
            out.append(self._break(f"an undecodable message: {type(e).__name__}"))
        return out

    def _break(self, why: str) -> Frame:
        self._broken = True
        return Frame(BROKEN, why)

    def close(self) -> list[Frame]:
        """A message begun and never ended is a broken stream."""
        if self._broken or not self._pending:
            return []
        return [self._break(f"a message cut short ({self._pending} bytes of it)")]


def _frame(headers: dict[str, object], payload: bytes) -> Frame:
    kind = _text(headers.get(":message-type")) or "event"
    data = payload.decode("utf-8", "replace")
    if kind == "exception":
        return Frame(EXCEPTION + _text(headers.get(":exception-type")), data)
    if kind == "error":
        message = _text(headers.get(":error-message"))
        return Frame(ERROR + _text(headers.get(":error-code")), json.dumps({"message": message}))
    return Frame(_text(headers.get(":event-type")), data)


def framing(what: str) -> EventStreamFraming:
    """A new reader of one stream (``what``: who asks, should botocore be missing)."""
    require_aws(what)
    return EventStreamFraming()
