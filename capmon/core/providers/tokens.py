"""The one prompt-size estimate: the client charges tpm buckets and checks context
windows with it, and the simulator counts prompt tokens with it, so both sides of a
test agree on what a prompt costs."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from capmon.core.types.result import Format, Request

# Role and framing: OpenAI's own accounting adds about this many tokens per message.
PER_MESSAGE = 4


def tokens_for_chars(chars: int) -> int:
    """About four characters a token."""
    return math.ceil(chars / 4)


def _chars(content: object, *, nested: bool = True) -> int:
    """The text of a message's content: a string, or its parts' text, a tool call's
    input (as JSON) and a tool result's own content (one level down, so a hostile
    nesting costs nothing)."""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return 0
    chars = 0
    for part in content:
        # dict first: a body's parts are dicts, and the ABC's check costs five times as much a part
        if type(part) is not dict and not isinstance(part, Mapping):
            continue
        text = part.get("text")
        if isinstance(text, str):
            chars += len(text)
        if nested and "content" in part:
            chars += _chars(part["content"], nested=False)
        given = part.get("input")
        if given is not None and isinstance(given, Mapping):  # most parts have none: no ABC check for them
            chars += len(json.dumps(given, default=str))
    return chars


def estimate_tokens(messages: Iterable[Any]) -> int:
    """About four characters a token over the text of the messages (see :func:`_chars`),
    plus the framing of each message. Anything else counts nothing."""
    chars = 0
    n = 0
    for m in messages:
        n += 1
        chars += _chars(m.get("content") if isinstance(m, Mapping) else None)
    return tokens_for_chars(chars) + PER_MESSAGE * n


def _tools(tools: object) -> int:
    """Tool definitions count as the text of their JSON (names, descriptions, schemas)."""
    if not isinstance(tools, list) or not tools:
        return 0
    return tokens_for_chars(len(json.dumps(tools, default=str)))


def _responses_items(body: Mapping[str, Any]) -> list[Any]:
    given = body.get("input")
    if isinstance(given, str):
        return [{"content": given}]
    items = []
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, Mapping):
            continue
        if "content" in item:
            items.append(item)
        else:  # a function call's arguments, a function call's output
            items.append({"content": item.get("arguments", item.get("output"))})
    return items


def _gemini_contents(given: object) -> list[Any]:
    """Gemini's contents as messages: each turn's parts, a call's or a response's object as
    its JSON text."""
    contents = given if isinstance(given, list) else [given] if isinstance(given, Mapping) else []
    items = []
    for content in contents:
        parts = content.get("parts") if isinstance(content, Mapping) else None
        said = []
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, Mapping):
                continue
            if isinstance(part.get("text"), str):
                said.append(part)
            elif "functionCall" in part or "functionResponse" in part:
                said.append({"text": json.dumps(part, default=str)})
        items.append({"content": said})
    return items


def _converse_messages(given: object) -> list[Any]:
    """Converse's messages: each block's text, a tool use's or a tool result's object as its JSON text."""
    items = []
    for m in given if isinstance(given, list) else []:
        content = m.get("content") if isinstance(m, Mapping) else None
        said = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, Mapping):
                continue
            if isinstance(block.get("text"), str):
                said.append(block)
            elif "toolUse" in block or "toolResult" in block:
                said.append({"text": json.dumps(block, default=str)})
        items.append({"content": said})
    return items


def _with(preamble: object, framed: object) -> list[Any]:
    messages = list(framed) if isinstance(framed, list) else []
    if preamble:
        messages.insert(0, {"content": preamble})
    return messages


def estimate_body(api: Format, body: Mapping[str, Any]) -> int:
    """A request body's prompt by its API, tools included: chat's messages; Anthropic's
    messages with the system prompt as one more message; the Responses API's input items
    with the instructions as one more; Gemini's contents with its systemInstruction as one more;
    Converse's messages with its system blocks as one more (its tools in toolConfig)."""
    if api is Format.MESSAGES:
        framed, preamble = body.get("messages"), body.get("system")
    elif api is Format.RESPONSES:
        framed, preamble = _responses_items(body), body.get("instructions")
    elif api is Format.GEMINI:
        framed = _gemini_contents(body.get("contents"))
        preamble = [p for c in _gemini_contents(body.get("systemInstruction")) for p in c["content"]]
    elif api is Format.CONVERSE:
        framed, preamble = _converse_messages(body.get("messages")), body.get("system")
        config = body.get("toolConfig")
        return estimate_tokens(_with(preamble, framed)) + _tools(
            config.get("tools") if isinstance(config, Mapping) else None
        )
    else:
        framed, preamble = body.get("messages"), None
    return estimate_tokens(_with(preamble, framed)) + _tools(body.get("tools"))


def estimate_request(request: Request) -> int:
    """The prompt of a request, whatever its API: what routing checks context windows and
    charges token budgets with."""
    if request.format is Format.CHAT:
        return estimate_tokens(request.messages) + _tools(request.extra.get("tools"))
    return estimate_body(request.format, request.extra)
