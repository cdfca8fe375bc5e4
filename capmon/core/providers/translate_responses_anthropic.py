"""OpenAI's Responses API on Anthropic Messages: a request to Messages, its answer and its
stream back to the Responses API (no Messages request goes to a Responses target:
capmon/core/providers/formats.py sends those as chat completions).

Requests go through the chat translation (:mod:`capmon.core.providers.translate_chat_anthropic`):
a Responses request is first the chat request it means (instructions, input items,
function tools), so the chat <-> Messages rules (tool choice, images, tool results, the
refusals) have one home. Answers and streams map directly, with the usage and stop-reason
tables of the chat module. Field names follow ``openai/types/responses`` and
``anthropic/types``. Pure functions and one stream translator; capmon/core/providers/formats.py uses them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capmon.core.providers.translate_chat_anthropic import (
    Untranslatable,
    anthropic_usage_to_openai,
    chat_to_messages,
    sub_object,
)

# Fields that mean nothing to the answer (bookkeeping, cache keys, what extra the reply
# carries), left out toward Anthropic. ``client_metadata``: Codex CLI's session and turn ids.
_NO_MEANING = frozenset(
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
_CARRIED = frozenset(
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


# ---------------------------------------------------------------- requests


def responses_to_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses request as a Messages body (without ``model`` and ``stream``)."""
    return chat_to_messages(responses_to_chat(body))


def responses_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request a Responses request means. Raises :class:`Untranslatable`."""
    for name, value in body.items():
        if name not in _NO_MEANING and name not in _CARRIED and value is not None:
            raise Untranslatable(f"{name} (no Anthropic counterpart)")
    if body.get("truncation") not in (None, "disabled"):
        raise Untranslatable("truncation = auto (the Responses API would cut the conversation itself)")
    _reasoning(body.get("reasoning"))
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    elif body.get("instructions"):
        raise Untranslatable("instructions that are not text")
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for i, item in enumerate(items):
            _item(item, i, messages)
    else:
        raise Untranslatable("no input")
    out: dict[str, Any] = {"messages": messages}
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = body["max_output_tokens"]
    _tools(body, out)
    _text_format(body.get("text"), out)
    return out


def _reasoning(reasoning: object) -> None:
    """A reasoning object that asks for no effort (absent or ``none``) asks for nothing an
    Anthropic model without thinking does not give: a summary is only ever of reasoning
    done, so ``summary`` alone (Codex CLI sends ``{"summary": "auto"}``) is left out. An
    effort is refused: Anthropic's thinking is not translated."""
    if reasoning is None:
        return
    if not isinstance(reasoning, Mapping) or set(reasoning) - {"effort", "summary"}:
        raise Untranslatable("reasoning options other than effort and summary")
    effort = reasoning.get("effort")
    if effort not in (None, "none"):
        raise Untranslatable(f"reasoning effort = {effort} (Anthropic's thinking is not translated)")


def _item(item: object, i: int, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, Mapping):
        raise Untranslatable(f"input[{i}]: not an item")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise Untranslatable(f"input[{i}]: a message with role {role}")
        messages.append({"role": role, "content": _content(item.get("content"), i)})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # text, then the calls: one turn
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = _content(output, i)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
    else:
        raise Untranslatable(f"input[{i}]: a {kind} item")


def _content(content: object, i: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            parts.append({"type": "refusal", "refusal": str(part.get("refusal", ""))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            what = "an input_image by file_id" if kind == "input_image" else f"a {kind} part"
            raise Untranslatable(f"input[{i}]: {what}")
    return parts


def _tools(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools:
        chat_tools = []
        for t in tools if isinstance(tools, list) else []:
            if not isinstance(t, Mapping) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, Mapping) else None
                raise Untranslatable(f"a built-in {kind} tool (only function tools translate)")
            extra = set(t) - {"type", "name", "description", "parameters", "strict"}
            if extra:
                raise Untranslatable(f"tool {t.get('name')}: {', '.join(sorted(extra))}")
            fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
            chat_tools.append({"type": "function", "function": fn})
        out["tools"] = chat_tools
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice in ("auto", "none", "required"):
        out["tool_choice"] = choice
    elif choice is not None:
        raise Untranslatable(f"tool_choice {json.dumps(choice)[:80]}")


def _text_format(text: object, out: dict[str, Any]) -> None:
    if not text:
        return
    if not isinstance(text, Mapping) or set(text) - {"format"}:
        raise Untranslatable("text options other than format (verbosity has no Anthropic counterpart)")
    fmt = text.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        out["response_format"] = fmt  # json_object and friends: the chat rules refuse them


# ---------------------------------------------------------------- answers


def _response_usage(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    chat = anthropic_usage_to_openai(usage)
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": chat["prompt_tokens_details"],
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat["total_tokens"],
    }


_INCOMPLETE = {"max_tokens": "max_output_tokens", "model_context_window_exceeded": "max_output_tokens"}


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _call_item(item_id: str, block: Mapping[str, Any], arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": str(block.get("id", "")),
        "name": str(block.get("name", "")),
        "arguments": arguments,
        "status": status,
    }


def _response(
    head: Mapping[str, Any], output: list[dict[str, Any]], stop: object, usage: Mapping[str, Any] | None
) -> dict[str, Any]:
    status, details = "completed", None
    if stop in _INCOMPLETE:
        status, details = "incomplete", {"reason": _INCOMPLETE[str(stop)]}
    elif stop == "refusal":
        status, details = "incomplete", {"reason": "content_filter"}
    return {
        **head,
        "object": "response",
        "status": status,
        "incomplete_details": details,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": _response_usage(usage) if usage is not None else None,
    }


def message_to_response(message: Mapping[str, Any], *, created: int) -> dict[str, Any]:
    """A Messages answer as a Responses API answer (thinking left out, as in chat)."""
    base = str(message.get("id", ""))
    output: list[dict[str, Any]] = []
    blocks = message.get("content")
    for n, block in enumerate(blocks if isinstance(blocks, list) else []):
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "text":
            output.append(_text_item(f"{base}_{n}", str(block.get("text", "")), "completed"))
        elif block.get("type") == "tool_use":
            output.append(_call_item(f"{base}_{n}", block, json.dumps(block.get("input", {})), "completed"))
    head = {"id": base, "created_at": created, "model": str(message.get("model", ""))}
    return _response(head, output, message.get("stop_reason"), sub_object(message, "usage"))


# ---------------------------------------------------------------- streams


class MessagesToResponsesStream:
    """Messages events in, Responses events out: ``response.created`` and
    ``response.in_progress``; per text block an output message item with its
    ``output_text`` deltas; per tool use a ``function_call`` item with its argument
    deltas; then ``response.completed`` (or ``response.incomplete``) carrying the whole
    answer. Thinking blocks are left out, as in answers."""

    def __init__(self, *, created: int) -> None:
        self.created = created
        self.head: dict[str, Any] = {"id": "", "created_at": created, "model": ""}
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._open: dict[int, tuple[int, dict[str, Any], list[str]]] = {}  # block -> (output index, item, pieces)
        self.stop: object = None
        self.usage: dict[str, Any] = {}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start":
            message = sub_object(event, "message")
            self.head.update(id=str(message.get("id", "")), model=str(message.get("model", "")))
            self.usage.update(sub_object(message, "usage"))
            skeleton = {**_response(self.head, [], None, None), "status": "in_progress"}
            return [
                self._event("response.created", response=skeleton),
                self._event("response.in_progress", response=skeleton),
            ]
        if kind == "content_block_start":
            return self._start(event)
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_stop":
            return self._stop(event)
        if kind == "message_delta":
            self.stop = sub_object(event, "delta").get("stop_reason")
            self.usage.update({k: v for k, v in sub_object(event, "usage").items() if v is not None})
            return []
        if kind == "message_stop":
            response = _response(self.head, self.output, self.stop, self.usage)
            done = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
            return [self._event(done, response=response)]
        return []

    def _start(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        block = sub_object(event, "content_block")
        index = event.get("index")
        if not isinstance(index, int) or block.get("type") not in ("text", "tool_use"):
            return []
        n = len(self.output)
        item_id = f"{self.head['id']}_{index}"
        if block.get("type") == "text":
            item = {**_text_item(item_id, "", "in_progress"), "content": []}
            self._open[index] = (n, item, [])
            self.output.append(item)
            part = {"type": "output_text", "text": "", "annotations": []}
            return [
                self._event("response.output_item.added", output_index=n, item=dict(item)),
                self._event("response.content_part.added", item_id=item_id, output_index=n, content_index=0, part=part),
            ]
        item = _call_item(item_id, block, "", "in_progress")
        self._open[index] = (n, item, [])
        self.output.append(item)
        return [self._event("response.output_item.added", output_index=n, item=dict(item))]

    def _delta(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        opened = self._open.get(event.get("index"))  # type: ignore[arg-type]
        if opened is None:
            return []
        n, item, pieces = opened
        delta = sub_object(event, "delta")
        piece = delta.get("text") if delta.get("type") == "text_delta" else delta.get("partial_json")
        if not isinstance(piece, str) or not piece:
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

    def _stop(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        opened = self._open.pop(event.get("index"), None)  # type: ignore[arg-type]
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
