"""The converse format: AWS Bedrock's Converse API (``/model/{modelId}/converse`` and
``/converse-stream``), which speaks for every model family on Bedrock. Its requests, answers
and stream events to and from the canonical hub (capmon/core/types/canon.py), and what reads
and probes it. A module of :class:`capmon.core.providers.hub.WireFormat`; see
ARCHITECTURE.md, "Across formats".

Where Converse differs from the other formats, and what that makes of a crossing:

* the model and streaming live in the URL (the Bedrock dialect's), so a Converse body has
  neither; the token cap is ``inferenceConfig.maxTokens``, the one token parameter;
* a block is an object with one key that names its kind (``{"text": ...}``,
  ``{"toolUse": ...}``, ``{"reasoningContent": ...}``); a tool result is ``success`` or
  ``error`` and holds ``text`` or ``json`` blocks (a ``json`` block crosses as its JSON's text);
* a model's own fields (Claude's ``thinking``, ``top_k``) go in
  ``additionalModelRequestFields``, which only Converse carries: from another format they
  are refused, as the encoder cannot know which model reads them; structured output (a JSON
  schema, sent as its JSON text) and a reasoning effort are ``outputConfig``'s, strict tools
  a ``toolSpec``'s ``strict``;
* there is no tool choice ``none``: a request that asks for it is not sent here;
* an answer has no id and no model (the URL named it);
* a stream is AWS's event stream (aws_eventstream.py): each event is one frame, read here
  as boto3 gives it, ``{eventType: payload}`` without its padding field ``p``. Its answer is
  whole at ``messageStop`` (the stop reason); ``metadata`` (the usage) follows it and is
  the stream's last event. An exception frame before output counts as the HTTP error it
  names, after output it ends the stream with that error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capmon.core.providers import aws_eventstream, hub, splice
from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_aws_event
from capmon.core.providers.frames import Event, FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request, caller_cap

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.

SOURCE = "converse"

_SLOTS = frozenset(
    {"model", "modelId", "stream", "messages", "system", "inferenceConfig", "toolConfig", "outputConfig"}
)
# Bookkeeping and a service tier: how a request is served and billed, never what it answers.
_NO_MEANING = frozenset({"requestMetadata", "serviceTier", "performanceConfig"})
_CONFIG = "inferenceConfig."
_CONFIG_SLOTS = frozenset({"maxTokens", "temperature", "topP", "stopSequences"})
_OUTPUT = "outputConfig."
# The reasoning efforts Converse takes (outputConfig.effort).
EFFORTS = frozenset({"low", "medium", "high", "xhigh", "max"})
_ROLES: Mapping[str, canon.Role] = {"user": canon.Role.USER, "assistant": canon.Role.ASSISTANT}
_CHOICES: Mapping[str, canon.Choice] = {"auto": canon.Choice.AUTO, "any": canon.Choice.ANY}
# An image's ``format`` and its media type.
_IMAGE_FORMATS = ("png", "jpeg", "gif", "webp")


def decode_request(body: Mapping[str, Any]) -> canon.Request:
    """A Converse body in canon terms: every field kept (Converse's own, like
    ``additionalModelRequestFields`` or ``guardrailConfig``, in ``own``; bookkeeping in
    ``aside``). Raises :class:`~capmon.core.providers.hub.Incapable` only for a body no
    format could read."""
    own, aside = hub.sort_fields(body, _SLOTS, _NO_MEANING)
    config = body.get("inferenceConfig")
    if not isinstance(config, Mapping):
        if config is not None:
            own["inferenceConfig"] = config
        config = {}
    for name, value in config.items():
        if name not in _CONFIG_SLOTS:
            (aside if value is None else own)[_CONFIG + name] = value
    stop = config.get("stopSequences")
    tools, choice = _tool_config(body.get("toolConfig"), own)
    output, effort = _output_config(body.get("outputConfig"), own)
    return canon.Request(
        source=SOURCE,
        messages=_messages(body.get("messages")),
        system=_system(body.get("system")),
        max_tokens=caller_cap(config.get("maxTokens")),
        stop=tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else (),
        temperature=config.get("temperature"),
        top_p=config.get("topP"),
        tools=tools,
        tool_choice=choice,
        output=output,
        effort=effort,
        own=own,
        aside=aside,
    )


def _system(system: object) -> tuple[canon.Part, ...]:
    if system is None:
        return ()
    if not isinstance(system, list):
        raise hub.Incapable("system: not a list of system blocks")
    return tuple(_block(b, f"system[{i}]") for i, b in enumerate(system))


def _messages(messages: object) -> tuple[canon.Message, ...]:
    if messages is None:
        return ()
    if not isinstance(messages, list):
        raise hub.Incapable("messages: not a list of messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role") if isinstance(m, Mapping) else None
        r = _ROLES.get(role) if isinstance(role, str) else None
        content = m.get("content") if isinstance(m, Mapping) else None
        if r is None or not isinstance(content, list):
            raise hub.Incapable(f"{where}: not a Converse message")
        parts = tuple(_block(b, f"{where}.content[{j}]") for j, b in enumerate(content))
        out.append(canon.Message(r, parts, where=where))
    return tuple(out)


def _block(b: object, where: str) -> canon.Part:
    """One content block; a kind the hub has no type for (a document, a video, a
    guardrail's content, a cache point) is kept whole, for Converse alone."""
    if not isinstance(b, Mapping) or len(b) != 1:
        raise hub.Incapable(f"{where}: not a content block (an object with one key)")
    kind, value = next(iter(b.items()))
    if kind == "text" and isinstance(value, str):
        return canon.text(value)
    if kind == "image":
        image = _image_of(value)
        if image is not None:
            return image
    if kind == "toolUse" and isinstance(value, Mapping) and set(value) == {"toolUseId", "name", "input"}:
        given = value["input"]
        return canon.ToolCall(
            str(value["toolUseId"]),
            str(value["name"]),
            json.dumps(given),
            given if isinstance(given, Mapping) else None,
        )
    if kind == "toolResult" and isinstance(value, Mapping) and set(value) <= {"toolUseId", "content", "status"}:
        result = _result(value, where)
        if result is not None:
            return result
    if kind == "reasoningContent":
        thinking = _thinking_of(value)
        if thinking is not None:
            return thinking
    return canon.Opaque(SOURCE, str(kind), b)


def _image_of(value: object) -> canon.Image | None:
    """An image's bytes (base64 on the wire); one in S3 only Converse carries."""
    source = value.get("source") if isinstance(value, Mapping) else None
    if isinstance(value, Mapping) and set(value) == {"format", "source"} and isinstance(source, Mapping):
        fmt, data = value["format"], source.get("bytes")
        if fmt in _IMAGE_FORMATS and set(source) == {"bytes"} and isinstance(data, str):
            return canon.Image(f"image/{fmt}", data)
    return None


def _result(value: Mapping[str, Any], where: str) -> canon.ToolResult | None:
    """A tool result whose blocks are text (a ``json`` block its JSON's text) and images."""
    content = value.get("content", [])
    status = value.get("status", "success")
    if not isinstance(content, list) or status not in ("success", "error"):
        return None
    parts: list[canon.Part] = []
    for j, block in enumerate(content):
        if isinstance(block, Mapping) and set(block) == {"json"}:
            parts.append(canon.Text(json.dumps(block["json"])))
            continue
        try:
            part = _block(block, f"{where}.toolResult.content[{j}]")
        except hub.Incapable:
            return None
        if not isinstance(part, (canon.Text, canon.Image)):
            return None
        parts.append(part)
    one = len(parts) == 1 and type(parts[0]) is canon.Text
    body: tuple[canon.Part, ...] | str = parts[0].text if one else tuple(parts)  # type: ignore[union-attr]
    return canon.ToolResult(str(value["toolUseId"]), body, status == "error")


def _thinking_of(value: object) -> canon.Thinking | None:
    """``reasoningText`` (its text and signature), or ``redactedContent`` (base64)."""
    if not isinstance(value, Mapping) or len(value) != 1:
        return None
    said, redacted = value.get("reasoningText"), value.get("redactedContent")
    if isinstance(said, Mapping) and isinstance(said.get("text"), str) and set(said) <= {"text", "signature"}:
        signature = said.get("signature")
        return canon.Thinking(said["text"], signature if isinstance(signature, str) else None)
    if isinstance(redacted, str):
        return canon.Thinking(redacted, redacted=True)
    return None


def _tool_config(config: object, own: dict[str, Any]) -> tuple[tuple[canon.Tool, ...], canon.ToolChoice | None]:
    """toolConfig's function tools and choice; anything else in it only Converse carries."""
    if config is None:
        return (), None
    tools = config.get("tools", []) if isinstance(config, Mapping) else None
    if not isinstance(config, Mapping) or not set(config) <= {"tools", "toolChoice"} or not isinstance(tools, list):
        own["toolConfig"] = config
        return (), None
    out: list[canon.Tool] = []
    for t in tools:
        spec = t.get("toolSpec") if isinstance(t, Mapping) and len(t) == 1 else None
        if isinstance(spec, Mapping) and set(spec) <= {"name", "description", "inputSchema", "strict"}:
            schema = spec.get("inputSchema")
            parameters = schema.get("json") if isinstance(schema, Mapping) else None
            description, strict = spec.get("description"), spec.get("strict")
            out.append(
                canon.Tool(
                    spec.get("name"),  # type: ignore[arg-type]  # as given: the refusal names it so
                    description if isinstance(description, str) else None,
                    parameters if isinstance(parameters, Mapping) else None,
                    strict if isinstance(strict, bool) else None,
                )
            )
        else:  # a cache point, a system tool: Converse's alone
            name = next(iter(t), "tool") if isinstance(t, Mapping) else "tool"
            out.append(canon.Tool(str(name), own=t if isinstance(t, Mapping) else {"tool": t}, builtin=True))
    return tuple(out), _choice(config.get("toolChoice"), own)


def _output_config(config: object, own: dict[str, Any]) -> tuple[canon.OutputSchema | None, str | None]:
    """outputConfig: a JSON schema the answer follows (its text parsed), and an effort; any
    other of its keys only Converse carries."""
    if config is None:
        return None, None
    if not isinstance(config, Mapping):
        own["outputConfig"] = config
        return None, None
    output: canon.OutputSchema | None = None
    effort: str | None = None
    for name, value in config.items():
        if name == "textFormat" and (output := _schema_of(value)) is not None:
            continue
        if name == "effort" and isinstance(value, str):
            effort = value
            continue
        own[_OUTPUT + name] = value
    return output, effort


def _schema_of(text_format: object) -> canon.OutputSchema | None:
    """A ``json_schema`` text format's schema (its JSON text parsed into an object), or None."""
    if not isinstance(text_format, Mapping) or text_format.get("type") != "json_schema":
        return None
    structure = text_format.get("structure")
    given = structure.get("jsonSchema") if isinstance(structure, Mapping) and set(structure) == {"jsonSchema"} else None
    if not isinstance(given, Mapping) or not set(given) <= {"schema", "name"}:  # a description: Converse's alone
        return None
    try:
        schema = json.loads(given.get("schema", ""))
    except (TypeError, ValueError, RecursionError):
        return None
    name = given.get("name")
    return canon.OutputSchema(schema, name if isinstance(name, str) else None) if isinstance(schema, dict) else None


def _choice(choice: object, own: dict[str, Any]) -> canon.ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, Mapping) and len(choice) == 1:
        kind, value = next(iter(choice.items()))
        if kind in _CHOICES and value == {}:
            return canon.ToolChoice(_CHOICES[kind])
        if kind == "tool" and isinstance(value, Mapping) and set(value) == {"name"} and isinstance(value["name"], str):
            return canon.ToolChoice(canon.Choice.TOOL, value["name"])
    own["toolConfig.toolChoice"] = choice
    return None


# ---------------------------------------------------------------- toward Converse

# Fields of other formats placed by the rules below, not by the generic refusal.
_PLACED = frozenset({"n"})


def encode_request(request: canon.Request) -> dict[str, Any]:
    """A Converse body (without the model, which is the URL's; ``maxTokens`` only when the
    caller set a cap). From Converse, the body it was; from another format, what Converse
    can carry of it, else :class:`~capmon.core.providers.hub.Incapable` with the reason."""
    same = request.source == SOURCE
    if not same:
        _refused_fields(request)
        if not request.messages:
            raise hub.Incapable("no messages")
    messages: list[dict[str, Any]] = []
    for m in request.messages:
        if m.role is canon.Role.SYSTEM:
            raise hub.Incapable(f"{m.where}: a system message after the conversation began (Converse has one, first)")
        blocks = [_encode_part(p, m.where, same) for p in m.parts]
        if not same:  # Converse refuses a blank text, and a message without blocks: they said nothing
            blocks = [b for b in blocks if b != _EMPTY]
            if not blocks:
                continue
        role = "user" if m.role is canon.Role.USER else "assistant"
        if messages and messages[-1]["role"] == role and not same:
            # Converse's roles alternate: chat's tool messages and the user's words after them are one turn
            messages[-1]["content"] += blocks
        else:
            messages.append({"role": role, "content": blocks})
    body: dict[str, Any] = {"messages": messages}
    if request.system:
        body["system"] = [_encode_part(p, "system", same) for p in request.system]
    config: dict[str, Any] = {}
    sampling = (request.max_tokens, request.temperature, request.top_p, list(request.stop) or None)
    config.update((k, v) for k, v in zip(_SAMPLING, sampling, strict=True) if v is not None)
    _encode_tools(request, body, same)
    _encode_output(request, body)
    if same:
        for name, value in [*request.own.items(), *request.aside.items()]:
            if name.startswith(_CONFIG):
                config[name.removeprefix(_CONFIG)] = value
            elif name == "toolConfig.toolChoice":
                body.setdefault("toolConfig", {})["toolChoice"] = value
            elif name.startswith(_OUTPUT):
                body.setdefault("outputConfig", {})[name.removeprefix(_OUTPUT)] = value
            else:
                body[name] = value
    if config:
        body["inferenceConfig"] = config
    return body


# inferenceConfig's fields for the cap, the sampling and the stop sequences, in the body's usual order.
_SAMPLING = ("maxTokens", "temperature", "topP", "stopSequences")
_EMPTY = {"text": ""}


def _refused_fields(request: canon.Request) -> None:
    """What Converse has no counterpart for, whatever model reads it."""
    own = request.own
    unplaced = next((name for name in own if name not in _PLACED), None)
    if unplaced is not None:
        raise hub.Incapable(f"{unplaced} (no Converse counterpart)")
    if own.get("n") not in (None, 1):
        raise hub.Incapable(f"n = {own['n']} (capmon asks for one answer)")
    if request.cache is not None:
        raise hub.Incapable("cache_control (not translated to Converse's cache points)")
    if request.thinking is not None:
        raise hub.Incapable("thinking (a model's own field on Bedrock: additionalModelRequestFields)")
    if request.effort is not None and request.effort not in EFFORTS:
        raise hub.Incapable(f"reasoning effort = {request.effort} (Converse takes {', '.join(sorted(EFFORTS))})")
    if request.parallel_tool_calls is False:
        raise hub.Incapable("parallel_tool_calls = false (Converse may always call several)")


def _no_cache(cache: canon.Cache | None, where: str) -> None:
    if cache is not None and cache.raw:
        raise hub.Incapable(f"{where}: cache_control (not translated to Converse's cache points)")


def _encode_part(p: canon.Part, where: str, same: bool) -> dict[str, Any]:
    if type(p) is canon.Text:
        _no_cache(p.cache, where)
        if p.citations:
            raise hub.Incapable(f"{where}: citations")
        return {"text": p.text}
    if isinstance(p, canon.Image):
        _no_cache(p.cache, where)
        return _encode_image(p, where)
    if isinstance(p, canon.ToolCall):
        _no_cache(p.cache, where)
        return {"toolUse": {"toolUseId": p.id, "name": p.name, "input": hub.call_input(p, p.where or where)}}
    if isinstance(p, canon.ToolResult):
        _no_cache(p.cache, where)
        content = p.content
        blocks = [{"text": content}] if isinstance(content, str) else [_encode_part(c, where, same) for c in content]
        result: dict[str, Any] = {"toolUseId": p.call_id, "content": blocks}
        if p.is_error:
            result["status"] = "error"
        return {"toolResult": result}
    if isinstance(p, canon.Thinking) and same:
        if p.redacted:
            return {"reasoningContent": {"redactedContent": p.text}}
        return {"reasoningContent": {"reasoningText": _reasoning_text(p)}}
    if isinstance(p, canon.Opaque) and p.format == SOURCE:
        return dict(p.raw)
    raise hub.Incapable(f"{where}: a {hub.part_kind(p)} part (no Converse counterpart)")


def _reasoning_text(p: canon.Thinking) -> dict[str, Any]:
    said: dict[str, Any] = {"text": p.text}
    if p.signature is not None:
        said["signature"] = p.signature
    return said


def _encode_image(image: canon.Image, where: str) -> dict[str, Any]:
    """An image's bytes, of a type Converse takes (it fetches no URL)."""
    kind = (image.media_type or "").removeprefix("image/")
    if image.data is not None and kind in _IMAGE_FORMATS:
        return {"image": {"format": kind, "source": {"bytes": image.data}}}
    if image.data is None:
        raise hub.Incapable(f"{where}: an image by URL (Converse takes an image's bytes)")
    raise hub.Incapable(f"{where}: an image of type {image.media_type} (Converse takes png, jpeg, gif and webp)")


def _encode_tools(request: canon.Request, body: dict[str, Any], same: bool) -> None:
    tools: list[dict[str, Any]] = []
    for t, builtin in hub.crossing_tools(request, same, _no_cache):
        if builtin is not None:
            tools.append(builtin)
            continue
        spec: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            spec["description"] = t.description
        spec["inputSchema"] = {"json": t.parameters if t.parameters is not None else {"type": "object"}}
        if t.strict is not None:
            spec["strict"] = t.strict
        tools.append({"toolSpec": spec})
    choice = request.tool_choice
    if choice is not None and choice.choice is canon.Choice.NONE:
        if not same:
            raise hub.Incapable('tool_choice "none" (Converse has no choice that forbids calls)')
    config: dict[str, Any] = {}
    if tools:
        config["tools"] = tools
    if choice is not None and choice.choice is not canon.Choice.NONE:
        config["toolChoice"] = (
            {"tool": {"name": choice.name}} if choice.choice is canon.Choice.TOOL else {choice.choice.value: {}}
        )
    if config:
        body["toolConfig"] = config
    if "tool_choice" in request.own and not same:
        raise hub.Incapable(f"tool_choice {json.dumps(request.own['tool_choice'])[:80]}")


def _encode_output(request: canon.Request, body: dict[str, Any]) -> None:
    """A response schema (its JSON as text, as Converse takes it) and an effort, in outputConfig."""
    config: dict[str, Any] = {}
    if request.output is not None:
        schema: dict[str, Any] = {"schema": json.dumps(request.output.schema)}
        if request.output.name is not None:
            schema["name"] = request.output.name
        config["textFormat"] = {"type": "json_schema", "structure": {"jsonSchema": schema}}
    if request.effort is not None:
        config["effort"] = request.effort
    if config:
        body["outputConfig"] = config


# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

# stopReason as the hub's stop: a guardrail's or a filter's stop is a refusal; a reason the
# hub has no word for (a malformed output or call) stays as given.
STOP_REASONS: Mapping[str, canon.Stop] = {
    "end_turn": canon.Stop.END_TURN,
    "tool_use": canon.Stop.TOOL_USE,
    "max_tokens": canon.Stop.MAX_TOKENS,
    "stop_sequence": canon.Stop.STOP_SEQUENCE,
    "guardrail_intervened": canon.Stop.REFUSAL,
    "content_filtered": canon.Stop.REFUSAL,
    "model_context_window_exceeded": canon.Stop.CONTEXT_WINDOW,
}
STOP_TO_REASON: Mapping[canon.Stop, str] = {
    canon.Stop.END_TURN: "end_turn",
    canon.Stop.TOOL_USE: "tool_use",
    canon.Stop.MAX_TOKENS: "max_tokens",
    canon.Stop.STOP_SEQUENCE: "stop_sequence",
    canon.Stop.REFUSAL: "content_filtered",
    canon.Stop.CONTEXT_WINDOW: "model_context_window_exceeded",
    canon.Stop.PAUSE_TURN: "end_turn",
}
# Every stopReason of Bedrock's API: one the hub has no word for is told to a Converse
# caller as it was; any other as end_turn.
_REASONS = frozenset({*STOP_REASONS, "malformed_model_output", "malformed_tool_use"})


def _stop(reason: object) -> tuple[canon.Stop | None, str | None]:
    if not isinstance(reason, str):
        return None, None
    stop = STOP_REASONS.get(reason)
    return stop, None if stop is not None else reason


def _reason(stop: canon.Stop | None, other: str | None) -> str:
    if stop is not None:
        return STOP_TO_REASON[stop]
    return other if other in _REASONS else "end_turn"


def decode_usage(usage: object) -> canon.Usage | None:
    """Converse's usage as the hub's: its input tokens are the fresh ones, cache reads and
    writes counted apart (as Anthropic's)."""
    if not isinstance(usage, Mapping):
        return None
    return canon.Usage(
        input=counts.count(usage.get("inputTokens")),
        cache_write=counts.count(usage.get("cacheWriteInputTokens")),
        cache_read=counts.count(usage.get("cacheReadInputTokens")),
        output=counts.count(usage.get("outputTokens")),
    )


def encode_usage(usage: canon.Usage) -> dict[str, Any]:
    """The hub's usage as Converse's (its three counts always; the cache's when told)."""
    out: dict[str, Any] = {"inputTokens": usage.input or 0, "outputTokens": usage.output or 0}
    out["totalTokens"] = usage.prompt + (usage.output or 0)
    if usage.cache_read is not None:
        out["cacheReadInputTokens"] = usage.cache_read
    if usage.cache_write is not None:
        out["cacheWriteInputTokens"] = usage.cache_write
    return out


def _object(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key) if obj is not None else None
    return value if isinstance(value, Mapping) else {}


def _content(answer: Mapping[str, Any]) -> list[Any]:
    content = _object(_object(answer, "output"), "message").get("content")
    return content if isinstance(content, list) else []


def _answer_part(b: object) -> canon.Part:
    if isinstance(b, Mapping) and len(b) == 1 and "toolResult" not in b:
        try:
            return _block(b, "the answer")
        except hub.Incapable:
            pass
    return canon.Opaque(SOURCE, "block", {"block": b})


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    """A Converse answer in the hub's terms (no id or model: the answer names neither).
    Raises :class:`~capmon.core.providers.hub.Incapable` for one without a message."""
    if not isinstance(_object(answer, "output").get("message"), Mapping):
        raise hub.Incapable("a Converse answer without a message")
    stop, other = _stop(answer.get("stopReason"))
    return canon.Answer(
        id="",
        model="",
        parts=tuple(_answer_part(b) for b in _content(answer)),
        stop=stop,
        usage=decode_usage(answer.get("usage")),
        stop_other=other,
    )


def encode_part(part: canon.Part) -> dict[str, Any]:
    """One part of an answer as a Converse block (a thought's signature goes with it:
    Converse tells it, and Claude on Bedrock reads it back)."""
    if isinstance(part, canon.Text):
        return {"text": part.text}
    if isinstance(part, canon.ToolCall):
        return {"toolUse": {"toolUseId": part.id, "name": part.name, "input": hub.call_input(part, "the answer")}}
    if isinstance(part, canon.Thinking):
        if part.redacted:
            return {"reasoningContent": {"redactedContent": part.text}}
        return {"reasoningContent": {"reasoningText": _reasoning_text(part)}}
    if isinstance(part, canon.Opaque) and part.format == SOURCE:
        return dict(part.raw)
    kind = hub.part_kind(part)
    raise hub.Incapable(f"a {kind} part in an answer (Converse answers carry text, tool uses and reasoning)")


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Converse one (``created``: Converse's answers carry no time).
    Raises :class:`~capmon.core.providers.hub.Incapable` for a call whose arguments are no
    JSON object."""
    out: dict[str, Any] = {
        "output": {"message": {"role": "assistant", "content": [encode_part(p) for p in answer.parts]}},
        "stopReason": _reason(answer.stop, answer.stop_other),
        "usage": encode_usage(answer.usage or canon.Usage()),
        "metrics": {"latencyMs": 0},
    }
    return out


def _event(chunk: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """A stream event's type and payload (``{"messageStart": {...}}``)."""
    if len(chunk) == 1:
        kind, payload = next(iter(chunk.items()))
        if isinstance(payload, Mapping):
            return str(kind), payload
    return "", {}


def _index(payload: Mapping[str, Any]) -> int:
    index = payload.get("contentBlockIndex")
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


class _Decoder:
    """Converse events in, the hub's events out: a block's start when its first event comes
    (a text or reasoning block has no ``contentBlockStart``), Converse's block indexes
    numbered from 0 in the order they came, the parts stopped at ``messageStop``, its stop
    reason told with the usage at ``metadata``, then the end (at the wire's end, when no
    metadata follows the stop)."""

    def __init__(self) -> None:
        self._started = False
        self._stopped = False  # messageStop came
        self._stop: tuple[canon.Stop | None, str | None] = (None, None)  # its reason, told with the usage
        self._done = False
        self._parts: dict[int, int] = {}  # Converse's index -> the hub's
        self._open: set[int] = set()

    def _part(self, index: int, first: canon.Part) -> tuple[int, list[canon.Event]]:
        if index in self._parts:
            return self._parts[index], []
        mine = self._parts[index] = len(self._parts)
        self._open.add(mine)
        return mine, [canon.PartStarted(mine, first)]

    def feed(self, chunk: Mapping[str, Any]) -> list[canon.Event]:
        if self._done:
            return []
        kind, payload = _event(chunk)
        out: list[canon.Event] = []
        if not self._started:
            self._started = True
            out.append(canon.Started("", ""))
        if kind == "contentBlockStart":
            use = _object(_object(payload, "start"), "toolUse")
            if use:
                call = canon.ToolCall(str(use.get("toolUseId", "")), str(use.get("name", "")), "")
                out += self._part(_index(payload), call)[1]
        elif kind == "contentBlockDelta":
            out += self._delta(_index(payload), _object(payload, "delta"))
        elif kind == "contentBlockStop":
            mine = self._parts.get(_index(payload))
            if mine is not None and mine in self._open:
                self._open.discard(mine)
                out.append(canon.PartStopped(mine))
        elif kind == "messageStop":
            self._stopped = True
            out += [canon.PartStopped(i) for i in sorted(self._open)]
            self._open.clear()
            self._stop = _stop(payload.get("stopReason"))
        elif kind == "metadata":
            self._done = True
            stop, other = self._stop
            out += [canon.Ended(stop, decode_usage(payload.get("usage")), None, other), canon.Done()]
        return out

    def _delta(self, index: int, delta: Mapping[str, Any]) -> list[canon.Event]:
        text, use, reasoning = delta.get("text"), _object(delta, "toolUse"), _object(delta, "reasoningContent")
        if isinstance(text, str):
            mine, out = self._part(index, canon.Text(""))
            return [*out, canon.PartDelta(mine, text=text)] if text else out
        if use:
            piece = use.get("input")
            mine, out = self._part(index, canon.ToolCall("", "", ""))
            return [*out, canon.PartDelta(mine, arguments=piece)] if isinstance(piece, str) and piece else out
        if reasoning:
            redacted = reasoning.get("redactedContent")
            if isinstance(redacted, str):
                return self._part(index, canon.Thinking(redacted, redacted=True))[1]
            mine, out = self._part(index, canon.Thinking(""))
            said, signature = reasoning.get("text"), reasoning.get("signature")
            if isinstance(said, str) and said:
                out.append(canon.PartDelta(mine, text=said))
            if isinstance(signature, str):
                out.append(canon.PartDelta(mine, signature=signature))
            return out
        return []

    def close(self) -> list[canon.Event]:
        if self._stopped and not self._done:  # the stop came, its metadata never did
            self._done = True
            stop, other = self._stop
            return [canon.Ended(stop, None, None, other), canon.Done()]
        return []


def stream_decoder() -> hub.StreamDecoder:
    return _Decoder()


class _Encoder:
    """The hub's events in, Converse's events out: ``messageStart``, a tool use's
    ``contentBlockStart``, each piece a ``contentBlockDelta``, ``contentBlockStop``; the
    stop in ``messageStop`` and the usage in ``metadata``, both at ``Done``."""

    def __init__(self) -> None:
        self._parts: dict[int, canon.Part] = {}
        self._said: set[int] = set()  # tool uses whose input came in deltas
        self._stop: canon.Stop | None = None
        self._other: str | None = None
        self._usage: canon.Usage | None = None

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            self._usage = event.usage
            return [{"messageStart": {"role": "assistant"}}]
        if isinstance(event, canon.PartStarted):
            return self._start(event.index, event.part)
        if isinstance(event, canon.PartDelta):
            return self._delta(event)
        if isinstance(event, canon.PartStopped):
            out = []
            started = self._parts.get(event.index)
            if isinstance(started, canon.ToolCall) and event.index not in self._said and started.input:
                out.append(self._block(event.index, {"toolUse": {"input": json.dumps(started.input)}}))
            return [*out, {"contentBlockStop": {"contentBlockIndex": event.index}}]
        if isinstance(event, canon.Ended):
            if event.stop is not None or event.stop_other is not None:
                self._stop, self._other = event.stop, event.stop_other
            if event.usage is not None:
                self._usage = event.usage if self._usage is None else self._usage.merged(event.usage)
            return []
        if isinstance(event, canon.Done):
            return [
                {"messageStop": {"stopReason": _reason(self._stop, self._other)}},
                {"metadata": {"usage": encode_usage(self._usage or canon.Usage()), "metrics": {"latencyMs": 0}}},
            ]
        return []

    def _start(self, index: int, part: canon.Part) -> list[dict[str, Any]]:
        self._parts[index] = part
        if isinstance(part, canon.ToolCall):  # its input comes in deltas (a start's is its first state)
            start = {"toolUse": {"toolUseId": part.id, "name": part.name}}
            return [{"contentBlockStart": {"start": start, "contentBlockIndex": index}}]
        if isinstance(part, canon.Text):
            return [self._block(index, {"text": part.text})] if part.text else []
        if isinstance(part, canon.Thinking):
            if part.redacted:
                return [self._block(index, {"reasoningContent": {"redactedContent": part.text}})]
            return [self._block(index, {"reasoningContent": {"text": part.text}})] if part.text else []
        kind = hub.part_kind(part)
        raise hub.Incapable(f"a {kind} part in a stream (Converse streams text, tool uses and reasoning)")

    @staticmethod
    def _block(index: int, delta: dict[str, Any]) -> dict[str, Any]:
        return {"contentBlockDelta": {"delta": delta, "contentBlockIndex": index}}

    def _delta(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        part = self._parts.get(event.index)
        thought = isinstance(part, canon.Thinking)
        out: list[dict[str, Any]] = []
        if event.text:
            out.append(
                self._block(
                    event.index, {"reasoningContent": {"text": event.text}} if thought else {"text": event.text}
                )
            )
        if event.arguments:
            self._said.add(event.index)
            out.append(self._block(event.index, {"toolUse": {"input": event.arguments}}))
        if event.signature is not None and thought:
            out.append(self._block(event.index, {"reasoningContent": {"signature": event.signature}}))
        return out


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``created`` and ``include_usage``: Converse's events carry no time and always their usage."""
    return _Encoder()


def answer_stream(answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """A whole answer as this format's stream (a plain answer to a stream request), through the hub."""
    return hub.told(decode_answer(answer), stream_encoder(created=created, include_usage=include_usage))


# ================================================================ reading and probing
# What a target sends in this format, read: a plain answer, its text and used tokens, a stream's
# frames (frames.Event; an exception inside the stream classified by its type, like the HTTP
# error it names) and the answer they assemble into; and what an attempt sends in it: the probe
# and the body (the fields capmon owns). The framing of AWS's event stream is aws_eventstream.py's.

_EVENTS = frozenset({"messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop"})
_LAST = "metadata"
_PADDING = "p"  # a random-length field that hides the payload's size: no meaning


def parse(status: int, body: bytes | str | None) -> Mapping[str, Any] | None:
    """A plain answer (an output message), or None: the classifier says what it is. Never raises."""
    parsed = hub.success_json(status, body)
    if isinstance(parsed, Mapping) and isinstance(_object(parsed, "output").get("message"), Mapping):
        return parsed
    return None


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def _text_of(blocks: list[Any]) -> str:
    return "".join(b["text"] for b in blocks if isinstance(b, Mapping) and isinstance(b.get("text"), str))


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its text blocks, in order."""
    return _text_of(_content(response))


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usage.totalTokens``; a stream's in its metadata)."""
    usage = _object(response, "usage") or _object(_object(response, _LAST), "usage")
    return counts.count(usage.get("totalTokens")) if usage else None


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text an event adds (a text delta's; "" for any other)."""
    said = _object(_object(chunk, "contentBlockDelta"), "delta").get("text")
    return said if isinstance(said, str) else ""


def converse_body(extra: Mapping[str, Any], *, max_tokens: int) -> dict[str, Any]:
    """A Converse body: the caller's fields untouched but the token cap, which capmon owns
    (and no model or ``stream``: the URL says both)."""
    body = {k: v for k, v in extra.items() if k not in ("model", "modelId", "stream")}
    config = extra.get("inferenceConfig")
    body["inferenceConfig"] = {**(config if isinstance(config, Mapping) else {}), "maxTokens": max_tokens}
    return body


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Converse request: one token of output (``model`` is the URL's)."""
    return converse_body({"messages": [{"role": "user", "content": [{"text": "ping"}]}]}, max_tokens=1)


def _broken(why: str) -> Event:
    return Event(FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, f"200 with a broken event stream ({why})", 200))


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a ConverseStream is. Never raises.

    An event is a CHUNK, ``{eventType: payload}`` without its padding (output when it
    carries text, a tool use or the stop); ``metadata`` is the last (DONE, with its usage);
    an exception or an error frame (aws_eventstream.py) is an error classified by its type,
    like the HTTP error it names; a frame the reader could not decode (a bad CRC, a message
    cut short), or a payload that is no event, is garbage.
    """
    what = aws_eventstream.special(frame)
    if what is not None:
        kind, name = what
        if kind is aws_eventstream.Special.BROKEN:
            return _broken(frame.data)
        return Event(FrameKind.ERROR, failure=classify_aws_event(name, frame.data, now=now, quota_hint=quota_hint))
    if frame.event not in _EVENTS and frame.event != _LAST:
        return Event(FrameKind.IGNORE)  # an event type newer than this reader: no part of the answer
    try:
        payload = json.loads(frame.data) if frame.data.strip() else {}
    except (ValueError, RecursionError):
        return _broken("an event that is not JSON")
    if not isinstance(payload, dict):
        return _broken("an event that is no object")
    payload.pop(_PADDING, None)
    chunk = {frame.event: payload}
    if frame.event == _LAST:
        return Event(FrameKind.DONE, chunk=chunk)
    return Event(FrameKind.CHUNK, chunk=chunk, output=_has_output(frame.event, payload))


def _has_output(kind: str, payload: Mapping[str, Any]) -> bool:
    if kind in ("messageStop", "contentBlockStart"):
        return True
    if kind != "contentBlockDelta":
        return False
    delta = _object(payload, "delta")
    return bool(delta.get("text") or delta.get("toolUse") or delta.get("reasoningContent"))


class Assembled:
    """A ConverseStream's events put together into the plain answer: each block's pieces
    joined (a tool use's input parsed once whole), the stop reason, the usage and metrics;
    whole at ``messageStop``."""

    def __init__(self) -> None:
        self.finished = False
        self._blocks: dict[int, dict[str, Any]] = {}
        self._inputs: dict[int, list[str]] = {}
        self._end: dict[str, Any] = {}

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        kind, payload = _event(chunk)
        index = _index(payload)
        if kind == "contentBlockStart":
            use = _object(_object(payload, "start"), "toolUse")
            if use:
                self._blocks[index] = {"toolUse": {"toolUseId": use.get("toolUseId"), "name": use.get("name")}}
                self._inputs[index] = []
        elif kind == "contentBlockDelta":
            self._delta(index, _object(payload, "delta"))
        elif kind == "messageStop":
            self.finished = True
            self._end["stopReason"] = payload.get("stopReason")
            if "additionalModelResponseFields" in payload:
                self._end["additionalModelResponseFields"] = payload["additionalModelResponseFields"]
        elif kind == _LAST:
            for key in ("usage", "metrics", "trace"):
                if key in payload:
                    self._end[key] = payload[key]

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        said, use, reasoning = delta.get("text"), _object(delta, "toolUse"), _object(delta, "reasoningContent")
        if isinstance(said, str):
            block = self._blocks.setdefault(index, {"text": ""})
            if isinstance(block.get("text"), str):
                block["text"] += said
        elif use and isinstance(use.get("input"), str):
            self._inputs.setdefault(index, []).append(use["input"])
        elif reasoning:
            block = self._blocks.setdefault(index, {"reasoningContent": {}})
            content = block.get("reasoningContent")
            if not isinstance(content, dict):
                return
            if isinstance(reasoning.get("redactedContent"), str):
                content["redactedContent"] = reasoning["redactedContent"]
                return
            reasoned = content.setdefault("reasoningText", {"text": ""})
            if isinstance(reasoning.get("text"), str):
                reasoned["text"] += reasoning["text"]
            if isinstance(reasoning.get("signature"), str):
                reasoned["signature"] = reasoning["signature"]

    def answer(self) -> Mapping[str, Any] | None:
        content = []
        for index in sorted(self._blocks):
            block = self._blocks[index]
            if "toolUse" in block:
                arguments = "".join(self._inputs.get(index, []))
                try:
                    given = json.loads(arguments) if arguments.strip() else {}
                except (ValueError, RecursionError):
                    given = arguments  # a broken call's arguments as they came: the check says so
                block = {"toolUse": {**block["toolUse"], "input": given}}
            content.append(block)
        return {"output": {"message": {"role": "assistant", "content": content}}, **self._end}


def assembler() -> Assembled:
    return Assembled()


def wire_body(
    request: Request,
    translated: Mapping[str, Any] | None,
    *,
    model: str,
    limit: int,
    stream: bool,
    token_param: TokenParam,
) -> dict[str, Any]:
    """A Converse body: the caller's fields untouched, or a translated request's; the cap
    as ``inferenceConfig.maxTokens`` (Converse has one token parameter). The model and
    streaming are the URL's (the dialect's), not the body's."""
    return converse_body(request.extra if translated is None else translated, max_tokens=limit)


def refused_token_param(failure: Failure, sent: TokenParam) -> bool:
    """Never: Converse has one token cap (``maxTokens``), nothing to relearn."""
    return False


def tool_calls(answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
    """Each ``toolUse`` of the answer: its name, id and input as JSON text (an input that is
    an object counts as whole: "")."""
    for b in _content(answer):
        use = b.get("toolUse") if isinstance(b, Mapping) else None
        if isinstance(use, Mapping):
            given = use.get("input")
            text = "" if isinstance(given, Mapping) else given if isinstance(given, str) else json.dumps(given)
            yield use.get("name"), use.get("toolUseId"), text


@dataclass
class _Calls:
    """The tool uses of a ConverseStream: each opens at its ``contentBlockStart``, takes its
    input in pieces and is checked at its ``contentBlockStop``; ``messageStop`` and
    ``metadata`` are the stream's end (a caller's end is kept until both came, or the wire ended)."""

    open: dict[int, hub.Call] = field(default_factory=dict)

    @staticmethod
    def last(chunk: Mapping[str, Any]) -> bool:
        return "messageStop" in chunk or _LAST in chunk

    def feed(self, chunk: Mapping[str, Any]) -> None:
        kind, payload = _event(chunk)
        index = _index(payload)
        if kind == "contentBlockStart":
            use = _object(_object(payload, "start"), "toolUse")
            if use:
                self.open[index] = hub.Call(use.get("name"), use.get("toolUseId"))
        elif kind == "contentBlockDelta" and index in self.open:
            piece = _object(_object(payload, "delta"), "toolUse").get("input")
            if isinstance(piece, str):
                self.open[index].pieces.append(piece)
        elif kind == "contentBlockStop" and index in self.open:
            self.open.pop(index).check()

    def end(self) -> None:
        calls, self.open = self.open, {}
        for call in calls.values():
            call.check()


def call_watcher() -> hub.CallWatcher:
    return _Calls()


# ================================================================ continuing a broken answer
# continued / splicer: a broken stream's continuation in this format (capmon/core/routing/continuation.py).


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the assistant's last message, and
    a user message ``instruction`` after it (None: none, the answer a prefill)."""
    said: list[dict[str, Any]] = [{"role": "assistant", "content": [{"text": partial}]}]
    if instruction is not None:
        said.append({"role": "user", "content": [{"text": instruction}]})
    return hub.appended(request, "messages", said)


@dataclass
class ConverseSplice(splice.Splice):
    """Converse events: a continuation's ``messageStart`` is left out, its text deltas go on
    (the prefill's whitespace not said twice), its ``messageStop`` says who continued the
    answer and its ``metadata`` usage counts every request."""

    def sent(self, chunk: Mapping[str, Any]) -> None:
        said = chunk_text(chunk)
        if said:
            self.text.append(said)
        elif "contentBlockStart" in chunk:
            self.other = True  # a tool use reached the caller

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        kind, payload = _event(chunk)
        if kind == "messageStart":
            return []
        if kind == "contentBlockDelta" and isinstance(_object(payload, "delta").get("text"), str):
            piece = self._text(payload["delta"]["text"])
            if not piece:
                return []
            return [{kind: {**payload, "delta": {"text": piece}}}]
        if kind == "messageStop":
            return [{kind: {**payload, splice.FIELD: self.said()}}]
        if kind == _LAST and isinstance(payload.get("usage"), Mapping):
            more = (("inputTokens", self.earlier_in), ("outputTokens", self.earlier_out))
            usage = splice.add_usage(payload["usage"], (*more, ("totalTokens", self.earlier_in + self.earlier_out)))
            return [{kind: {**payload, "usage": usage}}]
        return [chunk]


def splicer(prompt: int) -> splice.Splice:
    """The splice of one streamed request in this format (``prompt``: its estimated tokens)."""
    return ConverseSplice(prompt)


def takes_prefill() -> bool:
    return True  # Converse goes on from an assistant message at the end (a model may refuse: [[models]] prefill)
