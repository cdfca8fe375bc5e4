"""OpenAI chat completions <-> Anthropic Messages: requests, answers and streams, both ways.

Translation covers what both APIs can say; a request that uses anything the other side
cannot carry is refused: the translation raises :class:`Untranslatable` with the reason
(:func:`capmon.core.providers.formats.incapable` then skips the target as incapable), so nothing that
changes what an answer means is ever dropped silently. A few fields that change nothing in
the answer (bookkeeping, cache keys, a user id) are listed below with what becomes of them.
Model, the final token cap and ``stream`` are the wire's (:func:`capmon.core.providers.openai_wire.chat_body`,
:func:`capmon.core.providers.anthropic_wire.messages_body`).

Field names follow the SDKs' types (``openai/types/chat``, ``anthropic/types``). Pure
functions on dicts and two small stateful stream translators; capmon/core/providers/formats.py uses them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from capmon.core.base.exceptions import CapmonError


class Untranslatable(CapmonError, ValueError):
    """A request or answer that the other format cannot carry; the message says why."""


# ---------------------------------------------------------------- shared mappings

FINISH_TO_STOP: Mapping[str, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
STOP_TO_FINISH: Mapping[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}
_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)
OPENAI_MAX_STOP = 4  # OpenAI takes at most four stop sequences


def sub_object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def anthropic_usage_to_openai(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Anthropic counts fresh input, cache writes and cache reads apart; OpenAI's
    ``prompt_tokens`` is all three, with the cached part in ``prompt_tokens_details``."""
    u = usage or {}
    fresh, written, read = (
        _int(u.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    prompt, output = fresh + written + read, _int(u.get("output_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
    }


def openai_usage_to_anthropic(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """The other way: the cached (and cache-written) part out of ``prompt_tokens``.
    Reads the chat shape (prompt / completion) and the Responses one (input / output)."""
    u = usage or {}
    details = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    read = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    written = _int(details.get("cache_write_tokens")) if isinstance(details, Mapping) else 0
    prompt = _int(u.get("prompt_tokens", u.get("input_tokens")))
    return {
        "input_tokens": max(0, prompt - read - written),
        "output_tokens": _int(u.get("completion_tokens", u.get("output_tokens"))),
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": written,
    }


def image_to_anthropic(url: str) -> dict[str, Any]:
    """A data URL becomes a base64 source, any other URL a url source."""
    match = _DATA_URL.fullmatch(url)
    if match:
        media = match.group("type").lower()
        if media not in _MEDIA_TYPES:
            raise Untranslatable(f"an image of type {media} (Anthropic takes jpeg, png, gif, webp)")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": match.group("data")}}
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise Untranslatable("an image that is neither a data URL nor an http(s) URL")


def image_to_url(block: Mapping[str, Any]) -> str:
    source = block.get("source")
    if isinstance(source, Mapping):
        if source.get("type") == "base64":
            return f"data:{source.get('media_type')};base64,{source.get('data')}"
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return str(source["url"])
    kind = source.get("type") if isinstance(source, Mapping) else None
    raise Untranslatable(f"an image with a {kind} source (only base64 and url sources translate)")


def tool_input(raw: object, where: str) -> dict[str, Any]:
    """A tool call's JSON arguments as the object Anthropic's ``input`` must be."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise Untranslatable(f"{where}: tool call arguments that are not JSON") from None
    if not isinstance(parsed, dict):
        raise Untranslatable(f"{where}: tool call arguments that are not a JSON object")
    return parsed


# ---------------------------------------------------------------- requests: chat -> Anthropic

# Chat fields that mean nothing to the answer: left out toward Anthropic (``user`` becomes
# ``metadata.user_id``). stream_options: capmon asks for usage itself. seed: a best-effort
# determinism hint with no counterpart; it changes no answer's meaning.
_CHAT_NO_MEANING = frozenset(
    {
        "store",
        "metadata",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "safety_identifier",
        "service_tier",
        "stream_options",
        "seed",
        "user",
    }
)
_CHAT_CARRIED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "stop",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "logprobs",
        "frequency_penalty",
        "presence_penalty",
        "modalities",
    }
)
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def _chat_fields(body: Mapping[str, Any]) -> None:
    for name, value in body.items():
        if name in _CHAT_NO_MEANING or name in _CHAT_CARRIED:
            continue
        if value is None or value is False or value == [] or value == {}:
            continue  # an explicit "off" is no request for the feature
        raise Untranslatable(f"{name} (no Anthropic counterpart)")
    n = body.get("n")
    if n not in (None, 1):
        raise Untranslatable(f"n = {n} (Anthropic gives one answer per request)")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise Untranslatable("logprobs (Anthropic gives none)")
    for name in ("frequency_penalty", "presence_penalty"):
        if body.get(name):
            raise Untranslatable(f"{name} (Anthropic has no penalties)")
    modalities = body.get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise Untranslatable("audio output (modalities)")
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if isinstance(value, (int, float)) and not 0 <= value <= 1:
            raise Untranslatable(f"{name} = {value} (Anthropic takes 0 to 1)")


def chat_to_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    """A chat request as a Messages body (without ``model`` and ``stream``; ``max_tokens``
    only when the caller set a cap). Raises :class:`Untranslatable` with the reason."""
    _chat_fields(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("no messages")
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in _CHAT_ROLES:
            raise Untranslatable(f"messages[{i}]: not a chat message")
        role = m["role"]
        if role in ("system", "developer"):
            blocks = _text_blocks(m.get("content"), f"messages[{i}]")
            if out:  # after the conversation began: Messages' own mid-conversation system message
                out.append({"role": "system", "content": blocks})
            else:
                system += blocks
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": _tool_id(m.get("tool_call_id"), i),
                "content": _tool_result_content(m.get("content"), i),
            }
            if out and out[-1]["role"] == "user" and _all_results(out[-1]["content"]):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "user":
            blocks = _user_blocks(m.get("content"), i)
            if out and out[-1]["role"] == "user":  # after tool results: one user turn
                out[-1]["content"] += blocks
            else:
                out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": "assistant", "content": _assistant_blocks(m, i)})
    result: dict[str, Any] = {"messages": out}
    if system:
        result["system"] = system[0]["text"] if len(system) == 1 else system
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        result["max_tokens"] = cap
    stop = body.get("stop")
    if stop:
        result["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            result[name] = body[name]
    if isinstance(body.get("user"), str):
        result["metadata"] = {"user_id": body["user"]}
    _chat_tools(body, result)
    _chat_format(body.get("response_format"), result)
    return result


def _all_results(blocks: list[dict[str, Any]]) -> bool:
    return all(b.get("type") == "tool_result" for b in blocks)


def _tool_id(value: object, i: int) -> str:
    if not isinstance(value, str) or not value:
        raise Untranslatable(f"messages[{i}]: a tool message without tool_call_id")
    return value


def _text_blocks(content: object, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, Mapping) and part.get("type") in ("text", "refusal"):
            out.append({"type": "text", "text": str(part.get("text", part.get("refusal", "")))})
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise Untranslatable(f"{where}: a {kind} part where only text is allowed")
    if not isinstance(content, list) and content is not None:
        raise Untranslatable(f"{where}: content that is neither text nor parts")
    return out


def _user_blocks(content: object, i: int) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return _text_blocks(content, f"messages[{i}]")
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            out.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise Untranslatable(f"messages[{i}]: an image_url part without a url")
            # ``detail`` is a resolution and cost hint with no counterpart; it changes no meaning.
            out.append(image_to_anthropic(url))
        elif kind == "input_audio":
            raise Untranslatable(f"messages[{i}]: audio input")
        else:
            raise Untranslatable(f"messages[{i}]: a {kind} part")
    return out


def _tool_result_content(content: object, i: int) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return _text_blocks(content, f"messages[{i}]")


def _assistant_blocks(m: Mapping[str, Any], i: int) -> list[dict[str, Any]]:
    if m.get("audio"):
        raise Untranslatable(f"messages[{i}]: an assistant audio reply")
    if m.get("function_call"):
        raise Untranslatable(f"messages[{i}]: a legacy function_call")
    blocks = [b for b in _text_blocks(m.get("content"), f"messages[{i}]") if b["text"]]
    if isinstance(m.get("refusal"), str) and m["refusal"]:
        blocks.append({"type": "text", "text": m["refusal"]})
    calls = m.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or call.get("type", "function") != "function":
            raise Untranslatable(f"messages[{i}]: a tool call that is not a function call")
        blocks.append(
            {
                "type": "tool_use",
                "id": _tool_id(call.get("id"), i),
                "name": str(fn.get("name", "")),
                "input": tool_input(fn.get("arguments"), f"messages[{i}]"),
            }
        )
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def _chat_tools(body: Mapping[str, Any], result: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools:
        out = []
        for t in tools if isinstance(tools, list) else []:
            fn = t.get("function") if isinstance(t, Mapping) else None
            if not isinstance(fn, Mapping) or t.get("type") != "function":
                kind = t.get("type") if isinstance(t, Mapping) else None
                raise Untranslatable(f"a {kind} tool (only function tools translate)")
            out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), fn.get("strict")))
        result["tools"] = out
    choice = tool_choice_to_anthropic(body.get("tool_choice"))
    if body.get("parallel_tool_calls") is False:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        result["tool_choice"] = choice


def function_tool(name: object, description: object, parameters: object, strict: object) -> dict[str, Any]:
    """One Anthropic client tool from an OpenAI function's parts (chat and Responses alike)."""
    if not isinstance(name, str) or not name:
        raise Untranslatable("a function tool without a name")
    tool: dict[str, Any] = {
        "name": name,
        "input_schema": parameters if isinstance(parameters, Mapping) else {"type": "object", "properties": {}},
    }
    if isinstance(description, str):
        tool["description"] = description
    if isinstance(strict, bool):
        tool["strict"] = strict
    return tool


def tool_choice_to_anthropic(choice: object) -> dict[str, Any] | None:
    """auto / none / required / a named function -> auto / none / any / tool. Chat's
    ``{"type": "function", "function": {"name"}}`` and Responses' ``{"type": "function",
    "name"}`` both name a tool."""
    if choice is None:
        return None
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if isinstance(name, str) and name:
            return {"type": "tool", "name": name}
    raise Untranslatable(f"tool_choice {json.dumps(choice)[:80]}")


def _chat_format(fmt: object, result: dict[str, Any]) -> None:
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if isinstance(schema, Mapping):
            result["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
            return
    raise Untranslatable("response_format other than text or a json_schema")


# ---------------------------------------------------------------- requests: Anthropic -> chat

# Messages fields that mean nothing to the answer, left out toward OpenAI (metadata's
# user_id becomes ``user``).
_MESSAGES_NO_MEANING = frozenset({"metadata", "service_tier", "speed", "diagnostics"})
_MESSAGES_CARRIED = frozenset(
    {
        "model",
        "messages",
        "system",
        "max_tokens",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "output_config",
        "thinking",
    }
)
_TOOL_KEYS = frozenset({"name", "description", "input_schema", "type", "strict", "eager_input_streaming"})


def _cache_control(obj: object, where: str) -> None:
    if (type(obj) is dict or isinstance(obj, Mapping)) and obj.get("cache_control"):
        raise Untranslatable(f"{where}: cache_control (OpenAI caches on its own terms)")


def _messages_fields(body: Mapping[str, Any]) -> None:
    for name, value in body.items():
        if name in _MESSAGES_NO_MEANING or name in _MESSAGES_CARRIED or value is None:
            continue
        raise Untranslatable(f"{name} (no OpenAI counterpart)")
    _cache_control(body, "the request")
    if isinstance(body.get("thinking"), Mapping):
        raise Untranslatable("thinking (OpenAI's chat completions cannot carry Anthropic's thinking)")
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and len(stop) > OPENAI_MAX_STOP:
        raise Untranslatable(f"{len(stop)} stop sequences (OpenAI takes {OPENAI_MAX_STOP})")


# Hints: fields that say how to serve a request, never what its answer means. A caching
# breakpoint; thinking left to the model (adaptive) or off; Anthropic's default effort
# ("high": the same as none asked); context edits that only clear thinking blocks (none
# cross: thinking in the history is refused). OpenAI's chat cannot honour them, so
# :func:`without_hints` takes them out for the config's rule ([client] unhonoured_hints:
# left out and said, or the target skipped); :func:`messages_to_chat` itself refuses them.
HINTS = ("cache_control", "thinking", "output_config.effort", "context_management")
_HINT_THINKING = frozenset({"adaptive", "disabled"})
_DEFAULT_EFFORT = "high"
_CLEAR_THINKING = "clear_thinking_"


def without_hints(body: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``body`` without its hints (see :data:`HINTS`), and the names of those taken out.
    ``thinking`` that asks for reasoning (``enabled`` with a budget) is no hint: it stays,
    and the translation refuses it."""
    found: set[str] = set()
    out = dict(body)
    if out.get("cache_control"):
        del out["cache_control"]
        found.add("cache_control")
    for name in ("system", "tools"):
        if isinstance(out.get(name), list):
            out[name] = _uncached(out[name], found)
    if isinstance(out.get("messages"), list):
        out["messages"] = [
            {**m, "content": _uncached(m["content"], found)}
            if isinstance(m, Mapping) and isinstance(m.get("content"), list)
            else m
            for m in out["messages"]
        ]
    thinking = out.get("thinking")
    if isinstance(thinking, Mapping) and thinking.get("type") in _HINT_THINKING:
        del out["thinking"]
        found.add("thinking")
    config = out.get("output_config")
    if isinstance(config, Mapping) and config.get("effort") == _DEFAULT_EFFORT:
        rest = {k: v for k, v in config.items() if k != "effort"}
        if rest:
            out["output_config"] = rest
        else:
            del out["output_config"]
        found.add("output_config.effort")
    edits = sub_object(out, "context_management").get("edits")
    if (
        set(sub_object(out, "context_management")) == {"edits"}
        and isinstance(edits, list)
        and all(isinstance(e, Mapping) and str(e.get("type", "")).startswith(_CLEAR_THINKING) for e in edits)
    ):
        del out["context_management"]
        found.add("context_management")
    return out, tuple(name for name in HINTS if name in found)


def _uncached(blocks: list[Any], found: set[str]) -> list[Any]:
    """Blocks (and a tool result's own blocks) without their cache breakpoints: the same
    list when none has one (a body's blocks are not copied for nothing)."""
    out, changed = [], False
    for block in blocks:
        given = block
        if type(block) is dict or isinstance(block, Mapping):
            if block.get("cache_control"):
                block = {k: v for k, v in block.items() if k != "cache_control"}
                found.add("cache_control")
            if isinstance(block.get("content"), list):
                content = _uncached(block["content"], found)
                if content is not block["content"]:
                    block = {**block, "content": content}
        changed = changed or block is not given
        out.append(block)
    return out if changed else blocks


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages request as a chat body (without ``model`` and ``stream``; the cap as
    ``max_completion_tokens``). Raises :class:`Untranslatable` with the reason."""
    _messages_fields(body)
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        out.append({"role": "system", "content": _plain_text(system, "system")})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Untranslatable("no messages")
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role == "system":  # the 2.x SDKs' SystemMessageParam: OpenAI takes a system message anywhere
            out.append({"role": "system", "content": _plain_text(m.get("content"), f"messages[{i}]")})
        elif role == "user":
            out += _user_messages(m.get("content"), i)
        elif role == "assistant":
            out.append(_assistant_message(m.get("content"), i))
        else:
            raise Untranslatable(f"messages[{i}]: not a Messages message")
    result: dict[str, Any] = {"messages": out}
    cap = body.get("max_tokens")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        result["max_completion_tokens"] = cap
    if body.get("stop_sequences"):
        result["stop"] = list(body["stop_sequences"])
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            result[name] = body[name]
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("user_id"), str):
        result["user"] = metadata["user_id"]
    _messages_tools(body, result)
    _messages_format(body.get("output_config"), result)
    return result


def _plain_text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else [content]:
        if not isinstance(block, Mapping) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise Untranslatable(f"{where}: a {kind} block where only text translates")
        _cache_control(block, where)
        if block.get("citations"):
            raise Untranslatable(f"{where}: citations")
        parts.append(str(block.get("text", "")))
    return "\n\n".join(parts)


def _blocks(content: object) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    # dict first: a body's blocks are dicts, and the ABC's check costs five times as much a block
    if isinstance(content, list) and all(type(b) is dict or isinstance(b, Mapping) for b in content):
        return content
    raise Untranslatable("content that is neither text nor blocks")


def _user_messages(content: object, i: int) -> list[dict[str, Any]]:
    """Tool results become tool messages (first, as OpenAI wants them right after the
    call); the rest of the turn one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[Mapping[str, Any]] = []
    where = f"messages[{i}]"
    for block in _blocks(content):
        _cache_control(block, where)
        kind = block.get("type")
        if kind == "text":
            if block.get("citations"):
                raise Untranslatable(f"{where}: citations")
            if type(block) is dict and len(block) == 2 and type(block.get("text")) is str:
                parts.append(block)  # already a chat text part: shared, not copied (a body may hold thousands)
            else:
                parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_to_url(block)}})
        elif kind == "tool_result":
            tools.append(_tool_message(block, where))
        else:
            raise Untranslatable(f"{where}: a {kind} block")
    out = tools
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        content_out: Any = "".join(p["text"] for p in parts) if only_text and len(parts) == 1 else parts
        out.append({"role": "user", "content": content_out})
    return out


_TOOL_ERROR = "(tool error) "


def _tool_message(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    text = _plain_text(block.get("content", ""), where)
    if block.get("is_error"):
        # OpenAI's tool message has no error flag; the model still learns the call failed.
        text = _TOOL_ERROR + text
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise Untranslatable(f"{where}: a tool_result without tool_use_id")
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant_message(content: object, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(content):
        _cache_control(block, where)
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))},
                }
            )
        else:
            raise Untranslatable(f"{where}: a {kind} block in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages_tools(body: Mapping[str, Any], result: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools:
        out = []
        for t in tools if isinstance(tools, list) else []:
            if not isinstance(t, Mapping) or t.get("type") not in (None, "custom") or "input_schema" not in t:
                kind = t.get("type") if isinstance(t, Mapping) else None
                raise Untranslatable(f"a built-in {kind} tool (only client tools translate)")
            extra = set(t) - _TOOL_KEYS - {"cache_control"}
            if extra:
                raise Untranslatable(f"tool {t.get('name')}: {', '.join(sorted(extra))}")
            _cache_control(t, f"tool {t.get('name')}")
            fn: dict[str, Any] = {"name": t["name"], "parameters": t["input_schema"]}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            if isinstance(t.get("strict"), bool):
                fn["strict"] = t["strict"]
            out.append({"type": "function", "function": fn})
        result["tools"] = out
    choice = body.get("tool_choice")
    if choice is None:
        return
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if kind in ("auto", "none"):
        result["tool_choice"] = kind
    elif kind == "any":
        result["tool_choice"] = "required"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        result["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise Untranslatable(f"tool_choice {json.dumps(choice)[:80]}")
    if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use"):
        result["parallel_tool_calls"] = False


def _messages_format(config: object, result: dict[str, Any]) -> None:
    if not config:
        return
    if isinstance(config, Mapping) and set(config) <= {"format"}:
        fmt = config.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), Mapping):
            result["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": fmt["schema"]},
            }
            return
    raise Untranslatable("output_config other than a json_schema format (effort has no chat counterpart)")


# ---------------------------------------------------------------- answers


def message_to_completion(message: Mapping[str, Any], *, created: int) -> dict[str, Any]:
    """A Messages answer as a chat completion. Thinking blocks are left out, as OpenAI
    leaves its own reasoning out of an answer (a request for thinking never crosses)."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in _blocks(message.get("content", [])):
        if block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))},
                }
            )
    out: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        out["tool_calls"] = calls
    stop = message.get("stop_reason")
    return {
        "id": str(message.get("id", "")),
        "object": "chat.completion",
        "created": created,
        "model": str(message.get("model", "")),
        "choices": [{"index": 0, "message": out, "finish_reason": STOP_TO_FINISH.get(str(stop), "stop")}],
        "usage": anthropic_usage_to_openai(message.get("usage")),
    }


def completion_to_message(completion: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion as a Messages answer. Raises :class:`Untranslatable` for tool
    arguments that are no JSON object (Anthropic's ``input`` must be one)."""
    try:
        choice = completion["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise Untranslatable("a chat completion without a choice") from None
    blocks: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        blocks.append({"type": "text", "text": message["content"]})
    if isinstance(message.get("refusal"), str) and message["refusal"]:
        blocks.append({"type": "text", "text": message["refusal"]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id", "")),
                "name": str(fn.get("name", "")),
                "input": tool_input(fn.get("arguments"), "the answer"),
            }
        )
    finish = choice.get("finish_reason")
    stop = "refusal" if message.get("refusal") else FINISH_TO_STOP.get(str(finish), "end_turn")
    return {
        "id": str(completion.get("id", "")),
        "type": "message",
        "role": "assistant",
        "model": str(completion.get("model", "")),
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": openai_usage_to_anthropic(completion.get("usage")),
    }


# ---------------------------------------------------------------- streams


class ChatToMessagesStream:
    """Chat chunks in, Messages events out: ``message_start``, a content block per text
    run and per tool call (arguments as ``input_json_delta``), then at :meth:`close` (the
    chat stream's ``[DONE]``) ``message_delta`` with the stop reason and usage and
    ``message_stop``. Usage arrives in OpenAI's last chunk, after the finish reason, so
    the stop waits for it; ask the chat side for ``stream_options.include_usage``."""

    def __init__(self, *, model: str = "") -> None:
        self.model = model
        self.started = False
        self.closed = False
        self._index = -1  # the open block, -1 when none
        self._open: tuple[str, int] | None = None  # ("text", 0) or ("tool", chat tool index)
        self.finish: str | None = None
        self.usage: Mapping[str, Any] | None = None

    def feed(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        out = self._start(chunk)
        if isinstance(chunk.get("usage"), Mapping):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for c in choices if isinstance(choices, list) else []:
            if not isinstance(c, Mapping) or c.get("index", 0) != 0:
                continue
            delta = sub_object(c, "delta")
            for piece in (delta.get("content"), delta.get("refusal")):
                if isinstance(piece, str) and piece:
                    out += self._block(("text", 0), {"type": "text", "text": ""})
                    out.append(self._delta({"type": "text_delta", "text": piece}))
            for call in delta.get("tool_calls") or []:
                out += self._tool(call)
            if c.get("finish_reason"):
                self.finish = c["finish_reason"]
        return out

    def _start(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": str(chunk.get("id", "")),
            "type": "message",
            "role": "assistant",
            "model": self.model or str(chunk.get("model", "")),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._index, "delta": delta}

    def _block(self, key: tuple[str, int], block: dict[str, Any]) -> list[dict[str, Any]]:
        if self._open == key:
            return []
        out = self._stop_block()
        self._index += 1
        self._open = key
        out.append({"type": "content_block_start", "index": self._index, "content_block": block})
        return out

    def _stop_block(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]

    def _tool(self, call: Mapping[str, Any]) -> list[dict[str, Any]]:
        index = call.get("index", 0)
        fn = sub_object(call, "function")
        key = ("tool", index if isinstance(index, int) else 0)
        block = {"type": "tool_use", "id": str(call.get("id") or ""), "name": str(fn.get("name") or ""), "input": {}}
        out = self._block(key, block)
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return out

    def close(self) -> list[dict[str, Any]]:
        """The closing events, once (the chat stream ended with ``[DONE]``)."""
        if self.closed:
            return []
        self.closed = True
        out = self._start({}) + self._stop_block()
        usage = openai_usage_to_anthropic(self.usage)
        out.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": FINISH_TO_STOP.get(str(self.finish), "end_turn"), "stop_sequence": None},
                "usage": usage,
            }
        )
        out.append({"type": "message_stop"})
        return out


class MessagesToChatStream:
    """Messages events in, chat chunks out, ending as OpenAI's streams do: a chunk with
    the finish reason, then (``include_usage``) a chunk with no choices and the usage;
    the framing adds ``data: [DONE]``. Thinking is left out, as in answers."""

    def __init__(self, *, created: int, include_usage: bool = True) -> None:
        self.created = created
        self.include_usage = include_usage
        self.id = ""
        self.model = ""
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None
        self._tools: dict[int, int] = {}  # Anthropic block index -> chat tool index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def feed(self, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            message = event["message"]
            self.id, self.model = str(message.get("id", "")), str(message.get("model", ""))
            self.usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            block = event["content_block"]
            if block.get("type") == "tool_use":
                n = self._tools[_int(event.get("index"))] = len(self._tools)
                call = {"index": n, "id": block.get("id"), "type": "function"}
                call["function"] = {"name": block.get("name"), "arguments": ""}
                return [self._chunk({"tool_calls": [call]})]
            if block.get("type") == "text" and block.get("text"):
                return [self._chunk({"content": block["text"]})]
            return []
        if kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            delta = event["delta"]
            if delta.get("type") == "text_delta" and delta.get("text"):
                return [self._chunk({"content": delta["text"]})]
            if delta.get("type") == "input_json_delta" and delta.get("partial_json"):
                tool = self._tools.get(_int(event.get("index")))
                if tool is not None:
                    return [
                        self._chunk({"tool_calls": [{"index": tool, "function": {"arguments": delta["partial_json"]}}]})
                    ]
            return []
        if kind == "message_delta":
            delta = sub_object(event, "delta")
            self.finish = STOP_TO_FINISH.get(str(delta.get("stop_reason")), "stop")
            self.usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            return []
        if kind == "message_stop":
            out = [self._chunk({}, self.finish or "stop")]
            if self.include_usage:
                out.append({**self._chunk({}), "choices": [], "usage": anthropic_usage_to_openai(self.usage)})
            return out
        return []
