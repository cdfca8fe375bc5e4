"""The chat format: OpenAI's chat completions (/chat/completions). Its requests, answers and stream events to and
from the canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capmon.core.providers import hub
from capmon.core.types import canon

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.
#
#
#
# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

FINISH_TO_STOP: Mapping[str, canon.Stop] = {
    "stop": canon.Stop.END_TURN,
    "length": canon.Stop.MAX_TOKENS,
    "tool_calls": canon.Stop.TOOL_USE,
    "function_call": canon.Stop.TOOL_USE,
    "content_filter": canon.Stop.REFUSAL,
}
STOP_TO_FINISH: Mapping[canon.Stop, str] = {
    canon.Stop.END_TURN: "stop",
    canon.Stop.STOP_SEQUENCE: "stop",
    canon.Stop.MAX_TOKENS: "length",
    canon.Stop.CONTEXT_WINDOW: "length",
    canon.Stop.TOOL_USE: "tool_calls",
    canon.Stop.REFUSAL: "content_filter",
    canon.Stop.PAUSE_TURN: "stop",
}


def _finish(stop: canon.Stop | None) -> str:
    """A stop reason as a finish reason; none (or one the hub does not know) is ``stop``."""
    return "stop" if stop is None else STOP_TO_FINISH.get(stop, "stop")


def _stop(finish: object) -> canon.Stop:
    """A finish reason as a stop reason; none, or one unknown, is the turn's end."""
    return FINISH_TO_STOP.get(str(finish), canon.Stop.END_TURN)


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def decode_usage(usage: object) -> canon.Usage:
    """OpenAI usage as the hub's: the cached (and cache-written) part out of the prompt
    tokens. Reads the chat shape (prompt / completion) and the Responses one (input /
    output); a count not given is 0."""
    u: Mapping[str, Any] = usage if isinstance(usage, Mapping) else {}
    details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    read = _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    written = _count(details.get("cache_write_tokens")) if isinstance(details, Mapping) else 0
    prompt = _count(u.get("prompt_tokens", u.get("input_tokens")))
    reasoning = _object(u, "completion_tokens_details").get("reasoning_tokens")
    return canon.Usage(
        input=max(0, prompt - read - written),
        cache_write=written,
        cache_read=read,
        output=_count(u.get("completion_tokens", u.get("output_tokens"))),
        reasoning=_count(reasoning) if reasoning is not None else None,
    )


def encode_usage(usage: canon.Usage | None) -> dict[str, Any]:
    """The hub's usage as chat's: ``prompt_tokens`` is fresh input, cache writes and cache
    reads together, the cached part in ``prompt_tokens_details``."""
    u = usage or canon.Usage()
    prompt, output = u.prompt, u.output or 0
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": u.cache_read or 0, "cache_write_tokens": u.cache_write or 0},
    }
    if u.reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning}
    return out


def _call(call_id: str, name: str, raw: object) -> canon.ToolCall:
    """A tool call: its arguments as the JSON text they were (none, or blank, is ``{}``)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return canon.ToolCall(call_id, name, raw if isinstance(raw, str) else "", input={})
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except (ValueError, RecursionError):
        parsed = None
    arguments = raw if isinstance(raw, str) else json.dumps(raw)
    return canon.ToolCall(call_id, name, arguments, input=parsed if isinstance(parsed, dict) else None)


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    """A chat completion's first choice in the hub's terms: its text, its refusal, its
    tool calls. Raises :class:`~capmon.core.providers.hub.Incapable` when it has none."""
    try:
        choice = answer["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise hub.Incapable("a chat completion without a choice") from None
    parts: list[canon.Part] = []
    content, refusal = message.get("content"), message.get("refusal")
    if isinstance(content, str) and content:
        parts.append(canon.Text(content))
    if isinstance(refusal, str) and refusal:
        parts.append(canon.Text(refusal, refusal=True))
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        parts.append(_call(str(call.get("id", "")), str(fn.get("name", "")), fn.get("arguments")))
    stop = canon.Stop.REFUSAL if refusal else _stop(choice.get("finish_reason"))
    return canon.Answer(
        id=str(answer.get("id", "")),
        model=str(answer.get("model", "")),
        parts=tuple(parts),
        stop=stop,
        usage=decode_usage(answer.get("usage")),
    )


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a chat completion. Thinking is left out, as OpenAI leaves its own
    reasoning out of an answer, and so is any part chat has no place for."""
    text: list[str] = []
    refusals: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in answer.parts:
        if isinstance(part, canon.Text):
            (refusals if part.refusal else text).append(part.text)
        elif isinstance(part, canon.ToolCall):
            function = {"name": part.name, "arguments": part.arguments}
            calls.append({"id": part.id, "type": "function", "function": function})
    content = "".join(text) if text or not (calls or refusals) else None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusals:
        message["refusal"] = "".join(refusals)
    if calls:
        message["tool_calls"] = calls
    return {
        "id": answer.id,
        "object": "chat.completion",
        "created": created,
        "model": answer.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(answer.stop)}],
        "usage": encode_usage(answer.usage),
    }


class _Decoder:
    """Chat chunks in, the hub's events out: a part per run of text (content or refusal)
    and per run of one tool call's pieces, a run ending when another begins; the stop
    reason and usage (OpenAI's last chunk, after the finish reason) only at :meth:`close`
    (the chat stream's ``[DONE]``)."""

    def __init__(self) -> None:
        self.started = False
        self.closed = False
        self._index = -1  # the open part, -1 when none
        self._open: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool index)
        self.finish: object = None
        self.usage: Mapping[str, Any] | None = None

    def feed(self, chunk: Mapping[str, Any]) -> list[canon.Event]:
        out = self._start(chunk)
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for c in choices if isinstance(choices, list) else []:
            if not isinstance(c, Mapping) or c.get("index", 0) != 0:
                continue
            delta = _object(c, "delta")
            for piece in (delta.get("content"), delta.get("refusal")):
                if isinstance(piece, str) and piece:
                    out += self._part(("text", 0), canon.Text(""))
                    out.append(canon.PartDelta(self._index, text=piece))
            for call in delta.get("tool_calls") or []:
                out += self._tool(call)
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]
        return out

    def _start(self, chunk: Mapping[str, Any]) -> list[canon.Event]:
        if self.started:
            return []
        self.started = True
        return [canon.Started(str(chunk.get("id", "")), str(chunk.get("model", "")))]

    def _part(self, key: tuple[str, int], part: canon.Part) -> list[canon.Event]:
        if self._open == key:
            return []
        out = self._stop_part()
        self._index += 1
        self._open = key
        out.append(canon.PartStarted(self._index, part))
        return out

    def _stop_part(self) -> list[canon.Event]:
        if self._open is None:
            return []
        self._open = None
        return [canon.PartStopped(self._index)]

    def _tool(self, call: Mapping[str, Any]) -> list[canon.Event]:
        index = call.get("index", 0)
        fn = _object(call, "function")
        part = canon.ToolCall(str(call.get("id") or ""), str(fn.get("name") or ""), "")
        out = self._part(("tool", index if isinstance(index, int) else 0), part)
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(canon.PartDelta(self._index, arguments=arguments))
        return out

    def close(self) -> list[canon.Event]:
        """The closing events, once (the chat stream ended with ``[DONE]``)."""
        if self.closed:
            return []
        self.closed = True
        out = self._start({}) + self._stop_part()
        out += [canon.Ended(_stop(self.finish), decode_usage(self.usage)), canon.Done()]
        return out


def stream_decoder() -> hub.StreamDecoder:
    return _Decoder()


class _Encoder:
    """The hub's events in, chat chunks out, ending as OpenAI's streams do: a chunk with the
    finish reason, then (``include_usage``) a chunk with no choices and the usage; the
    framing adds ``data: [DONE]``. Thinking is left out, as in answers."""

    def __init__(self, *, created: int, include_usage: bool) -> None:
        self.created = created
        self.include_usage = include_usage
        self.id = ""
        self.model = ""
        self.usage: canon.Usage | None = None
        self.finish: str | None = None
        self._parts: dict[int, canon.Part] = {}  # index -> the part as it started
        self._tools: dict[int, int] = {}  # part index -> chat tool index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def _add(self, usage: canon.Usage | None) -> None:
        if usage is not None:
            self.usage = usage if self.usage is None else self.usage.merged(usage)

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            self.id, self.model = event.id, event.model
            self._add(event.usage)
            return [self._chunk({"role": "assistant", "content": ""})]
        if isinstance(event, canon.PartStarted):
            return self._started(event.index, event.part)
        if isinstance(event, canon.PartDelta):
            if event.text and not isinstance(self._parts.get(event.index), canon.Thinking):
                return [self._chunk({"content": event.text})]
            tool = self._tools.get(event.index)
            if event.arguments and tool is not None:
                return [self._chunk({"tool_calls": [{"index": tool, "function": {"arguments": event.arguments}}]})]
            return []
        if isinstance(event, canon.Ended):
            self.finish = _finish(event.stop)
            self._add(event.usage)
            return []
        if isinstance(event, canon.Done):
            out = [self._chunk({}, self.finish or "stop")]
            if self.include_usage:
                out.append({**self._chunk({}), "choices": [], "usage": encode_usage(self.usage)})
            return out
        return []

    def _started(self, index: int, part: canon.Part) -> list[dict[str, Any]]:
        self._parts[index] = part
        if isinstance(part, canon.ToolCall):
            n = self._tools[index] = len(self._tools)
            call = {"index": n, "id": part.id, "type": "function", "function": {"name": part.name, "arguments": ""}}
            return [self._chunk({"tool_calls": [call]})]
        if isinstance(part, canon.Text) and part.text:
            return [self._chunk({"content": part.text})]
        return []


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    return _Encoder(created=created, include_usage=include_usage)


# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#
