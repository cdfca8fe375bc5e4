"""What a stream's frame is once its format has read it: an :class:`Event` of a
:class:`FrameKind` (a chunk of the answer, the end, an error, nothing, or garbage), the one
vocabulary the attempt reads every format's stream in (capmon/core/routing/attempt.py).

A dialect's framing turns bytes into :class:`~capmon.core.providers.sse.Frame` s; each
format module's ``read_frame`` turns a frame into an :class:`Event`. See ARCHITECTURE.md,
"The wire".
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capmon.core.providers.sse import Frame
from capmon.core.types.failure import Failure, Kind


class FrameKind(enum.StrEnum):
    CHUNK = "chunk"  # a chat.completion.chunk (choices may be empty: normal traffic)
    DONE = "done"  # data: [DONE]
    ERROR = "error"  # an error inside the stream: classified like the HTTP error it describes
    IGNORE = "ignore"  # a ping or an event that carries no answer
    BROKEN = "broken"  # not JSON, or JSON that is no event at all


@dataclass(frozen=True, slots=True)
class Event:
    kind: FrameKind
    chunk: Mapping[str, Any] | None = None
    failure: Failure | None = None
    output: bool = False  # carries content, a tool call, a refusal or a finish reason


def typed_event(frame: Frame) -> Event | tuple[Any, Any, str]:
    """A frame of a stream whose events carry a ``type`` (the Responses API, Anthropic's
    Messages): (the decoded data, its type, the event's name: the ``event:`` line or the
    type), or the BROKEN event when the data is not JSON."""
    data = frame.data.strip()
    try:
        obj = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return Event(
            FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream event (not JSON)", 200)
        )
    kind = obj.get("type") if isinstance(obj, dict) else None
    return obj, kind, frame.event or (kind if isinstance(kind, str) else "")
