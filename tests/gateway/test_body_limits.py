"""The gateway's limits of shape (``[gateway] max_messages``, ``max_content_blocks``,
``max_tools``; capmon/gateway/shape.py) through the real SDKs on the simulator: a request
past one is a 400 naming the array, the limit's key and the count, in the OpenAI shape on
/v1/chat/completions and /v1/responses and in Anthropic's on /v1/messages; a body read in
slices (past a MiB) is refused at the first item past a limit, before the rest is read;
and bodies at the limits are served, small and big alike."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from capmon.gateway.shape import READ_AT_ONCE
from tests.gateway.helpers import CLAUDE_WEATHER_TOOL, HEADER_STYLES, WEATHER_TOOL, running, two_wires

pytestmark = pytest.mark.looptime

LIMITS = "max_messages = 3\nmax_content_blocks = 6\nmax_tools = 2"
# flagship on the simulator's OpenAI wire; claude on its Anthropic wire (Messages served as they are)
MODELS: dict[str, Any] = {"models": ("flagship", "claude"), "anthropic": ("claude",), "gateway": LIMITS}


PAD = " " * (READ_AT_ONCE + 1)  # whitespace between two tokens: a body read in slices, its prompt unchanged


def user(*parts: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": p} for p in parts]}


def tools(n: int) -> list[dict[str, Any]]:
    return [{**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "name": f"tool_{i}"}} for i in range(n)]


def claude_tools(n: int) -> list[dict[str, Any]]:
    return [{**CLAUDE_WEATHER_TOOL, "name": f"tool_{i}"} for i in range(n)]


def openai_refusal(e: openai.BadRequestError) -> dict[str, Any]:
    assert e.status_code == 400, e
    body = e.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}, body
    assert body["type"] == "invalid_request_error" and body["code"] == "array_above_max_length", body
    return body


def anthropic_refusal(e: anthropic.BadRequestError) -> str:
    assert e.status_code == 400, e
    body = e.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == "invalid_request_error", body
    message: str = body["error"]["message"]
    return message


CHAT_OVER: list[tuple[dict[str, Any], str, str]] = [
    (
        {"messages": [user("a")] * 4},
        "messages",
        "the request has 4 messages, more than this gateway takes (at most 3: gateway.max_messages)",
    ),
    (
        {"messages": [user("a", "b", "c", "d"), user("e", "f", "g")]},
        "messages[1].content",
        "the request has 7 content blocks, more than this gateway takes (at most 6: gateway.max_content_blocks)",
    ),
    (  # tool calls count as blocks, with the parts of every message
        {
            "messages": [
                user("a", "b", "c", "d"),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": f"c{i}", "type": "function", "function": {"name": "tool_0", "arguments": "{}"}}
                        for i in range(3)
                    ],
                },
            ]
        },
        "messages[1].tool_calls",
        "the request has 7 content blocks, more than this gateway takes (at most 6: gateway.max_content_blocks)",
    ),
    (
        {"messages": [user("a")], "tools": tools(3)},
        "tools",
        "the request has 3 tools, more than this gateway takes (at most 2: gateway.max_tools)",
    ),
]


@pytest.mark.parametrize("over, param, words", CHAT_OVER)
async def test_chat_past_a_limit_is_a_400_naming_the_array_the_limit_and_the_count(
    over: dict[str, Any], param: str, words: str
) -> None:
    async with running(two_wires(), **MODELS) as gw, gw.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model="auto", **over)
        assert gw.client.snapshot().requests == 0  # refused at the edge: the core never saw it
    body = openai_refusal(refused.value)
    assert body["param"] == param and body["message"] == f"{param}: {words}", body


RESPONSES_OVER: list[tuple[dict[str, Any], str, str]] = [
    ({"input": [{"role": "user", "content": "a"}] * 4}, "input", "the request has 4 input items"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 7}]},
        "input[0].content",
        "the request has 7 content blocks",
    ),
    (
        {"input": "a", "tools": [{"type": "function", "name": f"t{i}", "parameters": {}} for i in range(3)]},
        "tools",
        "the request has 3 tools",
    ),
]


@pytest.mark.parametrize("over, param, words", RESPONSES_OVER)
async def test_responses_past_a_limit_is_a_400_in_the_openai_shape(
    over: dict[str, Any], param: str, words: str
) -> None:
    async with running(two_wires(), **MODELS) as gw, gw.openai() as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.responses.create(model="auto", **over)
    body = openai_refusal(refused.value)
    assert body["param"] == param and body["message"].startswith(f"{param}: {words}, more than"), body
    assert "gateway.max_" in body["message"], body


MESSAGES_OVER: list[tuple[dict[str, Any], tuple[str, ...], str]] = [
    (
        {"messages": [user("a"), {"role": "assistant", "content": "b"}] * 2},
        ("messages",),
        "the request has 4 messages, more than this gateway takes (at most 3: gateway.max_messages)",
    ),
    (  # the system prompt's blocks and a tool result's own blocks count with the messages' blocks
        {
            "system": [{"type": "text", "text": "s1"}, {"type": "text", "text": "s2"}],
            "messages": [
                user("a"),
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "tool_0", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}] * 2}
                    ],
                },
            ],
        },
        # where the count passes the limit: the last of these arrays in the body's order
        ("system", "messages[2].content[0].content"),
        "the request has 7 content blocks, more than this gateway takes (at most 6: gateway.max_content_blocks)",
    ),
    (
        {"messages": [user("a")], "tools": claude_tools(3)},
        ("tools",),
        "the request has 3 tools, more than this gateway takes (at most 2: gateway.max_tools)",
    ),
]


@pytest.mark.parametrize("style", HEADER_STYLES)
@pytest.mark.parametrize("over, arrays, words", MESSAGES_OVER)
async def test_messages_past_a_limit_is_a_400_in_anthropics_shape(
    over: dict[str, Any], arrays: tuple[str, ...], words: str, style: str
) -> None:
    async with running(two_wires(), **MODELS) as gw, gw.anthropic(style=style) as sdk:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await sdk.messages.create(model="auto", max_tokens=10, **over)
        with pytest.raises(anthropic.BadRequestError) as counted:
            await sdk.messages.count_tokens(model="auto", **over)
    for e in (refused.value, counted.value):
        message = anthropic_refusal(e)
        at, _, rest = message.partition(": ")
        assert at in arrays and rest == words, message


async def test_bodies_at_every_limit_are_served() -> None:
    chat = {"messages": [user("a", "b"), {"role": "assistant", "content": "c"}, user("d", "e", "f", "g")]}
    claude = {
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            user("a"),
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "tool_0", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "r"}] * 2}
                ],
            },
        ],
        "tools": claude_tools(2),
    }
    async with running(two_wires(), **MODELS) as gw, gw.openai() as sdk, gw.anthropic() as claude_sdk:
        completion = await sdk.chat.completions.create(model="flagship", tools=tools(2), **chat)
        response = await sdk.responses.create(model="flagship", input=[{"role": "user", "content": "a"}] * 3, tools=[])
        message = await claude_sdk.messages.create(model="claude", max_tokens=10, **claude)
        translated = await claude_sdk.messages.create(model="flagship", max_tokens=10, **claude)
    assert completion.choices[0].message.content and response.output_text
    assert message.content and translated.content
    assert message.model == "sim-claude" and translated.model == "sim-flagship"


async def test_a_big_body_is_read_in_slices_refused_past_a_limit_and_served_within() -> None:
    """Past READ_AT_ONCE a body is read in slices: the same answers, in both shapes."""
    within = json.dumps({"model": "claude", "max_tokens": 10, "messages": [user("a", "b")]})
    over = json.dumps({"model": "claude", "max_tokens": 10, "messages": [user(*"abcdefg")]})
    chat_over = json.dumps({"model": "flagship", "messages": [user(*"abcdefg")]})
    padded = [text.replace('"messages":', '"messages":' + PAD, 1) for text in (within, over, chat_over)]
    async with running(two_wires(), **MODELS) as gw, gw.http() as http:
        served = await http.post("/v1/messages", content=padded[0].encode())
        refused = await http.post("/v1/messages", content=padded[1].encode())
        chat_refused = await http.post("/v1/chat/completions", content=padded[2].encode())
        # the item past the limit is where reading stops: what follows it is not even read
        cut = padded[1][: padded[1].index('"g"}') + 4] + ", NOT JSON AT ALL"
        stopped = await http.post("/v1/messages", content=cut.encode())
        broken = await http.post("/v1/messages", content=(padded[0] + ",").encode())
        nan = await http.post("/v1/messages", content=padded[0].replace('"max_tokens": 10', '"top_p": NaN').encode())
        array = await http.post("/v1/chat/completions", content=f"[{PAD}{{}}]".encode())
    assert served.status_code == 200 and served.json()["model"] == "sim-claude", served.text[:300]
    for r in (refused, stopped):
        assert r.status_code == 400 and r.json()["type"] == "error", r.text[:300]
        assert r.json()["error"]["message"] == (
            "messages[0].content: the request has more than 6 content blocks, more than this gateway takes "
            "(at most 6: gateway.max_content_blocks)"
        )
    error = chat_refused.json()["error"]
    assert chat_refused.status_code == 400 and error["code"] == "array_above_max_length", error
    assert error["param"] == "messages[0].content" and "gateway.max_content_blocks" in error["message"], error
    assert broken.status_code == 400 and "could not parse the JSON body" in broken.json()["error"]["message"]
    assert nan.status_code == 400 and "NaN is not a JSON number" in nan.json()["error"]["message"]
    assert array.status_code == 400 and array.json()["error"]["message"] == "expected a JSON object as the request body"
