"""The chat format: OpenAI's chat completions (/chat/completions). Its requests, answers and
stream events to and from the canonical hub (capmon/core/types/canon.py), and what reads and
probes it. A module of :class:`capmon.core.providers.hub.WireFormat`; see ARCHITECTURE.md,
"Across formats"."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers import hub, splice
from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_event, parse_completion
from capmon.core.providers.frames import Event, FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request, caller_cap

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
        max_tokens=caller_cap(cap),
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
                raise hub.Incapable(f"a built-in {t.own.get('type') or t.name} tool (only client tools translate)")
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
            part = self._parts.get(event.index)
            if event.text and not isinstance(part, canon.Thinking):
                refused = isinstance(part, canon.Text) and part.refusal
                return [self._chunk({"refusal" if refused else "content": event.text})]
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
            return [self._chunk({"refusal" if part.refusal else "content": part.text})]
        return []


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    return _Encoder(created=created, include_usage=include_usage)


def answer_stream(answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """A whole answer as this format's stream (a plain answer to a stream request), through the hub."""
    return hub.told(decode_answer(answer), stream_encoder(created=created, include_usage=include_usage))


# ================================================================ reading and probing
# What a target sends in this format, read: a plain answer, its text and used tokens, a stream's
# frames (frames.Event) and the answer they assemble into; and what an attempt sends in it: the
# probe, the body (the fields capmon owns), the token parameter a model refuses (token_param.py).


def parse(status: int, body: bytes) -> Mapping[str, Any] | None:
    """A plain answer (a chat completion with choices), or None: the classifier says what it is."""
    return parse_completion(status, body)


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its first choice's content."""
    try:
        content = response["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usage.total_tokens``), if it says so sensibly."""
    usage = (response or {}).get("usage")
    return counts.count(usage.get("total_tokens")) if isinstance(usage, Mapping) else None


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The content text of a chunk's first choice ("" when none)."""
    choices = chunk.get("choices")
    if not choices or not isinstance(choices, list):
        return ""
    c = choices[0]
    delta = c.get("delta") if isinstance(c, dict) else None
    content = delta.get("content") if isinstance(delta, dict) else None
    return content if isinstance(content, str) else ""


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest request that proves a model answers: one token of output."""
    return {"model": model, "messages": [{"role": "user", "content": "ping"}], token_param.value: 1, "n": 1}


# An error event's names (``event:``) on OpenAI's streams (the Responses API's too).
ERROR_EVENTS = frozenset({"error", "response.failed", "response.error"})


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a chat stream is (chunks, ``[DONE]``, errors). Never raises."""
    data = frame.data.strip()
    if data == "[DONE]":
        return Event(FrameKind.DONE)
    if not data:
        if frame.event in ERROR_EVENTS:
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
        if frame.event in ERROR_EVENTS or _is_error(obj):
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


class Assembled:
    """A chat stream's chunks put together into the plain answer; a finish reason makes it whole."""

    def __init__(self) -> None:
        self._chunks = Assembler()

    @property
    def finished(self) -> bool:
        return bool(self._chunks.finish_reason)

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        self._chunks.add(chunk)

    def answer(self) -> Mapping[str, Any] | None:
        return self._chunks.completion()


def assembler() -> Assembled:
    return Assembled()


# Fields the client owns: everything else the caller sets passes through untouched.
_OWNED = frozenset({"model", "messages", "n", "stream", *(p.value for p in TokenParam)})


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


def wire_body(
    request: Request,
    translated: Mapping[str, Any] | None,
    *,
    model: str,
    limit: int,
    stream: bool,
    token_param: TokenParam,
) -> dict[str, Any]:
    """A chat body: the caller's messages and fields untouched, or a translated request's
    (then a stream asks for usage: a Messages caller's closing usage comes from OpenAI's
    last chunk); the cap as the model's token parameter, n = 1."""
    if translated is None:
        messages, extra, temperature = request.messages, request.extra, request.temperature
    else:
        messages, extra, temperature = tuple(translated["messages"]), translated, None
        if stream:
            extra = {**extra, "stream_options": {"include_usage": True}}
    return chat_body(
        messages, extra, model=model, token_param=token_param, max_tokens=limit, temperature=temperature, stream=stream
    )


# The token parameter: chat completions has two (token_param.py), and a model refuses one.
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


def tool_calls(answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
    """Each tool call of a completion's choices: its name, id and arguments as JSON text."""
    choices = answer.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        message = _object(choice, "message") if isinstance(choice, Mapping) else {}
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            fn = _object(call, "function") if isinstance(call, Mapping) else {}
            given = fn.get("arguments")
            text = given if isinstance(given, str) else "" if given is None else json.dumps(given)
            yield fn.get("name"), call.get("id") if isinstance(call, Mapping) else None, text


class _Calls:
    """The tool calls of a chat stream, as another format's caller gets them: one run of
    deltas of one call is one tool call, which ends when the choice moves on (to another
    call or to text) or finishes. OpenAI streams a call's pieces in a row; a call whose
    pieces come apart is told in pieces, each of which must be whole."""

    def __init__(self) -> None:
        self._seen: dict[int, hub.Call] = {}  # index -> its name and id, from its first delta
        self._run: tuple[int, hub.Call] | None = None

    @staticmethod
    def last(chunk: Mapping[str, Any]) -> bool:
        return False  # the chat stream's end is [DONE], which carries no chunk

    def feed(self, chunk: Mapping[str, Any]) -> None:
        choices = chunk.get("choices")
        for c in choices if isinstance(choices, list) else []:
            if not isinstance(c, Mapping) or c.get("index", 0) != 0:
                continue
            delta = _object(c, "delta")
            if any(isinstance(delta.get(k), str) and delta.get(k) for k in ("content", "refusal")):
                self.end()
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, Mapping):
                    self._piece(call)
            if c.get("finish_reason"):
                self.end()

    def _piece(self, call: Mapping[str, Any]) -> None:
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        fn = _object(call, "function")
        known = self._seen.setdefault(index, hub.Call())
        known.name = known.name or fn.get("name")
        known.id = known.id or call.get("id")
        if self._run is None or self._run[0] != index:
            self.end()
            self._run = (index, hub.Call(known.name, known.id))
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            self._run[1].pieces.append(arguments)

    def end(self) -> None:
        if self._run is not None:
            _, call = self._run
            self._run = None
            call.check()


def call_watcher() -> hub.CallWatcher:
    return _Calls()


# ================================================================ continuing a broken answer
# continued / splicer: a broken stream's continuation in this format (capmon/core/routing/continuation.py).


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the assistant's last message, and
    a user message ``instruction`` after it (None: none, the answer a prefill)."""
    said: list[dict[str, Any]] = [{"role": "assistant", "content": partial}]
    if instruction is not None:
        said.append({"role": "user", "content": instruction})
    return dataclasses.replace(request, messages=(*request.messages, *said))


@dataclass
class ChatSplice(splice.Splice):
    """Chat chunks: a continuation's role chunk is left out, its chunks take the first
    answer's id, the finish chunk says who continued it, the usage chunk counts every request."""

    id: Any = None

    def sent(self, chunk: Mapping[str, Any]) -> None:
        if self.id is None:
            self.id = chunk.get("id")
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, Mapping):
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                self.text.append(content)
            if delta.get("tool_calls"):
                self.half_call = True
            if choice.get("finish_reason") is not None and self.half_call:
                self.half_call, self.other = False, True

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        out = dict(chunk)
        if self.id is not None and "id" in out:
            out["id"] = self.id
        choices = out.get("choices")
        if isinstance(choices, list) and choices:
            fitted = []
            ends = False
            for choice in choices:
                if not isinstance(choice, Mapping):
                    fitted.append(choice)
                    continue
                delta = dict(choice.get("delta") or {})
                content = delta.get("content")
                if isinstance(content, str) and content:
                    delta["content"] = self._text(content)
                if choice.get("finish_reason") is None and not delta.get("content") and not delta.get("tool_calls"):
                    if set(delta) <= {"role", "content", "refusal"} and not delta.get("refusal"):
                        continue  # a role chunk, or text the prefill had: nothing new
                ends = ends or choice.get("finish_reason") is not None
                fitted.append({**choice, "delta": delta})
            if not fitted:
                return []
            out["choices"] = fitted
            if ends:
                out[splice.FIELD] = self.said()
        usage = out.get("usage")
        if isinstance(usage, Mapping):
            more = (("prompt_tokens", self.earlier_in), ("completion_tokens", self.earlier_out))
            out["usage"] = splice.add_usage(usage, (*more, ("total_tokens", self.earlier_in + self.earlier_out)))
            out[splice.FIELD] = self.said()
        return [out]


def splicer(prompt: int) -> splice.Splice:
    """The splice of one streamed request in this format (``prompt``: its estimated tokens)."""
    return ChatSplice(prompt)


def takes_prefill() -> bool:
    return False  # a chat model answers a conversation that ends with its own message anew, it does not go on from it
