"""Which format an attempt speaks, and how a request crosses from the caller's format to
the target's and its answer back.

A caller speaks one :class:`~capmon.core.types.result.Format` (chat completions, the Responses
API, Anthropic's Messages, Google's generateContent); a target's endpoint speaks one provider API
(:class:`~capmon.core.types.config.EndpointApi`). This module is the one place that pairs them:

* the *wire* an attempt sends, its URL, key and stream framing: the endpoint's dialect
  (capmon/core/providers/dialect.py: an Anthropic endpoint always speaks Messages; an OpenAI
  or Azure one speaks the caller's format, and chat completions for a Messages caller);
* the body (:func:`outbound`): the same format untouched but the token cap and ``n``, as
  always; across formats translated by the pure modules (``translate_*``); the fields a
  target cannot take but whose absence changes no answer's meaning (sampling fields its API
  version refuses, Anthropic's hints an OpenAI-wire target cannot honour) dropped and said,
  or the target refused, by the config's rule (:func:`_by_rule`);
* why a target cannot carry a request (:func:`incapable`): the target is then skipped,
  as one whose context window is too small, and the attempt record says why;
* the answer and the stream events in the caller's format (:func:`answer_in`,
  :func:`stream_codec`), and the wire's own frame reader and assembler (:class:`WireReader`,
  from the wire's format module: ``hub.FORMATS``);
  an answer that crosses has its tool calls checked (arguments that are no JSON object are a
  broken answer, :class:`~capmon.core.base.exceptions.BrokenAnswer`), and a stream that crosses
  keeps the caller's end events back until the wire's own end is whole (:class:`_Crossing`).
* a broken stream's continuation in the caller's format (:func:`continued`, :func:`splicer`:
  its format module's; capmon/core/routing/continuation.py).

See ARCHITECTURE.md, "Across formats".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from capmon.core.providers import hub, usage

# isort: split
# hub first: it imports the format modules, each of which imports it
from capmon.core.providers import chat_format, converse_format, gemini_format, messages_format
from capmon.core.providers.classify import QUOTA_HINT
from capmon.core.providers.dialect import dialect_of
from capmon.core.providers.frames import Event
from capmon.core.providers.hub import FORMATS
from capmon.core.providers.splice import Splice
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.config import ClientConfig, DropRule
from capmon.core.types.failure import Failure
from capmon.core.types.prices import Tokens
from capmon.core.types.result import Format, Request

if TYPE_CHECKING:
    from capmon.core.routing.targets import Target


# ---------------------------------------------------------------- requests


def caller_body(request: Request) -> dict[str, Any]:
    """The request in its own format, as the caller would have sent it."""
    if request.format is not Format.CHAT:
        return dict(request.extra)
    body = {**request.extra, "messages": list(request.messages)}
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.max_tokens is not None:
        body.setdefault("max_tokens", request.max_tokens)
    return body


@dataclass(frozen=True, slots=True)
class Outbound:
    """What one attempt sends: the body in the target's wire, and the fields left out."""

    wire: Format
    body: dict[str, Any]
    dropped: tuple[str, ...] = ()


Incapable = hub.Incapable  # the target cannot carry this request (the message says why)


def _translated(
    request: Request, target_wire: Format, client: ClientConfig
) -> tuple[Mapping[str, Any] | None, tuple[str, ...]]:
    """The caller's body in the target's wire, without the fields capmon owns, and the
    hints left out; None when the formats are the same (the caller's fields then pass
    through untouched)."""
    if request.format is target_wire:
        return None, ()
    if target_wire is Format.RESPONSES:  # no dialect sends another format there
        raise Incapable(f"{request.format.value} requests cannot be sent as {target_wire.value}")
    return hub.translate_request(caller_body(request), request.format, target_wire, hints=client.unhonoured_hints)


def outbound(
    request: Request,
    t: Target,
    *,
    token_param: TokenParam,
    limit: int,
    stream: bool,
    client: ClientConfig,
) -> Outbound:
    """The body one attempt sends to ``t``: the wire's format makes it (the caller's own,
    or translated through the hub), then the endpoint's dialect applies its rules. Raises
    :class:`~capmon.core.providers.hub.Incapable` when ``t`` cannot carry the request
    (:func:`incapable` says so before any attempt)."""
    dialect = dialect_of(t.endpoint)
    target_wire = dialect.wire_of(request.format, t.model.wire_name)
    why = dialect.unserved(t.endpoint, target_wire)
    if why is not None:
        raise Incapable(why)
    translated, hints = _translated(request, target_wire, client)
    body = FORMATS[target_wire].wire_body(
        request, translated, model=t.model.wire_name, limit=limit, stream=stream, token_param=token_param
    )
    body, dropped = dialect.body_rules(body, t.endpoint, target_wire, client.refused_sampling)
    return Outbound(target_wire, body, hints + dropped)


def incapable(request: Request, t: Target, client: ClientConfig) -> str | None:
    """Why ``t`` cannot carry ``request``, or None. The check is the translation itself
    (:func:`outbound`), so the check and the body sent cannot disagree; a request in the
    target's own format is not checked where the dialect has no rules for bodies (it
    passes untouched)."""
    dialect = dialect_of(t.endpoint)
    target_wire = dialect.wire_of(request.format, t.model.wire_name)
    why = dialect.unserved(t.endpoint, target_wire)
    if why is not None:
        return why
    if request.format is target_wire and not dialect.has_body_rules(t.endpoint):
        return None
    try:
        outbound(request, t, token_param=TokenParam.MAX_TOKENS, limit=1, stream=False, client=client)
    except Incapable as e:
        return str(e)
    return None


def probe_body(t: Target, token_param: TokenParam) -> tuple[Format, dict[str, Any]]:
    """The smallest request that proves ``t`` answers, in the wire its endpoint speaks to a
    chat caller, made by that wire's format, as the endpoint's dialect takes it (Claude's on
    Vertex AI: its model in the URL, not the body)."""
    dialect = dialect_of(t.endpoint)
    probe_wire = dialect.wire_of(Format.CHAT, t.model.wire_name)
    body = FORMATS[probe_wire].probe_body(t.model.wire_name, token_param)
    if dialect.has_body_rules(t.endpoint):
        body, _ = dialect.body_rules(body, t.endpoint, probe_wire, DropRule.DROP)  # "ping" has nothing to drop
    return probe_wire, body


def refused_token_param(target_wire: Format, failure: Failure, sent: TokenParam) -> bool:
    """Whether ``failure`` says the model refuses the token parameter ``sent`` (the quirk of
    a wire with two, which its format knows: chat completions)."""
    return FORMATS[target_wire].refused_token_param(failure, sent)


# ---------------------------------------------------------------- answers


def parse_plain(target_wire: Format, status: int, body: bytes) -> Mapping[str, Any] | None:
    """A plain answer in the target's wire, or None (then the classifier says what it is);
    its usage bounded (capmon/core/providers/usage.py), so no reader sees a count no answer can have."""
    answer = FORMATS[target_wire].parse(status, body)
    return None if answer is None else usage.bounded(answer)


def unfinished(
    target_wire: Format, status: int, headers: Any, body: bytes, *, now: float, quota_hint: float
) -> Failure | None:
    """Why a 2xx that :func:`parse_plain` refused is no answer, when the target wire's format
    says more than the classifier (a failed Responses answer); None: the classifier says."""
    return FORMATS[target_wire].unfinished(status, headers, body, now=now, quota_hint=quota_hint)


def answer_in(caller: Format, target_wire: Format, response: Mapping[str, Any], *, created: int) -> Mapping[str, Any]:
    """The target's answer in the caller's format (through the hub: :func:`hub.translate_answer`).
    Across formats its tool calls are checked first: raises
    :class:`~capmon.core.base.exceptions.BrokenAnswer` for arguments that are no JSON object
    (the answer is broken, whatever format tells it), and :class:`~capmon.core.providers.hub.Incapable`
    for anything else the caller's format cannot carry."""
    if caller is target_wire:
        return response
    for call in FORMATS[target_wire].tool_calls(response):
        hub.check_call(*call)
    return hub.translate_answer(response, target_wire, caller, created=created)


def text_of(caller: Format, response: Mapping[str, Any]) -> str:
    """An answer's text, in the caller's format."""
    return FORMATS[caller].text(response)


# Where each format's answer keeps its usage, and how it reads as the hub's (the cached part apart).
_USAGE: Mapping[Format, tuple[str, Callable[[object], canon.Usage | None]]] = {
    Format.CHAT: ("usage", chat_format.decode_usage),
    Format.RESPONSES: ("usage", chat_format.decode_usage),
    Format.MESSAGES: ("usage", messages_format.decode_usage),
    Format.GEMINI: ("usageMetadata", gemini_format.decode_usage),
    Format.CONVERSE: ("usage", converse_format.decode_usage),
}


def tokens_of(caller: Format, response: Mapping[str, Any] | None) -> Tokens | None:
    """An answer's (in the caller's format) token counts as they are priced; None when it
    tells none."""
    key, decode = _USAGE[caller]
    told = (response or {}).get(key)
    return Tokens.of(decode(told)) if isinstance(told, Mapping) else None


def used_tokens(caller: Format, response: Mapping[str, Any] | None) -> int | None:
    """The tokens an answer (in the caller's format) says it used."""
    return FORMATS[caller].used_tokens(response)


# ---------------------------------------------------------------- streams


class Codec(Protocol):
    """Turns the target's stream events into the caller's: per event, then at the end.
    ``close`` is called only once the wire's own end has come (its last event, or [DONE]),
    and gives the caller's end events; either may raise
    :class:`~capmon.core.base.exceptions.BrokenAnswer`."""

    def feed(self, chunk: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]: ...

    def close(self) -> Sequence[Mapping[str, Any]]: ...


class _Same:
    def feed(self, chunk: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        return (chunk,)  # passed through as the provider sent it, byte for byte: nothing checked

    def close(self) -> Sequence[Mapping[str, Any]]:
        return ()


SAME = _Same()


class _Crossing:
    """A stream told in another format. Every event of the target's wire is checked
    before it is translated: a tool call that ends with arguments that are no JSON object
    raises :class:`~capmon.core.base.exceptions.BrokenAnswer`, before the caller sees its end.
    What the translator gives for the wire's last event (``message_stop``: the chat finish
    and usage chunks, ``response.completed``) and at ``close`` (``message_delta`` and
    ``message_stop``) is the caller's end, given only by ``close``: the attempt calls it
    once the wire's own end has come and its answer is whole, so a stream that breaks
    never ends the way a whole one does."""

    def __init__(
        self,
        feed: Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
        calls: hub.CallWatcher,
        close: Callable[[], Sequence[Mapping[str, Any]]] = tuple,
    ) -> None:
        self._feed, self._close, self._calls = feed, close, calls
        self._end: list[Mapping[str, Any]] = []

    def feed(self, chunk: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        self._calls.feed(chunk)
        out = self._feed(chunk)
        if self._calls.last(chunk):
            self._end += out
            return ()
        return out

    def close(self) -> Sequence[Mapping[str, Any]]:
        self._calls.end()
        return [*self._end, *self._close()]


def stream_codec(request: Request, target_wire: Format, *, created: int) -> Codec:
    """The translator of one streaming attempt's events into the caller's format (through the
    hub: :class:`hub.Translation`), the target wire's tool calls checked as they end."""
    if request.format is target_wire:
        return SAME
    translation = hub.Translation(target_wire, request.format, created=created, include_usage=asks_usage(request))
    return _Crossing(translation.feed, FORMATS[target_wire].call_watcher(), translation.close)


def answer_as_stream(
    caller: Format, response: Mapping[str, Any], *, created: int, include_usage: bool
) -> list[dict[str, Any]]:
    """A whole answer in the caller's format (a plain answer to a stream request: a server
    that ignores ``stream``; crossed back by :func:`answer_in` first) as the stream events
    that tell it in that format, its end included (the format's ``answer_stream``;
    ``include_usage``: a chat caller's ``stream_options``). Raises
    :class:`~capmon.core.providers.hub.Incapable` for what the caller's events cannot carry."""
    return FORMATS[caller].answer_stream(response, created=created, include_usage=include_usage)


def asks_usage(request: Request) -> bool:
    """Whether a chat caller asked for the usage chunk (``stream_options.include_usage``)."""
    options = request.extra.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage"))


class WireReader:
    """Reads one target's stream in its own wire: each frame as a
    :class:`~capmon.core.providers.frames.Event`, and the whole answer the events make
    (the wire's format module's ``read_frame`` and ``assembler``)."""

    def __init__(self, target_wire: Format) -> None:
        self.wire = target_wire
        self._finished = False  # the wire's end came (the attempt says)
        fmt = FORMATS[target_wire]
        self._read = fmt.read_frame
        self._assembled = fmt.assembler()

    @property
    def finished(self) -> bool:
        """The answer is whole: the wire's end came, or the answer says so (a finish reason)."""
        return self._finished or self._assembled.finished

    @finished.setter
    def finished(self, value: bool) -> None:
        self._finished = value

    def read(self, frame: Frame, *, now: float, quota_hint: float = QUOTA_HINT) -> Event:
        """One frame's event, its usage bounded (capmon/core/providers/usage.py): what the caller, the
        assembler and the translators get."""
        event = self._read(frame, now=now, quota_hint=quota_hint)
        if event.chunk is not None:
            chunk = usage.bounded(event.chunk)
            if chunk is not event.chunk:
                return dataclasses.replace(event, chunk=chunk)
        return event

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        """One event with a chunk (``done``: the stream's last, which carries one on the
        Responses and Messages wires)."""
        self._assembled.add(chunk, done)

    def answer(self) -> Mapping[str, Any] | None:
        """The whole answer in the target's wire."""
        return self._assembled.answer()


def takes_untouched(caller: Format, t: Target) -> bool:
    """Whether ``t`` takes every ``caller`` request as it comes (:func:`incapable` says None
    for any body, without reading it): its endpoint serves the caller's own format to its
    model and has no rules for bodies. Fixed by the config: a client reads it once."""
    dialect = dialect_of(t.endpoint)
    wire = dialect.wire_of(caller, t.model.wire_name)
    return wire is caller and dialect.unserved(t.endpoint, wire) is None and not dialect.has_body_rules(t.endpoint)


def incapable_targets(request: Request, targets: Sequence[Target], client: ClientConfig) -> dict[str, str]:
    """Per target that cannot carry ``request``, why (checked once per endpoint and wire:
    the reason depends on its API, version and the wire the model speaks there (Vertex AI's
    publishers), not on the model itself or the key)."""
    by_wire: dict[tuple[str, Format], str | None] = {}
    out: dict[str, str] = {}
    for t in targets:
        where = (t.endpoint.name, dialect_of(t.endpoint).wire_of(request.format, t.model.wire_name))
        if where not in by_wire:
            by_wire[where] = incapable(request, t, client)
        why = by_wire[where]
        if why is not None:
            out[t.id] = why
    return out


def chunk_text(caller: Format, chunk: Mapping[str, Any]) -> str:
    """The text a stream chunk or event in the caller's format adds ("" when none)."""
    return FORMATS[caller].chunk_text(chunk)


# ---------------------------------------------------------------- continuing a broken answer


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the assistant's last message, in the
    caller's format (its format module's), and a user message ``instruction`` after it (None: none)."""
    return FORMATS[request.format].continued(request, partial, instruction)


def splicer(caller: Format, prompt: int) -> Splice:
    """The splice of one streamed request in the caller's format (its format module's)."""
    return FORMATS[caller].splicer(prompt)


def takes_prefill(request: Request, t: Target) -> bool:
    """Whether the wire an attempt for ``request`` sends to ``t`` takes a prefill."""
    return FORMATS[dialect_of(t.endpoint).wire_of(request.format, t.model.wire_name)].takes_prefill()
