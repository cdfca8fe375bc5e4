"""The messages format: Anthropic's Messages (/v1/messages). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capmon.core.providers import anthropic_wire as aw
from capmon.core.providers.anthropic_wire import ERROR_STATUS as ERROR_STATUS  # the error shape's types
from capmon.core.providers.classify import QUOTA_HINT
from capmon.core.providers.openai_wire import Event, TokenParam
from capmon.core.providers.sse import Frame
from capmon.core.types.failure import Failure

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.
#
#
#
# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#


def parse(status: int, body: bytes) -> Mapping[str, Any] | None:
    """A plain answer (a message), or None: the classifier says what it is."""
    return aw.parse_message(status, body)


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its text blocks, in order."""
    return aw.message_text(response)


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """All the tokens the answer's usage counts (input, cache writes and reads, output)."""
    return aw.usage_total((response or {}).get("usage"))


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a stream event adds (a ``text_delta``; "" when none)."""
    if chunk.get("type") != "content_block_delta":
        return ""
    delta = chunk.get("delta")
    text = delta.get("text") if isinstance(delta, Mapping) and delta.get("type") == "text_delta" else None
    return text if isinstance(text, str) else ""


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Messages request: one token of output (Messages has one token parameter)."""
    body = {"messages": [{"role": "user", "content": "ping"}]}
    return aw.messages_body(body, model=model, max_tokens=1, stream=False)


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a Messages stream is (in-stream errors classified by their type). Never raises."""
    return aw.read_frame(frame, now=now, quota_hint=quota_hint)


class Assembled:
    """A Messages stream's events put together into the plain answer (whole at ``message_stop``)."""

    finished = False

    def __init__(self) -> None:
        self._events = aw.MessageAssembler()

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        self._events.add(chunk)

    def answer(self) -> Mapping[str, Any] | None:
        return self._events.message()


def assembler() -> Assembled:
    return Assembled()


def error_body(failure: Failure, message: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape, for the gateway's reply body and in-stream ``event: error``
    to a Messages caller (the chat and Responses callers' shapes are the gateway's own,
    capmon/gateway/errors.py)."""
    return aw.error_body(failure, message)
