"""A streamed answer that broke after output reached the caller, finished by the next attempt.

When a stream breaks after output (a cut, an in-stream overload), the answer so far is not
thrown away: the request goes again (the same model or the next, by the normal routing)
with the partial answer appended, and only the new text reaches the caller, spliced into
the stream it already has, so the caller sees one continuous answer in its own format:

* the request (:func:`continued_request`): the caller's request with the partial answer as
  an assistant message, in the caller's format. The attempt's normal way
  (capmon/core/providers/formats.py) carries it to the target's wire, through the hub when
  the formats differ. On Anthropic's Messages wire an assistant message at the end is a
  *prefill*: the model goes on from its last character. Elsewhere (OpenAI's APIs continue
  no assistant message), for a model declared ``prefill = false``, or one whose 400 said
  it takes none (:func:`refuses_prefill`: learned once, the request retried at once, that
  400 never the caller's error), a user message follows it: :data:`INSTRUCTION`.
* the stream (:class:`Splice`, one per caller format): what went to the caller is followed
  as it goes (the text, the open block or item, the ids, the sequence numbers); a
  continuation's events are fitted into it: no second start (``message_start``,
  ``response.created``, a role chunk), the open text block or item goes on under its own
  index and id, later ones are numbered after it, the end carries the usage of every
  request and says who continued it (``capmon_continued``: a list of ``{"model", "offset"}``).
* what cannot be continued: a break inside a tool call's arguments that already reached the
  caller (the call is never sent as whole: the stream ends with a clear error), an answer
  with anything but text before the break, a caller who opted out, a request past
  ``[client] continuations``. Those end as before: RequestFailed, a clear in-band error.

See ARCHITECTURE.md, "Continuing a broken answer".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers.tokens import tokens_for_chars
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Continued, Format, Request

# What a model that takes no prefill is asked, after the partial answer as its own message.
# It names no tool, so a tool loop reads it as no request for a call.
INSTRUCTION = (
    "Your previous message was cut off. Continue it from exactly where it stops, without repeating"
    " any of it: begin with the very next characters."
)
# The field the end of a continued stream carries (a chat chunk, a Messages message_delta,
# a Responses response): who continued the answer and from which character.
FIELD = "capmon_continued"

# The words of a provider's 400 that refuses an assistant prefill (Anthropic's models that
# take none; the trailing whitespace rule of the ones that do).
_REFUSALS = (
    "does not support assistant message prefill",
    "assistant message prefill",
    "final assistant content cannot end with trailing whitespace",
    "prefill",
)


def refuses_prefill(failure: Failure | None) -> bool:
    """Whether ``failure`` is a target's refusal of an assistant prefill (a 400 that names it)."""
    if failure is None or failure.kind is not Kind.BAD_REQUEST:
        return False
    reason = failure.reason.lower()
    return any(words in reason for words in _REFUSALS)


@dataclass(frozen=True, slots=True)
class Partial:
    """What the caller has of a broken answer."""

    text: str  # its text, every text block's in order
    half_call: bool = False  # a tool call's arguments reached the caller, and the call never ended
    other: bool = False  # something but text reached the caller (a whole tool call): not continued

    @property
    def why_not(self) -> str | None:
        """Why this answer cannot be continued (None: it can)."""
        if self.half_call:
            return "it broke inside a tool call's arguments that had reached the caller"
        if self.other:
            return "the caller already had more than text (a tool call)"
        return None


def continued_request(request: Request, text: str, *, prefill: bool) -> tuple[Request, str]:
    """``request`` with the partial answer ``text`` as the assistant's message, in the
    caller's format, and the whitespace taken off its end (a prefill may not end with any:
    the continuation's first characters make up for it). ``prefill`` False: a user message
    with :data:`INSTRUCTION` follows."""
    strip = text.rstrip() if prefill else text
    trailing = text[len(strip) :]
    fmt = request.format
    said: list[dict[str, Any]] = []
    if fmt is Format.MESSAGES:
        said.append({"role": "assistant", "content": [{"type": "text", "text": strip}]})
        if not prefill:
            said.append({"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]})
        body = dict(request.extra)
        body["messages"] = [*(body.get("messages") or ()), *said]
        return dataclasses.replace(request, extra=body), trailing
    said.append({"role": "assistant", "content": strip})
    if not prefill:
        said.append({"role": "user", "content": INSTRUCTION})
    if fmt is Format.RESPONSES:
        body = dict(request.extra)
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
        body["input"] = [*items, *said]
        return dataclasses.replace(request, extra=body), trailing
    return dataclasses.replace(request, messages=(*request.messages, *said)), trailing


def _add(usage: Mapping[str, Any], names: Sequence[tuple[str, int]]) -> dict[str, Any]:
    out = dict(usage)
    for name, more in names:
        value = out.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = value + more
    return out


@dataclass
class Splice:
    """A stream's chunks in the caller's format as they went out (:meth:`sent`), and a
    continuation's fitted into them (:meth:`fit`). The base class knows the text and the
    usage to add; a subclass per format knows its events."""

    prompt: int  # the tokens of the request each earlier attempt sent (estimated)
    records: list[Continued] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    half_call: bool = False
    other: bool = False
    earlier_in: int = 0  # tokens the earlier attempts read and wrote (estimated: they never said)
    earlier_out: int = 0
    _trim: str = ""  # whitespace the prefill left off, which the continuation says again
    _fitted: bool = False  # the latest continuation has sent the caller something

    @property
    def offset(self) -> int:
        return sum(len(t) for t in self.text)

    def partial(self) -> Partial:
        return Partial("".join(self.text), self.half_call, self.other)

    def begin(self, model: str, trailing: str) -> None:
        """A continuation by ``model`` begins: the attempt that broke counts in the usage."""
        self._trim = trailing
        if self.records and not self._fitted:  # the last continuation's attempt sent nothing: another goes on
            self.records[-1] = Continued(model, self.records[-1].offset)
            return
        before = self.records[-1].offset if self.records else 0
        self.records.append(Continued(model, self.offset))
        self.earlier_in += self.prompt
        self.earlier_out += tokens_for_chars(self.offset - before)
        self._fitted = False

    def _text(self, piece: str) -> str:
        """A continuation's text, the whitespace the prefill left off (and said already) taken off its start."""
        if self._trim and piece:
            n = 0
            while n < len(piece) and n < len(self._trim) and piece[n] == self._trim[n]:
                n += 1
            self._trim = ""
            piece = piece[n:]
        return piece

    def said(self) -> list[dict[str, Any]]:
        return [r.as_json() for r in self.records]

    def out(self, chunk: Mapping[str, Any]) -> None:
        """``chunk`` went to the caller."""
        self._fitted = True
        self.sent(chunk)

    def sent(self, chunk: Mapping[str, Any]) -> None:  # pragma: no cover - each format's
        raise NotImplementedError

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:  # pragma: no cover - each format's
        raise NotImplementedError


@dataclass
class ChatSplice(Splice):
    """Chat chunks: a continuation's role chunk is left out, its chunks take the first
    answer's id, the finish chunk says who continued it, the usage chunk counts every request."""

    id: Any = None

    def sent(self, chunk: Mapping[str, Any]) -> None:
        if self.id is None:
            self.id = chunk.get("id")
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
            if delta.get("tool_calls"):
                self.half_call = True
            if choice.get("finish_reason") is not None and self.half_call:
                self.half_call, self.other = False, True

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        out = dict(chunk)
        if self.id is not None and "id" in out:
            out["id"] = self.id
        choices = out.get("choices")
        if isinstance(choices, list) and choices:
            fitted = []
            ends = False
            for choice in choices:
                if not isinstance(choice, Mapping):
                    fitted.append(choice)
                    continue
                delta = dict(choice.get("delta") or {})
                content = delta.get("content")
                if isinstance(content, str) and content:
                    delta["content"] = self._text(content)
                if choice.get("finish_reason") is None and not delta.get("content") and not delta.get("tool_calls"):
                    if set(delta) <= {"role", "content", "refusal"} and not delta.get("refusal"):
                        continue  # a role chunk, or text the prefill had: nothing new
                ends = ends or choice.get("finish_reason") is not None
                fitted.append({**choice, "delta": delta})
            if not fitted:
                return []
            out["choices"] = fitted
            if ends:
                out[FIELD] = self.said()
        usage = out.get("usage")
        if isinstance(usage, Mapping):
            more = (("prompt_tokens", self.earlier_in), ("completion_tokens", self.earlier_out))
            out["usage"] = _add(usage, (*more, ("total_tokens", self.earlier_in + self.earlier_out)))
            out[FIELD] = self.said()
        return [out]


@dataclass
class MessagesSplice(Splice):
    """Messages events: the continuation's ``message_start`` is left out, its first text
    block goes on as the open one (same index, no second start), later blocks are numbered
    after the caller's; ``message_delta`` counts every request and says who continued it."""

    blocks: int = 0  # blocks the caller has been started
    open: int | None = None  # the caller's open block
    open_text: bool = False
    _map: dict[int, int] = field(default_factory=dict)

    def begin(self, model: str, trailing: str) -> None:
        super().begin(model, trailing)
        self._map = {}

    def sent(self, chunk: Mapping[str, Any]) -> None:
        kind = chunk.get("type")
        index = chunk.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            block = chunk.get("content_block") or {}
            self.blocks = max(self.blocks, index + 1)
            self.open, self.open_text = index, block.get("type") == "text"
            if block.get("type") == "tool_use":
                self.half_call = True
        elif kind == "content_block_delta":
            delta = chunk.get("delta") or {}
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self.text.append(delta["text"])
        elif kind == "content_block_stop":
            if self.half_call and index == self.open:
                self.half_call, self.other = False, True
            self.open, self.open_text = None, False

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        kind = chunk.get("type")
        index = chunk.get("index")
        if kind == "message_start":
            return []
        if kind == "content_block_start" and isinstance(index, int):
            block = chunk.get("content_block") or {}
            if not self._map and self.open is not None and self.open_text and block.get("type") == "text":
                self._map[index] = self.open  # the open text block goes on
                return []
            self._map[index] = self.blocks  # the next the caller has not seen
            return [{**chunk, "index": self._map[index]}]
        if kind in ("content_block_delta", "content_block_stop") and isinstance(index, int):
            out = {**chunk, "index": self._map.get(index, index)}
            delta = out.get("delta")
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
                text = self._text(str(delta.get("text") or ""))
                if not text:
                    return []
                out["delta"] = {**delta, "text": text}
            return [out]
        if kind == "message_delta":
            out = dict(chunk)
            usage = out.get("usage")
            if isinstance(usage, Mapping):
                out["usage"] = _add(usage, (("input_tokens", self.earlier_in), ("output_tokens", self.earlier_out)))
            out[FIELD] = self.said()
            return [out]
        return [chunk]


@dataclass
class ResponsesSplice(Splice):
    """Responses events: the continuation's ``response.created`` and ``response.in_progress``
    are left out, its first message item goes on as the caller's open one (its id, its
    output index, its text whole in the done events), later items are numbered after the
    caller's, every event's sequence number follows the caller's, and ``response.completed``
    carries the whole output, the first response's id, every request's usage, and who
    continued it."""

    response_id: Any = None
    seq: int = 0  # the next sequence number the caller expects
    items: dict[int, Mapping[str, Any]] = field(default_factory=dict)  # output index -> item as last told
    open: int | None = None  # the caller's open message item (its output index)
    open_text: list[str] = field(default_factory=list)
    _map: dict[int, int] = field(default_factory=dict)
    _prefix: dict[int, str] = field(default_factory=dict)  # the caller's output index -> text before

    def begin(self, model: str, trailing: str) -> None:
        super().begin(model, trailing)
        self._map, self._prefix = {}, {}

    def sent(self, chunk: Mapping[str, Any]) -> None:
        kind = chunk.get("type")
        seq = chunk.get("sequence_number")
        if isinstance(seq, int):
            self.seq = seq + 1
        response = chunk.get("response")
        if kind == "response.created" and isinstance(response, Mapping) and self.response_id is None:
            self.response_id = response.get("id")
        n = chunk.get("output_index")
        item = chunk.get("item")
        if kind == "response.output_item.added" and isinstance(n, int) and isinstance(item, Mapping):
            self.items[n] = item
            if item.get("type") == "message":
                self.open, self.open_text = n, []
            elif item.get("type") == "function_call":
                self.half_call = True
            else:
                self.other = True
        elif kind == "response.output_text.delta" and isinstance(chunk.get("delta"), str):
            self.text.append(chunk["delta"])
            if n == self.open:
                self.open_text.append(chunk["delta"])
        elif kind == "response.output_item.done" and isinstance(n, int) and isinstance(item, Mapping):
            self.items[n] = item
            if item.get("type") == "function_call":
                self.half_call, self.other = False, True
            if n == self.open:
                self.open = None

    def _item(self, item: Mapping[str, Any], n: int) -> dict[str, Any]:
        out = dict(item)
        prefix = self._prefix.get(n)
        if prefix is not None:
            out["id"] = self.items[n].get("id", out.get("id"))
            content = out.get("content")
            if isinstance(content, list) and content and isinstance(content[0], Mapping):
                first = dict(content[0])
                first["text"] = prefix + str(first.get("text") or "")
                out["content"] = [first, *content[1:]]
        return out

    def _numbered(self, chunk: dict[str, Any]) -> list[Mapping[str, Any]]:
        if "sequence_number" in chunk:
            chunk["sequence_number"] = self.seq
        return [chunk]

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        kind = chunk.get("type")
        if kind in ("response.created", "response.in_progress"):
            return []
        out = dict(chunk)
        n = out.get("output_index")
        if kind == "response.output_item.added" and isinstance(n, int):
            item = out.get("item") or {}
            if not self._map and self.open is not None and item.get("type") == "message":
                self._map[n] = self.open
                self._prefix[self.open] = "".join(self.open_text)
                return []
            self._map[n] = max([*self.items, -1]) + 1  # the next the caller has not seen
        if isinstance(n, int):
            mine = self._map.get(n, n)
            out["output_index"] = mine
            if mine in self._prefix:
                if kind == "response.content_part.added":
                    return []
                out["item_id"] = self.items[mine].get("id", out.get("item_id"))
                prefix = self._prefix[mine]
                if kind == "response.output_text.delta":
                    text = self._text(str(out.get("delta") or ""))
                    if not text:
                        return []
                    out["delta"] = text
                elif kind == "response.output_text.done":
                    out["text"] = prefix + str(out.get("text") or "")
                elif kind == "response.content_part.done" and isinstance(out.get("part"), Mapping):
                    out["part"] = {**out["part"], "text": prefix + str(out["part"].get("text") or "")}
                if isinstance(out.get("item"), Mapping):
                    out["item"] = self._item(out["item"], mine)
        if kind in ("response.completed", "response.incomplete") and isinstance(out.get("response"), Mapping):
            response = dict(out["response"])
            if self.response_id is not None:
                response["id"] = self.response_id
            told = dict(self.items)
            for i, item in enumerate(response.get("output") or ()):
                mine = self._map.get(i, i)
                told[mine] = self._item(item, mine) if isinstance(item, Mapping) else item
            response["output"] = [told[i] for i in sorted(told)]
            usage = response.get("usage")
            if isinstance(usage, Mapping):
                response["usage"] = _add(
                    usage,
                    (
                        ("input_tokens", self.earlier_in),
                        ("output_tokens", self.earlier_out),
                        ("total_tokens", self.earlier_in + self.earlier_out),
                    ),
                )
            response[FIELD] = self.said()
            out["response"] = response
        return self._numbered(out)


def splice_for(caller: Format, prompt: int) -> Splice:
    """The splice of one streamed request in the caller's format."""
    if caller is Format.MESSAGES:
        return MessagesSplice(prompt)
    if caller is Format.RESPONSES:
        return ResponsesSplice(prompt)
    return ChatSplice(prompt)
