"""Structured output: a request that asks for JSON gets a JSON document as its answer's text,
as the real providers give it, so that a client can parse it and check it against its schema
(Gemini CLI's model router, the SDKs' ``parse`` helpers). Each API asks in its own words:

- chat completions: ``response_format`` ``{"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}`` or ``{"type": "json_object"}`` (``"text"``: prose);
- the Responses API: ``text.format`` ``{"type": "json_schema", "name", "schema", "strict"}``
  or ``{"type": "json_object"}``;
- Gemini (the Gemini API and Vertex AI): ``generationConfig.responseMimeType``
  ``"application/json"`` with ``responseJsonSchema`` (JSON Schema), ``responseSchema``
  (Gemini's Schema: capital types, ``nullable``) or neither (any object); ``"text/x.enum"``
  with a ``responseSchema`` of an enum: one of its values, as plain text. Proto names
  (``response_mime_type``...) are read as their JSON names, as Google reads them;
- Anthropic's Messages (also on Vertex AI and Bedrock's InvokeModel): ``output_config.format``
  ``{"type": "json_schema", "schema"}`` (and the beta's ``output_format``, the same object);
- Bedrock's Converse: ``outputConfig.textFormat`` ``{"type": "json_schema", "structure":
  {"jsonSchema": {"schema": "<the schema as a JSON string>", "name"?, "description"?}}}``.

The document is ``tools.example_value(schema)``: valid against the common JSON Schema
keywords. A classify prompt a model labels (capmon/sim/labels.py) puts its label in the first
``enum`` that holds it; JSON mode without a schema answers ``{"answer": <the label or
"sample">}``. The document rides on the ticket (``Ticket.structured``), so every answer of
every API, plain or streamed (in pieces, as text is), broken by a fault or continued, says
it; usage and pacing stay the prose answer's. A call of a tool, when the simulator makes one,
is the answer instead. When ``max_tokens`` would cut the prose short, a document that fits
in the tokens is whole and ends as a finished answer (a model stops when its JSON is done);
a longer one is cut there, as a real model's would be.

Pure: no web framework. A malformed request raises :class:`OutputError` with the parameter
to name in the 400.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from capmon.core.providers.gemini_format import json_names
from capmon.sim.labels import label_for
from capmon.sim.model import Simulator, Ticket
from capmon.sim.streams import tokens_of
from capmon.sim.tools import LastTurn, example_value, gemini_schema

JSON_MIME = "application/json"
ENUM_MIME = "text/x.enum"
TEXT_MIMES = ("text/plain", "")
JSON_MODE_KEY = "answer"  # json_object mode's one property
CHARS_PER_TOKEN = 4  # streams.tokens_of's measure: a cut document keeps this many per token


class OutputError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Shape(Enum):
    """What kind of answer a request asked for."""

    SCHEMA = "json_schema"  # a JSON document valid against ``schema``
    OBJECT = "json_object"  # any JSON object
    ENUM = "enum"  # one of ``schema``'s enum values, as plain text (Gemini's text/x.enum)


@dataclass(frozen=True)
class Output:
    shape: Shape
    schema: Any = None  # JSON Schema (Gemini's already read as one)

    def document(self, label: str | None = None) -> str:
        """The answer's text; ``label``: a classify prompt's, placed where an enum takes it."""
        if self.shape is Shape.OBJECT:
            return json.dumps({JSON_MODE_KEY: label if label is not None else "sample"}, ensure_ascii=False)
        value = example_value(self.schema, prefer=label)
        if self.shape is Shape.ENUM:
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return json.dumps(value, ensure_ascii=False)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OutputError(
            f"Invalid type for '{where}': expected an object, but got {type(value).__name__} instead.", where
        )
    return value


def _openai_format(fmt: Any, where: str, inner: str | None) -> Output | None:
    """OpenAI's format object (chat's ``response_format``, whose schema sits under
    ``json_schema``; the Responses API's ``text.format``, where it sits in the format itself)."""
    if fmt is None:
        return None
    fmt = _object(fmt, where)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Output(Shape.OBJECT)
    if kind != "json_schema":
        raise OutputError(
            f"Invalid value: {kind!r}. Supported values are: 'text', 'json_object', and 'json_schema'.",
            f"{where}.type",
        )
    spec = fmt if inner is None else fmt.get(inner)
    at = where if inner is None else f"{where}.{inner}"
    if spec is None:
        raise OutputError(f"Missing required parameter: '{at}'.", at)
    spec = _object(spec, at)
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise OutputError(f"Missing required parameter: '{at}.name'.", f"{at}.name")
    schema = spec.get("schema", {})
    return Output(Shape.SCHEMA, _object(schema, f"{at}.schema"))


def parse_chat(body: dict[str, Any]) -> Output | None:
    """Chat completions' ``response_format``."""
    return _openai_format(body.get("response_format"), "response_format", "json_schema")


def parse_responses(body: dict[str, Any]) -> Output | None:
    """The Responses API's ``text.format``."""
    text = body.get("text")
    if text is None:
        return None
    return _openai_format(_object(text, "text").get("format"), "text.format", None)


def parse_gemini(body: dict[str, Any]) -> Output | None:
    """Gemini's ``generationConfig``: ``responseMimeType`` and its schema."""
    config = json_names(body).get("generationConfig")
    if not isinstance(config, dict):
        return None
    mime = config.get("responseMimeType", "")
    schema, json_schema = config.get("responseSchema"), config.get("responseJsonSchema")
    where = "generation_config"
    if schema is not None and json_schema is not None:
        raise OutputError(
            f"* GenerateContentRequest.{where}.response_schema: response_schema and response_json_schema "
            "cannot both be set.\n",
            "generationConfig",
        )
    given = json_schema if schema is None else gemini_schema(schema)
    if given is not None and not isinstance(given, dict):
        raise OutputError(
            f"* GenerateContentRequest.{where}: the response schema must be a Schema object.\n", "generationConfig"
        )
    if mime == JSON_MIME:
        return Output(Shape.OBJECT) if given is None else Output(Shape.SCHEMA, given)
    if mime == ENUM_MIME:
        if given is None or not isinstance(given.get("enum"), list) or not given["enum"]:
            raise OutputError(
                f"* GenerateContentRequest.{where}.response_schema: text/x.enum needs a schema of an enum.\n",
                "generationConfig",
            )
        return Output(Shape.ENUM, given)
    if given is not None and mime in TEXT_MIMES:
        raise OutputError(
            f"* GenerateContentRequest.{where}.response_mime_type: a response schema needs "
            f"response_mime_type {JSON_MIME} or {ENUM_MIME}.\n",
            "generationConfig",
        )
    return None  # text, or another MIME type the simulator answers in prose


def parse_messages(body: dict[str, Any]) -> Output | None:
    """Anthropic's ``output_config.format`` (or the beta's ``output_format``)."""
    config = body.get("output_config")
    fmt, where = (config.get("format"), "output_config.format") if isinstance(config, dict) else (None, "")
    if fmt is None:
        fmt, where = body.get("output_format"), "output_format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        raise OutputError(
            f"{where}: Input tag {kind!r} found using 'type' does not match any of the expected tags: 'json_schema'",
            where,
        )
    if not isinstance(fmt.get("schema"), dict):
        raise OutputError(f"{where}.schema: Field required", f"{where}.schema")
    return Output(Shape.SCHEMA, fmt["schema"])


def parse_converse(body: dict[str, Any]) -> Output | None:
    """Bedrock Converse's ``outputConfig.textFormat`` (its schema a JSON string)."""
    config = body.get("outputConfig")
    fmt = config.get("textFormat") if isinstance(config, dict) else None
    if fmt is None:
        return None
    where = "outputConfig.textFormat"
    structure = fmt.get("structure") if isinstance(fmt, dict) else None
    spec = structure.get("jsonSchema") if isinstance(structure, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(spec, dict):
        raise OutputError(
            f"The value at {where} must have type json_schema and a structure with a jsonSchema.", "outputConfig"
        )
    text = spec.get("schema")
    try:
        schema = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        schema = None
    if not isinstance(schema, dict):
        raise OutputError(
            f"The value at {where}.structure.jsonSchema.schema must be a JSON schema (an object, as a JSON string).",
            "outputConfig",
        )
    return Output(Shape.SCHEMA, schema)


D = TypeVar("D")


def answered(ticket: Ticket, output: Output, label: str | None) -> Ticket:
    """``ticket`` answering ``output``'s document (a cut one when its tokens run out first)."""
    text = output.document(label)
    reason = ticket.finish_reason
    if reason == "length":
        if tokens_of(text) <= ticket.completion_tokens:
            reason = "stop"  # the whole document fits: the model stops there
        else:
            text = text[: ticket.completion_tokens * CHARS_PER_TOKEN]
    return dataclasses.replace(ticket, structured=text, finish_reason=reason)


def with_output(decision: D, output: Output | None, sim: Simulator, turn: LastTurn | None) -> D:
    """``decision`` (admitted or faulted) with its ticket answering ``output``'s document;
    a model that labels classify prompts puts the label of ``turn`` (the user's words) in it."""
    ticket = getattr(decision, "ticket", None)
    if output is None or not isinstance(ticket, Ticket) or not sim.has_model(ticket.model):
        return decision
    state = sim.state(ticket.model)
    said = turn.text if turn is not None and not turn.is_tool_result else None
    label = label_for(state.labels, state.disagree, said)
    return dataclasses.replace(decision, ticket=answered(ticket, output, label))  # type: ignore[type-var]
