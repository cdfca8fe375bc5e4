"""The OpenAI wire format: request bodies, headers, bounded body reads, SSE frames and
the chunks inside them, and the token-parameter quirk of reasoning models.

Nothing else in capmon builds a request body or reads a stream byte by byte, so a
provider's dialect (Azure's empty first chunk, OpenRouter's comment lines, an
``event: error`` frame, a usage-only last chunk) is handled here once. See
ARCHITECTURE.md, "The wire".

Pure functions and small classes, no I/O of their own except :func:`read_capped`, which
pulls a body from an httpx response and stops at a cap (a stream's reads count against
the cap in capmon/core/routing/attempt.py, between its per-read timeouts).
"""

from __future__ import annotations

import enum
import json
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_event
from capmon.core.providers.sse import Frame as Frame  # re-exported: the frame every wire reads
from capmon.core.providers.sse import SSEParser as SSEParser  # re-exported
from capmon.core.types.failure import Failure, Kind

log = logging.getLogger("capmon.client")

# Fields the client owns: everything else the caller sets passes through untouched.
TOKEN_PARAMS = ("max_tokens", "max_completion_tokens")
_OWNED = frozenset({"model", "messages", "n", "stream", *TOKEN_PARAMS})


class TokenParam(enum.StrEnum):
    MAX_TOKENS = "max_tokens"
    MAX_COMPLETION_TOKENS = "max_completion_tokens"

    @property
    def other(self) -> TokenParam:
        return TokenParam.MAX_COMPLETION_TOKENS if self is TokenParam.MAX_TOKENS else TokenParam.MAX_TOKENS


class TokenParams:
    """Which token parameter each model is sent: configured, then learned from refusals.
    ``on_learn(model, param, reason)`` is told of each change (the client publishes it)."""

    def __init__(self, configured: Mapping[str, str], on_learn: Callable[[str, str, str], None]) -> None:
        self._param = {model: TokenParam(p) for model, p in configured.items()}
        self._on_learn = on_learn

    def __getitem__(self, model: str) -> TokenParam:
        return self._param[model]

    def learn(self, model: str, refused: TokenParam, reason: str) -> None:
        """The model refused ``refused``: send the other from now on."""
        if self._param[model] is refused:
            self._param[model] = refused.other
            log.info("model %s refused %s; sending %s from now on", model, refused.value, refused.other.value)
            self._on_learn(model, refused.other.value, reason)


def chat_body(
    messages: tuple[Mapping[str, Any], ...],
    extra: Mapping[str, Any],
    *,
    model: str,
    token_param: TokenParam,
    max_tokens: int,
    temperature: float | None,
    stream: bool,
) -> dict[str, Any]:
    """A chat-completions body: the caller's fields untouched, then the ones the client owns."""
    body = {k: v for k, v in extra.items() if k not in _OWNED} if extra else {}
    body["model"] = model
    body["messages"] = list(messages)
    body[token_param.value] = max_tokens
    body["n"] = 1
    if temperature is not None:
        body["temperature"] = temperature
    if stream:
        body["stream"] = True
    return body


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest request that proves a model answers: one token of output."""
    return {"model": model, "messages": [{"role": "user", "content": "ping"}], token_param.value: 1, "n": 1}


# ---------------------------------------------------------------- the token parameter

_PARAM_NAMES = re.compile(r"max_completion_tokens|max_tokens")
_SUGGESTED = re.compile(r"use\W{0,3}(max_completion_tokens|max_tokens)\W{0,3}instead")
_UNSUPPORTED = re.compile(
    r"unsupported.parameter|not supported|unrecognized request argument|extra inputs are not permitted"
    r"|extra_forbidden|unknown (?:field|parameter|argument)|unexpected keyword|invalid.parameter|not permitted"
)


def refused_token_param(failure: Failure, sent: TokenParam) -> bool:
    """Whether a 400 says the model refuses the token parameter that was sent.

    OpenAI's o-series and gpt-5 answer ``unsupported_parameter`` to ``max_tokens``;
    older deployments answer "Unrecognized request argument supplied:
    max_completion_tokens"; vLLM and Mistral name the field in a validation error.
    """
    if failure.kind is not Kind.BAD_REQUEST or failure.status not in (400, 422):
        return False
    text = f"{failure.code or ''} {failure.reason}".lower()
    if not _UNSUPPORTED.search(text):
        return False
    suggested = _SUGGESTED.search(text)
    if suggested:  # "... 'max_tokens' is not supported ... Use 'max_completion_tokens' instead."
        return suggested.group(1) != sent.value
    return set(_PARAM_NAMES.findall(text)) == {sent.value}


# ---------------------------------------------------------------- bounded reads


class Oversized(Exception):
    """A body or stream went past the configured cap; reading stopped there."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"response larger than {cap} bytes")
        self.cap = cap


def oversized_failure(cap: int, status: int | None, streaming: bool) -> Failure:
    what = "stream" if streaming else "body"
    return Failure(
        Kind.OVERSIZED, f"response {what} larger than the {cap:,}-byte cap (client.max_response_bytes)", status
    )


async def read_capped(resp: httpx.Response, cap: int) -> bytes:
    """The whole body, or :class:`Oversized` as soon as more than ``cap`` bytes arrive."""
    length = resp.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > cap:
        raise Oversized(cap)
    if not _raw(resp):
        return await _collect(resp.aiter_bytes(), cap)
    resp.is_stream_consumed = True  # what aiter_raw does, and then reads as it is read here
    try:
        body = await _collect(resp.stream, cap)  # type: ignore[arg-type]  # an async stream (_raw)
    except httpx.RequestError as e:
        _name_request(e, resp)
        raise
    await resp.aclose()
    return body


async def _collect(pieces: AsyncIterable[bytes], cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for piece in pieces:
        size += len(piece)
        if size > cap:
            raise Oversized(cap)
        parts.append(piece)
    return b"".join(parts)


def body_pieces(resp: httpx.Response) -> AsyncIterator[bytes]:
    """The body as it arrives, what ``resp.aiter_bytes()`` yields (but its empty pieces)."""
    return _raw_pieces(resp) if _raw(resp) else resp.aiter_bytes()


def _raw(resp: httpx.Response) -> bool:
    """Whether the body is the transport's own bytes, to be read from the response's stream
    as httpx's ``aiter_raw`` reads it, without the decoder and chunker layers around it (a
    fifth of a small answer's CPU on the aiohttp transport): no content coding, not read
    yet. Everything else, a coded body or one already read, goes through httpx."""
    return not (
        resp.is_stream_consumed
        or resp.is_closed
        or not isinstance(resp.stream, httpx.AsyncByteStream)
        or resp.headers.get_list("content-encoding")
    )


async def _raw_pieces(resp: httpx.Response) -> AsyncIterator[bytes]:
    # httpx's aiter_raw, but the chunker (with no chunk size it only drops empty pieces).
    resp.is_stream_consumed = True
    stream = resp.stream
    assert isinstance(stream, httpx.AsyncByteStream)
    try:
        async for piece in stream:
            if piece:
                yield piece
    except httpx.RequestError as e:
        _name_request(e, resp)
        raise
    await resp.aclose()


def _name_request(e: httpx.RequestError, resp: httpx.Response) -> None:
    """As httpx's ``request_context``: an error while reading names its request."""
    try:
        e.request = resp.request
    except RuntimeError:  # a response made without one
        pass


# ---------------------------------------------------------------- stream chunks


class FrameKind(enum.StrEnum):
    CHUNK = "chunk"  # a chat.completion.chunk (choices may be empty: normal traffic)
    DONE = "done"  # data: [DONE]
    ERROR = "error"  # an error inside the stream: classified like the HTTP error it describes
    IGNORE = "ignore"  # a ping or an event that carries no answer
    BROKEN = "broken"  # not JSON, or JSON that is no event at all


@dataclass(frozen=True, slots=True)
class Event:
    kind: FrameKind
    chunk: Mapping[str, Any] | None = None
    failure: Failure | None = None
    output: bool = False  # carries content, a tool call, a refusal or a finish reason


_ERROR_EVENTS = frozenset({"error", "response.failed", "response.error"})


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one SSE frame of a chat stream is. Never raises."""
    data = frame.data.strip()
    if data == "[DONE]":
        return Event(FrameKind.DONE)
    if not data:
        if frame.event in _ERROR_EVENTS:
            return Event(FrameKind.ERROR, failure=classify_event(None, frame.event, now=now, quota_hint=quota_hint))
        return Event(FrameKind.IGNORE)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return Event(
            FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream chunk (not JSON)", 200)
        )
    if isinstance(obj, dict):
        choices = obj.get("choices")
        if isinstance(choices, list) and "error" not in obj:
            return Event(FrameKind.CHUNK, chunk=obj, output=_has_output(choices))
        if frame.event in _ERROR_EVENTS or _is_error(obj):
            return Event(FrameKind.ERROR, failure=classify_event(obj, frame.event, now=now, quota_hint=quota_hint))
        return Event(FrameKind.IGNORE)  # {"type": "ping"}, usage-only shapes without choices
    if isinstance(obj, list) and any(isinstance(x, dict) and _is_error(x) for x in obj[:4]):
        return Event(FrameKind.ERROR, failure=classify_event(obj, frame.event, now=now, quota_hint=quota_hint))
    return Event(FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream chunk (no event)", 200))


def _is_error(obj: Mapping[str, Any]) -> bool:
    return "error" in obj or obj.get("object") == "error" or obj.get("type") in ("error", "response.failed")


def _has_output(choices: list[Any]) -> bool:
    for c in choices:
        if not isinstance(c, dict):
            continue
        if c.get("finish_reason"):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("refusal") or delta.get("function_call")
        ):
            return True
    return False


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The content text of a chunk's first choice ("" when none)."""
    choices = chunk.get("choices")
    if not choices or not isinstance(choices, list):
        return ""
    c = choices[0]
    delta = c.get("delta") if isinstance(c, dict) else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


@dataclass
class _ToolCall:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class Assembler:
    """Builds the non-streaming answer from a stream's chunks: content, tool calls merged
    by index, finish reason and usage, so a streamed answer reads like a plain one."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.role = "assistant"
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.tools: dict[int, _ToolCall] = {}
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any]) -> None:
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return
        for c in choices:
            if not isinstance(c, dict) or c.get("index", 0) != 0:
                continue
            if c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
            delta = c.get("delta")
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("role"), str):
                self.role = delta["role"]
            if isinstance(delta.get("content"), str):
                self.text.append(delta["content"])
            if isinstance(delta.get("refusal"), str):
                self.refusal.append(delta["refusal"])
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        self._tool(call)

    def _tool(self, call: Mapping[str, Any]) -> None:
        index = call.get("index", len(self.tools))
        if not isinstance(index, int):
            index = len(self.tools)
        t = self.tools.setdefault(index, _ToolCall())
        if isinstance(call.get("id"), str):
            t.id = call["id"]
        if isinstance(call.get("type"), str):
            t.type = call["type"]
        fn = call.get("function")
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str):
                t.name += fn["name"]
            if isinstance(fn.get("arguments"), str):
                t.arguments.append(fn["arguments"])

    @property
    def content(self) -> str:
        return "".join(self.text)

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content if self.text or not self.tools else None}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        if self.tools:
            message["tool_calls"] = [
                {"id": t.id, "type": t.type, "function": {"name": t.name, "arguments": "".join(t.arguments)}}
                for _, t in sorted(self.tools.items())
            ]
        out: dict[str, Any] = {
            **self.head,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            out["usage"] = self.usage
        return out


def total_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens an answer says it used (``usage.total_tokens``), if it says so sensibly."""
    usage = (response or {}).get("usage")
    return counts.count(usage.get("total_tokens")) if isinstance(usage, Mapping) else None


def completion_text(response: Mapping[str, Any]) -> str:
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


# ---------------------------------------------------------------- the Responses API

# Events that carry no answer yet: held back, so an error after them can still fall back.
_RESPONSES_PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
_RESPONSES_DONE = frozenset({"response.completed", "response.incomplete"})


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


def responses_body(extra: Mapping[str, Any], *, model: str, max_output_tokens: int, stream: bool) -> dict[str, Any]:
    """A Responses API body (see :func:`owned_body`)."""
    return owned_body(extra, model=model, cap_field="max_output_tokens", cap=max_output_tokens, stream=stream)


def parse_response(status: int, body: bytes | None) -> Mapping[str, Any] | None:
    """A Responses API answer when a plain response is one (completed or incomplete),
    else None: then the classifier says what it is. Never raises."""
    if not 200 <= status < 300 or not body:
        return None
    try:
        parsed = json.loads(body)
    except Exception:
        return None
    if (
        isinstance(parsed, Mapping)
        and parsed.get("object") == "response"
        and parsed.get("status") in ("completed", "incomplete")
    ):
        return parsed
    return None


def typed_event(frame: Frame) -> Event | tuple[Any, Any, str]:
    """A frame of a stream whose events carry a ``type`` (the Responses API, Anthropic's
    Messages): (the decoded data, its type, the event's name: the ``event:`` line or the
    type), or the BROKEN event when the data is not JSON."""
    data = frame.data.strip()
    try:
        obj = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return Event(
            FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream event (not JSON)", 200)
        )
    kind = obj.get("type") if isinstance(obj, dict) else None
    return obj, kind, frame.event or (kind if isinstance(kind, str) else "")


def read_responses_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one SSE frame of a Responses API stream is. Never raises.

    ``response.completed`` / ``response.incomplete`` is DONE (its ``response`` is the
    answer); ``response.failed`` and ``error`` are errors; the preamble events are held;
    every other event is output."""
    decoded = typed_event(frame)
    if isinstance(decoded, Event):
        return decoded
    obj, kind, name = decoded
    if name in _ERROR_EVENTS or (
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


def response_text(response: Mapping[str, Any]) -> str:
    """The text of a Responses API answer: its output_text parts, in order."""
    out = []
    items = response.get("output")
    for item in items if isinstance(items, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                out.append(part["text"])
    return "".join(out)
