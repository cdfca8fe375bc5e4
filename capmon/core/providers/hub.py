"""The hub's moves: a request, an answer or a stream from one format to another, always
through the canonical types (capmon/core/types/canon.py), and the registry of formats.

A format is a module (``chat_format``, ``responses_format``, ``messages_format``) with the
functions of :class:`WireFormat`; a new format is one more module and one more line in
:data:`FORMATS`. See ARCHITECTURE.md, "Across formats".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from capmon.core.base.exceptions import CapmonError
from capmon.core.providers.classify import QUOTA_HINT
from capmon.core.providers.openai_wire import Event, TokenParam
from capmon.core.providers.sse import Frame
from capmon.core.types import canon
from capmon.core.types.failure import Failure
from capmon.core.types.result import Format


class Incapable(CapmonError, ValueError):
    """A request or an answer that the target format cannot carry (the message says why):
    the target is skipped as incapable, or the answer is a broken one."""


class StreamDecoder(Protocol):
    """A stream in a format's own events in, canonical events out."""

    def feed(self, chunk: Mapping[str, Any]) -> Sequence[canon.Event]: ...

    def close(self) -> Sequence[canon.Event]:
        """At the wire's own end (a format whose end carries no event: chat's [DONE])."""
        ...


class StreamEncoder(Protocol):
    """Canonical events in, a format's own events out."""

    def feed(self, event: canon.Event) -> Sequence[dict[str, Any]]: ...


class WireFormat(Protocol):
    """What a format module provides (the module itself is the implementation)."""

    def decode_request(self, body: Mapping[str, Any]) -> canon.Request: ...

    def encode_request(self, request: canon.Request) -> dict[str, Any]: ...

    def decode_answer(self, answer: Mapping[str, Any]) -> canon.Answer: ...

    def encode_answer(self, answer: canon.Answer, *, created: int) -> dict[str, Any]: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def stream_encoder(self, *, created: int, include_usage: bool) -> StreamEncoder: ...


class Assembled(Protocol):
    """A stream's events in a format, put together into its plain answer."""

    @property
    def finished(self) -> bool:
        """The answer is whole before the wire's end marker (chat: a finish reason)."""
        ...

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        """One event with a chunk (``done``: the stream's last, which carries one on the
        Responses and Messages wires)."""
        ...

    def answer(self) -> Mapping[str, Any] | None: ...


class FormatReading(Protocol):
    """How a format module reads what a target sends in it, and probes in it (each module's
    "reading and probing" section). ``WireFormat`` and this make a whole format module."""

    def parse(self, status: int, body: bytes) -> Mapping[str, Any] | None:
        """A plain answer, or None (then the classifier says what the response is)."""
        ...

    def unfinished(self, status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
        """Why a 2xx that :meth:`parse` refused is no answer, when the format says more
        than the classifier (None: the classifier says)."""
        ...

    def text(self, response: Mapping[str, Any]) -> str: ...

    def used_tokens(self, response: Mapping[str, Any] | None) -> int | None: ...

    def chunk_text(self, chunk: Mapping[str, Any]) -> str: ...

    def probe_body(self, model: str, token_param: TokenParam) -> dict[str, Any]: ...

    def read_frame(self, frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event: ...

    def assembler(self) -> Assembled: ...


# The registry of formats, below what the format modules import this module for.
from capmon.core.providers import chat_format, messages_format, responses_format  # noqa: E402

FORMATS: Mapping[Format, FormatReading] = {
    Format.CHAT: chat_format,
    Format.RESPONSES: responses_format,
    Format.MESSAGES: messages_format,
}
