"""The gemini format: Google's generateContent (``:generateContent`` and
``:streamGenerateContent?alt=sse``, on the Gemini API and on Vertex AI alike). Its requests,
answers and stream chunks to and from the canonical hub (capmon/core/types/canon.py), and
what reads and probes it. A module of :class:`capmon.core.providers.hub.WireFormat`; see
ARCHITECTURE.md, "Across formats".

Where Gemini differs from the other formats, and what that makes of a crossing:

* the model and streaming live in the URL (the dialects'), so a Gemini body has neither;
  the token cap is ``generationConfig.maxOutputTokens``, the one token parameter;
* a call's ``id`` is optional (the Gemini API answers without one; a ``functionResponse``
  names its function): the decoder gives a call without one an id of its own (:data:`_MADE`),
  so a result finds its call by id in every other format; toward Gemini a request from
  another format carries no ids (Gemini pairs a result with its call by name and order) and
  a Gemini request its own ids only;
* a ``thoughtSignature`` is for the model that made it alone: it crosses to no other format
  (another model could not read it), and no other format's signature crosses to Gemini;
  thought text in an answer crosses as thinking, in a request's history to no other format;
* a stream's chunks are whole answers in pieces (text in pieces, a call whole in one
  chunk); the chunk with ``finishReason`` is its end (there is no ``[DONE]``);
* Google's JSON takes a field by its proto name as well as by its JSON name
  (``parameters_json_schema`` is ``parametersJsonSchema``), and its SDKs send some fields so
  (google-genai 3.6: ``parameters_json_schema``, ``thinking_budget``): a body is read with
  every field under its JSON name (:func:`json_names`), the caller's own values (a call's
  arguments, a schema's property names) untouched.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from capmon.core.providers import hub, splice
from capmon.core.providers import usage as counts
from capmon.core.providers.classify import QUOTA_HINT, classify_event
from capmon.core.providers.frames import Event, FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.providers.token_param import TokenParam
from capmon.core.types import canon
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request, caller_cap

# ================================================================ requests
# decode_request / encode_request: a request body to and from canon.Request.

SOURCE = "gemini"

_SLOTS = frozenset({"model", "stream", "contents", "systemInstruction", "generationConfig", "tools", "toolConfig"})
_NO_MEANING = frozenset({"labels"})  # Vertex's billing labels
# generationConfig's keys with a canon slot; any other is kept under "generationConfig.<key>"
# (in ``own``, or ``aside`` for those that change no answer's meaning).
_CONFIG = "generationConfig."
_CONFIG_SLOTS = frozenset(
    {"maxOutputTokens", "stopSequences", "temperature", "topP", "responseMimeType", "responseJsonSchema"}
)
_CONFIG_NO_MEANING = frozenset({"seed"})  # a determinism hint, as chat's seed
_JSON = "application/json"
_ROLES: Mapping[str, canon.Role] = {
    "user": canon.Role.USER,
    "model": canon.Role.ASSISTANT,
    "function": canon.Role.USER,  # older bodies put function responses in a turn of their own
}
_DECLARATION_SLOTS = frozenset({"name", "description", "parameters", "parametersJsonSchema"})
_MODES: Mapping[str, canon.Choice] = {"AUTO": canon.Choice.AUTO, "ANY": canon.Choice.ANY, "NONE": canon.Choice.NONE}
# The prefix of a call id the decoder made (``gemini_<tag>``, letters and digits only, short:
# Anthropic's ids allow no colon, OpenAI's no more than 40 characters): never sent to Gemini.
_MADE = "gemini_"
_TAG_CHARS = 12
# Gemini's limit on stop sequences.
MAX_STOP = 5


def _made_id(tag: str) -> str:
    return _MADE + "".join(c for c in tag if c.isascii() and c.isalnum())[-_TAG_CHARS:]


class _Ids:
    """The calls of one conversation as they are decoded: each gets an id (its own, or one
    made), and a result without an id is the earliest call of its name still unanswered."""

    def __init__(self) -> None:
        self._made = 0
        self._open: dict[str, list[str]] = {}

    def _new(self) -> str:
        self._made += 1
        return _made_id(str(self._made - 1))

    def call(self, name: str, given: object) -> str:
        call_id = given if isinstance(given, str) and given else self._new()
        self._open.setdefault(name, []).append(call_id)
        return call_id

    def result(self, name: str, given: object) -> str:
        pending = self._open.get(name, [])
        if isinstance(given, str) and given:
            if given in pending:
                pending.remove(given)
            return given
        return pending.pop(0) if pending else self._new()


# Values that are the caller's own, not Google's messages: their keys are never renamed (a
# call's arguments, a function's answer, a JSON Schema, labels); a Schema's ``properties``
# keys are property names, its values Schemas again.
_FREE = frozenset(
    {"args", "response", "parametersJsonSchema", "responseJsonSchema", "labels", "example", "default", "enum"}
)
_NAMED = frozenset({"properties"})


def _json_name(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def json_names(value: Any) -> Any:
    """``value`` (a Gemini body, or any part of one) with every field under its JSON name
    (``lowerCamelCase``), as Google's own servers read a proto name; the caller's own
    values untouched (:data:`_FREE`). The same object when nothing needs renaming."""
    if isinstance(value, list):
        items = [json_names(v) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if not isinstance(value, Mapping):
        return value
    out: dict[str, Any] = {}
    changed = False
    for key, v in value.items():
        name = _json_name(key) if isinstance(key, str) and "_" in key.strip("_") else key
        if name in _FREE:
            new = v
        elif name in _NAMED and isinstance(v, Mapping):
            new = {k: json_names(schema) for k, schema in v.items()}
            new = v if all(new[k] is v[k] for k in v) else new
        else:
            new = json_names(v)
        changed = changed or name != key or new is not v
        out[name] = new
    return out if changed else value


def decode_request(body: Mapping[str, Any]) -> canon.Request:
    """A Gemini body in canon terms: every field kept (Gemini's own, like ``safetySettings``,
    ``cachedContent`` or ``generationConfig.topK``, in ``own``; bookkeeping in ``aside``).
    Raises :class:`~capmon.core.providers.hub.Incapable` only for a body no format could read."""
    body = json_names(body)
    own, aside = hub.sort_fields(body, _SLOTS, _NO_MEANING)
    config = _config(body.get("generationConfig"), own, aside)
    stop = config.get("stopSequences")
    ids = _Ids()
    tools = body.get("tools")
    decoded_tools = _tools(tools) if isinstance(tools, list) else ()
    if tools is not None and not isinstance(tools, list):
        own["tools"] = tools
    tool_choice, strict = _tool_choice(body.get("toolConfig"), own)
    if strict:  # VALIDATED: calls held to their schemas, which is a strict tool elsewhere
        decoded_tools = tuple(t if t.builtin else dataclasses.replace(t, strict=True) for t in decoded_tools)
    return canon.Request(
        source=SOURCE,
        messages=_contents(body.get("contents"), ids),
        system=_system(body.get("systemInstruction")),
        max_tokens=caller_cap(config.get("maxOutputTokens")),
        stop=tuple(s for s in stop if isinstance(s, str)) if isinstance(stop, list) else (),
        temperature=config.get("temperature"),
        top_p=config.get("topP"),
        tools=decoded_tools,
        tool_choice=tool_choice,
        output=_output_of(config, own, aside),
        own=own,
        aside=aside,
    )


def _config(config: object, own: dict[str, Any], aside: dict[str, Any]) -> Mapping[str, Any]:
    """generationConfig's keys with a slot; each other kept under its dotted name."""
    if not isinstance(config, Mapping):
        if config is not None:
            own["generationConfig"] = config
        return {}
    for name, value in config.items():
        if name in _CONFIG_SLOTS:
            continue
        if name in _CONFIG_NO_MEANING or value is None or (name == "candidateCount" and value == 1):
            aside[_CONFIG + name] = value
        else:
            own[_CONFIG + name] = value
    return config


def _output_of(config: Mapping[str, Any], own: dict[str, Any], aside: dict[str, Any]) -> canon.OutputSchema | None:
    """JSON that follows a JSON schema (``responseJsonSchema``) is the hub's structured
    output; JSON mode alone, or Gemini's own schema dialect (``responseSchema``), only
    Gemini carries."""
    mime, schema = config.get("responseMimeType"), config.get("responseJsonSchema")
    if mime == _JSON and isinstance(schema, Mapping) and _CONFIG + "responseSchema" not in own:
        return canon.OutputSchema(schema)
    if mime is not None:
        (aside if mime == "text/plain" else own)[_CONFIG + "responseMimeType"] = mime
    if schema is not None:
        own[_CONFIG + "responseJsonSchema"] = schema
    return None


def _system(system: object) -> tuple[canon.Part, ...]:
    if isinstance(system, str):  # the SDKs take one; the wire takes a content
        return (canon.Text(system),) if system else ()
    if system is None:
        return ()
    parts = system.get("parts") if isinstance(system, Mapping) else None
    if not isinstance(parts, list):
        raise hub.Incapable("systemInstruction: not a content with parts")
    return tuple(_part(p, f"systemInstruction.parts[{j}]", _Ids()) for j, p in enumerate(parts))


def _contents(contents: object, ids: _Ids) -> tuple[canon.Message, ...]:
    if contents is None:
        return ()
    if not isinstance(contents, list):
        raise hub.Incapable("contents: not a list of contents")
    out = []
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        role = content.get("role", "user") if isinstance(content, Mapping) else None
        r = _ROLES.get(role) if isinstance(role, str) else None
        parts = content.get("parts") if isinstance(content, Mapping) else None
        if r is None or not isinstance(parts, list):
            raise hub.Incapable(f"{where}: not a Gemini content")
        out.append(
            canon.Message(r, tuple(_part(p, f"{where}.parts[{j}]", ids) for j, p in enumerate(parts)), where=where)
        )
    return tuple(out)


def _part(p: object, where: str, ids: _Ids) -> canon.Part:
    """One part. Its thoughtSignature stays with Gemini (see the module's docstring)."""
    if not isinstance(p, Mapping):
        raise hub.Incapable(f"{where}: not a part")
    keys = set(p) - {"thoughtSignature"}
    text = p.get("text")
    if isinstance(text, str) and keys <= {"text", "thought"}:
        if p.get("thought"):
            signature = p.get("thoughtSignature")
            return canon.Thinking(text, signature if isinstance(signature, str) else None)
        return canon.text(text)
    call = p.get("functionCall")
    if keys == {"functionCall"} and isinstance(call, Mapping) and set(call) <= {"name", "args", "id"}:
        name, given = str(call.get("name", "")), call.get("args", {})
        return canon.ToolCall(
            ids.call(name, call.get("id")), name, json.dumps(given), given if isinstance(given, Mapping) else None
        )
    response = p.get("functionResponse")
    if keys == {"functionResponse"} and isinstance(response, Mapping) and set(response) <= {"name", "response", "id"}:
        content, is_error = _result_content(response.get("response", {}))
        return canon.ToolResult(ids.result(str(response.get("name", "")), response.get("id")), content, is_error)
    image = _image_of(p) if len(keys) == 1 else None
    if image is not None:
        return image
    return canon.Opaque(SOURCE, next(iter(keys), "part"), p)  # code execution, video, a file, ...


def _image_of(p: Mapping[str, Any]) -> canon.Image | None:
    """An image inline (base64), or by an http(s) URL (``fileData``)."""
    data, file = p.get("inlineData"), p.get("fileData")
    if isinstance(data, Mapping) and set(data) == {"mimeType", "data"}:
        mime = data["mimeType"]
        if isinstance(mime, str) and mime.startswith("image/") and isinstance(data["data"], str):
            return canon.Image(mime, data["data"])
    if isinstance(file, Mapping) and set(file) == {"mimeType", "fileUri"}:
        mime, uri = file["mimeType"], file["fileUri"]
        if isinstance(mime, str) and mime.startswith("image/") and isinstance(uri, str) and uri.startswith("http"):
            return canon.Image(mime, url=uri)
    return None


def _result_content(response: object) -> tuple[str, bool]:
    """A function's response as a tool result's text: ``{"output": text}`` is that text,
    ``{"error": text}`` that text failed; any other object its JSON."""
    if isinstance(response, Mapping) and len(response) == 1:
        for key, failed in (("output", False), ("error", True)):
            if isinstance(response.get(key), str):
                return response[key], failed
    return json.dumps(response), False


def _json_schema(schema: object) -> object:
    """Gemini's schema dialect (``parameters``: OpenAPI's subset, types in capitals) as JSON
    schema: its types in lower case (the rest is the same words)."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items()}
    kind = schema.get("type")
    if isinstance(kind, str):
        out["type"] = kind.lower()
    return out


def _tools(tools: list[Any]) -> tuple[canon.Tool, ...]:
    """Each function declaration a tool; anything else in a tools entry (googleSearch,
    codeExecution, urlContext, ...) a built-in tool that only Gemini carries."""
    out: list[canon.Tool] = []
    for t in tools:
        declarations = t.get("functionDeclarations") if isinstance(t, Mapping) else None
        if isinstance(declarations, list):
            out += [_declaration(d) for d in declarations]
        rest = {k: v for k, v in t.items() if k != "functionDeclarations"} if isinstance(t, Mapping) else {"tool": t}
        if rest or not isinstance(declarations, list):
            out.append(canon.Tool(next(iter(rest), "tool"), own=rest, builtin=True))
    return tuple(out)


def _declaration(d: object) -> canon.Tool:
    if not isinstance(d, Mapping):
        return canon.Tool("functionDeclaration", own={"functionDeclaration": d}, builtin=True)
    schema = d.get("parametersJsonSchema")
    if schema is None and "parameters" in d:
        schema = _json_schema(d["parameters"])
    description = d.get("description")
    return canon.Tool(
        d.get("name"),  # type: ignore[arg-type]  # as given: the refusal names it so
        description if isinstance(description, str) else None,
        schema if isinstance(schema, Mapping) else None,
        own={k: v for k, v in d.items() if k not in _DECLARATION_SLOTS},
    )


def _tool_choice(config: object, own: dict[str, Any]) -> tuple[canon.ToolChoice | None, bool]:
    """``toolConfig.functionCallingConfig`` as a tool choice, and whether its mode is
    VALIDATED (auto, calls held to their schemas); anything else only Gemini carries."""
    if config is None:
        return None, False
    calling = config.get("functionCallingConfig") if isinstance(config, Mapping) else None
    if isinstance(config, Mapping) and set(config) == {"functionCallingConfig"} and isinstance(calling, Mapping):
        mode, names = calling.get("mode"), calling.get("allowedFunctionNames")
        if set(calling) == {"mode"} and isinstance(mode, str) and mode in _MODES:
            return canon.ToolChoice(_MODES[mode]), False
        if set(calling) == {"mode"} and mode == "VALIDATED":
            return canon.ToolChoice(canon.Choice.AUTO), True
        if set(calling) == {"mode", "allowedFunctionNames"} and mode == "ANY" and isinstance(names, list):
            if len(names) == 1 and isinstance(names[0], str):
                return canon.ToolChoice(canon.Choice.TOOL, names[0]), False
    own["toolConfig"] = config
    return None, False


# ---------------------------------------------------------------- toward Gemini

# Fields of other formats placed by the rules below, not by the generic refusal.
_PENALTIES = {"frequency_penalty": "frequencyPenalty", "presence_penalty": "presencePenalty"}
_PLACED = frozenset({"n", "logprobs", "modalities", "response_format", "top_k", *_PENALTIES})


def encode_request(request: canon.Request) -> dict[str, Any]:
    """A Gemini body (without the model, which is the URL's; ``maxOutputTokens`` only when
    the caller set a cap). From Gemini, the body it was; from another format, what Gemini
    can carry of it, else :class:`~capmon.core.providers.hub.Incapable` with the reason."""
    same = request.source == SOURCE
    config: dict[str, Any] = {}
    if not same:
        _refused_fields(request, config)
    if not request.messages and not same:
        raise hub.Incapable("no messages")
    names = {p.id: p.name for m in request.messages for p in m.parts if isinstance(p, canon.ToolCall)}
    contents: list[dict[str, Any]] = []
    for m in request.messages:
        if m.role is canon.Role.SYSTEM:
            raise hub.Incapable(f"{m.where}: a system message after the conversation began (Gemini has one, first)")
        parts = [_encode_part(p, m.where, names, same) for p in m.parts]
        if not same:  # Gemini refuses an empty text, and a turn without parts: they said nothing
            parts = [p for p in parts if p != _EMPTY]
            if not parts:
                continue
        role = "user" if m.role is canon.Role.USER else "model"
        if contents and contents[-1]["role"] == role and not same:
            # One turn per role, as Gemini's turns alternate (chat's tool messages and the
            # user's words after them are one user turn)
            contents[-1]["parts"] += parts
        else:
            contents.append({"role": role, "parts": parts})
    body: dict[str, Any] = {"contents": contents}
    if request.system:
        body["systemInstruction"] = {"parts": [_encode_part(p, "system", names, same) for p in request.system]}
    sampling = (request.max_tokens, list(request.stop) or None, request.temperature, request.top_p)
    config.update((k, v) for k, v in zip(_SAMPLING, sampling, strict=True) if v is not None)
    if request.output is not None:
        config["responseMimeType"] = _JSON
        config["responseJsonSchema"] = request.output.schema
    _encode_tools(request, body, same)
    if same:
        for name, value in [*request.own.items(), *request.aside.items()]:
            if name.startswith(_CONFIG):
                config[name.removeprefix(_CONFIG)] = value
            else:
                body[name] = value
    if config:
        body["generationConfig"] = config
    return body


def _refused_fields(request: canon.Request, config: dict[str, Any]) -> None:
    """What Gemini has no counterpart for; what it has (penalties, top_k, JSON mode, a seed)
    goes into ``config``."""
    own = request.own
    unplaced = next((name for name in own if name not in _PLACED), None)
    if unplaced is not None:
        raise hub.Incapable(f"{unplaced} (no Gemini counterpart)")
    if own.get("n") not in (None, 1):
        raise hub.Incapable(f"n = {own['n']} (capmon asks Gemini for one candidate)")
    if own.get("logprobs"):
        raise hub.Incapable("logprobs (not translated to Gemini's)")
    modalities = own.get("modalities")
    if isinstance(modalities, list) and any(m != "text" for m in modalities):
        raise hub.Incapable("audio output (modalities)")
    response_format = own.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, Mapping) or response_format.get("type") != "json_object":
            raise hub.Incapable("response_format other than text, json_object or a json_schema")
        config["responseMimeType"] = _JSON
    for name, field in _PENALTIES.items():
        if own.get(name) is not None:
            config[field] = own[name]
    if own.get("top_k") is not None:
        config["topK"] = own["top_k"]
    seed = request.aside.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = seed
    if request.cache is not None:
        raise hub.Incapable("cache_control (Gemini caches on its own terms)")
    if request.thinking is not None:
        raise hub.Incapable("thinking (Anthropic's thinking is not translated to Gemini's)")
    if request.effort is not None:
        raise hub.Incapable(f"reasoning effort = {request.effort} (not translated to Gemini's thinking)")
    if len(request.stop) > MAX_STOP:
        raise hub.Incapable(f"{len(request.stop)} stop sequences (Gemini takes {MAX_STOP})")
    if request.parallel_tool_calls is False:
        raise hub.Incapable("parallel_tool_calls = false (Gemini may always call several)")


_EMPTY = {"text": ""}
# generationConfig's fields for the cap, the stop sequences and the sampling, in canon's order.
_SAMPLING = ("maxOutputTokens", "stopSequences", "temperature", "topP")


def _no_cache(cache: canon.Cache | None, where: str) -> None:
    if cache is not None and cache.raw:
        raise hub.Incapable(f"{where}: cache_control (Gemini caches on its own terms)")


def _encode_part(p: canon.Part, where: str, names: Mapping[str, str], same: bool) -> dict[str, Any]:
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
        call: dict[str, Any] = {"name": p.name, "args": hub.call_input(p, p.where or where)}
        if same and not p.id.startswith(_MADE):
            call["id"] = p.id
        return {"functionCall": call}
    if isinstance(p, canon.ToolResult):
        _no_cache(p.cache, where)
        return {"functionResponse": _function_response(p, where, names, same)}
    if isinstance(p, canon.Thinking) and same and not p.redacted:
        thought: dict[str, Any] = {"text": p.text, "thought": True}
        if p.signature is not None:
            thought["thoughtSignature"] = p.signature
        return thought
    if isinstance(p, canon.Opaque) and p.format == SOURCE:
        return dict(p.raw)
    raise hub.Incapable(f"{where}: a {hub.part_kind(p)} part (no Gemini counterpart)")


def _encode_image(image: canon.Image, where: str) -> dict[str, Any]:
    """Inline data, or an http(s) URL with its type (Gemini's ``fileData`` names one)."""
    if image.data is not None and isinstance(image.media_type, str):
        return {"inlineData": {"mimeType": image.media_type, "data": image.data}}
    if isinstance(image.url, str) and image.url.startswith(("http://", "https://")) and image.media_type:
        return {"fileData": {"mimeType": image.media_type, "fileUri": image.url}}
    raise hub.Incapable(f"{where}: an image by URL (Gemini takes inline data, or a URL with its type)")


def _function_response(result: canon.ToolResult, where: str, names: Mapping[str, str], same: bool) -> dict[str, Any]:
    """A tool result as a function's response: a JSON object's text is that object, other
    text ``{"output": text}`` (``{"error": text}`` when it failed), as Google's SDK says it."""
    name = names.get(result.call_id)
    if name is None:
        raise hub.Incapable(f"{where}: a tool result whose call is not in the conversation (Gemini names the function)")
    content = result.content
    if not isinstance(content, str):
        texts = []
        for part in content:
            if type(part) is not canon.Text:
                kind = hub.part_kind(part)
                raise hub.Incapable(f"{where}: a {kind} part in a tool result (Gemini's response is an object)")
            texts.append(part.text)
        content = "".join(texts)
    response: Mapping[str, Any] = {"error" if result.is_error else "output": content}
    if not result.is_error:
        try:
            parsed = json.loads(content)
        except (ValueError, RecursionError):
            parsed = None
        if isinstance(parsed, dict):
            response = parsed
    out: dict[str, Any] = {"name": name, "response": response}
    if same and not result.call_id.startswith(_MADE):
        out["id"] = result.call_id
    return out


def _encode_tools(request: canon.Request, body: dict[str, Any], same: bool) -> None:
    declarations: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    for t, builtin in hub.crossing_tools(request, same, _no_cache):
        if builtin is not None:
            entries.append(builtin)
            continue
        declaration: dict[str, Any] = {"name": t.name}
        if t.description is not None:
            declaration["description"] = t.description
        if t.parameters is not None:
            declaration["parametersJsonSchema"] = t.parameters
        declaration.update(t.own)
        declarations.append(declaration)
    if declarations:
        entries.insert(0, {"functionDeclarations": declarations})
    if entries:
        body["tools"] = entries
    choice, strict = request.tool_choice, any(t.strict for t in request.tools)
    if choice is None and strict:
        choice = canon.ToolChoice(canon.Choice.AUTO)
    if choice is not None:
        calling: dict[str, Any] = {"mode": choice.choice.value.upper()}
        if choice.choice is canon.Choice.AUTO and strict:
            calling["mode"] = "VALIDATED"
        elif choice.choice is canon.Choice.TOOL:
            calling = {"mode": "ANY", "allowedFunctionNames": [choice.name]}
        body["toolConfig"] = {"functionCallingConfig": calling}
    if "tool_choice" in request.own and not same:
        raise hub.Incapable(f"tool_choice {json.dumps(request.own['tool_choice'])[:80]}")


# ================================================================ answers and streams
# decode_answer / encode_answer / stream_decoder / stream_encoder.

# finishReason as the hub's stop: every filter is a refusal (chat's content_filter); a
# reason the hub has no word for (a malformed call, LANGUAGE, OTHER, ...) stays as given.
_FILTERED = ("SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "MODEL_ARMOR", "JAILBREAK")
FINISH_TO_STOP: Mapping[str, canon.Stop] = {
    "STOP": canon.Stop.END_TURN,
    "MAX_TOKENS": canon.Stop.MAX_TOKENS,
    **{r: canon.Stop.REFUSAL for r in (*_FILTERED, "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION")},
}
STOP_TO_FINISH: Mapping[canon.Stop, str] = {
    canon.Stop.END_TURN: "STOP",
    canon.Stop.STOP_SEQUENCE: "STOP",
    canon.Stop.TOOL_USE: "STOP",  # Gemini says STOP after its calls
    canon.Stop.PAUSE_TURN: "STOP",
    canon.Stop.MAX_TOKENS: "MAX_TOKENS",
    canon.Stop.CONTEXT_WINDOW: "MAX_TOKENS",
    canon.Stop.REFUSAL: "SAFETY",
}
# Every finishReason Google's SDK knows (google.genai.types.FinishReason): one of these that
# the hub has no word for is told to a Gemini caller as it was; any other reason as OTHER.
_FINISHES = frozenset(
    {
        *FINISH_TO_STOP,
        "FINISH_REASON_UNSPECIFIED",
        "LANGUAGE",
        "OTHER",
        "MALFORMED_FUNCTION_CALL",
        "IMAGE_OTHER",
        "NO_IMAGE",
        "UNEXPECTED_TOOL_CALL",
        "TOO_MANY_TOOL_CALLS",
        "MISSING_THOUGHT_SIGNATURE",
        "MALFORMED_RESPONSE",
    }
)


def _stop(finish: object, called: bool) -> tuple[canon.Stop | None, str | None]:
    """A finishReason as a stop reason (STOP after a call is the tool's turn), else None and
    the reason as given."""
    if not isinstance(finish, str):
        return None, None
    stop = FINISH_TO_STOP.get(finish)
    if stop is canon.Stop.END_TURN and called:
        return canon.Stop.TOOL_USE, None
    return stop, None if stop is not None else finish


def _finish(stop: canon.Stop | None, other: str | None) -> str:
    if stop is not None:
        return STOP_TO_FINISH[stop]
    if other is None:
        return "STOP"
    return other if other in _FINISHES else "OTHER"


def _object(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is an object, else an empty one."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def decode_usage(usage: object) -> canon.Usage | None:
    """usageMetadata as the hub's usage: the cached part out of the prompt; output is the
    candidates' tokens and the thoughts' (as OpenAI's and Anthropic's output counts reasoning)."""
    if not isinstance(usage, Mapping):
        return None
    prompt, cached = counts.count(usage.get("promptTokenCount")), counts.count(usage.get("cachedContentTokenCount"))
    answer, thoughts = counts.count(usage.get("candidatesTokenCount")), counts.count(usage.get("thoughtsTokenCount"))
    fresh = None if prompt is None else max(0, prompt - (cached or 0))
    output = None if answer is None and thoughts is None else (answer or 0) + (thoughts or 0)
    return canon.Usage(input=fresh, cache_read=cached, output=output, reasoning=thoughts)


def encode_usage(usage: canon.Usage) -> dict[str, Any]:
    """The hub's usage as usageMetadata (a count not told is left out)."""
    out: dict[str, Any] = {}
    output, thoughts = usage.output, usage.reasoning
    if usage.input is not None or usage.cache_read is not None or usage.cache_write is not None:
        out["promptTokenCount"] = usage.prompt
    if usage.cache_read:
        out["cachedContentTokenCount"] = usage.cache_read
    if output is not None:
        out["candidatesTokenCount"] = max(0, output - (thoughts or 0))
    if thoughts is not None:
        out["thoughtsTokenCount"] = thoughts
    if out:
        out["totalTokenCount"] = usage.prompt + (output or 0)
    return out


def _candidate(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    candidates = answer.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first if isinstance(first, Mapping) else None


def _parts_of(candidate: Mapping[str, Any] | None) -> list[Any]:
    parts = _object(candidate, "content").get("parts") if candidate is not None else None
    return parts if isinstance(parts, list) else []


def blocked(answer: Mapping[str, Any]) -> str | None:
    """Why the prompt was blocked (``promptFeedback.blockReason``), when it was and no
    candidate came: an answer that is a refusal, not an error."""
    reason = _object(answer, "promptFeedback").get("blockReason")
    return reason if isinstance(reason, str) and _candidate(answer) is None else None


def _answer_part(p: object, tag: str) -> canon.Part:
    """One part of an answer; a call without an id gets one (the answer's id and its place)."""
    if not isinstance(p, Mapping):
        return canon.Opaque(SOURCE, "part", {"part": p})
    text, call = p.get("text"), p.get("functionCall")
    if isinstance(text, str):
        if p.get("thought"):
            signature = p.get("thoughtSignature")
            return canon.Thinking(text, signature if isinstance(signature, str) else None)
        return canon.Text(text)
    if isinstance(call, Mapping):
        name, given = str(call.get("name", "")), call.get("args", {})
        given_id = call.get("id")
        return canon.ToolCall(
            given_id if isinstance(given_id, str) and given_id else _made_id(tag),
            name,
            json.dumps(given),
            given if isinstance(given, Mapping) else None,
        )
    return canon.Opaque(SOURCE, next(iter(p), "part"), p)


def decode_answer(answer: Mapping[str, Any]) -> canon.Answer:
    """A Gemini answer's first candidate in the hub's terms (a blocked prompt: no parts, a
    refusal). Raises :class:`~capmon.core.providers.hub.Incapable` for an answer with neither."""
    candidate = _candidate(answer)
    response_id = str(answer.get("responseId", ""))
    if candidate is None and blocked(answer) is None:
        raise hub.Incapable("a Gemini answer without a candidate")
    parts = tuple(_answer_part(p, f"{response_id[-8:]}x{i}") for i, p in enumerate(_parts_of(candidate)))
    stop: canon.Stop | None
    if candidate is None:
        stop, other = canon.Stop.REFUSAL, None
    else:
        stop, other = _stop(candidate.get("finishReason"), any(isinstance(p, canon.ToolCall) for p in parts))
    return canon.Answer(
        id=response_id,
        model=str(answer.get("modelVersion", "")),
        parts=parts,
        stop=stop,
        usage=decode_usage(answer.get("usageMetadata")),
        stop_other=other,
    )


def encode_part(part: canon.Part) -> dict[str, Any]:
    """One part of an answer as Gemini's. Left out: citations (Gemini's own are the
    candidate's citationMetadata, with offsets no other format gives) and a thought's
    signature (another model's, which no Gemini model reads; a Gemini answer never crosses
    to a Gemini caller)."""
    if isinstance(part, canon.Text):
        return {"text": part.text}
    if isinstance(part, canon.ToolCall):
        return {"functionCall": {"id": part.id, "name": part.name, "args": hub.call_input(part, "the answer")}}
    if isinstance(part, canon.Thinking) and not part.redacted:
        return {"text": part.text, "thought": True}
    if isinstance(part, canon.Opaque) and part.format == SOURCE:
        return dict(part.raw)
    raise hub.Incapable(f"a {hub.part_kind(part)} part in an answer (Gemini answers carry text, calls and thoughts)")


def encode_answer(answer: canon.Answer, *, created: int) -> dict[str, Any]:
    """The hub's answer as a Gemini one (``created``: Gemini's answers carry no time).
    Raises :class:`~capmon.core.providers.hub.Incapable` for a call whose arguments are no
    JSON object."""
    candidate = {
        "content": {"role": "model", "parts": [encode_part(p) for p in answer.parts]},
        "finishReason": _finish(answer.stop, answer.stop_other),
        "index": 0,
    }
    out: dict[str, Any] = {"candidates": [candidate], "modelVersion": answer.model, "responseId": answer.id}
    if answer.usage is not None:
        out["usageMetadata"] = encode_usage(answer.usage)
    return out


class _Decoder:
    """Gemini chunks in, the hub's events out: a part per run of text (or of thought text),
    a call whole (its start, its arguments, its stop), the end at the chunk with a
    finishReason (or a blocked prompt's)."""

    def __init__(self) -> None:
        self._started = False
        self._ended = False
        self._index = -1
        self._open: str | None = None  # "text" or "thought": the open part's kind
        self._called = False
        self._id = ""

    def _stop_open(self) -> list[canon.Event]:
        if self._open is None:
            return []
        self._open = None
        return [canon.PartStopped(self._index)]

    def _start(self, part: canon.Part) -> list[canon.Event]:
        out = self._stop_open()
        self._index += 1
        return [*out, canon.PartStarted(self._index, part)]

    def feed(self, chunk: Mapping[str, Any]) -> list[canon.Event]:
        if self._ended:
            return []
        out: list[canon.Event] = []
        usage = decode_usage(chunk.get("usageMetadata"))
        if not self._started:
            self._started = True
            self._id = str(chunk.get("responseId", ""))
            opening = None if usage is None else dataclasses.replace(usage, output=None, reasoning=None)
            out.append(canon.Started(self._id, str(chunk.get("modelVersion", "")), opening))
        candidate = _candidate(chunk)
        if candidate is None:
            if blocked(chunk) is not None:
                self._ended = True
                out += [canon.Ended(canon.Stop.REFUSAL, usage), canon.Done()]
            return out
        for p in _parts_of(candidate):
            out += self._part(p)
        finish = candidate.get("finishReason")
        if finish:
            self._ended = True
            stop, other = _stop(finish, self._called)
            out += [*self._stop_open(), canon.Ended(stop, usage, None, other), canon.Done()]
        return out

    def _part(self, p: object) -> list[canon.Event]:
        part = _answer_part(p, f"{self._id[-8:]}x{self._index + 1}")
        out: list[canon.Event] = []
        if isinstance(part, (canon.Text, canon.Thinking)):
            kind = "thought" if isinstance(part, canon.Thinking) else "text"
            if self._open != kind:
                if not part.text and kind == "text":
                    return []  # the empty text of a last chunk starts nothing
                out += self._start(canon.Thinking("") if kind == "thought" else canon.Text(""))
                self._open = kind
            if part.text:
                out.append(canon.PartDelta(self._index, text=part.text))
            if isinstance(part, canon.Thinking) and part.signature is not None:
                out.append(canon.PartDelta(self._index, signature=part.signature))
            return out
        if isinstance(part, canon.ToolCall):
            self._called = True
            out += self._start(dataclasses.replace(part, arguments="", input=None))
            out += [canon.PartDelta(self._index, arguments=part.arguments), canon.PartStopped(self._index)]
            return out
        return [*self._start(part), canon.PartStopped(self._index)]

    def close(self) -> list[canon.Event]:
        return []  # the end is the chunk with a finishReason


def stream_decoder() -> hub.StreamDecoder:
    return _Decoder()


class _Encoder:
    """The hub's events in, Gemini chunks out: each piece of text its chunk, a call whole in
    one when it stops, the finishReason and the usage in the last (at ``Done``)."""

    def __init__(self) -> None:
        self._id = ""
        self._model = ""
        self._parts: dict[int, canon.Part] = {}
        self._args: dict[int, list[str]] = {}
        self._stop: canon.Stop | None = None
        self._other: str | None = None
        self._usage: canon.Usage | None = None

    def _chunk(self, parts: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        candidate = {"content": {"role": "model", "parts": parts}, **more, "index": 0}
        return {"candidates": [candidate], "modelVersion": self._model, "responseId": self._id}

    def feed(self, event: canon.Event) -> list[dict[str, Any]]:
        if isinstance(event, canon.Started):
            self._id, self._model, self._usage = event.id, event.model, event.usage
            return []
        if isinstance(event, canon.PartStarted):
            part = self._parts[event.index] = event.part
            if isinstance(part, canon.ToolCall):  # its arguments come in deltas (a start's are its first state)
                self._args[event.index] = []
                return []
            if isinstance(part, (canon.Text, canon.Thinking)) and not getattr(part, "redacted", False):
                return [self._chunk([encode_part(part)])] if part.text else []
            return [self._chunk([encode_part(part)])]
        if isinstance(event, canon.PartDelta):
            return self._delta(event)
        if isinstance(event, canon.PartStopped):
            started = self._parts.get(event.index)
            if not isinstance(started, canon.ToolCall):
                return []
            pieces = self._args.pop(event.index, [])
            if not pieces and started.input is not None:  # no deltas: the call is as it started
                pieces = [json.dumps(started.input)]
            arguments = "".join(pieces)
            call = canon.ToolCall(started.id, started.name, arguments, _parsed_object(arguments))
            return [self._chunk([encode_part(call)])]
        if isinstance(event, canon.Ended):
            if event.stop is not None or event.stop_other is not None:
                self._stop, self._other = event.stop, event.stop_other
            if event.usage is not None:
                self._usage = event.usage if self._usage is None else self._usage.merged(event.usage)
            return []
        if isinstance(event, canon.Done):
            last = self._chunk([{"text": ""}], finishReason=_finish(self._stop, self._other))
            if self._usage is not None:
                last["usageMetadata"] = encode_usage(self._usage)
            return [last]
        return []

    def _delta(self, event: canon.PartDelta) -> list[dict[str, Any]]:
        part = self._parts.get(event.index)
        if event.arguments is not None and event.index in self._args:
            self._args[event.index].append(event.arguments)
        thought = isinstance(part, canon.Thinking)
        pieces: list[dict[str, Any]] = []
        if event.text:
            pieces.append({"text": event.text, "thought": True} if thought else {"text": event.text})
        return [self._chunk(pieces)] if pieces else []


def _parsed_object(arguments: str) -> Mapping[str, Any] | None:
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def stream_encoder(*, created: int, include_usage: bool) -> hub.StreamEncoder:
    """``created`` and ``include_usage``: Gemini's chunks carry no time and always their usage."""
    return _Encoder()


def answer_stream(answer: Mapping[str, Any], *, created: int, include_usage: bool) -> list[dict[str, Any]]:
    """A whole answer as this format's stream (a plain answer to a stream request), through the hub."""
    return hub.told(decode_answer(answer), stream_encoder(created=created, include_usage=include_usage))


# ================================================================ reading and probing
# What a target sends in this format, read: a plain answer, its text and used tokens, a stream's
# frames (frames.Event; an error inside the stream classified like the HTTP error it names) and
# the answer they assemble into; and what an attempt sends in it: the probe and the body (the
# fields capmon owns). The framing of Google's streams is google_sse.py's.

_CHUNK_KEYS = frozenset({"candidates", "usageMetadata", "promptFeedback", "modelVersion", "responseId"})


def parse(status: int, body: bytes | str | None) -> Mapping[str, Any] | None:
    """A plain answer (a candidate, or a blocked prompt's feedback), or None: the classifier
    says what it is. Never raises."""
    parsed = hub.success_json(status, body)
    if isinstance(parsed, Mapping) and "error" not in parsed and (_candidate(parsed) or blocked(parsed)):
        return parsed
    return None


def unfinished(status: int, headers: Any, body: bytes, *, now: float, quota_hint: float) -> Failure | None:
    """A 2xx that is no answer: the classifier says what it is (None)."""
    return None


def _text_of(candidate: Mapping[str, Any] | None) -> str:
    return "".join(
        p["text"]
        for p in _parts_of(candidate)
        if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought")
    )


def text(response: Mapping[str, Any]) -> str:
    """The answer's text: its first candidate's text parts (thoughts aside), in order."""
    return _text_of(_candidate(response))


def used_tokens(response: Mapping[str, Any] | None) -> int | None:
    """The tokens the answer says it used (``usageMetadata.totalTokenCount``)."""
    usage = (response or {}).get("usageMetadata")
    return counts.count(usage.get("totalTokenCount")) if isinstance(usage, Mapping) else None


def chunk_text(chunk: Mapping[str, Any]) -> str:
    """The text a chunk adds (its first candidate's text parts; "" when none)."""
    return _text_of(_candidate(chunk))


def generation_body(extra: Mapping[str, Any], *, max_tokens: int) -> dict[str, Any]:
    """A Gemini body: the caller's fields untouched but the token cap and one candidate,
    which capmon owns (and no ``model`` or ``stream``: the URL says both)."""
    extra = json_names(extra)
    body = {k: v for k, v in extra.items() if k not in ("model", "stream")}
    config = extra.get("generationConfig")
    body["generationConfig"] = {**(config if isinstance(config, Mapping) else {}), "maxOutputTokens": max_tokens}
    body["generationConfig"]["candidateCount"] = 1
    return body


def probe_body(model: str, token_param: TokenParam) -> dict[str, Any]:
    """The smallest Gemini request: one token of output (``model`` is the URL's)."""
    return generation_body({"contents": [{"role": "user", "parts": [{"text": "ping"}]}]}, max_tokens=1)


def _has_output(candidate: Mapping[str, Any]) -> bool:
    if candidate.get("finishReason"):
        return True
    return any(
        isinstance(p, Mapping) and (p.get("text") or "functionCall" in p or p.get("thoughtSignature"))
        for p in _parts_of(candidate)
    )


def read_frame(frame: Frame, *, now: float | None = None, quota_hint: float = QUOTA_HINT) -> Event:
    """What one frame of a Gemini stream is. Never raises.

    A chunk is a CHUNK (output when it carries text, a call or the finishReason); an
    ``error`` (in a ``data:`` frame, or the raw object google_sse.py reads) is an error
    classified like the HTTP error its ``code`` names; a blocked prompt's chunk is the
    answer's end (a refusal, not an error); anything else is garbage.
    """
    data = frame.data.strip()
    if not data:
        return Event(FrameKind.IGNORE)
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return Event(
            FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream chunk (not JSON)", 200)
        )
    if isinstance(obj, list) and any(isinstance(x, Mapping) and "error" in x for x in obj[:4]):
        return Event(FrameKind.ERROR, failure=classify_event(obj, frame.event, now=now, quota_hint=quota_hint))
    if isinstance(obj, dict) and "error" in obj:
        return Event(FrameKind.ERROR, failure=classify_event(obj, frame.event, now=now, quota_hint=quota_hint))
    if not isinstance(obj, dict) or not _CHUNK_KEYS.intersection(obj):
        return Event(
            FrameKind.BROKEN, failure=Failure(Kind.TRANSIENT, "200 with a broken stream chunk (no chunk)", 200)
        )
    candidate = _candidate(obj)
    output = blocked(obj) is not None if candidate is None else _has_output(candidate)
    return Event(FrameKind.CHUNK, chunk=obj, output=output)


# A candidate's fields besides its content that the last chunk with one says.
_CANDIDATE_KEYS = ("safetyRatings", "citationMetadata", "groundingMetadata", "finishMessage", "avgLogprobs")


class Assembled:
    """A Gemini stream's chunks put together into the plain answer: text pieces joined into
    one part per run (thoughts apart), calls as they came, the finishReason, the last usage;
    whole at the chunk with a finishReason (or a blocked prompt's)."""

    def __init__(self) -> None:
        self.finished = False
        self._head: dict[str, Any] = {}
        self._parts: list[dict[str, Any]] = []
        self._candidate: dict[str, Any] = {}
        self._usage: Mapping[str, Any] | None = None
        self._feedback: Mapping[str, Any] | None = None

    def add(self, chunk: Mapping[str, Any], done: bool) -> None:
        for key in ("responseId", "modelVersion", "createTime"):
            if key in chunk:
                self._head[key] = chunk[key]
        if isinstance(chunk.get("usageMetadata"), Mapping):
            self._usage = chunk["usageMetadata"]  # each chunk's counts are the whole answer's so far
        if isinstance(chunk.get("promptFeedback"), Mapping):
            self._feedback = chunk["promptFeedback"]
        candidate = _candidate(chunk)
        if candidate is None:
            self.finished = self.finished or blocked(chunk) is not None
            return
        for p in _parts_of(candidate):
            if isinstance(p, Mapping):
                self._add_part(p)
        for key in _CANDIDATE_KEYS:
            if key in candidate:
                self._candidate[key] = candidate[key]
        if candidate.get("finishReason"):
            self._candidate["finishReason"] = candidate["finishReason"]
            self.finished = True

    def _add_part(self, p: Mapping[str, Any]) -> None:
        last = self._parts[-1] if self._parts else None
        piece = p.get("text")
        if (
            isinstance(piece, str)
            and last is not None
            and isinstance(last.get("text"), str)
            and bool(last.get("thought")) == bool(p.get("thought"))
            and set(p) <= {"text", "thought", "thoughtSignature"}
        ):
            last["text"] += piece
            if "thoughtSignature" in p:
                last["thoughtSignature"] = p["thoughtSignature"]
        elif not (piece == "" and set(p) == {"text"}):
            self._parts.append(dict(p))

    def answer(self) -> Mapping[str, Any] | None:
        out: dict[str, Any] = {}
        if self._parts or self._candidate or self._feedback is None:
            content = {"role": "model", "parts": self._parts}
            out["candidates"] = [{"content": content, **self._candidate, "index": 0}]
        if self._feedback is not None:
            out["promptFeedback"] = self._feedback
        if self._usage is not None:
            out["usageMetadata"] = self._usage
        return {**out, **self._head}


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
    """A Gemini body: the caller's fields untouched, or a translated request's; the cap as
    ``generationConfig.maxOutputTokens`` and one candidate (Gemini has one token
    parameter). ``model`` and ``stream`` are the URL's (the dialect's), not the body's."""
    return generation_body(request.extra if translated is None else translated, max_tokens=limit)


def refused_token_param(failure: Failure, sent: TokenParam) -> bool:
    """Never: Gemini has one token cap (``maxOutputTokens``), nothing to relearn."""
    return False


def tool_calls(answer: Mapping[str, Any]) -> Iterator[tuple[object, object, str]]:
    """Each ``functionCall`` of the first candidate: its name, id and arguments as JSON text
    (``args`` that are an object count as whole: "")."""
    for p in _parts_of(_candidate(answer)):
        call = p.get("functionCall") if isinstance(p, Mapping) else None
        if isinstance(call, Mapping):
            given = call.get("args")
            yield (
                call.get("name"),
                call.get("id"),
                "" if given is None or isinstance(given, Mapping) else json.dumps(given),
            )


class _Calls:
    """The calls of a Gemini stream: each comes whole in one chunk (checked there), and the
    chunk with a finishReason (or a blocked prompt's) is the last."""

    @staticmethod
    def last(chunk: Mapping[str, Any]) -> bool:
        candidate = _candidate(chunk)
        return bool(candidate.get("finishReason")) if candidate is not None else blocked(chunk) is not None

    @staticmethod
    def feed(chunk: Mapping[str, Any]) -> None:
        for name, call_id, arguments in tool_calls(chunk):
            hub.check_call(name, call_id, arguments)

    @staticmethod
    def end() -> None:
        return None  # no call is ever open between chunks


def call_watcher() -> hub.CallWatcher:
    return _Calls()


# ================================================================ continuing a broken answer
# continued / splicer: a broken stream's continuation in this format (capmon/core/routing/continuation.py).


def continued(request: Request, partial: str, instruction: str | None) -> Request:
    """``request`` with the partial answer ``partial`` as the model's last turn, and a user
    turn ``instruction`` after it (None: none)."""
    said: list[dict[str, Any]] = [{"role": "model", "parts": [{"text": partial}]}]
    if instruction is not None:
        said.append({"role": "user", "parts": [{"text": instruction}]})
    return hub.appended(request, "contents", said)


@dataclass
class GeminiSplice(splice.Splice):
    """Gemini chunks: a continuation's chunks take the first answer's responseId, its text
    goes on (the prefill's whitespace not said twice), the last chunk says who continued it
    and its usage counts every request."""

    id: Any = None

    def sent(self, chunk: Mapping[str, Any]) -> None:
        if self.id is None:
            self.id = chunk.get("responseId")
        for p in _parts_of(_candidate(chunk)):
            if not isinstance(p, Mapping):
                continue
            if isinstance(p.get("text"), str) and not p.get("thought"):
                self.text.append(p["text"])
            elif "functionCall" in p:
                self.other = True  # a whole call reached the caller

    def fit(self, chunk: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        out = dict(chunk)
        if self.id is not None and "responseId" in out:
            out["responseId"] = self.id
        candidate = _candidate(out)
        if candidate is not None:
            fitted = []
            for p in _parts_of(candidate):
                if isinstance(p, Mapping) and isinstance(p.get("text"), str) and not p.get("thought"):
                    piece = self._text(p["text"])
                    if piece:
                        fitted.append({**p, "text": piece})
                else:
                    fitted.append(p)
            ends = bool(candidate.get("finishReason"))
            if not fitted and not ends and "usageMetadata" not in out:
                return []
            content = {**_object(candidate, "content"), "parts": fitted}
            out["candidates"] = [{**candidate, "content": content}, *out["candidates"][1:]]
            if ends:
                out[splice.FIELD] = self.said()
        usage = out.get("usageMetadata")
        if isinstance(usage, Mapping):
            more = (("promptTokenCount", self.earlier_in), ("candidatesTokenCount", self.earlier_out))
            out["usageMetadata"] = splice.add_usage(
                usage, (*more, ("totalTokenCount", self.earlier_in + self.earlier_out))
            )
        return [out]


def splicer(prompt: int) -> splice.Splice:
    """The splice of one streamed request in this format (``prompt``: its estimated tokens)."""
    return GeminiSplice(prompt)


def takes_prefill() -> bool:
    return False  # Gemini answers a conversation that ends with the model's turn anew
