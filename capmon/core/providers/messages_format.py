"""The messages format: Anthropic's Messages (/v1/messages). Its requests, answers and stream events to and from the
canonical hub (capmon/core/types/canon.py), and what reads and probes it. A module of
:class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md, "Across formats"."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers import hub, splice
from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_event
from capmon.core.providers.frames import Event, FrameKind, typed_event
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request, caller_cap

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.

# Anthropic's Messages decoded into canon and encoded from it. Toward Messages from another
# format the rules are those of the chat translation it replaces (the golden tables in
# tests/core/providers/test_golden_requests.py): what Anthropic cannot carry is refused with
# the reason, naming its place in the caller's body; a Messages request crosses back to
# Messages whole (thinking, cache hints, citations, a tool result's error flag).

SOURCE = "messages"

_MESSAGES_NO_MEANING = frozenset({"metadata", "service_tier", "speed", "diagnostics"})
_MESSAGES_SLOTS = frozenset(
    {
        "model",
        "stream",
        "messages",
        "system",
        "max_tokens",
        "stop_sequences",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "output_config",
        "thinking",
        "cache_control",
    }
)
_ROLES: Mapping[str, canon.Role] = {
    "user": canon.Role.USER,
    "assistant": canon.Role.ASSISTANT,
    "system": canon.Role.SYSTEM,
}
_TOOL_SLOTS = frozenset({"name", "description", "input_schema", "strict", "cache_control"})
_CHOICES = frozenset({"auto", "none", "any"})


def decode_request(body: Mapping[str, Any]) -> canon.Request:
    """A Messages body in canon terms: every field kept (Anthropic's own, like ``top_k`` or
    ``context_management``, in ``own``; bookkeeping in ``aside``). Raises
    :class:`~capmon.core.providers.hub.Incapable` only for a body no format could read."""
    own, aside = hub.sort_fields(body, _MESSAGES_SLOTS, _MESSAGES_NO_MEANING)
    messages = body.get("messages")
    decoded = tuple(_message(m, i) for i, m in enumerate(messages)) if isinstance(messages, list) else ()
    system, plain = _system(body.get("system"))
    cap = body.get("max_tokens")
    stop = body.get("stop_sequences")
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    cache = body.get("cache_control")
    if isinstance(cache, Mapping):
        request_cache: canon.Cache | None = canon.Cache(cache)
    else:
        request_cache = None
        if cache is not None:
            own["cache_control"] = cache
    tool_choice, parallel = _tool_choice(body.get("tool_choice"), own)
    output, effort = _output_config(body.get("output_config"), own, aside)
    thinking = body.get("thinking")
    if thinking is not None and not isinstance(thinking, Mapping):
        aside["thinking"] = thinking  # asks for nothing a translation could say
    tools = body.get("tools")
    return canon.Request(
        source=SOURCE,
        messages=decoded,
        system=system,
        system_plain=plain,
        max_tokens=caller_cap(cap),
        stop=tuple(stop) if isinstance(stop, list) else (),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        user=user if isinstance(user, str) else None,
        tools=tuple(_tool(t) for t in tools) if isinstance(tools, list) else (),
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        output=output,
        cache=request_cache,
        thinking=thinking if isinstance(thinking, Mapping) else None,
        effort=effort,
        own=own,
        aside=aside,
    )


def _system(system: object) -> tuple[tuple[canon.Part, ...], bool]:
    if isinstance(system, str):
        return ((canon.Text(system),) if system else ()), True
    if isinstance(system, list):
        return _parts(system), False
    if isinstance(system, Mapping):
        return _parts([system]), False
    if system is None:
        return (), False
    raise hub.Incapable(f"system: a {type(system).__name__} block where only text translates")


def _message(m: object, i: int) -> canon.Message:
    role = m.get("role") if isinstance(m, Mapping) else None
    r = _ROLES.get(role) if isinstance(role, str) else None
    if r is None or not isinstance(m, Mapping):
        raise hub.Incapable(f"messages[{i}]: not a Messages message")
    content = m.get("content")
    where = f"messages[{i}]"
    if isinstance(content, str):
        return canon.Message(r, (canon.text(content),), True, where)
    return canon.Message(r, _parts(content), False, where)


def _parts(content: object) -> tuple[canon.Part, ...]:
    """Blocks as parts. A plain text block (a dict of ``type`` and ``text``) is kept with
    the part, so an encoder of that shape shares it (a body may hold thousands)."""
    if not isinstance(content, list):
        raise hub.Incapable("content that is neither text nor blocks")
    text = canon.text
    out: list[canon.Part] = []
    for b in content:
        # dict first: a body's blocks are dicts, and the ABC's check costs five times as much a block
        if type(b) is dict and len(b) == 2 and b.get("type") == "text" and type(t := b.get("text")) is str:
            out.append(text(t, b))
        else:
            out.append(_part(b))
    return tuple(out)


def _cache(block: Mapping[str, Any]) -> canon.Cache | None:
    value = block.get("cache_control")
    return canon.Cache(value) if isinstance(value, Mapping) else None


def _part(b: object) -> canon.Part:
    if type(b) is not dict and not isinstance(b, Mapping):
        raise hub.Incapable("content that is neither text nor blocks")
    kind = b.get("type")
    if kind == "text":
        citations = b.get("citations")
        cites = tuple(citations) if isinstance(citations, list) else ()
        return canon.Text(str(b.get("text", "")), _cache(b), cites)
    if kind == "image":
        source = b.get("source")
        if isinstance(source, Mapping):
            if source.get("type") == "base64":
                return canon.Image(source.get("media_type"), source.get("data"), cache=_cache(b))
            if source.get("type") == "url" and isinstance(source.get("url"), str):
                return canon.Image(url=source["url"], cache=_cache(b))
        return canon.Opaque(SOURCE, "image", b)  # a file source: only Messages carries it
    if kind == "tool_use":
        given = b.get("input", {})
        return canon.ToolCall(
            str(b.get("id", "")),
            str(b.get("name", "")),
            json.dumps(given),
            given if isinstance(given, Mapping) else None,
            _cache(b),
        )
    if kind == "tool_result":
        call_id = b.get("tool_use_id")
        content = b.get("content", "")
        return canon.ToolResult(
            call_id if isinstance(call_id, str) else "",
            content if isinstance(content, str) else _parts([content] if isinstance(content, Mapping) else content),
            bool(b.get("is_error")),
            _cache(b),
        )
    if kind == "thinking":
        signature = b.get("signature")
        return canon.Thinking(str(b.get("thinking", "")), signature if isinstance(signature, str) else None)
    if kind == "redacted_thinking":
        return canon.Thinking(str(b.get("data", "")), redacted=True)
    return canon.Opaque(SOURCE, str(kind), b)


def _tool(t: object) -> canon.Tool:
    if not isinstance(t, Mapping):
        return canon.Tool("", builtin=True)
    if t.get("type") not in (None, "custom") or "input_schema" not in t:
        return canon.Tool(str(t.get("name", "")), own=dict(t), builtin=True)
    description, strict = t.get("description"), t.get("strict")
    return canon.Tool(
        t.get("name"),  # type: ignore[arg-type]  # as given: the refusal names it so
        description if isinstance(description, str) else None,
        t["input_schema"],
        strict if isinstance(strict, bool) else None,
        _cache(t),
        {k: v for k, v in t.items() if k not in _TOOL_SLOTS},
    )


def _tool_choice(choice: object, own: dict[str, Any]) -> tuple[canon.ToolChoice | None, bool | None]:
    if choice is None:
        return None, None
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    parallel = False if isinstance(choice, Mapping) and choice.get("disable_parallel_tool_use") else None
    if isinstance(kind, str) and kind in _CHOICES:
        return canon.ToolChoice(canon.Choice(kind)), parallel
    if kind == "tool" and isinstance(choice, Mapping) and isinstance(choice.get("name"), str):
        return canon.ToolChoice(canon.Choice.TOOL, choice["name"]), parallel
    own["tool_choice"] = choice
    return None, None


def _output_config(
    config: object, own: dict[str, Any], aside: dict[str, Any]
) -> tuple[canon.OutputSchema | None, str | None]:
    """A json_schema format and an effort in their slots; any other key in ``own``'s
    ``output_config`` (which no other format carries)."""
    if not config:
        if config is not None:
            aside["output_config"] = config
        return None, None
    if not isinstance(config, Mapping):
        own["output_config"] = config
        return None, None
    rest = dict(config)
    output = effort = None
    fmt = rest.get("format")
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), Mapping):
        output = canon.OutputSchema(fmt["schema"])
        del rest["format"]
    if isinstance(rest.get("effort"), str):
        effort = rest.pop("effort")
    if rest:
        own["output_config"] = rest
    return output, effort


# ---------------------------------------------------------------- toward Messages

_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_PENALTIES = ("frequency_penalty", "presence_penalty")
# Fields of other formats placed by the rules below, not by the generic refusal.
_PLACED = frozenset(
    {
        "n",
        "logprobs",
        *_PENALTIES,
        "modalities",
        "response_format",
        "text.format",
        "text",
        "tool_choice",
        "truncation",
        "reasoning",
    }
)


def encode_request(request: canon.Request) -> dict[str, Any]:
    """A Messages body (without ``model`` and ``stream``; ``max_tokens`` only when the
    caller set a cap). From Messages, the body it was; from another format, what Messages
    can carry of it, else :class:`~capmon.core.providers.hub.Incapable` with the reason."""
    if request.source == SOURCE:
        return _same(request)
    _refused_fields(request)
    if not request.messages and not request.system:  # a system prompt alone is a conversation's start
        raise hub.Incapable("no messages")
    # Toward Messages a message is always blocks (the translation's tables), and chat's turns
    # merge as Anthropic's: a tool message's result joins a turn of results, a user message
    # the user turn before it.
    out: list[dict[str, Any]] = []
    for m in request.messages:
        if m.role is canon.Role.SYSTEM:  # after the conversation began: Messages' own system message
            out.append({"role": "system", "content": [_text_block(p, m.where) for p in m.parts]})
        elif m.parts and all(type(p) is canon.ToolResult for p in m.parts):  # a tool message's result
            for p in m.parts:
                block = _tool_result(p, m.where)  # type: ignore[arg-type]
                if out and out[-1]["role"] == "user" and _all_results(out[-1]["content"]):
                    out[-1]["content"].append(block)
                else:
                    out.append({"role": "user", "content": [block]})
        elif m.role is canon.Role.USER:
            blocks = [_user_block(p, m.where) for p in m.parts]
            if out and out[-1]["role"] == "user":  # after tool results: one user turn
                out[-1]["content"] += blocks
            else:
                out.append({"role": "user", "content": blocks})
        else:
            out.append({"role": "assistant", "content": _assistant_blocks(m)})
    result: dict[str, Any] = {"messages": out}
    if request.system:
        system = [_text_block(p, "system") for p in request.system]
        result["system"] = system[0]["text"] if len(system) == 1 else system
    if request.max_tokens is not None:
        result["max_tokens"] = request.max_tokens
    if request.stop:
        result["stop_sequences"] = list(request.stop)
    if request.temperature is not None:
        result["temperature"] = request.temperature
    if request.top_p is not None:
        result["top_p"] = request.top_p
    if isinstance(request.user, str):
        result["metadata"] = {"user_id": request.user}
    _tools(request, result)
    _output(request, result)
    if request.thinking is not None:  # another format's thinking, in Anthropic's terms: carried
        result["thinking"] = dict(request.thinking)
    return result


def _refused_fields(request: canon.Request) -> None:
    """What Anthropic has no counterpart for, in the order the chat translation said it."""
    own = request.own
    for name in own:
        if name not in _PLACED:
            raise hub.Incapable(f"{name} (no Anthropic counterpart)")
    n = own.get("n")
    if n not in (None, 1):
        raise hub.Incapable(f"n = {n} (Anthropic gives one answer per request)")
    if own.get("logprobs") or own.get("top_logprobs"):
        raise hub.Incapable("logprobs (Anthropic gives none)")
    for name in _PENALTIES:
        if own.get(name):
            raise hub.Incapable(f"{name} (Anthropic has no penalties)")
    modalities = own.get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise hub.Incapable("audio output (modalities)")
    if "truncation" in own:
        raise hub.Incapable("truncation = auto (the Responses API would cut the conversation itself)")
    if "reasoning" in own:
        raise hub.Incapable("reasoning options other than effort and summary")
    if request.effort is not None:
        raise hub.Incapable(f"reasoning effort = {request.effort} (Anthropic's thinking is not translated)")
    if request.source == "responses":  # its tools and tool choice were read before the rest
        for t in request.tools:
            _client_tool(t, request.source)
        _own_choice(request)
    if "text" in own:
        raise hub.Incapable("text options other than format (verbosity has no Anthropic counterpart)")
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p)):
        if isinstance(value, (int, float)) and not 0 <= value <= 1:
            raise hub.Incapable(f"{name} = {value} (Anthropic takes 0 to 1)")


def _all_results(blocks: list[dict[str, Any]]) -> bool:
    return all(b.get("type") == "tool_result" for b in blocks)


def _kind(part: canon.Part) -> str:
    """How the caller's format names a part it gave (for a refusal)."""
    if isinstance(part, canon.Opaque):
        return part.kind
    if isinstance(part, canon.Image):
        return "image_url"
    if isinstance(part, canon.Text):
        return "refusal" if part.refusal else "text"
    return type(part).__name__


def _text_block(part: canon.Part, where: str) -> dict[str, Any]:
    """A text block of a part that can only be text (system and tool messages, assistant text)."""
    if not isinstance(part, canon.Text):
        raise hub.Incapable(f"{where}: a {_kind(part)} part where only text is allowed")
    return {"type": "text", "text": part.text}


def _user_block(part: canon.Part, where: str) -> dict[str, Any]:
    if type(part) is canon.Text and not part.refusal:
        return {"type": "text", "text": part.text}
    if isinstance(part, canon.Image):
        return _image(part)
    if isinstance(part, canon.ToolResult):  # a turn of results and text (Gemini's)
        return _tool_result(part, where)
    if isinstance(part, canon.Opaque) and part.kind == "input_audio":
        raise hub.Incapable(f"{where}: audio input")
    if isinstance(part, canon.Opaque) and part.kind == "input_image":
        raise hub.Incapable(f"{where}: an input_image by file_id")
    raise hub.Incapable(f"{where}: a {_kind(part)} part")


def _image(image: canon.Image) -> dict[str, Any]:
    """A base64 image (jpeg, png, gif or webp), or one by an http(s) URL."""
    if image.data is not None:
        media = str(image.media_type).lower()
        if media not in _MEDIA_TYPES:
            raise hub.Incapable(f"an image of type {media} (Anthropic takes jpeg, png, gif, webp)")
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": image.data}}
    if isinstance(image.url, str) and image.url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": image.url}}
    raise hub.Incapable("an image that is neither a data URL nor an http(s) URL")


def _tool_result(result: canon.ToolResult, where: str) -> dict[str, Any]:
    content = result.content
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": result.call_id,
        "content": content if isinstance(content, str) else [_text_block(p, where) for p in content],
    }
    if result.is_error:  # a failed call (Gemini's {"error": ...}, Converse's status "error") stays one
        block["is_error"] = True
    return block


def _assistant_blocks(m: canon.Message) -> list[dict[str, Any]]:
    where = m.where
    if m.own.get("audio"):
        raise hub.Incapable(f"{where}: an assistant audio reply")
    if m.own.get("function_call"):
        raise hub.Incapable(f"{where}: a legacy function_call")
    blocks: list[dict[str, Any]] = []
    for p in m.parts:
        if isinstance(p, canon.ToolCall):
            blocks.append(
                {"type": "tool_use", "id": p.id, "name": p.name, "input": hub.call_input(p, p.where or where)}
            )
        elif (block := _text_block(p, where))["text"]:
            blocks.append(block)
    if not blocks:
        blocks.append({"type": "text", "text": ""})
    return blocks


def _tools(request: canon.Request, result: dict[str, Any]) -> None:
    if request.tools:
        out = []
        for t in request.tools:
            _client_tool(t, request.source)
            if not isinstance(t.name, str) or not t.name:
                raise hub.Incapable("a function tool without a name")
            tool: dict[str, Any] = {
                "name": t.name,
                "input_schema": t.parameters
                if isinstance(t.parameters, Mapping)
                else {"type": "object", "properties": {}},
            }
            if t.description is not None:
                tool["description"] = t.description
            if t.strict is not None:
                tool["strict"] = t.strict
            out.append(tool)
        result["tools"] = out
    _own_choice(request)
    choice = _choice(request.tool_choice)
    if request.parallel_tool_calls is False:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        result["tool_choice"] = choice


def _client_tool(t: canon.Tool, source: str) -> None:
    """Only client (function) tools, with no keys of their format's own, cross."""
    if t.builtin:
        built = "a built-in" if source == "responses" else "a"
        raise hub.Incapable(f"{built} {t.own.get('type') or t.name} tool (only function tools translate)")
    if t.own:
        raise hub.Incapable(f"tool {t.name}: {', '.join(sorted(t.own))}")


def _own_choice(request: canon.Request) -> None:
    if "tool_choice" in request.own:
        raise hub.Incapable(f"tool_choice {json.dumps(request.own['tool_choice'])[:80]}")


def _choice(choice: canon.ToolChoice | None) -> dict[str, Any] | None:
    if choice is None:
        return None
    if choice.choice is canon.Choice.TOOL:
        return {"type": "tool", "name": choice.name}
    return {"type": choice.choice.value}


def _output(request: canon.Request, result: dict[str, Any]) -> None:
    if "response_format" in request.own or "text.format" in request.own:
        raise hub.Incapable("response_format other than text or a json_schema")
    if request.output is not None:
        result["output_config"] = {"format": {"type": "json_schema", "schema": request.output.schema}}


# ---------------------------------------------------------------- Messages to Messages


def _same(request: canon.Request) -> dict[str, Any]:
    """A request decoded from Messages, as it was (but ``model`` and ``stream``)."""
    body: dict[str, Any] = {"messages": [_same_message(m) for m in request.messages]}
    if request.system:
        plain = request.system_plain and len(request.system) == 1
        first = request.system[0]
        body["system"] = (
            first.text if plain and isinstance(first, canon.Text) else [_same_part(p) for p in request.system]
        )
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    if request.stop:
        body["stop_sequences"] = list(request.stop)
    for name, value in (("temperature", request.temperature), ("top_p", request.top_p)):
        if value is not None:
            body[name] = value
    if request.user is not None and "metadata" not in request.aside:
        body["metadata"] = {"user_id": request.user}
    if request.tools:
        body["tools"] = [_same_tool(t) for t in request.tools]
    choice = _choice(request.tool_choice)
    if choice is not None:
        if request.parallel_tool_calls is False:
            choice["disable_parallel_tool_use"] = True
        body["tool_choice"] = choice
    config: dict[str, Any] = {}
    if request.output is not None:
        config["format"] = {"type": "json_schema", "schema": request.output.schema}
    if request.effort is not None:
        config["effort"] = request.effort
    if config:
        body["output_config"] = config
    if request.thinking is not None:
        body["thinking"] = request.thinking
    if request.cache is not None:
        body["cache_control"] = request.cache.raw
    for name, value in [*request.own.items(), *request.aside.items()]:
        if name == "output_config" and isinstance(value, Mapping) and config:
            body[name] = {**config, **value}
        else:
            body[name] = value
    return body


def _same_message(m: canon.Message) -> dict[str, Any]:
    if m.plain and len(m.parts) == 1 and isinstance(m.parts[0], canon.Text):
        return {"role": m.role.value, "content": m.parts[0].text}
    return {"role": m.role.value, "content": [_same_part(p) for p in m.parts]}


def _cached(block: dict[str, Any], cache: canon.Cache | None) -> dict[str, Any]:
    if cache is not None:
        block["cache_control"] = cache.raw
    return block


def _same_part(p: canon.Part) -> Any:
    if type(p) is canon.Text:
        if p.raw is not None:
            return p.raw
        block: dict[str, Any] = {"type": "text", "text": p.text}
        if p.citations:
            block["citations"] = list(p.citations)
        return _cached(block, p.cache)
    if isinstance(p, canon.Image):
        if p.data is not None:
            source = {"type": "base64", "media_type": p.media_type, "data": p.data}
        else:
            source = {"type": "url", "url": p.url}
        return _cached({"type": "image", "source": source}, p.cache)
    if isinstance(p, canon.ToolCall):
        given = p.input if p.input is not None else json.loads(p.arguments)
        return _cached({"type": "tool_use", "id": p.id, "name": p.name, "input": given}, p.cache)
    if isinstance(p, canon.ToolResult):
        content = p.content if isinstance(p.content, str) else [_same_part(c) for c in p.content]
        block = {"type": "tool_result", "tool_use_id": p.call_id, "content": content}
        if p.is_error:
            block["is_error"] = True
        return _cached(block, p.cache)
    if isinstance(p, canon.Thinking):
        if p.redacted:
            return {"type": "redacted_thinking", "data": p.text}
        thinking = {"type": "thinking", "thinking": p.text}
        if p.signature is not None:
            thinking["signature"] = p.signature
        return thinking
    if isinstance(p, canon.Opaque) and p.format == SOURCE:
        return p.raw
    raise hub.Incapable(f"a {_kind(p)} part (no Messages counterpart)")


def _same_tool(t: canon.Tool) -> dict[str, Any]:
    if t.builtin:
        return dict(t.own)
    tool: dict[str, Any] = {"name": t.name, "input_schema": t.parameters}
    if t.description is not None:
        tool["description"] = t.description
    if t.strict is not None:
        tool["strict"] = t.strict
    tool.update(t.own)
    return _cached(tool, t.cache)


# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

_STOPS: Mapping[str, canon.Stop] = {s.value: s for s in canon.Stop}  # Messages' stop reasons are the hub's


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _stop(value: object) -> tuple[canon.Stop | None, str | None]:
    """A stop reason the hub knows, else None and the one given (newer than the hub), if any."""
    if not isinstance(value, str):
        return None, None
    stop = _STOPS.get(value)
    return stop, None if stop is not None else value


def _stop_reason(stop: canon.Stop | None, other: str | None) -> str | None:
    return other if stop is None else stop.value


def decode_usage(usage: object) -> canon.Usage | None:
    """Messages usage as the hub's: the same split (fresh input, cache writes, cache reads);
    a count not given (or no count) is None."""
    if not isinstance(usage, Mapping):
        return None
    return canon.Usage(
        input=_count(usage.get("input_tokens")),
        cache_write=_count(usage.get("cache_creation_input_tokens")),
        cache_read=_count(usage.get("cache_read_input_tokens")),
        output=_count(usage.get("output_tokens")),
    )


def encode_usage(usage: canon.Usage) -> dict[str, Any]:
    """The counts the usage has (a count not told is left out)."""
    pairs = (
        ("input_tokens", usage.input),
        ("output_tokens", usage.output),
        ("cache_read_input_tokens", usage.cache_read),
        ("cache_creation_input_tokens", usage.cache_write),
    )
    return {name: count for name, count in pairs if count is not None}


def decode_part(block: Mapping[str, Any]) -> canon.Part:
    """One content block of an answer (or a stream's block as it starts)."""
    kind = block.get("type")
    if kind == "text":
        cited = block.get("citations")
        citations = tuple(c for c in cited if isinstance(c, Mapping)) if isinstance(cited, list) else ()
        return canon.Text(str(block.get("text", "")), citations=citations)
    if kind == "tool_use":
        given = block.get("input", {})
        return canon.ToolCall(
            id=str(block.get("id", "")),
            name=str(block.get("name", "")),
            arguments=json.dumps(given),
            input=given if isinstance(given, Mapping) else None,
        )
    if kind == "thinking":
        signature = block.get("signature")
        return canon.Thinking(str(block.get("thinking", "")), signature if isinstance(signature, str) else None)
    if kind == "redacted_thinking":
        return canon.Thinking(str(block.get("data", "")), redacted=True)
    return canon.Opaque("messages", str(kind), block)  # a server tool's use or result, ...


def _tool_input(call: canon.ToolCall) -> Mapping[str, Any]:
    """A call's ``input``: the object its arguments are (Anthropic's must be one)."""
    if call.input is not None:
        return call.input
    try:
        json.loads(call.arguments)
    except (ValueError, RecursionError):
        raise hub.Incapable("the answer: tool call arguments that are not JSON") from None
    raise hub.Incapable("the answer: tool call arguments that are not a JSON object")


def encode_part(part: canon.Part) -> dict[str, Any]:
    """One part of an answer as a content block."""
    if isinstance(part, canon.Text):
        block: dict[str, Any] = {"type": "text", "text": part.text}
        if part.citations:
            block["citations"] = [dict(c) for c in part.citations]
        return block
    if isinstance(part, canon.ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": _tool_input(part)}
    if isinstance(part, canon.Thinking):
        if part.redacted:
            return {"type": "redacted_thinking", "data": part.text}
        block = {"type": "thinking", "thinking": part.text}
        if part.signature is not None:
            block["signature"] = part.signature
        return block
    if isinstance(part, canon.Opaque) and part.format == "messages":
        return dict(part.raw)
    kind = part.kind if isinstance(part, canon.Opaque) else type(part).__name__.lower()
    raise hub.Incapable(f"a {kind} part in an answer (Messages answers carry text, tool calls and thinking)")


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    """A Messages answer in the hub's terms: every block a part, in order (so a part's
    index is its block's)."""
    content = answer.get("content", [])
    if isinstance(content, str):
        blocks: list[Mapping[str, Any]] = [{"type": "text", "text": content}]
    elif isinstance(content, list) and all(type(b) is dict or isinstance(b, Mapping) for b in content):
        blocks = content
    else:
        raise hub.Incapable("content that is neither text nor blocks")
    sequence = answer.get("stop_sequence")
    stop, other = _stop(answer.get("stop_reason"))
    return canon.Answer(
        id=str(answer.get("id", "")),
        model=str(answer.get("model", "")),
        parts=tuple(decode_part(b) for b in blocks),
        stop=stop,
        usage=decode_usage(answer.get("usage")),
        stop_sequence=sequence if isinstance(sequence, str) else None,
        stop_other=other,
    )


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Messages one (``created``: Messages answers carry no time).
    Raises :class:`~capmon.core.providers.hub.Incapable` for a tool call whose arguments
    are no JSON object."""
    out: dict[str, Any] = {
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": [encode_part(p) for p in answer.parts],
        "stop_reason": _stop_reason(answer.stop, answer.stop_other),
        "stop_sequence": answer.stop_sequence,
    }
    if answer.usage is not None:
        out["usage"] = encode_usage(answer.usage)
    return out


class _Decoder:
    """Messages events in, the hub's out: they are the same sequence (``ping`` and
    ``error`` aside: keep-alives, and errors the reader classifies before any decoder)."""

    def feed(self, event: Mapping[str, Any]) -> list[canon.Event]:
        kind, index = event.get("type"), event.get("index")
        if kind == "message_start":
            message = _object(event, "message")
            usage = decode_usage(message.get("usage"))
            return [canon.Started(str(message.get("id", "")), str(message.get("model", "")), usage)]
        if kind == "message_delta":
            delta = _object(event, "delta")
            sequence = delta.get("stop_sequence")
            (stop, other), usage = _stop(delta.get("stop_reason")), decode_usage(event.get("usage"))
            return [canon.Ended(stop, usage, sequence if isinstance(sequence, str) else None, other)]
        if kind == "message_stop":
            return [canon.Done()]
        if not isinstance(index, int):
            return []
        if kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            return [canon.PartStarted(index, decode_part(event["content_block"]))]
        if kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            return self._delta(index, event["delta"])
        if kind == "content_block_stop":
            return [canon.PartStopped(index)]
        return []

    @staticmethod
    def _delta(index: int, delta: Mapping[str, Any]) -> list[canon.Event]:
        kind = delta.get("type")
        if kind in ("text_delta", "thinking_delta"):
            text = delta.get("text" if kind == "text_delta" else "thinking")
            return [canon.PartDelta(index, text=text)] if isinstance(text, str) else []
        if kind == "input_json_delta":
            piece = delta.get("partial_json")
            return [canon.PartDelta(index, arguments=piece)] if isinstance(piece, str) else []
        if kind == "signature_delta":
            signature = delta.get("signature")
            return [canon.PartDelta(index, signature=signature)] if isinstance(signature, str) else []
        if kind == "citations_delta":
            citation = delta.get("citation")
            return [canon.PartDelta(index, citation=citation)] if isinstance(citation, Mapping) else []
        return []

    def close(self) -> list[canon.Event]:
        return []  # the Messages stream ends with its own event (message_stop)


def stream_decoder() -> hub.StreamDecoder:
    return _Decoder()


class _Encoder:
    """The hub's events in, Messages events out (one for one)."""

    def __init__(self) -> None:
        self._parts: dict[int, canon.Part] = {}  # index -> the part as it started

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            usage = {"input_tokens": 0, "output_tokens": 0} if event.usage is None else encode_usage(event.usage)
            message: dict[str, Any] = {
                "id": event.id,
                "type": "message",
                "role": "assistant",
                "model": event.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            }
            return [{"type": "message_start", "message": message}]
        if isinstance(event, canon.PartStarted):
            self._parts[event.index] = part = event.part
            if isinstance(part, canon.ToolCall):  # its input comes in pieces
                block = {"type": "tool_use", "id": part.id, "name": part.name, "input": dict(part.input or {})}
            else:
                block = encode_part(part)
            return [{"type": "content_block_start", "index": event.index, "content_block": block}]
        if isinstance(event, canon.PartDelta):
            return [{"type": "content_block_delta", "index": event.index, "delta": d} for d in self._deltas(event)]
        if isinstance(event, canon.PartStopped):
            return [{"type": "content_block_stop", "index": event.index}]
        if isinstance(event, canon.Ended):
            delta = {"stop_reason": _stop_reason(event.stop, event.stop_other), "stop_sequence": event.stop_sequence}
            out: dict[str, Any] = {"type": "message_delta", "delta": delta}
            if event.usage is not None:
                out["usage"] = encode_usage(event.usage)
            return [out]
        if isinstance(event, canon.Done):
            return [{"type": "message_stop"}]
        return []

    def _deltas(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if event.text is not None:
            if isinstance(self._parts.get(event.index), canon.Thinking):
                out.append({"type": "thinking_delta", "thinking": event.text})
            else:
                out.append({"type": "text_delta", "text": event.text})
        if event.arguments is not None:
            out.append({"type": "input_json_delta", "partial_json": event.arguments})
        if event.signature is not None:
            out.append({"type": "signature_delta", "signature": event.signature})
        if event.citation is not None:
            out.append({"type": "citations_delta", "citation": dict(event.citation)})
        return out


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``created`` and ``include_usage``: Messages events carry no time and always their usage."""
    return _Encoder()


def answer_stream(answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """A whole answer as this format's stream (a plain answer to a stream request), through the hub."""
    return hub.told(decode_answer(answer), stream_encoder(created=created, include_usage=include_usage))


# ================================================================ reading and probing
# What a target sends in this format, read: a plain answer, its text and used tokens, a stream's
# frames (frames.Event; in-stream errors classified by their type) and the answer they assemble
# into; Anthropic's error shape, which the gateway tells a Messages caller; and what an attempt
# sends in it: the probe and the body (the fields capmon owns). What an endpoint's API version
# refuses is its dialect's (anthropic_dialect.py).


def parse(status: int, body: bytes | str | None) -> Mapping[str, Any] | None:
    """A plain answer (a message), or None: the classifier says what it is. Never raises."""
    parsed = hub.success_json(status, body)
    if isinstance(parsed, Mapping) and parsed.get("type") == "message" and isinstance(parsed.get("content"), list):
        return parsed
    return None


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its text blocks, in order."""
    blocks = response.get("content")
    return "".join(
        b["text"]
        for b in (blocks if isinstance(blocks, list) else [])
        if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """All the tokens the answer's usage counts: input (fresh, cache writes and cache reads) and output."""
    usage = (response or {}).get("usage")
    if not isinstance(usage, Mapping) or not any(
        isinstance(usage.get(k), int) for k in ("input_tokens", "output_tokens")
    ):
        return None
    return sum(
        (counts.count(usage.get(k)) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")
    )


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a stream event adds (a ``text_delta``; "" when none)."""
    if chunk.get("type") != "content_block_delta":
        return ""
    delta = chunk.get("delta")
    text = delta.get("text") if isinstance(delta, Mapping) and delta.get("type") == "text_delta" else None
    return text if isinstance(text, str) else ""


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Messages request: one token of output (Messages has one token parameter)."""
    body = {"messages": [{"role": "user", "content": "ping"}]}
    return messages_body(body, model=model, max_tokens=1, stream=False)


# Events that carry no answer yet: held back, so an error after them can still fall back.
_PREAMBLE = frozenset({"message_start", "content_block_start", "content_block_stop"})
_DELTA_FIELDS = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking"}


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a Messages stream is. Never raises.

    ``message_stop`` is DONE; ``error`` is an error classified by its type; ``ping`` and
    unknown event types (Anthropic says new ones may appear) are ignored; a delta that
    carries text, tool input or thinking, and ``message_delta`` (the stop reason), are output.
    """
    decoded = typed_event(frame)
    if isinstance(decoded, Event):
        return decoded
    obj, kind, name = decoded
    if name == "error" or kind == "error":
        return Event(FrameKind.ERROR, failure=event_failure(obj, now=now, quota_hint=quota_hint))
    if name == "ping":
        return Event(FrameKind.IGNORE)
    if not isinstance(obj, dict) or not isinstance(kind, str):
        return Event(FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream event", 200))
    if kind == "message_stop":
        return Event(FrameKind.DONE, chunk=obj)
    if kind in _PREAMBLE:
        return Event(FrameKind.CHUNK, chunk=obj)
    if kind == "message_delta":
        return Event(FrameKind.CHUNK, chunk=obj, output=True)
    if kind == "content_block_delta":
        delta = obj.get("delta")
        dtype = delta.get("type") if isinstance(delta, dict) else None
        piece = delta.get(_DELTA_FIELDS.get(str(dtype), "")) if isinstance(delta, dict) else None
        return Event(FrameKind.CHUNK, chunk=obj, output=bool(piece) or dtype == "signature_delta")
    return Event(FrameKind.IGNORE)


@dataclass
class _Block:
    block: dict[str, Any]
    pieces: list[str] = field(default_factory=list)  # input_json_delta pieces of a tool_use block


class MessageAssembler:
    """Builds the plain answer from a Messages stream's events: text, tool_use blocks with
    their input put together from ``input_json_delta`` pieces, thinking with its
    signature, the stop reason and the usage, so a streamed answer reads like a plain one."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: str | None = None
        self.stop_sequence: str | None = None
        self.usage: dict[str, Any] = {}

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), Mapping):
            start = event["message"]
            self.head = {k: start[k] for k in ("id", "model", "role") if k in start}
            if isinstance(start.get("usage"), Mapping):
                self.usage.update(start["usage"])
        elif kind == "content_block_start" and isinstance(event.get("content_block"), Mapping):
            index = event.get("index", len(self.blocks))
            self.blocks[index if isinstance(index, int) else len(self.blocks)] = _Block(dict(event["content_block"]))
        elif kind == "content_block_delta" and isinstance(event.get("delta"), Mapping):
            self._delta(event.get("index"), event["delta"])
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping):
                self.stop_reason = delta.get("stop_reason") or self.stop_reason
                self.stop_sequence = delta.get("stop_sequence") or self.stop_sequence
            if isinstance(event.get("usage"), Mapping):
                # Counts in message_delta are cumulative: they replace, not add.
                self.usage.update({k: v for k, v in event["usage"].items() if v is not None})

    def _delta(self, index: object, delta: Mapping[str, Any]) -> None:
        b = self.blocks.get(index) if isinstance(index, int) else None
        if b is None:
            return
        dtype = delta.get("type")
        if dtype == "text_delta" and isinstance(delta.get("text"), str):
            b.block["text"] = b.block.get("text", "") + delta["text"]
        elif dtype == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            b.pieces.append(delta["partial_json"])
        elif dtype == "thinking_delta" and isinstance(delta.get("thinking"), str):
            b.block["thinking"] = b.block.get("thinking", "") + delta["thinking"]
        elif dtype == "signature_delta" and isinstance(delta.get("signature"), str):
            b.block["signature"] = b.block.get("signature", "") + delta["signature"]

    @property
    def text(self) -> str:
        return "".join(b.block.get("text", "") for _, b in sorted(self.blocks.items()) if b.block.get("type") == "text")

    def message(self) -> dict[str, Any]:
        """The answer as a plain Messages response. Tool input that is not JSON is kept as
        the text it was (under ``input``'s ``_raw``) rather than lost: the caller sees it."""
        content = []
        for _, b in sorted(self.blocks.items()):
            block = dict(b.block)
            if b.pieces or block.get("type") == "tool_use":
                raw = "".join(b.pieces)
                try:
                    block["input"] = json.loads(raw) if raw.strip() else block.get("input") or {}
                except ValueError:
                    block["input"] = {"_raw": raw}
            content.append(block)
        return {
            "id": self.head.get("id", ""),
            "type": "message",
            "role": "assistant",
            "model": self.head.get("model", ""),
            "content": content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": {"input_tokens": 0, "output_tokens": 0, **self.usage},
        }


class Assembled:
    """A Messages stream's events put together into the plain answer (whole at ``message_stop``)."""

    finished = False

    def __init__(self) -> None:
        self._events = MessageAssembler()

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        self._events.add(chunk)

    def answer(self) -> Mapping[str, Any] | None:
        return self._events.message()


def assembler() -> Assembled:
    return Assembled()


# What each error type of Anthropic's says as an HTTP status: an in-stream error carries
# only its type, and the classifier reads kinds from statuses (404 is a bad request, not
# a transient failure; 402 a quota).
ERROR_STATUS: Mapping[str, int] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "conflict_error": 409,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_KIND_ERROR: Mapping[Kind, str] = {
    Kind.CAPACITY: "overloaded_error",
    Kind.RATE_LIMITED: "rate_limit_error",
    Kind.QUOTA: "billing_error",
    Kind.AUTH: "authentication_error",
    Kind.TOO_LARGE: "request_too_large",
    Kind.BAD_REQUEST: "invalid_request_error",
    Kind.TRANSIENT: "api_error",
    Kind.OVERSIZED: "api_error",
}


def event_failure(obj: object, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Failure:
    """An ``event: error`` of a Messages stream, classified like the HTTP error its type
    stands for (``overloaded_error`` is capacity, whatever the message says). Never raises."""
    error = obj.get("error") if isinstance(obj, Mapping) else None
    if isinstance(error, Mapping):
        status = ERROR_STATUS.get(str(error.get("type")))
        if status is not None and "status" not in error:
            obj = {**obj, "error": {**error, "status": status}}  # type: ignore[dict-item]
    return classify_event(obj, "error", now=now, quota_hint=quota_hint)


def error_type(failure: Failure) -> str:
    """The Anthropic error type a failure is told to an Anthropic client as: Anthropic's
    own when it said one, else the one its kind stands for."""
    if failure.code in ERROR_STATUS:
        return str(failure.code)
    if failure.kind is Kind.AUTH and failure.status == 403:
        return "permission_error"
    if failure.kind is Kind.TOO_LARGE and failure.status != 413:
        return "invalid_request_error"  # "prompt is too long" is a 400 on Anthropic's API
    return _KIND_ERROR[failure.kind]


def error_body(failure: Failure, message: str | None = None) -> dict[str, Any]:
    """Anthropic's error shape, for the gateway's reply body and in-stream ``event: error``
    to a Messages caller (the chat and Responses callers' shapes are the gateway's own,
    capmon/gateway/errors.py)."""
    return {"type": "error", "error": {"type": error_type(failure), "message": message or failure.reason}}


def messages_body(extra: Mapping[str, Any], *, model: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    """A Messages body (see :func:`~capmon.core.providers.hub.owned_body`); the cap is required by the
    API: the model's cap when the caller gave none."""
    return hub.owned_body(extra, model=model, cap_field="max_tokens", cap=max_tokens, stream=stream)


def wire_body(
    request: Request,
    translated: Mapping[str, Any] | None,
    *,
    model: str,
    limit: int,
    stream: bool,
    token_param: TokenParam,
) -> dict[str, Any]:
    """A Messages body: the caller's fields untouched, or a translated request's; the cap
    as ``max_tokens`` (Messages has one token parameter)."""
    return messages_body(
        request.extra if translated is None else translated, model=model, max_tokens=limit, stream=stream
    )


def refused_token_param(failure: Failure, sent: TokenParam) -> bool:
    """Never: Messages has one token cap (``max_tokens``), nothing to relearn."""
    return False


def tool_calls(answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
    """Each ``tool_use`` block of a message: its name, id and input as JSON text (an
    ``input`` that is an object counts as whole: "")."""
    blocks = answer.get("content")
    for block in blocks if isinstance(blocks, list) else []:
        if isinstance(block, Mapping) and block.get("type") == "tool_use":
            given = block.get("input")
            text = "" if given is None or isinstance(given, Mapping) else json.dumps(given)
            yield block.get("name"), block.get("id"), text


class _Calls:
    """The tool calls of a Messages stream: each ``tool_use`` block ends with its
    ``content_block_stop``, and the stream with ``message_stop``."""

    def __init__(self) -> None:
        self._open: dict[int, hub.Call] = {}

    @staticmethod
    def last(event: Mapping[str, Any]) -> bool:
        return event.get("type") == "message_stop"

    def feed(self, event: Mapping[str, Any]) -> None:
        kind, index = event.get("type"), event.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start":
            block = event.get("content_block")
            if isinstance(block, Mapping) and block.get("type") == "tool_use":
                self._open[index] = hub.Call(block.get("name"), block.get("id"))
        elif kind == "content_block_delta" and index in self._open:
            delta = event.get("delta")
            piece = delta.get("partial_json") if isinstance(delta, Mapping) else None
            if isinstance(delta, Mapping) and delta.get("type") == "input_json_delta" and isinstance(piece, str):
                self._open[index].pieces.append(piece)
        elif kind == "content_block_stop" and index in self._open:
            self._open.pop(index).check()

    def end(self) -> None:
        """Blocks never stopped end with the stream."""
        for call in self._open.values():
            call.check()
        self._open.clear()


def call_watcher() -> hub.CallWatcher:
    return _Calls()


# ================================================================ continuing a broken answer
# continued / splicer: a broken stream's continuation in this format (capmon/core/routing/continuation.py).


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the assistant's last message, and
    a user message ``instruction`` after it (None: none, the answer a prefill)."""
    said: list[dict[str, Any]] = [{"role": "assistant", "content": [{"type": "text", "text": partial}]}]
    if instruction is not None:
        said.append({"role": "user", "content": [{"type": "text", "text": instruction}]})
    return hub.appended(request, "messages", said)


@dataclass
class MessagesSplice(splice.Splice):
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
                out["usage"] = splice.add_usage(
                    usage, (("input_tokens", self.earlier_in), ("output_tokens", self.earlier_out))
                )
            out[splice.FIELD] = self.said()
            return [out]
        return [chunk]


def splicer(prompt: int) -> splice.Splice:
    """The splice of one streamed request in this format (``prompt``: its estimated tokens)."""
    return MessagesSplice(prompt)


def takes_prefill() -> bool:
    return True  # Anthropic's Messages goes on from an assistant message at the end (a prefill)
