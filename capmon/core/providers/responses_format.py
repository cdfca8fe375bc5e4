"""The responses format: OpenAI's Responses API (/responses). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers import chat_format, hub, splice
from capmon.core.providers.chat_format import ERROR_EVENTS, function_tool, image_of, tool_call, tool_choice_of
from capmon.core.providers.classify import QUOTA_HINT, classify_event, classify_response
from capmon.core.providers.frames import Event, FrameKind, typed_event
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request, caller_cap

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.

# OpenAI's Responses API decoded into canon: instructions and the leading system and
# developer items are the system prompt, input items messages (a function call joins the
# assistant turn before it; its output is a tool result of a user turn), function tools
# tools. No request of another format is ever encoded into it: formats.wire_of sends the
# Responses API only to OpenAI and Azure endpoints, in the caller's own format.

SOURCE = "responses"

# Fields that mean nothing to the answer (bookkeeping, cache keys, what extra the reply
# carries): kept aside. ``client_metadata``: Codex CLI's session and turn ids.
_RESPONSES_NO_MEANING = frozenset(
    {
        "store",
        "metadata",
        "client_metadata",
        "include",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "service_tier",
        "stream_options",
    }
)
_RESPONSES_SLOTS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "stream",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "user",
        "truncation",
        "reasoning",
    }
)
_ITEM_ROLES: Mapping[str, canon.Role] = {
    "user": canon.Role.USER,
    "assistant": canon.Role.ASSISTANT,
    "system": canon.Role.SYSTEM,
    "developer": canon.Role.SYSTEM,
}
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})


def decode_request(body: Mapping[str, Any]) -> canon.Request:
    """A Responses body in canon terms (fields with no slot in ``own``, bookkeeping in
    ``aside``). Raises :class:`~capmon.core.providers.hub.Incapable` for a body that is no
    Responses request, or holds an item the hub has no type for (a reasoning item, a
    built-in tool's call), naming it by its place (``input[i]``)."""
    own, aside = hub.sort_fields(body, _RESPONSES_SLOTS, _RESPONSES_NO_MEANING)
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        own["truncation"] = truncation
    elif "truncation" in body:
        aside["truncation"] = truncation
    effort = _reasoning(body.get("reasoning"), own, aside)
    system: list[canon.Part] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        system.append(canon.Text(instructions))
    elif instructions:
        raise hub.Incapable("instructions that are not text")
    items = body.get("input")
    if isinstance(items, str):
        messages = [canon.Message(canon.Role.USER, (canon.Text(items),), True, "input")]
    elif isinstance(items, list):
        messages = _Turns(system).read(items)
    else:
        raise hub.Incapable("no input")
    cap = body.get("max_output_tokens")
    user = body.get("user")
    parallel = body.get("parallel_tool_calls")
    tools = body.get("tools")
    return canon.Request(
        source=SOURCE,
        messages=tuple(messages),
        system=tuple(system),
        system_plain=len(system) == 1,
        max_tokens=caller_cap(cap),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        user=user if isinstance(user, str) else None,
        tools=tuple(_tool(t) for t in tools) if isinstance(tools, list) and tools else (),
        tool_choice=_tool_choice(body.get("tool_choice"), own),
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        output=_text_format(body, own, aside),
        effort=effort,
        own=own,
        aside=aside,
    )


def _reasoning(reasoning: object, own: dict[str, Any], aside: dict[str, Any]) -> str | None:
    """A reasoning object's effort. One that asks for none (absent or ``none``) asks for
    nothing a model without reasoning does not give: a summary is only ever of reasoning
    done, so ``summary`` alone (Codex CLI sends ``{"summary": "auto"}``) is kept aside."""
    if reasoning is None:
        return None
    if not isinstance(reasoning, Mapping) or set(reasoning) - {"effort", "summary"}:
        own["reasoning"] = reasoning
        return None
    aside["reasoning"] = reasoning
    effort = reasoning.get("effort")
    return None if effort in (None, "none") else str(effort)


class _Turns:
    """Input items as messages: the system and developer messages before the conversation
    join the system prompt; a function call joins the assistant turn just before it."""

    def __init__(self, system: list[canon.Part]) -> None:
        self.system = system
        self.out: list[canon.Message] = []

    def read(self, items: list[Any]) -> list[canon.Message]:
        for i, item in enumerate(items):
            self._item(item, i)
        return self.out

    def _item(self, item: object, i: int) -> None:
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise hub.Incapable(f"{where}: not an item")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            r = _ITEM_ROLES.get(role) if isinstance(role, str) else None
            if r is None:
                raise hub.Incapable(f"{where}: a message with role {role}")
            content = item.get("content")
            parts = _content(content, where)
            if r is not canon.Role.USER:
                _only_known(parts, where)
            if r is canon.Role.SYSTEM:
                if not self.out:
                    self.system += _texts(parts, where)
                    return
                _texts(parts, where)
            self.out.append(canon.Message(r, parts, isinstance(content, str), where))
        elif kind == "function_call":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise hub.Incapable(f"{where}: a tool message without tool_call_id")
            call = tool_call(call_id, item.get("name"), item.get("arguments", ""), where)
            last = self.out[-1] if self.out else None
            if last is not None and last.role is canon.Role.ASSISTANT:  # text, then the calls: one turn
                self.out[-1] = dataclasses.replace(last, parts=(*last.parts, call))
            else:
                self.out.append(canon.Message(canon.Role.ASSISTANT, (call,), False, where))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise hub.Incapable(f"{where}: a tool message without tool_call_id")
            output = item.get("output")
            content = output if isinstance(output, str) else _content(output, where)
            if not isinstance(content, str):
                _only_known(content, where)
            self.out.append(canon.Message(canon.Role.USER, (canon.ToolResult(call_id, content),), False, where))
        else:
            raise hub.Incapable(f"{where}: a {kind} item")


def _content(content: object, where: str) -> tuple[canon.Part, ...]:
    if isinstance(content, str):
        return (canon.text(content),)
    parts: list[canon.Part] = []
    for part in content if isinstance(content, list) else []:
        mapping = type(part) is dict or isinstance(part, Mapping)
        kind = part.get("type") if mapping else None
        if kind in ("input_text", "output_text") and mapping:
            t = part.get("text", "")
            parts.append(canon.text(t if type(t) is str else str(t)))
        elif kind == "refusal" and isinstance(part, Mapping):
            parts.append(canon.Text(str(part.get("refusal", "")), refusal=True))
        elif kind == "input_image" and isinstance(part, Mapping) and isinstance(part.get("image_url"), str):
            parts.append(image_of(part["image_url"], part.get("detail")))
        else:  # a file, an image by file_id, ...: only the Responses API carries them
            parts.append(canon.Opaque(SOURCE, str(kind), part if isinstance(part, Mapping) else {}))
    return tuple(parts)


def _only_known(parts: tuple[canon.Part, ...], where: str) -> None:
    """Parts the hub has no type for, outside a user message (where the target says)."""
    for p in parts:
        if isinstance(p, canon.Opaque):
            what = "an input_image by file_id" if p.kind == "input_image" else f"a {p.kind} part"
            raise hub.Incapable(f"{where}: {what}")


def _texts(parts: tuple[canon.Part, ...], where: str) -> tuple[canon.Part, ...]:
    for p in parts:
        if not isinstance(p, canon.Text):
            raise hub.Incapable(f"{where}: a image_url part where only text is allowed")
    return parts


def _tool(t: object) -> canon.Tool:
    if not isinstance(t, Mapping) or t.get("type") != "function":
        return canon.Tool("", own=dict(t) if isinstance(t, Mapping) else {}, builtin=True)
    tool = function_tool(t.get("name"), t.get("description"), t.get("parameters"), t.get("strict"))
    extra = {k: v for k, v in t.items() if k not in _FUNCTION_KEYS}
    return dataclasses.replace(tool, own=extra) if extra else tool


def _tool_choice(choice: object, own: dict[str, Any]) -> canon.ToolChoice | None:
    if isinstance(choice, Mapping) and choice.get("type") == "function" and not isinstance(choice.get("name"), str):
        own["tool_choice"] = choice
        return None
    return tool_choice_of(choice, own)


def _text_format(body: Mapping[str, Any], own: dict[str, Any], aside: dict[str, Any]) -> canon.OutputSchema | None:
    text = body.get("text")
    if not text:
        if "text" in body:
            aside["text"] = text
        return None
    if not isinstance(text, Mapping) or set(text) - {"format"}:
        own["text"] = text
        return None
    fmt = text.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), Mapping):
        name, strict = fmt.get("name"), fmt.get("strict")
        return canon.OutputSchema(
            fmt["schema"], name if isinstance(name, str) else None, strict if isinstance(strict, bool) else None
        )
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        aside["text"] = text
        return None
    own["text.format"] = fmt  # json_object and friends: no other format carries them
    return None


def encode_request(request: canon.Request) -> dict[str, Any]:
    """Never needed: no request of another format is sent to the Responses API
    (:func:`capmon.core.providers.formats.wire_of`). Raises
    :class:`~capmon.core.providers.hub.Incapable`."""
    raise hub.Incapable(
        f"{request.source} requests cannot be sent as responses (only a Responses caller's own request goes there)"
    )


# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

_NOT_READ = (
    "a Responses {} is read only by a Responses caller, which gets it untouched "
    "(no caller of another format is ever served by a Responses wire)"
)


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    raise hub.Incapable(_NOT_READ.format("answer"))


def stream_decoder() -> hub.StreamDecoder:
    raise hub.Incapable(_NOT_READ.format("stream"))


def encode_usage(usage: canon.Usage | None) -> dict[str, Any]:
    """The hub's usage as the Responses API's: ``input_tokens`` is fresh input, cache writes
    and cache reads together, the cached part in ``input_tokens_details``."""
    u = usage or canon.Usage()
    prompt, output = u.prompt, u.output or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": u.cache_read or 0, "cache_write_tokens": u.cache_write or 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning or 0},
        "total_tokens": prompt + output,
    }


# Stop reasons that leave a response incomplete, and why (any other completes it).
INCOMPLETE: Mapping[canon.Stop, str] = {
    canon.Stop.MAX_TOKENS: "max_output_tokens",
    canon.Stop.CONTEXT_WINDOW: "max_output_tokens",
    canon.Stop.REFUSAL: "content_filter",
}


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(item_id: str, call: canon.ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _response(
    head: Mapping[str, Any], output: list[dict[str, Any]], stop: canon.Stop | None, usage: canon.Usage | None
) -> dict[str, Any]:
    reason = None if stop is None else INCOMPLETE.get(stop)
    return {
        **head,
        "object": "response",
        "status": "completed" if reason is None else "incomplete",
        "incomplete_details": None if reason is None else {"reason": reason},
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": encode_usage(usage) if usage is not None else None,
    }


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Responses API answer: an output message item per text part and
    a function call item per tool call, each item's id the answer's and the part's index
    (every part counts, thinking too); thinking left out, as in chat."""
    output: list[dict[str, Any]] = []
    for n, part in enumerate(answer.parts):
        if isinstance(part, canon.Text):
            output.append(_text_item(f"{answer.id}_{n}", part.text, "completed"))
        elif isinstance(part, canon.ToolCall):
            output.append(_call_item(f"{answer.id}_{n}", part, part.arguments, "completed"))
    head = {"id": answer.id, "created_at": created, "model": answer.model}
    return _response(head, output, answer.stop, answer.usage or canon.Usage())


class _Encoder:
    """The hub's events in, Responses events out: ``response.created`` and
    ``response.in_progress``; per text part an output message item with its
    ``output_text`` deltas; per tool call a ``function_call`` item with its argument
    deltas; then ``response.completed`` (or ``response.incomplete``) carrying the whole
    answer. Thinking is left out, as in answers."""

    def __init__(self, *, created: int) -> None:
        self.created = created
        self.head: dict[str, Any] = {"id": "", "created_at": created, "model": ""}
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[int, tuple[int, dict[str, Any], list[str]]] = {}  # part -> (output index, item, pieces)
        self.stop: canon.Stop | None = None
        self.usage = canon.Usage()

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            self.head.update(id=event.id, model=event.model)
            self.usage = self.usage.merged(event.usage or canon.Usage())
            skeleton = {**_response(self.head, [], None, None), "status": "in_progress"}
            return [
                self._event("response.created", response=skeleton),
                self._event("response.in_progress", response=skeleton),
            ]
        if isinstance(event, canon.PartStarted):
            return self._start(event.index, event.part)
        if isinstance(event, canon.PartDelta):
            return self._delta(event)
        if isinstance(event, canon.PartStopped):
            return self._stop(event.index)
        if isinstance(event, canon.Ended):
            self.stop = event.stop
            self.usage = self.usage.merged(event.usage or canon.Usage())
            return []
        if isinstance(event, canon.Done):
            response = _response(self.head, self.output, self.stop, self.usage)
            done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            return [self._event(done, response=response)]
        return []

    def _start(self, index: int, part: canon.Part) -> list[dict[str, Any]]:
        n = len(self.output)
        item_id = f"{self.head['id']}_{index}"
        if isinstance(part, canon.Text):
            item = {**_text_item(item_id, "", "in_progress"), "content": []}
            self._open[index] = (n, item, [])
            self.output.append(item)
            text = {"type": "output_text", "text": "", "annotations": []}
            return [
                self._event("response.output_item.added", output_index=n, item=dict(item)),
                self._event("response.content_part.added", item_id=item_id, output_index=n, content_index=0, part=text),
            ]
        if isinstance(part, canon.ToolCall):
            item = _call_item(item_id, part, "", "in_progress")
            self._open[index] = (n, item, [])
            self.output.append(item)
            return [self._event("response.output_item.added", output_index=n, item=dict(item))]
        return []

    def _delta(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        opened = self._open.get(event.index)
        if opened is None:
            return []
        n, item, pieces = opened
        piece = event.text if event.text is not None else event.arguments
        if not piece:
            return []
        pieces.append(piece)
        if item["type"] == "message":
            return [
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            ]
        return [self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=n, delta=piece)]

    def _stop(self, index: int) -> list[dict[str, Any]]:
        opened = self._open.pop(index, None)
        if opened is None:
            return []
        n, item, pieces = opened
        whole = "".join(pieces)
        if item["type"] == "message":
            done = _text_item(item["id"], whole, "completed")
            self.output[n] = done
            part = done["content"][0]
            return [
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=n,
                    content_index=0,
                    text=whole,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done", item_id=item["id"], output_index=n, content_index=0, part=part
                ),
                self._event("response.output_item.done", output_index=n, item=done),
            ]
        done = {**item, "arguments": whole, "status": "completed"}
        self.output[n] = done
        return [
            self._event("response.function_call_arguments.done", item_id=item["id"], output_index=n, arguments=whole),
            self._event("response.output_item.done", output_index=n, item=done),
        ]


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``include_usage``: a Responses stream's last event always carries the whole answer, usage too."""
    return _Encoder(created=created)


def answer_stream(answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """A whole response as its own stream's events (a plain answer to a stream request), its
    items as they are (this format is never read into the hub): ``response.created`` and
    ``response.in_progress``; per item its ``added``, its text, refusal or arguments in one
    delta, its ``done``s; then ``response.completed`` (or ``response.incomplete``) carrying the
    response itself. ``created`` and ``include_usage``: the response carries its own."""
    out: list[dict[str, Any]] = []

    def event(kind: str, **fields: Any) -> None:
        out.append({"type": kind, "sequence_number": len(out), **fields})

    skeleton = {**answer, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    event("response.created", response=skeleton)
    event("response.in_progress", response=skeleton)
    output = answer.get("output")
    for n, item in enumerate(output if isinstance(output, list) else []):
        if not isinstance(item, Mapping):
            continue
        kind, item_id = item.get("type"), item.get("id")
        if kind == "message":
            event("response.output_item.added", output_index=n, item={**item, "status": "in_progress", "content": []})
            content = item.get("content")
            for c, part in enumerate(content if isinstance(content, list) else []):
                _part_events(event, item_id, n, c, part)
        elif kind == "function_call":
            event("response.output_item.added", output_index=n, item={**item, "arguments": "", "status": "in_progress"})
            arguments = item.get("arguments")
            whole = arguments if isinstance(arguments, str) else ""
            if whole:
                event("response.function_call_arguments.delta", item_id=item_id, output_index=n, delta=whole)
            event("response.function_call_arguments.done", item_id=item_id, output_index=n, arguments=whole)
        else:
            event("response.output_item.added", output_index=n, item=dict(item))
        event("response.output_item.done", output_index=n, item=dict(item))
    done = "response.incomplete" if answer.get("status") == "incomplete" else "response.completed"
    event(done, response=dict(answer))
    return out


def _part_events(event: Any, item_id: object, n: int, c: int, part: object) -> None:
    """One content part of a message item as its stream tells it."""
    if not isinstance(part, Mapping):
        return
    where = {"item_id": item_id, "output_index": n, "content_index": c}
    kind = part.get("type")
    field = "text" if kind == "output_text" else "refusal" if kind == "refusal" else None
    if field is None:
        event("response.content_part.added", **where, part=dict(part))
        event("response.content_part.done", **where, part=dict(part))
        return
    whole = part.get(field)
    whole = whole if isinstance(whole, str) else ""
    started = {**part, field: ""}
    if kind == "output_text":
        started["annotations"] = []
    event("response.content_part.added", **where, part=started)
    if kind == "output_text":
        if whole:
            event("response.output_text.delta", **where, delta=whole, logprobs=[])
        event("response.output_text.done", **where, text=whole, logprobs=[])
    else:
        if whole:
            event("response.refusal.delta", **where, delta=whole)
        event("response.refusal.done", **where, refusal=whole)
    event("response.content_part.done", **where, part=dict(part))


# ================================================================ reading and probing
# What a target sends in this format, read: a plain answer (or why a 2xx is none), its text and
# used tokens, a stream's frames (frames.Event) and the answer its last event carries; and what
# an attempt sends in it: the probe and the body (the fields capmon owns).


def parse(status: int, body: bytes) -> Mapping[str, Any] | None:
    """A plain answer (a completed or incomplete response), or None: then the classifier
    (or :func:`unfinished`) says what it is. Never raises."""
    parsed = hub.success_json(status, body)
    if (
        isinstance(parsed, Mapping)
        and parsed.get("object") == "response"
        and parsed.get("status") in ("completed", "incomplete")
    ):
        return parsed
    return None


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure:
    """A 2xx that is no finished response: a failed one says why, like its stream would."""
    try:
        obj = json.loads(body)
    except Exception:
        obj = None
    if isinstance(obj, Mapping) and obj.get("object") == "response" and obj.get("status") == "failed":
        return classify_event(
            {"type": "response.failed", "response": obj}, "response.failed", now=now, quota_hint=quota_hint
        )
    failure = classify_response(status, headers, body, now=now, quota_hint=quota_hint)
    return failure or Failure(Kind.TRANSIENT, f"{status} with no finished response", status)


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its output_text parts, in order."""
    out = []
    items = response.get("output")
    for item in items if isinstance(items, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                out.append(part["text"])
    return "".join(out)


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usage.total_tokens``, as a chat completion says them)."""
    return chat_format.used_tokens(response)


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a stream event adds (``response.output_text.delta``; "" when none)."""
    delta = chunk.get("delta") if chunk.get("type") == "response.output_text.delta" else None
    return delta if isinstance(delta, str) else ""


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Responses request: one token of output is too few for the API (its
    floor is 16), so the probe asks for that floor."""
    return responses_body({"input": "ping"}, model=model, max_output_tokens=16, stream=False)


# Events that carry no answer yet: held back, so an error after them can still fall back.
_RESPONSES_PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_RESPONSES_DONE = frozenset({"response.completed", "response.incomplete"})


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a Responses stream is. Never raises.

    ``response.completed`` / ``response.incomplete`` is DONE (its ``response`` is the
    answer); ``response.failed`` and ``error`` are errors; the preamble events are held;
    every other event is output."""
    decoded = typed_event(frame)
    if isinstance(decoded, Event):
        return decoded
    obj, kind, name = decoded
    if name in ERROR_EVENTS or (
        isinstance(obj, dict)
        and "error" in obj
        and name not in _RESPONSES_DONE
        and not name.startswith("response.output")
    ):
        return Event(FrameKind.ERROR, failure=classify_event(obj, name, now=now, quota_hint=quota_hint))
    if not isinstance(obj, dict):
        return Event(FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream event", 200))
    if name in _RESPONSES_DONE:
        return Event(FrameKind.DONE, chunk=obj, output=True)
    if name in _RESPONSES_PREAMBLE or not name:
        return Event(FrameKind.CHUNK, chunk=obj, output=False)
    return Event(FrameKind.CHUNK, chunk=obj, output=not name.endswith(".added"))


class Assembled:
    """A Responses stream's answer: the response its last event (``response.completed``) carries."""

    finished = False  # whole only at that last event, which the attempt sees

    def __init__(self) -> None:
        self._final: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        if done:
            final = chunk.get("response")
            self._final = final if isinstance(final, Mapping) else None

    def answer(self) -> Mapping[str, Any] | None:
        return self._final


def assembler() -> Assembled:
    return Assembled()


def responses_body(extra: Mapping[str, Any], *, model: str, max_output_tokens: int, stream: bool) -> dict[str, Any]:
    """A Responses API body (see :func:`~capmon.core.providers.hub.owned_body`)."""
    return hub.owned_body(extra, model=model, cap_field="max_output_tokens", cap=max_output_tokens, stream=stream)


def wire_body(
    request: Request,
    translated: Mapping[str, Any] | None,
    *,
    model: str,
    limit: int,
    stream: bool,
    token_param: TokenParam,
) -> dict[str, Any]:
    """A Responses body: the caller's own fields untouched (no other format is sent as
    Responses: :func:`encode_request` refuses), the cap as ``max_output_tokens``."""
    return responses_body(
        request.extra if translated is None else translated, model=model, max_output_tokens=limit, stream=stream
    )


def refused_token_param(failure: Failure, sent: TokenParam) -> bool:
    """Never: the Responses API has one token cap (``max_output_tokens``), nothing to relearn."""
    return False


def tool_calls(answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
    """Each ``function_call`` item of a response's output: its name, call id and arguments."""
    items = answer.get("output")
    for item in items if isinstance(items, list) else []:
        if isinstance(item, Mapping) and item.get("type") == "function_call":
            given = item.get("arguments")
            yield item.get("name"), item.get("call_id"), given if isinstance(given, str) else ""


def call_watcher() -> hub.CallWatcher:
    raise hub.Incapable(_NOT_READ.format("stream"))


# ================================================================ continuing a broken answer
# continued / splicer: a broken stream's continuation in this format (capmon/core/routing/continuation.py).


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the assistant's last message, and
    a user message ``instruction`` after it (None: none, the answer a prefill)."""
    said: list[dict[str, Any]] = [{"role": "assistant", "content": partial}]
    if instruction is not None:
        said.append({"role": "user", "content": instruction})
    body = dict(request.extra)
    given = body.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or ())
    body["input"] = [*items, *said]
    return dataclasses.replace(request, extra=body)


@dataclass
class ResponsesSplice(splice.Splice):
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
                response["usage"] = splice.add_usage(
                    usage,
                    (
                        ("input_tokens", self.earlier_in),
                        ("output_tokens", self.earlier_out),
                        ("total_tokens", self.earlier_in + self.earlier_out),
                    ),
                )
            response[splice.FIELD] = self.said()
            out["response"] = response
        return self._numbered(out)


def splicer(prompt: int) -> splice.Splice:
    """The splice of one streamed request in this format (``prompt``: its estimated tokens)."""
    return ResponsesSplice(prompt)


def takes_prefill() -> bool:
    return False  # the Responses API answers anew after an assistant item, it does not go on from it
