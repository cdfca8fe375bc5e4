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


# ---------------------------------------------------------------- the registry and the moves
# The format modules import this one (Incapable, the protocols): they are imported here, below
# what they use of it.

from capmon.core.providers import chat_format, messages_format, responses_format  # noqa: E402

# The ignores: until each module decodes and encodes requests too (helper REQ's part of
# issue 28); mypy then says they are unused, and they go.
FORMATS: Mapping[Format, WireFormat] = {
    Format.CHAT: chat_format,  # type: ignore[dict-item]
    Format.RESPONSES: responses_format,  # type: ignore[dict-item]
    Format.MESSAGES: messages_format,  # type: ignore[dict-item]
}


def translate_answer(answer: Mapping[str, Any], source: Format, target: Format, *, created: int) -> dict[str, Any]:
    """An answer in ``source``'s format told in ``target``'s (``created``: the time a target
    format that carries one says). Raises :class:`Incapable` for what ``target`` cannot carry."""
    return FORMATS[target].encode_answer(FORMATS[source].decode_answer(answer), created=created)


class Translation:
    """A stream in ``source``'s events told in ``target``'s, event by event: ``feed`` each
    event as it comes, ``close`` once the source's stream has ended (what a format whose end
    carries no event, chat's ``[DONE]``, still has to say). Either may raise :class:`Incapable`."""

    def __init__(self, source: Format, target: Format, *, created: int, include_usage: bool = True) -> None:
        self._decoder = FORMATS[source].stream_decoder()
        self._encoder = FORMATS[target].stream_encoder(created=created, include_usage=include_usage)

    def _encoded(self, events: Sequence[canon.Event]) -> list[dict[str, Any]]:
        return [out for event in events for out in self._encoder.feed(event)]

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        return self._encoded(self._decoder.feed(chunk))

    def close(self) -> list[dict[str, Any]]:
        return self._encoded(self._decoder.close())
