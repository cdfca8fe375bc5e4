"""The canonical hub: one typed representation of a request, an answer and a stream event
that every format decodes into and encodes from (capmon/core/providers/*_format.py).

A move between two formats is ``target.encode(source.decode(x))``: the source's decoder
says what the caller asked for, in these terms, and keeps everything it saw (a field no
other format has stays in ``Request.own`` under its own name); the target's encoder carries
what it can and raises :class:`~capmon.core.providers.format.Incapable` for anything it
cannot carry that changes an answer's meaning. So nothing is ever dropped silently, and a
thing two formats both carry (thinking, cache hints, citations, a tool result's error flag)
crosses between them whole. The same format never goes through here: it passes untouched.

Names follow the richest of the formats (Anthropic's Messages: parts are its blocks, stream
events its events); see ARCHITECTURE.md, "Across formats".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# ---------------------------------------------------------------- parts


@dataclass(frozen=True, slots=True)
class Cache:
    """A caching breakpoint on a part, a tool or the whole request (Anthropic's
    ``cache_control``), kept as given (``{"type": "ephemeral", "ttl": "1h"}``)."""

    raw: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Text:
    text: str
    cache: Cache | None = None
    citations: tuple[Mapping[str, Any], ...] = ()  # as the source gave them
    refusal: bool = False  # OpenAI's refusal: text a model gave instead of an answer
    # The source's own block when it is exactly ``{"type": "text", "text": text}`` (a dict of
    # those two keys, chat's text part and Messages' text block alike): an encoder whose
    # part has that shape shares it rather than copying (a body can hold thousands).
    raw: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)


_new = object.__new__
_set_text, _set_cache, _set_citations, _set_refusal, _set_raw = (
    Text.__dict__[name].__set__ for name in ("text", "cache", "citations", "refusal", "raw")
)


def text(text: str, raw: Mapping[str, Any] | None = None) -> Text:
    """``Text(text, raw=raw)`` made at twice the speed (its slots set directly): a body may
    hold hundreds of thousands of text blocks, each decoded into one."""
    part = _new(Text)
    _set_text(part, text)
    _set_cache(part, None)
    _set_citations(part, ())
    _set_refusal(part, False)
    _set_raw(part, raw)
    return part


@dataclass(frozen=True, slots=True)
class Image:
    """An image: ``data`` (base64, with its ``media_type``) or a ``url``."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    detail: str | None = None  # OpenAI's resolution hint; no meaning to the answer
    cache: Cache | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A call the model made. ``arguments`` is the JSON text as the source had it (a
    Messages ``input`` object is dumped once); ``input`` is the parsed object when the
    text is one, else None (the encoder that needs an object refuses)."""

    id: str
    name: str
    arguments: str
    input: Mapping[str, Any] | None = None
    cache: Cache | None = None
    where: str = ""  # its place in the caller's body when not its message's (a Responses item)


@dataclass(frozen=True, slots=True)
class ToolResult:
    call_id: str
    content: tuple[Part, ...] | str
    is_error: bool = False
    cache: Cache | None = None


@dataclass(frozen=True, slots=True)
class Thinking:
    """Reasoning a model showed (Anthropic's ``thinking`` / ``redacted_thinking`` blocks)."""

    text: str
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class Opaque:
    """A part the hub has no type for, kept as its format gave it (a server tool's use,
    a document): only its own format can carry it."""

    format: str
    kind: str
    raw: Mapping[str, Any]


Part = Text | Image | ToolCall | ToolResult | Thinking | Opaque


class Role(enum.StrEnum):
    SYSTEM = "system"  # a system message inside the conversation (the request's own is Request.system)
    USER = "user"  # tool results are parts of a user turn
    ASSISTANT = "assistant"


@dataclass(frozen=True, slots=True)
class Message:
    role: Role
    parts: tuple[Part, ...]
    # The source gave the content as one string (not a list of parts): an encoder that
    # can say either says it the same way, so a round trip changes no byte of meaning.
    plain: bool = False
    where: str = ""  # its place in the caller's body ("messages[3]", "input[2]"): refusals name it
    # The source message's other keys with meaning (chat's audio reply, a legacy
    # function_call), under their own names: only the same format carries them.
    own: Mapping[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- what an answer ends with


class Stop(enum.StrEnum):
    """Why an answer ended (Anthropic's stop reasons; each format maps its own)."""

    END_TURN = "end_turn"
    STOP_SEQUENCE = "stop_sequence"
    MAX_TOKENS = "max_tokens"
    CONTEXT_WINDOW = "model_context_window_exceeded"
    TOOL_USE = "tool_use"
    REFUSAL = "refusal"
    PAUSE_TURN = "pause_turn"


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as Anthropic splits them: fresh input, cache writes and cache reads
    apart (OpenAI's prompt tokens are their sum). None: not told (a stream tells them in
    pieces; :meth:`merged` keeps what a later piece does not say)."""

    input: int | None = None
    cache_write: int | None = None
    cache_read: int | None = None
    output: int | None = None
    reasoning: int | None = None

    def merged(self, later: Usage) -> Usage:
        def pick(a: int | None, b: int | None) -> int | None:
            return a if b is None else b

        return Usage(
            pick(self.input, later.input),
            pick(self.cache_write, later.cache_write),
            pick(self.cache_read, later.cache_read),
            pick(self.output, later.output),
            pick(self.reasoning, later.reasoning),
        )

    @property
    def prompt(self) -> int:
        """All input tokens: fresh, written to the cache and read from it."""
        return (self.input or 0) + (self.cache_write or 0) + (self.cache_read or 0)


# ---------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Tool:
    """A client (function) tool."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] | None = None  # JSON schema; None: none given
    strict: bool | None = None
    cache: Cache | None = None
    own: Mapping[str, Any] = field(default_factory=dict)  # the source format's other keys
    # A built-in (server) tool, not a client one: ``own`` is the whole tool as the source
    # gave it (its ``type`` names it); only its own format carries it.
    builtin: bool = False


class Choice(enum.StrEnum):
    AUTO = "auto"
    NONE = "none"
    ANY = "any"  # OpenAI's "required"
    TOOL = "tool"  # the named one


@dataclass(frozen=True, slots=True)
class ToolChoice:
    choice: Choice
    name: str | None = None


@dataclass(frozen=True, slots=True)
class OutputSchema:
    """Structured output: a JSON schema the answer must follow."""

    schema: Mapping[str, Any]
    name: str | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """What a caller asked for, in no format. The model, the final token cap and
    ``stream`` are the wire's (capmon sets them per attempt), so they are not here;
    ``max_tokens`` is the caller's own cap."""

    source: str  # the format it was decoded from (a Format's value)
    messages: tuple[Message, ...]
    system: tuple[Part, ...] = ()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    output: OutputSchema | None = None
    cache: Cache | None = None  # a breakpoint on the whole request
    thinking: Mapping[str, Any] | None = None  # Anthropic's thinking setting, as given
    effort: str | None = None  # a reasoning effort (Anthropic's output_config.effort, OpenAI's reasoning.effort)
    # Fields of the source format with meaning that no other slot holds (n, logprobs,
    # penalties, a response_format other than a schema, ...), under their own names: an
    # encoder of the same family may carry them; any other refuses a set one.
    own: Mapping[str, Any] = field(default_factory=dict)
    # Fields of the source format that change no answer's meaning (bookkeeping, cache keys,
    # a determinism seed, a field explicitly off), under their own names: an encoder of the
    # same family may carry them; any other leaves them out.
    aside: Mapping[str, Any] = field(default_factory=dict)
    system_plain: bool = False  # the system prompt was one string (as Message.plain)


# ---------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class Answer:
    id: str
    model: str
    parts: tuple[Part, ...]
    stop: Stop | None  # None: the source said none, or one the hub does not know
    usage: Usage | None = None
    stop_sequence: str | None = None
    # A stop reason the hub does not know (stop is None), as the source said it: only its
    # own format carries it; any other says what it says for none.
    stop_other: str | None = None


# ---------------------------------------------------------------- stream events
# A stream is Anthropic's event sequence: start, then per part a start, deltas and a
# stop (indexes count parts from 0), then the end (stop reason and usage), then done.


@dataclass(frozen=True, slots=True)
class Started:
    id: str
    model: str
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class PartStarted:
    index: int
    part: Part  # its first state (a tool call with its id and name, empty arguments)


@dataclass(frozen=True, slots=True)
class PartDelta:
    index: int
    text: str | None = None  # text or thinking
    arguments: str | None = None  # a tool call's JSON, a piece at a time
    signature: str | None = None  # thinking's signature
    citation: Mapping[str, Any] | None = None  # one more citation of a text part, as the source gave it


@dataclass(frozen=True, slots=True)
class PartStopped:
    index: int


@dataclass(frozen=True, slots=True)
class Ended:
    """The answer's stop reason and usage (more may follow in another ``Ended``)."""

    stop: Stop | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None
    stop_other: str | None = None  # as Answer.stop_other


@dataclass(frozen=True, slots=True)
class Done:
    """The answer is whole."""


Event = Started | PartStarted | PartDelta | PartStopped | Ended | Done
