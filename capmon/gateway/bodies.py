"""What a client asked for: the JSON body of a chat-completions or Responses request,
checked as far as routing needs (the rest passes to the provider untouched), and the
per-request headers ``x-capmon-deadline`` and ``x-capmon-priority``."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capmon.core.result import ChatRequest, Priority
from capmon.gateway.auth import Caller
from capmon.gateway.errors import ApiError
from capmon.gateway.models import ModelNames

DEADLINE_HEADER = "x-capmon-deadline"
PRIORITY_HEADER = "x-capmon-priority"


@dataclass(frozen=True, slots=True)
class Wanted:
    """A request the gateway will route."""

    request: ChatRequest
    stream: bool
    priority: Priority


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code, param)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's depth
        raise _bad("We could not parse the JSON body of your request: expected a JSON object.") from None
    if not isinstance(body, dict):
        raise _bad(f"expected a JSON object as the request body, got {type(body).__name__}")
    return body


def _deadline(headers: Mapping[str, str]) -> float | None:
    raw = headers.get(DEADLINE_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise _bad(f"{DEADLINE_HEADER}: expected seconds (a positive number), got {raw[:40]!r}", DEADLINE_HEADER)
    return value


def _priority(headers: Mapping[str, str], caller: Caller) -> Priority:
    raw = headers.get(PRIORITY_HEADER)
    if caller.priority is Priority.BATCH:  # a batch key's requests stay batch, whatever they ask
        chosen = Priority.BATCH
    else:
        chosen = Priority.INTERACTIVE
    if raw is None:
        return chosen
    try:
        asked = Priority(raw.strip().lower())
    except ValueError:
        raise _bad(f"{PRIORITY_HEADER}: expected interactive or batch, got {raw[:40]!r}", PRIORITY_HEADER) from None
    return Priority.BATCH if asked is Priority.BATCH else chosen


def _model(body: Mapping[str, Any], names: ModelNames) -> str | None:
    if "model" not in body:
        raise _bad("you must provide a model parameter", "model", "missing_required_parameter")
    model = body["model"]
    if not isinstance(model, str):
        raise _bad(f"model: expected a string, got {type(model).__name__}", "model")
    return names.resolve(model)


def _stream(body: Mapping[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise _bad(f"stream: expected true or false, got {stream!r}"[:200], "stream")
    return stream


def _positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{name}: expected a whole number of at least 1, got {value!r}"[:200], name)
    number: int = value
    return number


def chat(body: dict[str, Any], headers: Mapping[str, str], caller: Caller, names: ModelNames) -> Wanted:
    """A chat-completions request. Every field but model, messages, stream, n and the
    token cap reaches the provider untouched."""
    model = _model(body, names)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise _bad("messages: expected a non-empty list of message objects", "messages")
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(f"n: this gateway answers with one choice (n = 1), got {n!r}"[:200], "n")
    cap = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
        raise _bad(f"temperature: expected a number, got {temperature!r}"[:200], "temperature")
    stream = _stream(body)
    priority = _priority(headers, caller)
    extra = {
        k: v
        for k, v in body.items()
        if k not in ("model", "messages", "stream", "n", "max_tokens", "max_completion_tokens", "temperature")
    }
    request = ChatRequest.of(
        messages,
        model=model,
        max_tokens=cap,
        temperature=temperature,
        priority=priority,
        deadline=_deadline(headers),
        extra=extra,
    )
    return Wanted(request, stream, priority)


def responses(body: dict[str, Any], headers: Mapping[str, str], caller: Caller, names: ModelNames) -> Wanted:
    """A Responses API request: the body goes as it is, but model, stream and the cap."""
    model = _model(body, names)
    stream = _stream(body)
    _positive_int(body, "max_output_tokens")
    priority = _priority(headers, caller)
    request = ChatRequest.responses(body, model=model, priority=priority, deadline=_deadline(headers))
    return Wanted(request, stream, priority)
