"""Server-sent events as the OpenAI APIs frame them.

Chat completions: ``data: {chunk}`` frames, then ``data: [DONE]``. The Responses API:
``event: TYPE`` + ``data: {event}`` frames, the last being the provider's
response.completed (or response.incomplete). A stream that breaks after its first byte
ends with an error frame instead (naming the request's id), never with [DONE] or a completed event, so no client
mistakes a cut answer for a whole one: ``data: {"error": {...}}`` for chat (the
openai SDKs raise on it), a ``response.failed`` event for the Responses API (what
Codex and the SDKs read as a failed response). Anthropic's Messages API: ``event: TYPE`` +
``data: {event}`` frames, the last being ``message_stop``; a stream that breaks ends with
Anthropic's ``event: error`` (the anthropic SDKs raise on it), never a ``message_stop``.
Google's generateContent: ``data: {chunk}`` frames, each a whole GenerateContentResponse, the
last carrying the finish reason; no end marker. A stream that breaks ends with ``data:
{"error": {...}}``, Google's error object (google-genai raises on it after the chunks it yielded).
Bedrock's ConverseStream is no SSE: AWS's binary event stream (:class:`EventStreamFraming`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from capmon.core.base.exceptions import RequestFailed
from capmon.core.providers import aws_frames
from capmon.gateway import anthropic_errors, bedrock_errors, gemini_errors
from capmon.gateway.errors import in_stream, json_bytes

HEADERS: Mapping[str, str] = {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


class ChatFraming:
    headers = HEADERS

    def frame(self, chunk: Mapping[str, Any]) -> bytes:
        return b"data: " + json_bytes(chunk) + b"\n\n"

    def done(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        return b"data: " + json_bytes({"error": {**in_stream(e), "request_id": request_id}}) + b"\n\n"


class ResponsesFraming:
    """Remembers the response object the events carry, so that a failure can be told as
    that response having failed."""

    headers = HEADERS

    def __init__(self) -> None:
        self.response: dict[str, Any] = {}
        self.sequence = -1

    def frame(self, event: Mapping[str, Any]) -> bytes:
        seq = event.get("sequence_number")
        if isinstance(seq, int):
            self.sequence = max(self.sequence, seq)
        response = event.get("response")
        if isinstance(response, Mapping):
            self.response = dict(response)
        return named(event)

    def done(self) -> bytes:
        return b""  # the provider's response.completed was the last event

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        err = in_stream(e)
        error = {"code": err["code"], "message": err["message"], "request_id": request_id}
        failed = {**self.response, "status": "failed", "error": error}
        event = {"type": "response.failed", "sequence_number": self.sequence + 1, "response": failed}
        return self.frame(event)


class MessagesFraming:
    headers = HEADERS

    def frame(self, event: Mapping[str, Any]) -> bytes:
        return named(event)

    def done(self) -> bytes:
        return b""  # the provider's (or the translation's) message_stop was the last event

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        return named({**anthropic_errors.in_stream(e), "request_id": request_id})  # where Anthropic's errors have it


class GeminiFraming:
    headers = HEADERS

    def frame(self, chunk: Mapping[str, Any]) -> bytes:
        return b"data: " + json_bytes(chunk) + b"\r\n\r\n"  # Google's own separator

    def done(self) -> bytes:
        return b""  # the last chunk, with its finish reason, was the end

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        return b"data: " + json_bytes(gemini_errors.in_stream(e, request_id)) + b"\r\n\r\n"


class GeminiArrayFraming:
    """Google's stream without ``alt=sse``: one JSON array whose items are the chunks, sent
    as they come; a break ends it with Google's error object as the last item."""

    headers: Mapping[str, str] = {**HEADERS, "content-type": "application/json; charset=utf-8"}

    def __init__(self) -> None:
        self.opened = False

    def _item(self, data: bytes) -> bytes:
        lead = b",\r\n" if self.opened else b"["
        self.opened = True
        return lead + data

    def frame(self, chunk: Mapping[str, Any]) -> bytes:
        return self._item(json_bytes(chunk))

    def done(self) -> bytes:
        return b"]" if self.opened else b"[]"

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        return self._item(json_bytes(gemini_errors.in_stream(e, request_id))) + b"]"


class EventStreamFraming:
    """Bedrock's ConverseStream: AWS's binary event stream (capmon/core/providers/aws_frames.py),
    one message per event, each chunk being ``{"eventType": payload}`` as boto3 yields them; a
    break ends it with an exception message (capmon/gateway/bedrock_errors.py)."""

    headers: Mapping[str, str] = {**HEADERS, "content-type": aws_frames.MEDIA_TYPE}

    def frame(self, chunk: Mapping[str, Any]) -> bytes:
        return b"".join(
            aws_frames.event(kind, payload) for kind, payload in chunk.items() if isinstance(payload, Mapping)
        )

    def done(self) -> bytes:
        return b""  # messageStop and metadata were the last events

    def error(self, e: RequestFailed, request_id: str) -> bytes:
        kind, message = bedrock_errors.in_stream(e, request_id)
        return aws_frames.exception(kind, {"message": message})


class InvokeStreamFraming(EventStreamFraming):
    """Bedrock's InvokeModelWithResponseStream for Anthropic's models (``AnthropicBedrock``):
    each Messages event a ``chunk`` event whose ``bytes`` are the event's JSON, base64 as
    boto3's JSON protocol carries a blob; a break ends with an exception, as Converse's."""

    def frame(self, chunk: Mapping[str, Any]) -> bytes:
        return aws_frames.event("chunk", {"bytes": base64.b64encode(json_bytes(chunk)).decode()})


Framing = ChatFraming | ResponsesFraming | MessagesFraming | GeminiFraming | GeminiArrayFraming | EventStreamFraming


def named(event: Mapping[str, Any]) -> bytes:
    """An ``event: TYPE`` frame, the type taken from the event (``message`` when it has none
    fit for an SSE field)."""
    kind = event.get("type")
    name = kind if isinstance(kind, str) and kind.isprintable() and "\n" not in kind else "message"
    return b"event: " + name.encode("utf-8", "replace") + b"\ndata: " + json_bytes(event) + b"\n\n"


def comment(text: str) -> bytes:
    return b": " + text.replace("\n", " ").encode("utf-8", "replace") + b"\n\n"
