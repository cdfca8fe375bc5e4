"""Tool calls over real HTTP: when the simulator answers with a call, the call's shape
(plain and streamed, exactly as OpenAI sends it; and as vLLM / Ollama / Azure frame it),
arguments built from the function's schema, and clear 400s for bad tools."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.faults import parse_rules
from capmon.sim.scenario import parse_scenario
from capmon.sim.server import SimHandle
from capmon.sim.tools import example_value
from tests.sim.helpers import AUTH, HELLO, chat_body, data_frames, fast_scenario, frames
from tests.support.simulated import StartSim

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 3},
                "days": {"type": "integer", "minimum": 2, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "detail": {"type": "boolean"},
            },
            "required": ["city", "days", "unit"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zones": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
        },
    },
}
TOOLS = [WEATHER, CLOCK]


async def post(sim: SimHandle, http: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    return await http.post(f"{sim.base_url}/chat/completions", json=chat_body(**extra), headers=AUTH)


def check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "days", "unit"}  # the required ones
    assert isinstance(args["city"], str) and len(args["city"]) >= 3
    assert isinstance(args["days"], int) and 2 <= args["days"] <= 7
    assert args["unit"] in ("c", "f")


async def test_required_tool_choice_answers_with_a_call(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, tools=TOOLS, tool_choice="required")
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["role"] == "assistant"
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    check_weather_args(call["function"]["arguments"])


async def test_named_tool_choice_calls_that_function(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_time"
    assert json.loads(call["function"]["arguments"]) == {"zones": ["sample", "sample"]}


async def test_auto_answers_with_text_unless_the_model_always_calls(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, tools=TOOLS)
    assert r.json()["choices"][0]["message"]["content"] and r.json()["choices"][0]["finish_reason"] == "stop"
    await http.post(f"{sim.admin_url}/models/sim-a", json={"tools": "always"})
    r = await post(sim, http, tools=TOOLS)
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    r = await post(sim, http, tools=TOOLS, tool_choice="none")  # "none" wins over "always"
    assert r.json()["choices"][0]["message"]["content"]
    r = await post(sim, http)  # no tools, no call
    assert "tool_calls" not in r.json()["choices"][0]["message"]


async def test_streamed_tool_call_exactly_as_openai_sends_it(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, tools=TOOLS, tool_choice="required", stream=True)
    chunks = data_frames(r.text)
    head = chunks[0]["choices"][0]["delta"]
    assert head["role"] == "assistant" and head["content"] is None
    (first,) = head["tool_calls"]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    pieces = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks[1:-1]]
    assert len(pieces) >= 3  # arguments in several pieces
    assert all(set(p) == {"index", "function"} and set(p["function"]) == {"arguments"} for p in pieces)
    check_weather_args("".join(p["function"]["arguments"] for p in pieces))
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


@pytest.mark.parametrize("style", ["vllm", "ollama", "azure", "openrouter"])
async def test_streamed_tool_call_in_other_styles(sim: SimHandle, http: httpx.AsyncClient, style: str) -> None:
    await http.post(f"{sim.admin_url}/models/sim-a", json={"stream_style": style})
    chunks = data_frames((await post(sim, http, tools=TOOLS, tool_choice="required", stream=True)).text)
    calls = [
        tc
        for c in chunks
        if c.get("choices") and "delta" in c["choices"][0]
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    names = [tc["function"]["name"] for tc in calls if tc["function"].get("name")]
    assert names == ["get_weather"]
    check_weather_args("".join(tc["function"].get("arguments", "") for tc in calls))
    finishes = [
        c["choices"][0]["finish_reason"] for c in chunks if c.get("choices") and c["choices"][0].get("finish_reason")
    ]
    assert finishes == ["tool_calls"]
    if style == "ollama":
        assert len(calls) == 1  # Ollama sends the whole call in one delta


async def test_the_openai_sdk_reads_tool_calls(sim: SimHandle) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="sim-a",
            messages=HELLO,
            tools=TOOLS,  # type: ignore[call-overload]
            tool_choice="required",
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        tool_call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
        check_weather_args(tool_call.function.arguments)  # type: ignore[union-attr]
        stream = await client.chat.completions.create(
            model="sim-a",
            messages=HELLO,
            tools=TOOLS,  # type: ignore[call-overload]
            tool_choice="required",
            stream=True,
        )
        arguments, name = "", None
        async for chunk in stream:
            for tc in chunk.choices[0].delta.tool_calls or []:
                name = tc.function.name or name  # type: ignore[union-attr]
                arguments += tc.function.arguments or ""  # type: ignore[union-attr]
    assert name == "get_weather"
    check_weather_args(arguments)


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_bad_tools_are_400_naming_the_parameter(
    sim: SimHandle, http: httpx.AsyncClient, extra: dict[str, Any], param: str
) -> None:
    r = await post(sim, http, **extra)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_example_values_follow_the_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"const": 3}, "b": {"default": "x"}}}
    assert example_value(schema) == {"a": 3, "b": "x"}
    assert example_value({"anyOf": [{"type": "number", "minimum": 10}, {"type": "string"}]}) == 10.0
    assert example_value({"type": ["null", "integer"], "exclusiveMinimum": 5}) == 6
    assert example_value({"type": "string", "maxLength": 2}) == "sa"
    deep: dict[str, Any] = {"type": "object", "properties": {}}
    node = deep
    for _ in range(50):  # a schema nested deeper than the limit stays small
        child: dict[str, Any] = {"type": "object", "properties": {}}
        node["properties"]["x"] = child
        node = child
    assert len(json.dumps(example_value(deep))) < 200


def test_tools_mode_is_a_scenario_key() -> None:
    assert parse_scenario('[[models]]\nname = "a"\ntools = "always"\n').models[0].tools == "always"
    with pytest.raises(ConfigError) as info:
        parse_scenario('[[models]]\nname = "a"\ntools = "sometimes"\n', "s.toml")
    assert info.value.key == "models[0].tools" and "expected one of auto, always" in str(info.value)


BROKEN = {"mode": "broken_tool_args", "count": 6}
CLAUDE_WEATHER = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]


def _not_json(arguments: str) -> bool:
    try:
        json.loads(arguments)
    except ValueError:
        return True
    return False


async def test_the_broken_tool_args_fault_cuts_a_calls_arguments_on_every_wire_plain_and_streamed(
    start_sim: StartSim, http: httpx.AsyncClient
) -> None:
    """Only the arguments are broken (half of a valid call's): the answer otherwise ends whole,
    with its finish reason, [DONE], message_stop or response.completed; a request that may
    call no tool passes by and leaves the rule's count."""
    sim = await start_sim(fast_scenario(api="all"))
    await http.post(f"{sim.admin_url}/faults", json=BROKEN)
    untouched = await post(sim, http)  # no tools: not shaped, not counted
    chat = (await post(sim, http, tools=TOOLS, tool_choice="required")).json()
    chat_stream = (await post(sim, http, tools=TOOLS, tool_choice="required", stream=True)).text
    claude = {"model": "sim-a", "max_tokens": 50, "messages": HELLO, "tools": [CLAUDE_WEATHER]}
    claude["tool_choice"] = {"type": "any"}
    head = {**AUTH, "anthropic-version": "2023-06-01"}
    message = (await http.post(f"{sim.origin}/v1/messages", json=claude, headers=head)).json()
    message_stream = (await http.post(f"{sim.origin}/v1/messages", json={**claude, "stream": True}, headers=head)).text
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}  # type: ignore[index]
    asked = {"model": "sim-a", "input": "Weather?", "tools": [tool], "tool_choice": "required"}
    response = (await http.post(f"{sim.base_url}/responses", json=asked, headers=AUTH)).json()
    response_stream = (await http.post(f"{sim.base_url}/responses", json={**asked, "stream": True}, headers=AUTH)).text
    left = (await http.get(f"{sim.admin_url}/faults")).json()
    assert untouched.json()["choices"][0]["finish_reason"] == "stop"
    (call,) = chat["choices"][0]["message"]["tool_calls"]
    assert chat["choices"][0]["finish_reason"] == "tool_calls" and _not_json(call["function"]["arguments"])
    chunks = data_frames(chat_stream)
    pieces = [tc["function"].get("arguments", "") for c in chunks[:-1] for tc in c["choices"][0]["delta"]["tool_calls"]]
    assert _not_json("".join(pieces)) and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chat_stream.endswith("data: [DONE]\n\n")
    (block,) = message["content"]
    assert message["stop_reason"] == "tool_use" and block["type"] == "tool_use" and isinstance(block["input"], str)
    assert _not_json(block["input"])
    events = [f.json() for f in frames(message_stream) if f.data]
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta")
    assert _not_json(partial) and [e["type"] for e in events][-3:] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    (item,) = response["output"]
    assert response["status"] == "completed" and item["type"] == "function_call" and _not_json(item["arguments"])
    streamed = [f.json() for f in frames(response_stream) if f.data]
    assert streamed[-1]["type"] == "response.completed"
    assert _not_json(streamed[-1]["response"]["output"][0]["arguments"])
    assert left == {"faults": []}  # six requests with tools took its six


def test_a_broken_tool_args_rule_applies_only_to_a_request_that_may_call_a_tool() -> None:
    (rule,) = parse_rules({"mode": "broken_tool_args", "count": 1})
    assert rule.applies_to("m", stream=False, tools=True) and rule.applies_to("m", stream=True, tools=True)
    assert not rule.applies_to("m", stream=True)
