"""Structured output on the simulator (capmon/sim/structured.py), through the real SDKs over
loopback: a request that asks for JSON gets a document its client parses and checks against
its schema, plain and streamed, on every API that can ask (chat completions, Responses,
Gemini, Anthropic's Messages, Bedrock's Converse); a tool call still wins, a short token cap
cuts only a document that does not fit, and a classify prompt's label lands in its enum."""

from __future__ import annotations

import asyncio
import enum
import json
from datetime import datetime
from typing import Any

import anthropic
import boto3
import botocore.config
import httpx
import openai
import pydantic
import pytest
from google import genai
from google.genai import types

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.labels import label_for
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle
from capmon.sim.structured import Output, Shape, parse_gemini
from capmon.sim.tools import example_value, gemini_schema
from tests.sim.helpers import AUTH, openai_sdk

LABELS = ("flash", "pro")
SCENARIO = Scenario(
    name="structured",
    models=(
        ModelSpec(
            name="sim-all",
            api="all",
            slots=8,
            base_latency=0.001,
            per_token=0.0,
            noise=0.0,
            answer_tokens=40,
            context_window=4000,
            labels=LABELS,
        ),
    ),
)
ASK = [{"role": "user", "content": "Describe a ticket as JSON."}]


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


# ---------------------------------------------------------------- a tiny checker


def conforms(value: Any, schema: Any, root: Any = None) -> bool:
    """``value`` against the JSON Schema keywords these tests use (no dependency for it)."""
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return True
    if "$ref" in schema:
        target = root
        for step in schema["$ref"].lstrip("#/").split("/"):
            target = target[step] if step else target
        return conforms(value, target, root)
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "anyOf" in schema and not any(conforms(value, b, root) for b in schema["anyOf"]):
        return False
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [k.lower() for k in (kinds if isinstance(kinds, list) else [kinds])]
        types_of = {
            "object": dict,
            "array": list,
            "string": str,
            "integer": int,
            "number": (int, float),
            "boolean": bool,
            "null": type(None),
        }
        if not any(isinstance(value, types_of[k]) and not (k != "boolean" and isinstance(value, bool)) for k in kinds):
            return False
    if isinstance(value, dict):
        props = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(conforms(v, props[k], root) for k, v in value.items() if k in props)
    if isinstance(value, list):
        enough = len(value) >= int(schema.get("minItems", 0))  # Gemini's int64 bounds come as strings
        return enough and all(conforms(v, schema.get("items"), root) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if isinstance(value, str):
        return schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
    return True


# ---------------------------------------------------------------- schemas


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Owner(pydantic.BaseModel):
    name: str
    email: str | None


class Ticket(pydantic.BaseModel):
    title: str
    priority: Priority
    owners: list[Owner]
    estimate: int
    opened: datetime


TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 8},
        "priority": {"type": "string", "enum": ["low", "high"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "estimate": {"type": "integer", "minimum": 3, "maximum": 9},
        "owner": {"$ref": "#/$defs/owner"},
    },
    "required": ["title", "priority", "tags", "estimate", "owner"],
    "additionalProperties": False,
    "$defs": {
        "owner": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "active": {"type": ["boolean", "null"]}},
            "required": ["name", "active"],
            "additionalProperties": False,
        }
    },
}
# Gemini's own schema dialect, as google-genai sends it: capitals, nullable, int64 bounds as strings.
GEMINI_SCHEMA = {
    "type": "OBJECT",
    "properties": {
        "verdict": {"type": "STRING", "enum": ["yes", "no"]},
        "scores": {"type": "ARRAY", "items": {"type": "NUMBER"}, "minItems": "2"},
        "note": {"type": "STRING", "nullable": True},
    },
    "required": ["verdict", "scores", "note"],
    "propertyOrdering": ["scores", "verdict", "note"],
}
# What Gemini CLI's model router asks for (its classifier's responseJsonSchema, in short).
ROUTER_SCHEMA = {
    "type": "object",
    "properties": {"reasoning": {"type": "string"}, "model_choice": {"type": "string", "enum": list(LABELS)}},
    "required": ["reasoning", "model_choice"],
}


def test_example_values_follow_refs_capitals_formats_and_order() -> None:
    assert conforms(example_value(TICKET_SCHEMA), TICKET_SCHEMA)
    value = example_value(gemini_schema(GEMINI_SCHEMA))
    assert list(value) == ["scores", "verdict", "note"] and len(value["scores"]) == 2
    assert conforms(value, GEMINI_SCHEMA)
    assert example_value({"type": "string", "format": "date-time"}) == "2025-01-01T00:00:00Z"
    assert example_value({"enum": ["a", "b"]}, prefer="b") == "b"
    assert example_value({"enum": ["a", "b"]}, prefer="c") == "a"


def test_proto_names_are_read_as_json_names() -> None:
    body = {"generation_config": {"response_mime_type": "application/json", "response_json_schema": ROUTER_SCHEMA}}
    assert parse_gemini(body) == Output(Shape.SCHEMA, ROUTER_SCHEMA)
    snake = {"generation_config": {"response_mime_type": "application/json", "response_schema": GEMINI_SCHEMA}}
    found = parse_gemini(snake)
    assert found is not None and found.schema["properties"]["note"]["type"] == ["string", "null"]


# ---------------------------------------------------------------- OpenAI


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "ticket", "schema": schema, "strict": True}}


async def test_chat_json_schema_plain_and_streamed(sim: SimHandle) -> None:
    async with openai_sdk(sim.base_url) as client:
        reply = await client.chat.completions.create(
            model="sim-all", messages=ASK, response_format=_json_schema(TICKET_SCHEMA)
        )
        assert reply.choices[0].finish_reason == "stop"
        assert conforms(json.loads(reply.choices[0].message.content or ""), TICKET_SCHEMA)
        assert reply.usage is not None and reply.usage.completion_tokens == 40  # counted as prose is
        stream = await client.chat.completions.create(
            model="sim-all", messages=ASK, response_format=_json_schema(TICKET_SCHEMA), stream=True
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert len([p for p in pieces if p]) > 1  # in pieces, as text streams
    assert conforms(json.loads("".join(pieces)), TICKET_SCHEMA)


async def test_chat_json_object_mode(sim: SimHandle) -> None:
    async with openai_sdk(sim.base_url) as client:
        reply = await client.chat.completions.create(
            model="sim-all", messages=ASK, response_format={"type": "json_object"}
        )
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


async def test_the_sdks_parse_helpers_get_their_models(sim: SimHandle) -> None:
    async with openai_sdk(sim.base_url) as client:
        chat = await client.chat.completions.parse(model="sim-all", messages=ASK, response_format=Ticket)
        parsed = chat.choices[0].message.parsed
        assert isinstance(parsed, Ticket) and parsed.owners and isinstance(parsed.opened, datetime)
        answer = await client.responses.parse(model="sim-all", input="Describe a ticket.", text_format=Ticket)
        assert isinstance(answer.output_parsed, Ticket)
        assert answer.text is not None and answer.text.format is not None and answer.text.format.type == "json_schema"


async def test_responses_json_schema_streamed(sim: SimHandle) -> None:
    body = {
        "model": "sim-all",
        "input": "Describe a ticket.",
        "text": {"format": {"type": "json_schema", "name": "ticket", "schema": TICKET_SCHEMA, "strict": True}},
    }
    async with openai_sdk(sim.base_url) as client:
        async with client.responses.stream(**body) as stream:  # type: ignore[call-overload]
            deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
            final = await stream.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    assert conforms(json.loads(final.output_text), TICKET_SCHEMA)


async def test_a_tool_call_wins_over_the_format(sim: SimHandle) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    async with openai_sdk(sim.base_url) as client:
        reply = await client.chat.completions.create(
            model="sim-all",
            messages=ASK,
            tools=[tool],  # type: ignore[list-item]
            tool_choice="required",
            response_format=_json_schema(TICKET_SCHEMA),
        )
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None


async def test_a_short_cap_cuts_only_a_document_that_does_not_fit(sim: SimHandle) -> None:
    small = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    async with openai_sdk(sim.base_url) as client:
        fits = await client.chat.completions.create(
            model="sim-all", messages=ASK, response_format=_json_schema(small), max_tokens=5
        )
        assert fits.choices[0].finish_reason == "stop" and json.loads(fits.choices[0].message.content or "")
        assert fits.usage is not None and fits.usage.completion_tokens == 5
        cut = await client.chat.completions.create(
            model="sim-all", messages=ASK, response_format=_json_schema(TICKET_SCHEMA), max_tokens=5
        )
    assert cut.choices[0].finish_reason == "length" and len(cut.choices[0].message.content or "") == 20


async def test_a_malformed_format_is_refused(sim: SimHandle) -> None:
    async with openai_sdk(sim.base_url) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(
                model="sim-all",
                messages=ASK,
                response_format={"type": "yaml"},  # type: ignore[typeddict-item]
            )
    assert info.value.param == "response_format.type"


async def test_a_classify_prompt_puts_its_label_in_the_enum(sim: SimHandle) -> None:
    prompt = "Classify: refactor the whole storage layer"
    label = label_for(LABELS, 0.0, prompt)
    async with openai_sdk(sim.base_url) as client:
        reply = await client.chat.completions.create(
            model="sim-all",
            messages=[{"role": "user", "content": prompt}],
            response_format=_json_schema(ROUTER_SCHEMA),
        )
    assert json.loads(reply.choices[0].message.content or "")["model_choice"] == label


# ---------------------------------------------------------------- Gemini


def _genai(sim: SimHandle) -> genai.Client:
    return genai.Client(api_key=SIMULATOR_DEMO_KEY, http_options=types.HttpOptions(base_url=sim.origin))


async def test_gemini_response_schema_gives_parsed(sim: SimHandle) -> None:
    async with _genai(sim).aio as client:
        config = types.GenerateContentConfig(response_mime_type="application/json", response_schema=Ticket)
        r = await client.models.generate_content(model="sim-all", contents="Describe a ticket.", config=config)
        assert isinstance(r.parsed, Ticket)
        config = types.GenerateContentConfig(response_mime_type="application/json", response_json_schema=ROUTER_SCHEMA)
        prompt = "Classify: rename a variable"
        r = await client.models.generate_content(model="sim-all", contents=prompt, config=config)
        assert isinstance(r.parsed, dict) and conforms(r.parsed, ROUTER_SCHEMA)
        assert r.parsed["model_choice"] == label_for(LABELS, 0.0, prompt)
        assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.STOP


async def test_gemini_streamed_in_capitals(sim: SimHandle) -> None:
    async with _genai(sim).aio as client:
        config = types.GenerateContentConfig(
            response_mime_type="application/json", response_schema=types.Schema.model_validate(GEMINI_SCHEMA)
        )
        stream = await client.models.generate_content_stream(model="sim-all", contents="Judge it.", config=config)
        pieces = [chunk.text or "" async for chunk in stream]
    assert len(pieces) > 1 and conforms(json.loads("".join(pieces)), GEMINI_SCHEMA)


async def test_gemini_raw_capitals_json_mode_and_enum(sim: SimHandle, http: httpx.AsyncClient) -> None:
    url = f"{sim.origin}/v1beta/models/sim-all:generateContent"
    headers = {"x-goog-api-key": SIMULATOR_DEMO_KEY}
    ask = {"contents": [{"role": "user", "parts": [{"text": "Judge it."}]}]}

    async def text(config: dict[str, Any]) -> str:
        r = await http.post(url, headers=headers, json={**ask, "generationConfig": config})
        assert r.status_code == 200, r.text
        return str(r.json()["candidates"][0]["content"]["parts"][0]["text"])

    judged = json.loads(await text({"responseMimeType": "application/json", "responseSchema": GEMINI_SCHEMA}))
    assert conforms(judged, GEMINI_SCHEMA)
    assert isinstance(json.loads(await text({"responseMimeType": "application/json"})), dict)
    enum_schema = {"type": "STRING", "enum": ["red", "green"]}
    assert await text({"responseMimeType": "text/x.enum", "responseSchema": enum_schema}) == "red"
    bad = await http.post(url, headers=headers, json={**ask, "generationConfig": {"responseSchema": GEMINI_SCHEMA}})
    assert bad.status_code == 400


# ---------------------------------------------------------------- Anthropic, Bedrock


async def test_anthropic_output_config_parsed_and_streamed(sim: SimHandle) -> None:
    async with anthropic.AsyncAnthropic(base_url=sim.origin, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as client:
        reply = await client.messages.parse(model="sim-all", max_tokens=200, messages=ASK, output_format=Ticket)
        assert isinstance(reply.parsed_output, Ticket)
        fmt = {"type": "json_schema", "schema": TICKET_SCHEMA}
        async with client.messages.stream(
            model="sim-all", max_tokens=200, messages=ASK, output_config={"format": fmt}
        ) as stream:
            text = await stream.get_final_text()
    assert conforms(json.loads(text), TICKET_SCHEMA)


async def test_bedrock_converse_output_config(sim: SimHandle) -> None:
    client = boto3.session.Session().client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=sim.origin,
        aws_access_key_id=SIMULATOR_DEMO_KEY,
        aws_secret_access_key=SIMULATOR_DEMO_KEY,
        config=botocore.config.Config(retries={"total_max_attempts": 1}, proxies={}),
    )
    text_format = {
        "type": "json_schema",
        "structure": {"jsonSchema": {"schema": json.dumps(TICKET_SCHEMA), "name": "ticket"}},
    }
    reply = await asyncio.to_thread(
        lambda: client.converse(
            modelId="sim-all",
            messages=[{"role": "user", "content": [{"text": "Describe a ticket."}]}],
            outputConfig={"textFormat": text_format},
        )
    )
    assert reply["stopReason"] == "end_turn"
    assert conforms(json.loads(reply["output"]["message"]["content"][0]["text"]), TICKET_SCHEMA)


async def test_raw_chat_carries_the_document(http: httpx.AsyncClient, sim: SimHandle) -> None:
    """Without an SDK in between: the content is the document, byte for byte JSON."""
    body = {"model": "sim-all", "messages": ASK, "response_format": _json_schema(TICKET_SCHEMA)}
    r = await http.post(f"{sim.base_url}/chat/completions", headers=AUTH, json=body)
    assert conforms(json.loads(r.json()["choices"][0]["message"]["content"]), TICKET_SCHEMA)
