"""Tool calls: read a request's ``tools`` and ``tool_choice`` (chat's, the Responses API's,
Anthropic's or Gemini's shape, into one :class:`ToolRequest`), decide whether the answer is a call,
and build its arguments from the function's JSON Schema so that they are valid JSON a
client can parse and check against that schema.

Under ``tool_choice: "auto"`` the conversation's last turn decides, deterministically, so
that a client's tool loop (Codex's ``exec_command`` / ``shell``, Claude Code's ``Bash``) runs
end to end. The last turn is what came after the model last spoke (:func:`closing_turn`),
system and developer messages left out: they instruct the model, they are nobody's turn
(Claude Code ends its conversation with one, an agent list, after the user's words). Then:
- a tool's result in it (chat's ``tool`` message, the Responses API's
  ``function_call_output``, Anthropic's ``tool_result``) is answered in text that quotes
  it, whatever user text came with it: the loop ends;
- else its last user message: one that names one of the tools (its whole name, any case)
  calls that tool; one with one of :data:`ASKING_WORDS` calls the first tool that takes a
  ``command`` or ``cmd``, else the first tool;
- anything else (no user message after the model's: a prefill) is answered in text.

Pure: no web framework. A bad ``tools`` or ``tool_choice`` raises :class:`ToolError`
with the parameter to name in the 400.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

MAX_SCHEMA_DEPTH = 8  # deeper schemas get {} there: a request cannot make the answer explode
# Words of a user message that ask for a tool under tool_choice "auto" (whole words, any case).
ASKING_WORDS = frozenset({"run", "execute", "call", "tool", "tools", "command", "shell"})
# Properties that hold a command to run: a call fills them with one that works in any shell.
COMMAND_PROPERTIES = ("command", "cmd")
EXAMPLE_COMMAND = ("echo", "hello")


class ToolError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: Any  # the function's JSON Schema (an object schema, usually)


@dataclass(frozen=True)
class LastTurn:
    """What a conversation ends with: the user's words, or a tool's result."""

    text: str
    is_tool_result: bool = False

    @property
    def tool_result(self) -> str | None:
        return self.text if self.is_tool_result else None


class Voice(Enum):
    """Who a message of a conversation speaks for, as the tool rule reads it."""

    USER = "user"  # the user's words
    RESULT = "result"  # a tool's result
    MODEL = "model"  # the model's own turn: its answer, its calls, its reasoning
    ASIDE = "aside"  # system and developer messages: instructions, nobody's turn


def closing_turn(backwards: Iterable[tuple[Voice, Any]]) -> LastTurn | None:
    """The turn a conversation ends with, from its messages read from the last (each its
    voice and its content): what came after the model last spoke, asides left out. Any
    tool result in it makes it the results' turn; else it is its last user message's; None
    when nothing came after the model's message (or the conversation is empty)."""
    results: list[Any] = []
    words: list[Any] = []  # the user messages' contents, the last first
    for voice, content in backwards:
        if voice is Voice.MODEL:
            break
        if voice is Voice.RESULT:
            results.append(content)
        elif voice is Voice.USER:
            words.append(content)
    if results:
        return LastTurn(text_of(results[::-1]), is_tool_result=True)
    return LastTurn(text_of(words[0])) if words else None


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "function" (then `name`)
    name: str | None = None

    def wants_call(self, mode: str, turn: LastTurn | None = None) -> Tool | None:
        """The tool to call under the model's ``tools`` mode ("auto" | "always") after
        ``turn``, or None (see the module's docstring for the rule)."""
        if not self.tools or self.choice == "none":
            return None
        if self.choice == "function":
            return next(t for t in self.tools if t.name == self.name)
        asked = self.asked_for(turn)
        if self.choice == "required" or mode == "always":
            return asked or self.tools[0]
        return asked

    def asked_for(self, turn: LastTurn | None) -> Tool | None:
        if turn is None or turn.is_tool_result:
            return None
        for tool in self.tools:
            if re.search(rf"(?<![\w-]){re.escape(tool.name)}(?![\w-])", turn.text, re.IGNORECASE):
                return tool
        if ASKING_WORDS.isdisjoint(re.findall(r"[a-z]+", turn.text.lower())):
            return None
        return next((t for t in self.tools if _takes_command(t)), self.tools[0])


def _takes_command(tool: Tool) -> bool:
    props = tool.parameters.get("properties") if isinstance(tool.parameters, dict) else None
    return isinstance(props, dict) and any(name in props for name in COMMAND_PROPERTIES)


def text_of(content: Any) -> str:
    """The text of a message's content: a string, or a list of parts / blocks with ``text``
    (a tool result's nested ``content`` or ``output`` included)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(t for t in (text_of(part) for part in content) if t)
    if isinstance(content, dict):
        for key in ("text", "content", "output"):
            if key in content:
                return text_of(content[key])
    return ""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the API carries it


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The request's tools, or None when it has none. Raises ToolError."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw is None:
        if choice is not None and choice != "none":
            raise ToolError(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                "tool_choice",
            )
        return None
    if not isinstance(raw, list):
        raise ToolError(f"Invalid type for 'tools': expected an array, but got {type(raw).__name__} instead.", "tools")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        fn = item.get("function") if isinstance(item, dict) and item.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolError(
                f'Invalid \'tools[{i}]\': expected {{"type": "function", "function": '
                f'{{"name": ..., "parameters": {{...}}}}}}.',
                f"tools[{i}]",
            )
        assert isinstance(fn, dict)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(
                f"Invalid 'tools[{i}].function.parameters': expected an object.", f"tools[{i}].function.parameters"
            )
        tools.append(Tool(name, params))
    names = {t.name for t in tools}
    if choice is None or choice in ("none", "auto", "required"):
        return ToolRequest(tuple(tools), choice or "auto")
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise ToolError(f"Invalid value for 'tool_choice': no function named {name!r} in 'tools'.", "tool_choice")
        return ToolRequest(tuple(tools), "function", name)
    raise ToolError(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}.',
        "tool_choice",
    )


# Anthropic's tool_choice types -> the ToolRequest choice they mean.
_ANTHROPIC_CHOICES = {"auto": "auto", "any": "required", "none": "none", "tool": "function"}


def parse_anthropic_tools(body: dict[str, Any]) -> ToolRequest | None:
    """Anthropic's ``tools`` (``{"name", "input_schema", ...}``; server tools, which carry a
    ``type`` of their own, are never called by the simulator) and ``tool_choice``
    (``{"type": "auto" | "any" | "none" | "tool", "name"?}``). Raises ToolError."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ToolError("tools: Input should be a valid list", "tools")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ToolError(f"tools.{i}.name: Field required", f"tools.{i}")
        if item.get("type") not in (None, "custom"):
            continue
        schema = item.get("input_schema")
        if not isinstance(schema, dict):
            raise ToolError(f"tools.{i}.custom.input_schema: Field required", f"tools.{i}.input_schema")
        tools.append(Tool(item["name"], schema))
    if choice is None:
        return ToolRequest(tuple(tools), "auto")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in _ANTHROPIC_CHOICES:
        raise ToolError("tool_choice: Input tag does not match any of 'auto', 'any', 'tool', 'none'", "tool_choice")
    assert isinstance(choice, dict)
    if kind != "tool":
        return ToolRequest(tuple(tools), _ANTHROPIC_CHOICES[kind])
    name = choice.get("name")
    if name not in {t.name for t in tools}:
        raise ToolError(f"tool_choice: no tool named {name!r} in tools", "tool_choice")
    return ToolRequest(tuple(tools), "function", name)


def parse_response_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The Responses API's ``tools`` (``{"type": "function", "name", "parameters", ...}``;
    hosted and custom tools, such as web_search or Codex's apply_patch, are never called by
    the simulator) and ``tool_choice`` ("none" | "auto" | "required" |
    ``{"type": "function", "name"}``; a hosted tool's or ``allowed_tools`` counts as "auto").
    Raises ToolError."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ToolError(f"Invalid type for 'tools': expected an array, but got {type(raw).__name__} instead.", "tools")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise ToolError(f"Invalid 'tools[{i}]': expected an object with a 'type'.", f"tools[{i}]")
        if item["type"] != "function":
            continue
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name")
        params = item.get("parameters")
        params = {"type": "object", "properties": {}} if params is None else params
        if not isinstance(params, dict):
            raise ToolError(f"Invalid 'tools[{i}].parameters': expected an object.", f"tools[{i}].parameters")
        tools.append(Tool(name, params))
    if choice is None or choice in ("none", "auto", "required"):
        return ToolRequest(tuple(tools), choice or "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if name not in {t.name for t in tools}:
            raise ToolError(f"Invalid value for 'tool_choice': no function named {name!r} in 'tools'.", "tool_choice")
        return ToolRequest(tuple(tools), "function", name)
    if isinstance(choice, dict) and isinstance(choice.get("type"), str):
        return ToolRequest(tuple(tools), "auto")
    raise ToolError(
        "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or an object with a 'type'.",
        "tool_choice",
    )


# Gemini's functionCallingConfig.mode -> the ToolRequest choice it means (VALIDATED calls only
# declared functions, with valid arguments: the simulator's calls always are).
_GEMINI_MODES = {"MODE_UNSPECIFIED": "auto", "AUTO": "auto", "ANY": "required", "NONE": "none", "VALIDATED": "auto"}


def parse_gemini_tools(body: dict[str, Any]) -> ToolRequest | None:
    """Gemini's ``tools`` (``[{"functionDeclarations": [{"name", "parameters" |
    "parametersJsonSchema"}]}]``, its schemas' upper-case types read as JSON Schema's; built-in
    tools such as googleSearch are never called by the simulator) and
    ``toolConfig.functionCallingConfig`` (``mode`` AUTO | ANY | NONE | VALIDATED;
    ``allowedFunctionNames`` narrows ANY to those, one name calls that one). Raises ToolError."""
    raw = body.get("tools")
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ToolError("Invalid value at 'tools': expected a list of Tool objects.", "tools")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        declarations = item.get("functionDeclarations", []) if isinstance(item, dict) else None
        if not isinstance(declarations, list):
            raise ToolError(f"Invalid value at 'tools[{i}]': expected a Tool object.", f"tools[{i}]")
        for j, fn in enumerate(declarations):
            where = f"tools[{i}].function_declarations[{j}]"
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str) or not name:
                raise ToolError(f"* GenerateContentRequest.{where}.name: Name cannot be empty.", where)
            assert isinstance(fn, dict)
            schema = fn.get("parametersJsonSchema", fn.get("parameters", {"type": "object", "properties": {}}))
            if not isinstance(schema, dict):
                raise ToolError(f"Invalid value at '{where}.parameters': expected a Schema object.", where)
            tools.append(Tool(name, gemini_schema(schema)))
    config = body.get("toolConfig")
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    calling = calling if isinstance(calling, dict) else {}
    mode = calling.get("mode", "AUTO")
    if mode not in _GEMINI_MODES:
        raise ToolError(
            f"Invalid value at 'tool_config.function_calling_config.mode' ({mode!r}): expected one of "
            f"{', '.join(_GEMINI_MODES)}.",
            "toolConfig",
        )
    allowed = calling.get("allowedFunctionNames")
    if allowed and mode == "ANY":
        if not isinstance(allowed, list) or not set(allowed) <= {t.name for t in tools}:
            raise ToolError(
                "* GenerateContentRequest.tool_config.function_calling_config.allowed_function_names: "
                "every name must be a declared function.",
                "toolConfig",
            )
        if len(allowed) == 1:
            return ToolRequest(tuple(tools), "function", allowed[0])
        tools = [t for t in tools if t.name in allowed]
    return ToolRequest(tuple(tools), _GEMINI_MODES[mode])


_CONVERSE_CHOICES = {"auto": "auto", "any": "required", "tool": "function"}


def parse_converse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """Bedrock Converse's ``toolConfig``: ``tools`` (``[{"toolSpec": {"name", "description"?,
    "inputSchema": {"json": schema}}}]``; cache points and system tools are never called by
    the simulator) and ``toolChoice`` (one of ``{"auto": {}}``, ``{"any": {}}``, ``{"tool":
    {"name"}}``). Raises ToolError with ValidationException's wording."""
    config = body.get("toolConfig")
    if config is None:
        return None
    raw = config.get("tools") if isinstance(config, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ToolError("The value at toolConfig.tools must be a non-empty list of tools.", "toolConfig.tools")
    assert isinstance(config, dict)
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        spec = item.get("toolSpec") if isinstance(item, dict) else None
        if spec is None and isinstance(item, dict) and item:
            continue  # a cachePoint or a system tool
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolError(f"The value at toolConfig.tools.{i}.toolSpec.name must be a tool name.", "toolConfig")
        assert isinstance(spec, dict)
        schema = spec.get("inputSchema")
        if not isinstance(schema, dict) or not isinstance(schema.get("json"), dict):
            raise ToolError(
                f"The value at toolConfig.tools.{i}.toolSpec.inputSchema must hold a JSON schema in json.", "toolConfig"
            )
        tools.append(Tool(name, schema["json"]))
    choice = config.get("toolChoice")
    if choice is None:
        return ToolRequest(tuple(tools), "auto")
    kinds = list(choice) if isinstance(choice, dict) else []
    if len(kinds) != 1 or kinds[0] not in _CONVERSE_CHOICES:
        raise ToolError("The value at toolConfig.toolChoice must be exactly one of auto, any or tool.", "toolConfig")
    assert isinstance(choice, dict)
    if kinds[0] != "tool":
        return ToolRequest(tuple(tools), _CONVERSE_CHOICES[kinds[0]])
    named = choice["tool"]
    name = named.get("name") if isinstance(named, dict) else None
    if name not in {t.name for t in tools}:
        raise ToolError(f"The tool {name!r} named in toolConfig.toolChoice is not in toolConfig.tools.", "toolConfig")
    return ToolRequest(tuple(tools), "function", name)


# Gemini's Schema keeps its integer bounds as int64, which proto JSON writes as strings ("1").
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")


def gemini_schema(schema: Any, depth: int = 0) -> Any:
    """A Gemini Schema (OpenAPI's subset: ``"type": "OBJECT"``, ``nullable``, int64 bounds as
    strings) as JSON Schema (``"object"``, ``["string", "null"]``, numbers), its fields under
    their JSON names already (capmon/core/providers/gemini_format.py ``json_names``)."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return schema
    out = dict(schema)
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
        if out.pop("nullable", False) is True:
            out["type"] = [out["type"], "null"]
    for key in _COUNTS:
        if isinstance(out.get(key), str) and out[key].isdigit():
            out[key] = int(out[key])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {n: gemini_schema(p, depth + 1) for n, p in out["properties"].items()}
    if "items" in out:
        out["items"] = gemini_schema(out["items"], depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [gemini_schema(b, depth + 1) for b in out[key]]
    return out


def make_call(tool: Tool, prefix: str = "call_") -> ToolCall:
    """A call of ``tool`` with arguments valid against its schema; ``prefix`` starts its id
    (OpenAI's ``call_``, Anthropic's ``toolu_``)."""
    arguments = json.dumps(example_value(tool.parameters), separators=(",", ":"))
    return ToolCall(id=f"{prefix}{secrets.token_hex(12)}", name=tool.name, arguments=arguments)


def _any_call(tools: ToolRequest | None, turn: LastTurn | None) -> Tool | None:
    return tools.wants_call("always", turn) if tools is not None else None


def may_call(tools: ToolRequest | None, turn: LastTurn | None) -> bool:
    """The request may be answered with a call of one of its tools (``tool_choice`` is not "none")."""
    return _any_call(tools, turn) is not None


def broken_call(tools: ToolRequest | None, turn: LastTurn | None, prefix: str = "call_") -> ToolCall | None:
    """The call a ``broken_tool_args`` fault answers with: the tool the request would call
    if the model always called one (None when it may call none), its arguments cut halfway.
    A proper prefix of a JSON object is never JSON, so the arguments are never whole."""
    tool = _any_call(tools, turn)
    if tool is None:
        return None
    call = make_call(tool, prefix)
    return dataclasses.replace(call, arguments=call.arguments[: len(call.arguments) // 2])


# Strings of the common JSON Schema formats (a client's model may parse them: a date, a UUID).
_FORMATS = {
    "date-time": "2025-01-01T00:00:00Z",
    "date": "2025-01-01",
    "time": "00:00:00Z",
    "duration": "PT1S",
    "email": "user@example.com",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
    "ipv6": "2001:db8::1",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
}


def example_value(
    schema: Any, depth: int = 0, name: str | None = None, *, root: Any = None, prefer: str | None = None
) -> Any:
    """A value that satisfies the common JSON Schema keywords of ``schema``: const, enum,
    default, type (object / array / string / integer / number / boolean / null, with
    their bounds, in any case: Gemini's are capitals; a string's common ``format``), the
    first branch of anyOf / oneOf / allOf, and ``$ref`` into ``root``'s ``$defs`` (``root``:
    the whole schema, ``schema`` itself at the top). An object has its required properties
    (all of them when none is required), in ``propertyOrdering``'s order when it has one.
    ``name``, the property that holds the value: a command (:data:`COMMAND_PROPERTIES`) gets
    one a shell can run. ``prefer``: a string an ``enum`` answers with when it holds it
    (a classify prompt's label, capmon/sim/labels.py)."""
    if root is None:
        root = schema
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return {}

    def inner(sub: Any, key: str | None = None) -> Any:
        return example_value(sub, depth + 1, key, root=root, prefer=prefer)

    if isinstance(schema.get("$ref"), str):
        return inner(_resolve(root, schema["$ref"]), name)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return prefer if prefer is not None and prefer in schema["enum"] else schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return inner(branches[0], name)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    kind = kind.lower() if isinstance(kind, str) else kind
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        names = [n for n in required if n in props] if isinstance(required, list) and required else list(props)
        order = schema.get("propertyOrdering")
        if isinstance(order, list):
            names.sort(key=lambda n: order.index(n) if n in order else len(order))
        return {str(n): inner(props[n], str(n)) for n in names}
    command = name in COMMAND_PROPERTIES
    if kind == "array":
        count = schema.get("minItems", 1)
        count = count if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 8 else 1
        items = schema.get("items", {"type": "string"})
        if command and _plain_string(items) and _fits(schema, "maxItems", len(EXAMPLE_COMMAND)):
            return [*EXAMPLE_COMMAND, *[EXAMPLE_COMMAND[-1]] * (count - len(EXAMPLE_COMMAND))]
        return [inner(items) for _ in range(count)]
    if kind == "integer":
        return _bounded(schema, 1, whole=True)
    if kind == "number":
        return _bounded(schema, 1.5, whole=False)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    text = " ".join(EXAMPLE_COMMAND) if command else _FORMATS.get(str(schema.get("format")), "sample")
    low = schema.get("minLength")
    if isinstance(low, int) and not isinstance(low, bool) and 0 <= low <= 1024:
        text = text.ljust(low, "x")
    high = schema.get("maxLength")
    if isinstance(high, int) and not isinstance(high, bool) and 0 <= high < len(text):
        text = text[:high]
    return text


def _resolve(root: Any, ref: str) -> Any:
    """The schema a local ``$ref`` (``#``, ``#/$defs/Name``, ``#/definitions/Name``) points
    at in ``root``; None (which answers ``{}``) for any other."""
    if not ref.startswith("#"):
        return None
    node = root
    for step in (s.replace("~1", "/").replace("~0", "~") for s in ref[1:].split("/") if s):
        node = node.get(step) if isinstance(node, dict) else None
    return node


def _plain_string(schema: Any) -> bool:
    """A string schema with no keyword that "echo" might break."""
    return isinstance(schema, dict) and schema.get("type") == "string" and set(schema) <= {"type", "description"}


def _fits(schema: dict[str, Any], key: str, size: int) -> bool:
    bound = schema.get(key)
    return not isinstance(bound, int) or isinstance(bound, bool) or bound >= size


def _bounded(schema: dict[str, Any], value: float, *, whole: bool) -> Any:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if isinstance(low, (int, float)) and not isinstance(low, bool) and value < low:
        value = low + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    if isinstance(high, (int, float)) and not isinstance(high, bool) and value > high:
        value = high - (1 if "exclusiveMaximum" in schema and "maximum" not in schema else 0)
    if whole:
        return math.floor(value) if isinstance(high, (int, float)) and value >= high else math.ceil(value)
    return float(value)
