"""The chat format: OpenAI's chat completions (/chat/completions). Its requests, answers and stream
events to and from the canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capmon.core.providers import openai_wire as wire
from capmon.core.providers.classify import QUOTA_HINT, parse_completion
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
    """A plain answer (a chat completion with choices), or None: the classifier says what it is."""
    return parse_completion(status, body)


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its first choice's content."""
    return wire.completion_text(response)


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usage.total_tokens``)."""
    return wire.total_tokens(response)


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a stream chunk adds ("" when none)."""
    return wire.chunk_text(chunk)


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest request that proves a model answers: one token of output."""
    return wire.probe_body(model, token_param)


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a chat stream is (chunks, ``[DONE]``, errors). Never raises."""
    return wire.read_frame(frame, now=now, quota_hint=quota_hint)


class Assembled:
    """A chat stream's chunks put together into the plain answer; a finish reason makes it whole."""

    def __init__(self) -> None:
        self._chunks = wire.Assembler()

    @property
    def finished(self) -> bool:
        return bool(self._chunks.finish_reason)

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        self._chunks.add(chunk)

    def answer(self) -> Mapping[str, Any] | None:
        return self._chunks.completion()


def assembler() -> Assembled:
    return Assembled()
