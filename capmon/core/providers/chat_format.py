"""The chat format: OpenAI's chat completions (/chat/completions). Its requests, answers and
stream events to and from the canonical hub (capmon/core/types/canon.py), and what reads and
probes it. A module of :class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md,
"Across formats"."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from capmon.core.providers import hub
from capmon.core.types import canon

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.

# OpenAI's chat completions decoded into canon and encoded from it. Toward chat from
# another format (Anthropic's Messages) the rules are those of the translation it replaces
# (the golden tables in tests/core/providers/test_golden_requests.py): what chat cannot
# carry is refused with the reason, naming its place in the caller's body.

SOURCE = "chat"

# Chat fields that mean nothing to the answer (``user`` is also the request's user): kept
# aside. stream_options: capmon asks for usage itself. seed: a best-effort determinism hint
# with no counterpart; it changes no answer's meaning.
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
_CHAT_SLOTS = frozenset(
    {
        "model",
        "messages",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
    }
)
# Chat's own fields with meaning, kept in ``own`` whatever their value (n = 1 and logprobs
# = false ask for nothing: the encoders that refuse them read the value).
_CHAT_OWN = frozenset({"n", "logprobs", "frequency_penalty", "presence_penalty", "modalities"})
_CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)", re.DOTALL)


def decode_request(body: Mapping[str, Any]) -> canon.Request:
    """A chat body in canon terms: every field kept (n, logprobs, penalties, modalities
    and any other with meaning in ``own``; bookkeeping and fields explicitly off in
    ``aside``). The system and developer messages before the conversation are the system
    prompt. Raises :class:`~capmon.core.providers.hub.Incapable` for a body that is no chat
    request (a message without a role, a tool message without its call's id, ...)."""
    own: dict[str, Any] = {}
    aside: dict[str, Any] = {}
    for name, value in body.items():
        if name in _CHAT_SLOTS:
            continue
        if name in _CHAT_OWN:
            own[name] = value
        elif name in _CHAT_NO_MEANING or value is None or value is False or value == [] or value == {}:
            aside[name] = value  # an explicit "off" is no request for the feature
        else:
            own[name] = value
    system: list[canon.Part] = []
    messages: list[canon.Message] = []
    given = body.get("messages")
    for i, m in enumerate(given if isinstance(given, list) else []):
        mapping = type(m) is dict or isinstance(m, Mapping)
        role = m.get("role") if mapping else None
        if not mapping or not isinstance(role, str) or role not in _CHAT_ROLES:
            raise hub.Incapable(f"messages[{i}]: not a chat message")
        where = f"messages[{i}]"
        content = m.get("content")
        if role in ("system", "developer"):
            parts = _text_parts(content, where)
            if messages:  # after the conversation began: a system message of its own
                messages.append(canon.Message(canon.Role.SYSTEM, parts, isinstance(content, str), where))
            else:
                system += parts
        elif role == "tool":
            result = canon.ToolResult(
                _call_id(m.get("tool_call_id"), i),
                content if isinstance(content, str) else _text_parts(content, where),
            )
            messages.append(canon.Message(canon.Role.USER, (result,), False, where))
        elif role == "user":
            messages.append(canon.Message(canon.Role.USER, _user_parts(content, i), isinstance(content, str), where))
        else:
            messages.append(_assistant(m, i))
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    user = body.get("user")
    tools = body.get("tools")
    parallel = body.get("parallel_tool_calls")
    return canon.Request(
        source=SOURCE,
        messages=tuple(messages),
        system=tuple(system),
        system_plain=len(system) == 1,
        max_tokens=cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None,
        stop=((stop,) if isinstance(stop, str) else tuple(stop)) if stop else (),
        temperature=body.get("temperature"),
        top_p=body.get("top_p"),
        user=user if isinstance(user, str) else None,
        tools=tuple(_tool(t) for t in tools) if isinstance(tools, list) else (),
        tool_choice=_tool_choice(body.get("tool_choice"), own),
        parallel_tool_calls=parallel if isinstance(parallel, bool) else None,
        output=_response_format(body, own, aside),
        own=own,
        aside=aside,
    )


def _call_id(value: object, i: int) -> str:
    if not isinstance(value, str) or not value:
        raise hub.Incapable(f"messages[{i}]: a tool message without tool_call_id")
    return value


def _text_parts(content: object, where: str) -> tuple[canon.Part, ...]:
    """Content that may only be text (and refusals): system, developer, tool and assistant."""
    if isinstance(content, str):
        return (canon.text(content),)
    out: list[canon.Part] = []
    for part in content if isinstance(content, list) else []:
        mapping = type(part) is dict or isinstance(part, Mapping)
        kind = part.get("type") if mapping else type(part).__name__
        if kind == "text" and mapping:
            out.append(canon.text(str(part.get("text", part.get("refusal", "")))))
        elif kind == "refusal" and mapping:
            out.append(canon.Text(str(part.get("text", part.get("refusal", ""))), refusal=True))
        else:
            raise hub.Incapable(f"{where}: a {kind} part where only text is allowed")
    if not isinstance(content, list) and content is not None:
        raise hub.Incapable(f"{where}: content that is neither text nor parts")
    return tuple(out)


def image_of(url: str, detail: object = None) -> canon.Image:
    """An image by its URL: a data URL is its data (base64) and media type."""
    found = _DATA_URL.fullmatch(url)
    hint = detail if isinstance(detail, str) else None
    if found:
        return canon.Image(found.group("type"), found.group("data"), detail=hint)
    return canon.Image(url=url, detail=hint)


def _user_parts(content: object, i: int) -> tuple[canon.Part, ...]:
    if not isinstance(content, list):
        return _text_parts(content, f"messages[{i}]")
    out: list[canon.Part] = []
    text = canon.text
    for part in content:
        mapping = type(part) is dict or isinstance(part, Mapping)
        kind = part.get("type") if mapping else None
        if kind == "text":
            t = part.get("text", "")
            out.append(text(t if type(t) is str else str(t)))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise hub.Incapable(f"messages[{i}]: an image_url part without a url")
            out.append(image_of(url, image.get("detail") if isinstance(image, Mapping) else None))
        else:  # audio, a file, ...: only chat carries them
            out.append(canon.Opaque(SOURCE, str(kind), part if isinstance(part, Mapping) else {}))
    return tuple(out)


def arguments_object(raw: object) -> Mapping[str, Any] | None:
    """A tool call's JSON arguments as an object (none or blank: an empty one), or None
    when they are no JSON object."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def tool_call(call_id: str, name: object, raw: object, where: str = "") -> canon.ToolCall:
    """A function call of chat or the Responses API: its arguments as given (JSON text)."""
    text = raw if isinstance(raw, str) else "" if raw is None else json.dumps(raw)
    return canon.ToolCall(call_id, str(name), text, arguments_object(raw), where=where)


def _assistant(m: Mapping[str, Any], i: int) -> canon.Message:
    where = f"messages[{i}]"
    own = {}
    for name in ("audio", "function_call"):
        if m.get(name):
            own[name] = m[name]
    content = m.get("content")
    parts = list(_text_parts(content, where)) if content is not None else []
    refusal = m.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(canon.Text(refusal, refusal=True))
    calls = m.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(call, Mapping) or call.get("type", "function") != "function":
            raise hub.Incapable(f"{where}: a tool call that is not a function call")
        parts.append(tool_call(_call_id(call.get("id"), i), fn.get("name", ""), fn.get("arguments")))
    return canon.Message(canon.Role.ASSISTANT, tuple(parts), isinstance(content, str), where, own)


def _tool(t: object) -> canon.Tool:
    fn = t.get("function") if isinstance(t, Mapping) else None
    if not isinstance(t, Mapping) or not isinstance(fn, Mapping) or t.get("type") != "function":
        return canon.Tool("", own=dict(t) if isinstance(t, Mapping) else {}, builtin=True)
    return function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"), fn.get("strict"))


def function_tool(name: object, description: object, parameters: object, strict: object) -> canon.Tool:
    """A function tool from its parts (chat and the Responses API alike); the name as given
    (an encoder that needs one refuses a tool without)."""
    return canon.Tool(
        name,  # type: ignore[arg-type]  # as given: an encoder refuses a tool without a name
        description if isinstance(description, str) else None,
        parameters if isinstance(parameters, Mapping) else None,
        strict if isinstance(strict, bool) else None,
    )


def tool_choice_of(choice: object, own: dict[str, Any]) -> canon.ToolChoice | None:
    """auto / none / required / a named function. Chat's ``{"type": "function", "function":
    {"name"}}`` and Responses' ``{"type": "function", "name"}`` both name a tool; any other
    choice is kept in ``own``."""
    if choice is None:
        return None
    if choice == "auto" or choice == "none":
        return canon.ToolChoice(canon.Choice(str(choice)))
    if choice == "required":
        return canon.ToolChoice(canon.Choice.ANY)
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        if isinstance(name, str) and name:
            return canon.ToolChoice(canon.Choice.TOOL, name)
    own["tool_choice"] = choice
    return None


_tool_choice = tool_choice_of


def _response_format(body: Mapping[str, Any], own: dict[str, Any], aside: dict[str, Any]) -> canon.OutputSchema | None:
    fmt = body.get("response_format")
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        if "response_format" in body:
            aside["response_format"] = fmt
        return None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if isinstance(schema, Mapping) and isinstance(spec, Mapping):
            name, strict = spec.get("name"), spec.get("strict")
            return canon.OutputSchema(
                schema, name if isinstance(name, str) else None, strict if isinstance(strict, bool) else None
            )
    own["response_format"] = fmt
    return None


# ---------------------------------------------------------------- toward chat

OPENAI_MAX_STOP = 4  # OpenAI takes at most four stop sequences
# Anthropic's tool keys that change nothing in an answer (left out toward chat).
_TOOL_NO_MEANING = frozenset({"type", "eager_input_streaming"})
_PLACED = frozenset({"tool_choice", "output_config"})
_TOOL_ERROR = "(tool error) "


def encode_request(request: canon.Request) -> dict[str, Any]:
    """A chat body (without ``model`` and ``stream``; the cap as ``max_completion_tokens``).
    Raises :class:`~capmon.core.providers.hub.Incapable` with the reason for what chat
    cannot carry: thinking, cache hints (see :func:`capmon.core.providers.hub.without_hints`),
    citations, blocks and tools only Anthropic has."""
    same = request.source == SOURCE
    if not same:
        _refused_fields(request)
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": _plain_text(request.system, "system")})
    if not request.messages:
        raise hub.Incapable("no messages")
    for m in request.messages:
        if m.role is canon.Role.SYSTEM:
            out.append({"role": "system", "content": _plain_text(m.parts, m.where)})
        elif m.role is canon.Role.USER:
            out += _user_messages(m)
        else:
            out.append(_assistant_message(m))
    result: dict[str, Any] = {"messages": out}
    if request.max_tokens is not None:
        result["max_completion_tokens"] = request.max_tokens
    if request.stop:
        result["stop"] = list(request.stop)
    if request.temperature is not None:
        result["temperature"] = request.temperature
    if request.top_p is not None:
        result["top_p"] = request.top_p
    if isinstance(request.user, str):
        result["user"] = request.user
    _tools(request, result)
    _output(request, result)
    if same:
        result.update(request.own)
        result.update(request.aside)
    return result


def _refused_fields(request: canon.Request) -> None:
    for name in request.own:
        if name not in _PLACED:
            raise hub.Incapable(f"{name} (no OpenAI counterpart)")
    if request.cache is not None:
        raise hub.Incapable("cache_control (no OpenAI counterpart)")
    if request.thinking is not None:
        raise hub.Incapable("thinking (OpenAI's chat completions cannot carry Anthropic's thinking)")
    if len(request.stop) > OPENAI_MAX_STOP:
        raise hub.Incapable(f"{len(request.stop)} stop sequences (OpenAI takes {OPENAI_MAX_STOP})")


def _kind(part: canon.Part) -> str:
    """How Anthropic's Messages names a part (for a refusal)."""
    if isinstance(part, canon.Opaque):
        return part.kind
    if isinstance(part, canon.Thinking):
        return "redacted_thinking" if part.redacted else "thinking"
    return _KINDS[type(part)]


_KINDS: Mapping[type, str] = {
    canon.Text: "text",
    canon.Image: "image",
    canon.ToolCall: "tool_use",
    canon.ToolResult: "tool_result",
}


def _cached(part: canon.Part) -> bool:
    """The part asks for a caching breakpoint (an empty cache_control asks for nothing)."""
    if isinstance(part, canon.Opaque):
        return bool(part.raw.get("cache_control"))
    cache = getattr(part, "cache", None)
    return cache is not None and bool(cache.raw)


def _no_cache(part: canon.Part, where: str) -> None:
    if _cached(part):
        raise hub.Incapable(f"{where}: cache_control (OpenAI caches on its own terms)")


def _plain_text(content: tuple[canon.Part, ...] | str, where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for p in content:
        if type(p) is not canon.Text:
            raise hub.Incapable(f"{where}: a {_kind(p)} block where only text translates")
        _no_cache(p, where)
        if p.citations:
            raise hub.Incapable(f"{where}: citations")
        parts.append(p.text)
    return "\n\n".join(parts)


def _image_url(image: canon.Image) -> dict[str, Any]:
    url = image.url if image.data is None else f"data:{image.media_type};base64,{image.data}"
    spec: dict[str, Any] = {"url": url}
    if image.detail is not None:
        spec["detail"] = image.detail
    return {"type": "image_url", "image_url": spec}


def _user_messages(m: canon.Message) -> list[dict[str, Any]]:
    """Tool results become tool messages (first, as OpenAI wants them right after the
    call); the rest of the turn one user message."""
    tools: list[dict[str, Any]] = []
    parts: list[Mapping[str, Any]] = []
    where = m.where
    text = canon.Text
    for p in m.parts:
        if type(p) is text:
            raw = p.raw
            if raw is not None:
                parts.append(raw)  # already a chat text part: shared, not copied (a body may hold thousands)
                continue
            _no_cache(p, where)
            if p.citations:
                raise hub.Incapable(f"{where}: citations")
            parts.append({"type": "text", "text": p.text})
            continue
        _no_cache(p, where)
        if isinstance(p, canon.Image):
            parts.append(_image_url(p))
        elif isinstance(p, canon.Opaque) and p.kind == "image":
            source = p.raw.get("source")
            kind = source.get("type") if isinstance(source, Mapping) else None
            raise hub.Incapable(f"an image with a {kind} source (only base64 and url sources translate)")
        elif isinstance(p, canon.ToolResult):
            tools.append(_tool_message(p, where))
        else:
            raise hub.Incapable(f"{where}: a {_kind(p)} block")
    out = tools
    if parts:
        only_text = all(p["type"] == "text" for p in parts)
        content: Any = "".join(p["text"] for p in parts) if only_text and len(parts) == 1 else parts
        out.append({"role": "user", "content": content})
    return out


def _tool_message(result: canon.ToolResult, where: str) -> dict[str, Any]:
    text = _plain_text(result.content, where)
    if result.is_error:
        # OpenAI's tool message has no error flag; the model still learns the call failed.
        text = _TOOL_ERROR + text
    if not result.call_id:
        raise hub.Incapable(f"{where}: a tool_result without tool_use_id")
    return {"role": "tool", "tool_call_id": result.call_id, "content": text}


def _assistant_message(m: canon.Message) -> dict[str, Any]:
    where = m.where
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for p in m.parts:
        _no_cache(p, where)
        if type(p) is canon.Text:
            text.append(p.text)
        elif isinstance(p, canon.ToolCall):
            calls.append({"id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}})
        else:
            raise hub.Incapable(f"{where}: a {_kind(p)} block in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(request: canon.Request, result: dict[str, Any]) -> None:
    if request.tools:
        out = []
        for t in request.tools:
            if t.builtin:
                raise hub.Incapable(f"a built-in {t.own.get('type')} tool (only client tools translate)")
            extra = set(t.own) - _TOOL_NO_MEANING
            if extra:
                raise hub.Incapable(f"tool {t.name}: {', '.join(sorted(extra))}")
            if t.cache is not None and t.cache.raw:
                raise hub.Incapable(f"tool {t.name}: cache_control (OpenAI caches on its own terms)")
            fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters}
            if t.description is not None:
                fn["description"] = t.description
            if t.strict is not None:
                fn["strict"] = t.strict
            out.append({"type": "function", "function": fn})
        result["tools"] = out
    if "tool_choice" in request.own:
        raise hub.Incapable(f"tool_choice {json.dumps(request.own['tool_choice'])[:80]}")
    choice = request.tool_choice
    if choice is None:
        return
    if choice.choice is canon.Choice.ANY:
        result["tool_choice"] = "required"
    elif choice.choice is canon.Choice.TOOL:
        result["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        result["tool_choice"] = choice.choice.value
    if request.parallel_tool_calls is not None:
        result["parallel_tool_calls"] = request.parallel_tool_calls


def _output(request: canon.Request, result: dict[str, Any]) -> None:
    if request.effort is not None or "output_config" in request.own:
        raise hub.Incapable("output_config other than a json_schema format (effort has no chat counterpart)")
    output = request.output
    if output is not None:
        spec: dict[str, Any] = {"name": output.name or "output", "schema": output.schema}
        if output.strict is not None:
            spec["strict"] = output.strict
        result["response_format"] = {"type": "json_schema", "json_schema": spec}


# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.
#
#
#
# ================================================================ reading and probing
# the answer and frames as the wire sends them, usage, text, the probe body, the error shape.
#
#
#
