"""The hub's moves: a request, an answer or a stream from one format to another, always
through the canonical types (capmon/core/types/canon.py), the registry of formats, and what
the format modules share (what a format module is: :class:`WireFormat`; the drop-or-skip rule;
a tool call's check; the fields capmon owns in a body sent in the caller's own format).

A format is a module (``chat_format``, ``responses_format``, ``messages_format``,
``gemini_format``, ``converse_format``) with the
functions of :class:`WireFormat`; a new format is one more module and one more line in
:data:`FORMATS`. See ARCHITECTURE.md, "Across formats".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from capmon.core.base.exceptions import BrokenAnswer, CapmonError
from capmon.core.providers.classify import QUOTA_HINT, classify_tool_call
from capmon.core.providers.frames import Event
from capmon.core.providers.splice import Splice
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.config import DropRule
from capmon.core.types.failure import Failure
from capmon.core.types.result import Format, Request


class Incapable(CapmonError, ValueError):
    """A request or an answer that the target format cannot carry (the message says why):
    the target is skipped as incapable, or the answer is a broken one."""


def drop_or_refuse(names: tuple[str, ...], rule: DropRule, why: str) -> tuple[str, ...]:
    """The one home of the drop-or-skip rule: ``names`` (fields a target cannot take, whose
    absence changes no answer's meaning: hints a format cannot honour, sampling fields an
    API version refuses) are dropped (returned, to be said on the attempt record and
    ``x-capmon-dropped``) or, by ``rule``, make the target incapable."""
    if names and rule is DropRule.SKIP:
        raise Incapable(f'{", ".join(names)} ({why} = "skip")')
    return names


def sort_fields(
    body: Mapping[str, Any], slots: frozenset[str], no_meaning: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A decoder's fields that no canon slot holds (``slots``: those it reads itself), in
    two: ``own``, fields with meaning that only this format has (an encoder of another
    format refuses a set one), and ``aside``, bookkeeping that changes no answer
    (``no_meaning``, and fields set to null)."""
    own: dict[str, Any] = {}
    aside: dict[str, Any] = {}
    for name, value in body.items():
        if name in slots:
            continue
        if name in no_meaning or value is None:
            aside[name] = value
        else:
            own[name] = value
    return own, aside


def check_call(name: object, call_id: object, arguments: str) -> None:
    """Raises :class:`~capmon.core.base.exceptions.BrokenAnswer` when a tool call's
    arguments are no JSON object: an answer that crosses formats is broken with one, whatever
    format tells it."""
    failure = classify_tool_call(name, call_id, arguments)
    if failure is not None:
        raise BrokenAnswer(failure)


def success_json(status: int, body: bytes | str | None) -> object | None:
    """A 2xx body's JSON (what a format's ``parse`` looks into), or None: not a success,
    empty, or not JSON. Never raises."""
    if not 200 <= status < 300 or not body:
        return None
    try:
        parsed: object = json.loads(body)
    except Exception:  # not JSON, not UTF-8, nested too deep: the classifier says which
        return None
    return parsed


def part_kind(part: canon.Part) -> str:
    """How the caller's format names a part it gave (for a refusal)."""
    if isinstance(part, canon.Opaque):
        return part.kind
    if isinstance(part, canon.Thinking):
        return "redacted thinking" if part.redacted else "thinking"
    return type(part).__name__.lower()


def crossing_tools(
    request: canon.Request, same: bool, no_cache: Callable[[canon.Cache | None, str], None]
) -> Iterator[tuple[canon.Tool, dict[str, Any] | None]]:
    """Each of ``request``'s tools, checked to be sent in a format (Gemini's, Converse's):
    a built-in tool only to its own format (``same``), as it came (its fields, yielded to be
    sent); a function tool without fields only its source format has, without a cache hint
    the format refuses (``no_cache`` raises), and with a name (yielded with None: the format
    encodes it). Raises :class:`Incapable` for a tool that cannot go."""
    for t in request.tools:
        if t.builtin:
            if not same:
                raise Incapable(f"a built-in {t.own.get('type') or t.name} tool (only function tools translate)")
            yield t, dict(t.own)
            continue
        if not same and t.own:
            raise Incapable(f"tool {t.name}: {', '.join(sorted(t.own))}")
        no_cache(t.cache, f"tool {t.name}")
        if not isinstance(t.name, str) or not t.name:
            raise Incapable("a function tool without a name")
        yield t, None


def owned_body(extra: Mapping[str, Any], *, model: str, cap_field: str, cap: int, stream: bool) -> dict[str, Any]:
    """A body in the caller's own format (the Responses API, Anthropic's Messages): the
    caller's fields untouched but the model, the token cap (``cap_field``) and ``stream``,
    which capmon owns."""
    body = {k: v for k, v in extra.items() if k not in ("model", "stream", cap_field)}
    body["model"] = model
    body[cap_field] = cap
    if stream:
        body["stream"] = True
    return body


def call_input(call: canon.ToolCall, where: str) -> Mapping[str, Any]:
    """A call's arguments as the JSON object a format that takes an object must send (none
    or blank: an empty one). Raises :class:`Incapable` naming ``where`` for arguments that
    are no JSON object."""
    if call.input is not None:
        return call.input
    if not call.arguments.strip():
        return {}
    try:
        json.loads(call.arguments)
    except (ValueError, RecursionError):
        raise Incapable(f"{where}: tool call arguments that are not JSON") from None
    raise Incapable(f"{where}: tool call arguments that are not a JSON object")


def appended(request: Request, key: str, turns: Sequence[Mapping[str, Any]]) -> Request:
    """``request`` (a body in its own format) with ``turns`` after its body's ``key`` list
    (``messages``, ``contents``): a broken answer's continuation, the caller's body not changed."""
    body = dict(request.extra)
    body[key] = [*(body.get(key) or ()), *turns]
    return dataclasses.replace(request, extra=body)


@dataclass
class Call:
    """One tool call of a stream, as far as it came: its name and id, and its arguments' pieces."""

    name: object = None
    id: object = None
    pieces: list[str] = field(default_factory=list)

    def check(self) -> None:
        check_call(self.name, self.id, "".join(self.pieces))


class CallWatcher(Protocol):
    """Checks each tool call of a stream in a format's own events as it ends (raising
    :class:`~capmon.core.base.exceptions.BrokenAnswer`), and knows the stream's last event."""

    def last(self, chunk: Mapping[str, Any]) -> bool:
        """Whether ``chunk`` is the stream's last event (False where the end carries none)."""
        ...

    def feed(self, chunk: Mapping[str, Any]) -> None: ...

    def end(self) -> None:
        """The stream ended: calls still open end with it."""
        ...


class StreamDecoder(Protocol):
    """A stream in a format's own events in, canonical events out."""

    def feed(self, chunk: Mapping[str, Any]) -> Sequence[canon.Event]: ...

    def close(self) -> Sequence[canon.Event]:
        """At the wire's own end (a format whose end carries no event: chat's [DONE])."""
        ...


class StreamEncoder(Protocol):
    """Canonical events in, a format's own events out."""

    def feed(self, event: canon.Event) -> Sequence[dict[str, Any]]: ...


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

    def wire_body(
        self,
        request: Request,
        translated: Mapping[str, Any] | None,
        *,
        model: str,
        limit: int,
        stream: bool,
        token_param: TokenParam,
    ) -> dict[str, Any]:
        """The body an attempt sends in this format: the caller's own request (``translated``
        None: its fields untouched) or a translated one, with the model, the token cap
        ``limit`` and ``stream`` set (and n = 1 where the format has n)."""
        ...

    def refused_token_param(self, failure: Failure, sent: TokenParam) -> bool:
        """Whether ``failure`` says the model refuses the token parameter ``sent`` (the
        quirk of a format with two: the client then sends the other, token_param.py)."""
        ...

    def tool_calls(self, answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
        """Each tool call of a whole answer: its name, id and arguments as JSON text."""
        ...

    def call_watcher(self) -> CallWatcher:
        """A new watcher of one stream's tool calls (see :class:`CallWatcher`)."""
        ...


class WireFormat(FormatReading, Protocol):
    """What a format module provides (the module itself is the implementation): its
    reading and probing, its moves to and from the hub, and a broken stream's continuation."""

    def decode_request(self, body: Mapping[str, Any]) -> canon.Request: ...

    def encode_request(self, request: canon.Request) -> dict[str, Any]: ...

    def decode_answer(self, answer: Mapping[str, Any]) -> canon.Answer: ...

    def encode_answer(self, answer: canon.Answer, *, created: int) -> dict[str, Any]: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def stream_encoder(self, *, created: int, include_usage: bool) -> StreamEncoder: ...

    # A broken stream's continuation in this format (each module's "continuing a broken
    # answer" section; capmon/core/routing/continuation.py).

    def continued(self, request: Request, partial: str, instruction: str | None) -> Request:
        """``request`` (in this format) with the partial answer ``partial`` as the assistant's
        last message, and a user message ``instruction`` after it (None: none)."""
        ...

    def takes_prefill(self) -> bool:
        """Whether a request may end with the assistant's own words for the model to go on
        from (a prefill; a model may still refuse one: ``[[models]] prefill``)."""
        ...

    def splicer(self, prompt: int) -> Splice:
        """A new splice of one streamed request in this format (see :class:`~capmon.core.providers.splice.Splice`)."""
        ...

    def answer_stream(self, answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
        """A whole answer in this format as the stream of events that tells it in this format,
        its end included: what a stream request answered plainly gives its caller (a server
        that ignores ``stream``). Raises :class:`Incapable` for what the events cannot carry."""
        ...


# ---------------------------------------------------------------- the registry and requests

# Imported here, at the end: each format module imports this one (its Incapable).
from capmon.core.providers import (  # noqa: E402
    chat_format,
    converse_format,
    gemini_format,
    messages_format,
    responses_format,
)

# Each format module: a new format is one more module and one more line here.
FORMATS: Mapping[Format, WireFormat] = {
    Format.CHAT: chat_format,
    Format.RESPONSES: responses_format,
    Format.MESSAGES: messages_format,
    Format.GEMINI: gemini_format,
    Format.CONVERSE: converse_format,
}


def translate_request(
    body: Mapping[str, Any], source: Format, target: Format, *, hints: DropRule | None = None
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``body`` (a request in ``source``) in ``target``, without ``model`` and ``stream``
    (the wire's): ``target.encode_request(source.decode_request(body))``, and the hints
    left out. With a rule (``hints``: ``[client] unhonoured_hints``), toward a format that
    cannot honour Anthropic's hints (:data:`HINTS`: any but Messages) they are taken out
    first and dropped, or make the target incapable; without one, the target's encoder
    refuses them like any field it cannot carry. Raises :class:`Incapable` with the
    reason when ``target`` cannot carry the request."""
    decoded = FORMATS[source].decode_request(body)
    left_out: tuple[str, ...] = ()
    if hints is not None and target is not Format.MESSAGES:  # only an Anthropic-shaped format honours them
        decoded, left_out = without_hints(decoded)
        why = f"hints {target.value} cannot honour; [client] unhonoured_hints"
        left_out = drop_or_refuse(left_out, hints, why)
    return FORMATS[target].encode_request(decoded), left_out


# Hints: what says how to serve a request, never what its answer means. A caching
# breakpoint; thinking left to the model (adaptive) or off; Anthropic's default effort
# ("high": the same as none asked); context edits that only clear thinking blocks (none
# cross: thinking in the history is refused). A format that cannot honour them (OpenAI's
# chat) refuses them in its encoder; :func:`without_hints` takes them out first for the
# config's rule ([client] unhonoured_hints: left out and said, or the target skipped).
HINTS = ("cache_control", "thinking", "output_config.effort", "context_management")
_HINT_THINKING = frozenset({"adaptive", "disabled"})
_DEFAULT_EFFORT = "high"
_CLEAR_THINKING = "clear_thinking_"


def without_hints(request: canon.Request) -> tuple[canon.Request, tuple[str, ...]]:
    """``request`` without its hints (see :data:`HINTS`), and the names of those taken out
    (in :data:`HINTS`' order); the same request when it has none. ``thinking`` that asks
    for reasoning (``enabled`` with a budget) and any other effort are no hints: they stay,
    and an encoder that cannot carry them refuses them."""
    found: set[str] = set()
    changes: dict[str, Any] = {}
    if request.cache is not None and request.cache.raw:
        changes["cache"] = None
        found.add("cache_control")
    system = _uncached(request.system, found)
    if system is not request.system:
        changes["system"] = system
    tools = tuple(
        dataclasses.replace(t, cache=None) if t.cache is not None and t.cache.raw else t for t in request.tools
    )
    if any(a is not b for a, b in zip(tools, request.tools, strict=True)):
        changes["tools"] = tools
        found.add("cache_control")
    messages, changed = [], False
    for m in request.messages:
        parts = _uncached(m.parts, found)
        if parts is not m.parts:
            m, changed = dataclasses.replace(m, parts=parts), True
        messages.append(m)
    if changed:
        changes["messages"] = tuple(messages)
    thinking = request.thinking
    if thinking is not None and thinking.get("type") in _HINT_THINKING:
        changes["thinking"] = None
        found.add("thinking")
    if request.effort == _DEFAULT_EFFORT:
        changes["effort"] = None
        found.add("output_config.effort")
    own = request.own
    management = own.get("context_management")
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if (
        isinstance(management, Mapping)
        and set(management) == {"edits"}
        and isinstance(edits, list)
        and all(isinstance(e, Mapping) and str(e.get("type", "")).startswith(_CLEAR_THINKING) for e in edits)
    ):
        changes["own"] = {k: v for k, v in own.items() if k != "context_management"}
        found.add("context_management")
    if not changes:
        return request, ()
    return dataclasses.replace(request, **changes), tuple(name for name in HINTS if name in found)


def _uncached(parts: tuple[canon.Part, ...], found: set[str]) -> tuple[canon.Part, ...]:
    """Parts (and a tool result's own parts) without their cache breakpoints: the same
    tuple when none has one (a body's parts are not copied for nothing)."""
    out: list[canon.Part] | None = None
    text = canon.Text
    for i, part in enumerate(parts):
        if type(part) is text and part.cache is None:  # the common part first: a body may hold thousands
            if out is not None:
                out.append(part)
            continue
        given = part
        if isinstance(part, canon.Opaque):
            if part.raw.get("cache_control"):
                part = dataclasses.replace(part, raw={k: v for k, v in part.raw.items() if k != "cache_control"})
        elif isinstance(part, canon.Thinking):
            pass
        else:
            if isinstance(part, canon.ToolResult) and not isinstance(part.content, str):
                content = _uncached(part.content, found)
                if content is not part.content:
                    part = dataclasses.replace(part, content=content)
            if part.cache is not None and part.cache.raw:
                part = dataclasses.replace(part, cache=None)
        if part is not given:
            found.add("cache_control")
            if out is None:
                out = list(parts[:i])
        if out is not None:
            out.append(part)
    return parts if out is None else tuple(out)


def translate_answer(answer: Mapping[str, Any], source: Format, target: Format, *, created: int) -> dict[str, Any]:
    """An answer in ``source``'s format told in ``target``'s (``created``: the time a target
    format that carries one says). Raises :class:`Incapable` for what ``target`` cannot carry."""
    return FORMATS[target].encode_answer(FORMATS[source].decode_answer(answer), created=created)


def answer_events(answer: canon.Answer) -> list[canon.Event]:
    """A whole answer as the stream that would have told it: its start, per part a start
    (a text, thinking or tool call empty, then its content in one delta; any other part
    whole), its end and done (a format's ``answer_stream``, through :func:`told`)."""
    usage = answer.usage
    opening = None if usage is None else canon.Usage(usage.input, usage.cache_write, usage.cache_read, 0)
    out: list[canon.Event] = [canon.Started(answer.id, answer.model, opening)]
    for i, part in enumerate(answer.parts):
        deltas: list[canon.PartDelta] = []
        if isinstance(part, canon.Text):
            first: canon.Part = canon.Text("", refusal=part.refusal)
            deltas += [canon.PartDelta(i, citation=c) for c in part.citations]
            deltas += [canon.PartDelta(i, text=part.text)] if part.text else []
        elif isinstance(part, canon.ToolCall):
            first = canon.ToolCall(part.id, part.name, "", where=part.where)
            deltas += [canon.PartDelta(i, arguments=part.arguments)] if part.arguments else []
        elif isinstance(part, canon.Thinking) and not part.redacted:
            first = canon.Thinking("")
            deltas += [canon.PartDelta(i, text=part.text)] if part.text else []
            deltas += [canon.PartDelta(i, signature=part.signature)] if part.signature is not None else []
        else:
            first = part
        out += [canon.PartStarted(i, first), *deltas, canon.PartStopped(i)]
    out += [canon.Ended(answer.stop, usage, answer.stop_sequence, answer.stop_other), canon.Done()]
    return out


def told(answer: canon.Answer, encoder: StreamEncoder) -> list[dict[str, Any]]:
    """A whole answer as ``encoder``'s format streams it (:func:`answer_events` encoded)."""
    return [out for event in answer_events(answer) for out in encoder.feed(event)]


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
