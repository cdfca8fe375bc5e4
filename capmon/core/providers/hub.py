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
from capmon.core.types import canon


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
