"""A client's tool loop against the simulator, with the real openai and anthropic SDKs over
real HTTP: under tool_choice "auto" a last user message that asks for a tool gets a call of
one of the given function tools, with arguments valid against its schema (Codex's
``exec_command`` and ``shell``); the tool's result comes back and the answer is text that
quotes it, so the loop ends. On the Responses API (plain and streamed, as the SDK's event
types say), chat completions and Anthropic's Messages API; and so when the conversation
ends with a system or developer message after the user's words (Claude Code's agent list)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.app import last_turn as chat_turn
from capmon.sim.messages import last_turn as messages_turn
from capmon.sim.responses import last_turn as responses_turn
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.server import SimHandle
from capmon.sim.tools import LastTurn, Tool, ToolRequest
from tests.sim.helpers import openai_sdk
from tests.support import claude_code

EXEC_SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
SHELL_SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}},
        "workdir": {"type": "string"},
        "timeout_ms": {"type": "integer"},
    },
    "required": ["command"],
}
PLAN_SCHEMA = {
    "type": "object",
    "properties": {"plan": {"type": "array", "items": {"type": "string"}}, "mode": {"enum": ["fast", "slow"]}},
    "required": ["plan", "mode"],
}
# What Codex sends: a hosted tool and a freeform one besides its function tools (never called).
CODEX_TOOLS: Any = [
    {"type": "function", "name": "update_plan", "parameters": PLAN_SCHEMA},
    {"type": "function", "name": "exec_command", "parameters": EXEC_SCHEMA, "strict": False},
    {"type": "function", "name": "shell", "parameters": SHELL_SCHEMA, "strict": False},
    {"type": "web_search"},
]
SCHEMAS = {"update_plan": PLAN_SCHEMA, "exec_command": EXEC_SCHEMA, "shell": SHELL_SCHEMA}
CHAT_TOOLS: Any = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
    for t in CODEX_TOOLS
    if t["type"] == "function"
]
ASK = "Run a command that prints hello."
RESULT = "Exit code: 0\nOutput:\nhello-from-the-tool"
SCENARIO = Scenario(
    name="tools",
    models=tuple(
        ModelSpec(name=name, api=api, slots=4, base_latency=0.001, per_token=0.0, noise=0.0, answer_tokens=30)
        for name, api in (("sim-a", "openai"), ("sim-claude", "anthropic"))
    ),
)


def conforms(value: Any, schema: dict[str, Any]) -> bool:
    """The JSON Schema keywords the tools above use (jsonschema is not installed)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(name in value for name in schema.get("required", []))
            and all(name in props and conforms(v, props[name]) for name, v in value.items())
        )
    if kind == "array":
        return isinstance(value, list) and all(conforms(v, schema.get("items", {})) for v in value)
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return kind is None


def test_the_schema_check_can_fail() -> None:
    assert conforms({"cmd": "ls"}, EXEC_SCHEMA)
    assert not conforms({}, EXEC_SCHEMA) and not conforms({"cmd": ["ls"]}, EXEC_SCHEMA)
    assert not conforms({"command": "ls"}, SHELL_SCHEMA) and not conforms({"plan": [], "mode": "x"}, PLAN_SCHEMA)


def check_call(name: str, arguments: str) -> dict[str, Any]:
    args = json.loads(arguments)
    assert conforms(args, SCHEMAS[name]), (name, args)
    return dict(args)


@pytest.fixture
def sim_scenario() -> Scenario:
    return SCENARIO


@pytest.fixture
async def client(sim: SimHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_sdk(sim.base_url) as c:
        yield c


# ---------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    "text, called",
    [
        (ASK, "exec_command"),  # asked: the first tool that takes a command
        ("Please execute ls", "exec_command"),
        ("Use the SHELL tool", "shell"),  # a tool named: that one, ahead of the asking words
        ("make an update_plan", "update_plan"),
        ("Say something about capacity.", None),
        ("The rerun recalled nothing", None),  # whole words only
        ("run the exec_commander", "exec_command"),  # "exec_commander" names no tool; "run" asks
    ],
)
def test_which_user_message_gets_which_call(text: str, called: str | None) -> None:
    tools = ToolRequest(tuple(Tool(n, s) for n, s in SCHEMAS.items()), "auto")
    tool = tools.wants_call("auto", LastTurn(text))
    assert (tool.name if tool else None) == called
    assert tools.wants_call("auto", LastTurn(text, is_tool_result=True)) is None
    assert ToolRequest(tools.tools, "none").wants_call("always", LastTurn(text)) is None


# ---------------------------------------------------------------- the Responses API


async def test_responses_calls_exec_command_then_answers_the_result(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(model="sim-a", input=ASK, tools=CODEX_TOOLS)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "exec_command" and call.status == "completed"
    assert check_call(call.name, call.arguments) == {"cmd": "echo hello"}
    assert call.call_id.startswith("call_") and call.id and call.id != call.call_id
    assert first.status == "completed" and first.usage is not None and first.usage.output_tokens > 0
    assert [t.type for t in first.tools] == ["function", "function", "function", "web_search"]
    history: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": ASK}]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
    ]
    second = await client.responses.create(model="sim-a", input=history, tools=CODEX_TOOLS)
    assert [item.type for item in second.output] == ["message"]
    assert "hello-from-the-tool" in second.output_text and second.status == "completed"


async def test_responses_shell_tool_gets_an_array_command(client: openai.AsyncOpenAI) -> None:
    reply = await client.responses.create(model="sim-a", input="use the shell tool to say hello", tools=CODEX_TOOLS)
    (call,) = reply.output
    assert call.type == "function_call" and call.name == "shell"
    assert check_call(call.name, call.arguments) == {"command": ["echo", "hello"]}


async def test_responses_without_an_ask_answer_in_text(client: openai.AsyncOpenAI) -> None:
    reply = await client.responses.create(model="sim-a", input="Say something about capacity.", tools=CODEX_TOOLS)
    assert [item.type for item in reply.output] == ["message"] and reply.output_text
    forced = await client.responses.create(
        model="sim-a", input="Hi", tools=CODEX_TOOLS, tool_choice={"type": "function", "name": "shell"}
    )
    assert forced.output[0].type == "function_call" and forced.output[0].name == "shell"


async def test_responses_streamed_call_as_the_api_streams_it(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(model="sim-a", input=ASK, tools=CODEX_TOOLS, stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert deltas >= 2  # the arguments in pieces
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added, done, completed = events[2], events[-2], events[-1]
    assert added.type == "response.output_item.added" and added.item.type == "function_call"
    assert added.item.arguments == "" and added.item.status == "in_progress" and added.item.name == "exec_command"
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    finished = events[-3]
    assert finished.type == "response.function_call_arguments.done" and finished.arguments == pieces
    assert all(getattr(e, "item_id", added.item.id) == added.item.id for e in events[3:-2])
    assert done.type == "response.output_item.done" and done.item.type == "function_call"
    assert done.item.arguments == pieces and done.item.call_id == added.item.call_id
    check_call("exec_command", pieces)
    assert completed.type == "response.completed" and completed.response.output[0].type == "function_call"


async def test_responses_streamed_round_trip_ends_in_text(client: openai.AsyncOpenAI) -> None:
    history: Any = [
        {"role": "user", "content": ASK},
        {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": '{"cmd":"echo hello"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": RESULT},
    ]
    stream = await client.responses.create(model="sim-a", input=history, tools=CODEX_TOOLS, stream=True)
    events = [e async for e in stream]
    assert not any("function_call" in e.type for e in events)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.startswith("The tool returned: Exit code: 0") and "hello-from-the-tool" in text
    assert events[-1].type == "response.completed"


async def test_responses_bad_tools_are_400(client: openai.AsyncOpenAI) -> None:
    for tools in ([{"type": "function"}], [{"type": "function", "name": "f", "parameters": []}], ["x"]):
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model="sim-a", input=ASK, tools=tools)  # type: ignore[arg-type]
        assert info.value.param is not None and info.value.param.startswith("tools[0]")  # type: ignore[attr-defined]


# ---------------------------------------------------------------- chat completions


async def test_chat_auto_calls_then_answers_the_result(client: openai.AsyncOpenAI) -> None:
    asked: Any = [{"role": "user", "content": ASK}]
    first = await client.chat.completions.create(model="sim-a", messages=asked, tools=CHAT_TOOLS, tool_choice="auto")
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "exec_command"
    check_call(call.function.name, call.function.arguments)
    history: Any = [
        *asked,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    second = await client.chat.completions.create(model="sim-a", messages=history, tools=CHAT_TOOLS)
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    assert "hello-from-the-tool" in (second.choices[0].message.content or "")


async def test_chat_streamed_auto_call_and_answer(client: openai.AsyncOpenAI) -> None:
    asked: Any = [{"role": "user", "content": [{"type": "text", "text": "use the shell tool"}]}]
    stream = await client.chat.completions.create(model="sim-a", messages=asked, tools=CHAT_TOOLS, stream=True)
    name, arguments, finish = None, "", None
    async for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or []:
            name = (tc.function.name if tc.function else None) or name
            arguments += (tc.function.arguments if tc.function else None) or ""
        finish = chunk.choices[0].finish_reason or finish
    assert name == "shell" and finish == "tool_calls"
    assert check_call(name, arguments) == {"command": ["echo", "hello"]}
    history: Any = [*asked, {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    stream = await client.chat.completions.create(model="sim-a", messages=history, tools=CHAT_TOOLS, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "hello-from-the-tool" in text


# ---------------------------------------------------------------- Anthropic's Messages API


async def test_messages_auto_calls_then_answers_the_result(sim: SimHandle) -> None:
    tools: Any = [{"name": t["name"], "input_schema": t["parameters"]} for t in CODEX_TOOLS if t["type"] == "function"]
    asked: Any = [{"role": "user", "content": "run ls please"}]
    async with anthropic.AsyncAnthropic(base_url=sim.origin, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        first = await c.messages.create(model="sim-claude", max_tokens=200, messages=asked, tools=tools)
        (block,) = first.content
        assert first.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "exec_command"
        assert conforms(block.input, EXEC_SCHEMA)
        history: Any = [
            *asked,
            {"role": "assistant", "content": [block.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": RESULT}]},
        ]
        second = await c.messages.create(model="sim-claude", max_tokens=200, messages=history, tools=tools)
    assert second.stop_reason == "end_turn" and second.content[0].type == "text"
    assert "hello-from-the-tool" in second.content[0].text


# ---------------------------------------------------------------- a conversation that ends with an aside
# System and developer messages are nobody's turn: the rule reads the user's words or the tools'
# results before them (Claude Code ends every conversation with one, its agent list).

SYSTEM_NOTE = "Available agent types: claude."


@pytest.mark.parametrize(
    "messages, turn",
    [
        ([{"role": "user", "content": ASK}, {"role": "system", "content": SYSTEM_NOTE}], LastTurn(ASK)),
        ([{"role": "user", "content": ASK}, {"role": "developer", "content": "run tools"}], LastTurn(ASK)),
        (  # the gateway's translation of an Anthropic tool_result that came with text: the loop ends
            [
                {"role": "user", "content": ASK},
                {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "shell"}}]},
                {"role": "tool", "tool_call_id": "c", "content": RESULT},
                {"role": "user", "content": "<system-reminder>run the tests</system-reminder>"},
                {"role": "system", "content": SYSTEM_NOTE},
            ],
            LastTurn(RESULT, is_tool_result=True),
        ),
        ([{"role": "user", "content": ASK}, {"role": "assistant", "content": "Sure"}], None),  # a prefill: text
        ([{"role": "system", "content": "run"}], None),
        ([{"role": "user", "content": "first"}, {"role": "user", "content": "Say hi"}], LastTurn("Say hi")),
    ],
)
def test_the_chat_turn_skips_trailing_asides(messages: list[dict[str, Any]], turn: LastTurn | None) -> None:
    assert chat_turn(messages) == turn


@pytest.mark.parametrize(
    "given, turn",
    [
        (
            [{"role": "user", "content": ASK}, {"type": "message", "role": "developer", "content": SYSTEM_NOTE}],
            LastTurn(ASK),
        ),
        ([{"role": "user", "content": ASK}, {"role": "system", "content": SYSTEM_NOTE}], LastTurn(ASK)),
        (
            [
                {"role": "user", "content": ASK},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "call_id": "c", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": RESULT},
                {"role": "developer", "content": SYSTEM_NOTE},
            ],
            LastTurn(RESULT, is_tool_result=True),
        ),
        ([{"role": "user", "content": ASK}, {"type": "function_call", "call_id": "c", "name": "shell"}], None),
        ([], None),
    ],
)
def test_the_responses_turn_skips_trailing_asides(given: list[dict[str, Any]], turn: LastTurn | None) -> None:
    assert responses_turn(given) == turn


@pytest.mark.parametrize(
    "messages, turn",
    [
        (claude_code.first_turn(), LastTurn(f"{claude_code.REMINDER} {claude_code.ASK}")),
        (
            claude_code.after_call({"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}),
            LastTurn(claude_code.RESULT, is_tool_result=True),
        ),
        (  # a tool's result with text beside it is still the results' turn
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT},
                        {"type": "text", "text": "now run the tests"},
                    ],
                },
                claude_code.AGENT_LIST,
            ],
            LastTurn(RESULT, is_tool_result=True),
        ),
        ([{"role": "user", "content": ASK}, {"role": "assistant", "content": "I will"}], None),
    ],
)
def test_the_messages_turn_skips_trailing_system_messages(
    messages: list[dict[str, Any]], turn: LastTurn | None
) -> None:
    assert messages_turn(messages) == turn


async def test_claude_codes_conversation_calls_bash_then_ends_in_text(sim: SimHandle) -> None:
    async with anthropic.AsyncAnthropic(base_url=sim.origin, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as c:
        async with c.messages.stream(
            **claude_code.request(claude_code.first_turn(), model="sim-claude", max_tokens=2000)
        ) as s:
            first = await s.get_final_message()
        (block,) = first.content
        assert first.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "Bash"
        assert block.input == {"command": "echo hello"} and conforms(block.input, claude_code.BASH_SCHEMA)
        history = claude_code.after_call(block.model_dump())
        async with c.messages.stream(**claude_code.request(history, model="sim-claude", max_tokens=2000)) as s:
            second = await s.get_final_message()
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
    assert "hello-from-ls" in second.content[0].text  # type: ignore[union-attr]


async def test_chat_with_a_trailing_system_message_calls_then_answers_the_result(client: openai.AsyncOpenAI) -> None:
    asked: Any = [{"role": "user", "content": ASK}, {"role": "system", "content": SYSTEM_NOTE}]
    first = await client.chat.completions.create(model="sim-a", messages=asked, tools=CHAT_TOOLS)
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls or []
    assert call.function.name == "exec_command" and check_call(call.function.name, call.function.arguments)
    history: Any = [
        asked[0],
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
        asked[1],
    ]
    stream = await client.chat.completions.create(model="sim-a", messages=history, tools=CHAT_TOOLS, stream=True)
    chunks = [c async for c in stream if c.choices]
    assert not any(c.choices[0].delta.tool_calls for c in chunks)
    assert "hello-from-the-tool" in "".join(c.choices[0].delta.content or "" for c in chunks)


async def test_responses_with_a_trailing_developer_message_calls_then_answers(client: openai.AsyncOpenAI) -> None:
    note: Any = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": SYSTEM_NOTE}]}
    asked: Any = [{"role": "user", "content": [{"type": "input_text", "text": ASK}]}, note]
    first = await client.responses.create(model="sim-a", input=asked, tools=CODEX_TOOLS, stream=True)
    events = [e async for e in first]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(item.type, getattr(item, "name", None)) for item in done] == [("function_call", "exec_command")]
    call: Any = done[0]
    check_call(call.name, call.arguments)
    history: Any = [
        asked[0],
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT},
        note,
    ]
    second = await client.responses.create(model="sim-a", input=history, tools=CODEX_TOOLS)
    assert [item.type for item in second.output] == ["message"] and "hello-from-the-tool" in second.output_text
