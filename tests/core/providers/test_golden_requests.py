"""Golden tests of the canonical hub's requests (capmon/core/providers/hub.py and the
*_format modules): every request table of the chat <-> Messages and Responses -> Messages
translations they replace, with the same inputs, expected outputs and refusal reasons,
through :func:`capmon.core.providers.hub.translate_request` (and the production check,
formats.incapable); every produced shape checked against the SDKs' own models. Then what the
hub carries that the chat translation could not: a Messages request crosses to Messages whole."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from anthropic.types import message_create_params
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import completion_create_params
from openai.types.responses import response_create_params
from pydantic import TypeAdapter

from capmon.core.providers import (
    anthropic_dialect,
    chat_format,
    converse_format,
    formats,
    gemini_format,
    hub,
    messages_format,
    responses_format,
)
from capmon.core.types import canon
from capmon.core.types.config import AnthropicVersion, ClientConfig, DropRule
from capmon.core.types.result import Format, Request
from tests.core.test_formats import target

pytestmark = pytest.mark.unit

ANTHROPIC_BODY: TypeAdapter[Any] = TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)
CHAT_BODY: TypeAdapter[Any] = TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
RESPONSES_BODY: TypeAdapter[Any] = TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)


def chat_to_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    return hub.translate_request(body, Format.CHAT, Format.MESSAGES)[0]


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    return hub.translate_request(body, Format.MESSAGES, Format.CHAT)[0]


def responses_to_messages(body: Mapping[str, Any]) -> dict[str, Any]:
    return hub.translate_request(body, Format.RESPONSES, Format.MESSAGES)[0]


def without_hints(body: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``body`` without its hints, and their names: decoded, the hints taken out
    (hub.without_hints), encoded back to Messages; ``model`` is the wire's (no request in
    canon terms names one), so it is put back as it was."""
    rest, hints = hub.without_hints(messages_format.decode_request(body))
    return {"model": body["model"], **messages_format.encode_request(rest)}, hints


PNG = "iVBORw0KGgo="
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather now", "parameters": WEATHER}}
ANTHROPIC_TOOL = {"name": "weather", "description": "Weather now", "input_schema": WEATHER}


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": list(messages), **fields}


def anthropic(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 1024, "messages": list(messages), **fields}


def chat_request(body: Mapping[str, Any]) -> Request:
    """A chat body as the caller's request (as the gateway reads one: the model aside)."""
    return Request.of(body["messages"], **{k: v for k, v in body.items() if k not in ("model", "messages")})


def incapable(request: Request, api: str, hints: DropRule = DropRule.DROP) -> str | None:
    """Why a target on ``api``'s wire cannot carry ``request``, or None: the production check
    (formats.incapable: the translation itself, then the wire's own rules)."""
    return formats.incapable(request, target(api), ClientConfig(unhonoured_hints=hints))


def refused(translate: Any, body: Mapping[str, Any]) -> str:
    """Why ``translate`` refuses ``body`` (it must)."""
    with pytest.raises(hub.Incapable) as e:
        translate(body)
    return str(e.value)


CALL = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
USE = {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}

# (name, chat request, the Messages fields it becomes): both directions read this table.
BOTH_WAYS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("plain-text", chat(user("Hi")), {"messages": [user([{"type": "text", "text": "Hi"}])]}),
    (
        "system-prompt",
        chat({"role": "system", "content": "Be brief."}, user("Hi")),
        {"system": "Be brief.", "messages": [user([{"type": "text", "text": "Hi"}])]},
    ),
    (
        "multi-turn",
        chat(user("Hi"), {"role": "assistant", "content": "Hello!"}, user("How are you?")),
        {
            "messages": [
                user([{"type": "text", "text": "Hi"}]),
                {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
                user([{"type": "text", "text": "How are you?"}]),
            ]
        },
    ),
    (
        "image-data-url",
        chat(
            user(
                [
                    {"type": "text", "text": "What is it?"},
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                ]
            )
        ),
        {
            "messages": [
                user(
                    [
                        {"type": "text", "text": "What is it?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                    ]
                )
            ]
        },
    ),
    (
        "image-url",
        chat(user([{"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}])),
        {"messages": [user([{"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}])]},
    ),
    (
        "tools-auto",
        chat(user("Weather?"), tools=[CHAT_TOOL], tool_choice="auto"),
        {
            "messages": [user([{"type": "text", "text": "Weather?"}])],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "auto"},
        },
    ),
    (
        "tools-none",
        chat(user("Weather?"), tools=[CHAT_TOOL], tool_choice="none"),
        {
            "messages": [user([{"type": "text", "text": "Weather?"}])],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "none"},
        },
    ),
    (
        "tools-required",
        chat(user("Weather?"), tools=[CHAT_TOOL], tool_choice="required"),
        {
            "messages": [user([{"type": "text", "text": "Weather?"}])],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any"},
        },
    ),
    (
        "tools-named",
        chat(user("Weather?"), tools=[CHAT_TOOL], tool_choice={"type": "function", "function": {"name": "weather"}}),
        {
            "messages": [user([{"type": "text", "text": "Weather?"}])],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "tool", "name": "weather"},
        },
    ),
    (
        "no-parallel-tool-calls",
        chat(user("Weather?"), tools=[CHAT_TOOL], tool_choice="required", parallel_tool_calls=False),
        {
            "messages": [user([{"type": "text", "text": "Weather?"}])],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        },
    ),
    (
        "tool-call-and-result-ids-kept",
        chat(
            user("Weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            tools=[CHAT_TOOL],
        ),
        {
            "messages": [
                user([{"type": "text", "text": "Weather in Paris?"}]),
                {"role": "assistant", "content": [USE]},
                user([{"type": "tool_result", "tool_use_id": "call_1", "content": "18C, sunny"}]),
            ],
            "tools": [ANTHROPIC_TOOL],
        },
    ),
    (
        "text-and-two-parallel-calls",
        chat(
            user("Paris and Rome?"),
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    CALL,
                    {**CALL, "id": "call_2", "function": {"name": "weather", "arguments": '{"city": "Rome"}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
        ),
        {
            "messages": [
                user([{"type": "text", "text": "Paris and Rome?"}]),
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Looking."},
                        USE,
                        {**USE, "id": "call_2", "input": {"city": "Rome"}},
                    ],
                },
                user(
                    [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                        {"type": "tool_result", "tool_use_id": "call_2", "content": "25C"},
                    ]
                ),
            ]
        },
    ),
    (
        "stop-sequences",
        chat(user("Count"), stop=["5", "six"]),
        {"messages": [user([{"type": "text", "text": "Count"}])], "stop_sequences": ["5", "six"]},
    ),
    (
        "sampling",
        chat(user("Hi"), temperature=0.2, top_p=0.9),
        {"messages": [user([{"type": "text", "text": "Hi"}])], "temperature": 0.2, "top_p": 0.9},
    ),
    (
        "token-cap",
        chat(user("Hi"), max_completion_tokens=77),
        {"messages": [user([{"type": "text", "text": "Hi"}])], "max_tokens": 77},
    ),
    (
        "json-schema-output",
        chat(user("Hi"), response_format={"type": "json_schema", "json_schema": {"name": "output", "schema": WEATHER}}),
        {
            "messages": [user([{"type": "text", "text": "Hi"}])],
            "output_config": {"format": {"type": "json_schema", "schema": WEATHER}},
        },
    ),
    (
        # Claude Code's mid-conversation system message (the SDK's SystemMessageParam)
        "mid-conversation-system",
        chat(user("Hi"), {"role": "assistant", "content": "Hello!"}, {"role": "system", "content": "Now in French."}),
        {
            "messages": [
                user([{"type": "text", "text": "Hi"}]),
                {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
                {"role": "system", "content": [{"type": "text", "text": "Now in French."}]},
            ]
        },
    ),
    (
        "user-id",
        chat(user("Hi"), user="u-42"),
        {"messages": [user([{"type": "text", "text": "Hi"}])], "metadata": {"user_id": "u-42"}},
    ),
]


@pytest.mark.parametrize(("name", "chat_body", "expected"), BOTH_WAYS, ids=[c[0] for c in BOTH_WAYS])
def test_chat_to_messages(name: str, chat_body: dict[str, Any], expected: dict[str, Any]) -> None:
    CHAT_BODY.validate_python(chat_body)
    assert incapable(chat_request(chat_body), "anthropic") is None
    got = chat_to_messages(chat_body)
    assert got == expected
    ANTHROPIC_BODY.validate_python(messages_format.messages_body(got, model="claude-x", max_tokens=1024, stream=False))


def _as_messages_request(expected: dict[str, Any]) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 1024, **expected}


@pytest.mark.parametrize(("name", "chat_body", "anthropic_fields"), BOTH_WAYS, ids=[c[0] for c in BOTH_WAYS])
def test_messages_to_chat_is_the_same_table_backwards(
    name: str, chat_body: dict[str, Any], anthropic_fields: dict[str, Any]
) -> None:
    body = _as_messages_request(anthropic_fields)
    if name == "token-cap":
        body["max_tokens"] = 77
    assert incapable(Request.anthropic(body), "openai") is None
    got = messages_to_chat(body)
    CHAT_BODY.validate_python({"model": "gpt-x", **got})
    # Chat -> Messages of what came back is the row again: the meaning went both ways.
    assert chat_to_messages({"model": "gpt-x", **got}) == {**anthropic_fields, "max_tokens": body["max_tokens"]}


def test_a_developer_prompt_and_several_system_parts_become_one_system() -> None:
    body = chat(
        {"role": "developer", "content": "Rule one."},
        {"role": "system", "content": [{"type": "text", "text": "Rule two."}]},
        user("Hi"),
    )
    assert chat_to_messages(body)["system"] == [
        {"type": "text", "text": "Rule one."},
        {"type": "text", "text": "Rule two."},
    ]


def test_anthropic_system_blocks_and_system_messages_become_system_messages() -> None:
    body = anthropic(
        user("Hi"),
        {"role": "system", "content": "Now in French."},
        user("Bonjour"),
        system=[{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
    )
    assert messages_to_chat(body)["messages"] == [
        {"role": "system", "content": "A\n\nB"},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Now in French."},
        {"role": "user", "content": "Bonjour"},
    ]


def test_a_failed_tool_result_says_so_in_the_tool_message() -> None:
    body = anthropic(
        user("Weather?"),
        {"role": "assistant", "content": [USE]},
        user(
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [{"type": "text", "text": "timeout"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again"},
            ]
        ),
    )
    got = messages_to_chat(body)["messages"]
    assert got[1]["tool_calls"][0]["id"] == "call_1"
    assert got[2:] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "(tool error) timeout"},
        {"role": "user", "content": "Try again"},
    ]


CHAT_REFUSED = [
    ("n-2", chat(user("Hi"), n=2), "n = 2"),
    ("logprobs", chat(user("Hi"), logprobs=True, top_logprobs=3), "logprobs"),
    ("audio-in", chat(user([{"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}])), "audio"),
    ("audio-out", chat(user("Hi"), modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}), "audio"),
    ("custom-tool", chat(user("Hi"), tools=[{"type": "custom", "custom": {"name": "grammar"}}]), "custom tool"),
    (
        "allowed-tools-choice",
        chat(
            user("Hi"),
            tools=[CHAT_TOOL],
            tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}},
        ),
        "tool_choice",
    ),
    ("temperature-over-1", chat(user("Hi"), temperature=1.5), "temperature = 1.5"),
    ("penalty", chat(user("Hi"), frequency_penalty=0.5), "frequency_penalty"),
    ("web-search", chat(user("Hi"), web_search_options={"search_context_size": "low"}), "web_search_options"),
    ("bmp-image", chat(user([{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}])), "image/bmp"),
    ("file-part", chat(user([{"type": "file", "file": {"file_id": "file-1"}}])), "file part"),
    ("legacy-functions", chat(user("Hi"), functions=[{"name": "f"}]), "functions"),
    ("prediction", chat(user("Hi"), prediction={"type": "content", "content": "x"}), "prediction"),
    (
        "arguments-not-json",
        chat(
            user("Hi"), {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{oops"}}]}
        ),
        "not JSON",
    ),
    ("json-object-format", chat(user("Hi"), response_format={"type": "json_object"}), "response_format"),
]


@pytest.mark.parametrize(("name", "body", "reason"), CHAT_REFUSED, ids=[c[0] for c in CHAT_REFUSED])
def test_chat_requests_anthropic_cannot_carry_are_refused(name: str, body: dict[str, Any], reason: str) -> None:
    assert reason in refused(chat_to_messages, body)
    got = incapable(chat_request(body), "anthropic")  # so a target on Anthropic's wire is skipped, saying why
    assert got is not None and reason in got, got


THINKING_ON = {"type": "enabled", "budget_tokens": 2048}
LOW_EFFORT = {"effort": "low"}
CLEAR_TOOLS = {"edits": [{"type": "clear_tool_uses_20250919"}]}
MESSAGES_REFUSED = [
    ("thinking", anthropic(user("Hi"), thinking=THINKING_ON), "thinking"),
    ("thinking-off", anthropic(user("Hi"), thinking={"type": "disabled"}), "thinking"),  # a hint: see HINTED
    ("clear-tool-uses", anthropic(user("Hi"), context_management=CLEAR_TOOLS), "context_management"),
    ("adaptive-thinking", anthropic(user("Hi"), thinking={"type": "adaptive"}), "thinking"),
    ("top-level-cache-control", anthropic(user("Hi"), cache_control={"type": "ephemeral"}), "cache_control"),
    (
        "block-cache-control",
        anthropic(user([{"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}])),
        "cache_control",
    ),
    (
        "system-cache-control",
        anthropic(user("Hi"), system=[{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]),
        "cache_control",
    ),
    ("top-k", anthropic(user("Hi"), top_k=40), "top_k"),
    (
        "web-search-tool",
        anthropic(user("Hi"), tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        "built-in",
    ),
    (
        "document",
        anthropic(user([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}])),
        "document",
    ),
    (
        "thinking-in-history",
        anthropic(
            user("Hi"), {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]}
        ),
        "thinking",
    ),
    ("five-stops", anthropic(user("Hi"), stop_sequences=["a", "b", "c", "d", "e"]), "5 stop sequences"),
    ("container", anthropic(user("Hi"), container="cntr_1"), "container"),
    ("effort", anthropic(user("Hi"), output_config={"effort": "high"}), "effort"),
    ("file-image", anthropic(user([{"type": "image", "source": {"type": "file", "file_id": "f1"}}])), "file source"),
    (
        "tool-examples",
        anthropic(user("Hi"), tools=[{**ANTHROPIC_TOOL, "input_examples": [{"city": "Oslo"}]}]),
        "input_examples",
    ),
    (
        "citations",
        anthropic(user([{"type": "text", "text": "x", "citations": [{"type": "char_location"}]}])),
        "citations",
    ),
]


@pytest.mark.parametrize(("name", "body", "reason"), MESSAGES_REFUSED, ids=[c[0] for c in MESSAGES_REFUSED])
def test_messages_requests_openai_cannot_carry_are_refused(name: str, body: dict[str, Any], reason: str) -> None:
    assert reason in refused(messages_to_chat, body)
    # so a target on OpenAI's wire is skipped, saying why (a hint among them when the rule says skip: see HINTED)
    got = incapable(Request.anthropic(body), "openai", hints=DropRule.SKIP)
    assert got is not None and reason in got, got


def test_fields_that_mean_nothing_to_the_answer_do_not_stop_a_request() -> None:
    body = chat(
        user("Hi"),
        store=True,
        seed=7,
        stream_options={"include_usage": True},
        prompt_cache_key="k",
        n=1,
        logprobs=False,
    )
    assert incapable(chat_request(body), "anthropic") is None
    assert incapable(Request.anthropic(anthropic(user("Hi"), service_tier="auto")), "openai") is None


# (name, Messages request, the hints taken out, the request without them): fields that say
# how to serve, never what an answer means, which OpenAI's chat cannot honour.
CACHE = {"type": "ephemeral"}
HINTED = [
    ("top-level-cache", anthropic(user("Hi"), cache_control=CACHE), ("cache_control",), anthropic(user("Hi"))),
    (
        "block-system-tool-and-tool-result-cache",
        anthropic(
            user([{"type": "text", "text": "Hi", "cache_control": CACHE}]),
            {"role": "assistant", "content": [USE]},
            user(
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_1",
                        "content": [{"type": "text", "text": "18C", "cache_control": CACHE}],
                    }
                ]
            ),
            system=[{"type": "text", "text": "S", "cache_control": CACHE}],
            tools=[{**ANTHROPIC_TOOL, "cache_control": CACHE}],
        ),
        ("cache_control",),
        anthropic(
            user([{"type": "text", "text": "Hi"}]),
            {"role": "assistant", "content": [USE]},
            user([{"type": "tool_result", "tool_use_id": "call_1", "content": [{"type": "text", "text": "18C"}]}]),
            system=[{"type": "text", "text": "S"}],
            tools=[ANTHROPIC_TOOL],
        ),
    ),
    ("adaptive-thinking", anthropic(user("Hi"), thinking={"type": "adaptive"}), ("thinking",), anthropic(user("Hi"))),
    ("thinking-off", anthropic(user("Hi"), thinking={"type": "disabled"}), ("thinking",), anthropic(user("Hi"))),
    (
        "default-effort",
        anthropic(user("Hi"), output_config={"effort": "high"}),
        ("output_config.effort",),
        anthropic(user("Hi")),
    ),
    (
        "default-effort-and-a-format",
        anthropic(user("Hi"), output_config={"effort": "high", "format": {"type": "json_schema", "schema": WEATHER}}),
        ("output_config.effort",),
        anthropic(user("Hi"), output_config={"format": {"type": "json_schema", "schema": WEATHER}}),
    ),
    (
        "clear-thinking-edits",
        anthropic(user("Hi"), context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
        ("context_management",),
        anthropic(user("Hi")),
    ),
    (
        "claude-code-all-four",
        anthropic(
            user("Hi"),
            cache_control=CACHE,
            thinking={"type": "adaptive"},
            output_config={"effort": "high"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        ),
        ("cache_control", "thinking", "output_config.effort", "context_management"),
        anthropic(user("Hi")),
    ),
    # not hints: they stay, and the translation refuses them (MESSAGES_REFUSED)
    (
        "thinking-with-a-budget",
        anthropic(user("Hi"), thinking=THINKING_ON),
        (),
        anthropic(user("Hi"), thinking=THINKING_ON),
    ),
    (
        "low-effort",
        anthropic(user("Hi"), output_config=LOW_EFFORT),
        (),
        anthropic(user("Hi"), output_config=LOW_EFFORT),
    ),
    (
        "clear-tool-uses",
        anthropic(user("Hi"), context_management=CLEAR_TOOLS),
        (),
        anthropic(user("Hi"), context_management=CLEAR_TOOLS),
    ),
]


@pytest.mark.parametrize(("name", "body", "hints", "rest"), HINTED, ids=[c[0] for c in HINTED])
def test_hints_are_taken_out_and_named_and_the_rest_translates_or_is_refused(
    name: str, body: dict[str, Any], hints: tuple[str, ...], rest: dict[str, Any]
) -> None:
    ANTHROPIC_BODY.validate_python(body)
    assert without_hints(body) == (rest, hints)
    if hints:
        refused(messages_to_chat, body)  # the translation alone never drops them silently
        messages_to_chat(rest)
        # a target on OpenAI's wire: the hints dropped, or (by the rule) the target skipped naming them
        assert incapable(Request.anthropic(body), "openai") is None
        why = incapable(Request.anthropic(body), "openai", hints=DropRule.SKIP)
        assert why is not None and all(h in why for h in hints), why
    else:
        refused(messages_to_chat, rest)
        assert incapable(Request.anthropic(rest), "openai") is not None


def test_sampling_a_2026_target_refuses_is_named_after_translation() -> None:
    translated = chat_to_messages(chat(user("Hi"), temperature=1.0, top_p=1.0))
    assert anthropic_dialect.refused_sampling(translated, AnthropicVersion.V2026_10_21) == ("temperature", "top_p")
    assert anthropic_dialect.refused_sampling(translated, AnthropicVersion.V2023_06_01) == ()


texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6), st.one_of(st.none(), texts))
def test_a_text_conversation_survives_a_round_trip(turns: list[str], system: str | None) -> None:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    back = messages_to_chat({"model": "c", **chat_to_messages(chat(*messages))})
    assert back["messages"] == messages


# ---------------------------------------------------------------- the Responses API to Messages

FUNCTION = {"type": "function", "name": "weather", "description": "Weather now", "parameters": WEATHER}


def req(input_: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "input": input_, **fields}


def text_user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


TABLE: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("input-string", req("Hi"), {"messages": [text_user("Hi")]}),
    ("instructions", req("Hi", instructions="Be brief."), {"system": "Be brief.", "messages": [text_user("Hi")]}),
    (
        "message-items",
        req(
            [
                {"role": "developer", "content": "Rules."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                {
                    "type": "message",
                    "id": "msg_0",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello!", "annotations": []}],
                },
                {"role": "user", "content": "More?"},
            ]
        ),
        {
            "system": "Rules.",
            "messages": [
                text_user("Hi"),
                {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
                text_user("More?"),
            ],
        },
    ),
    (
        "image",
        req(
            [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"}],
                }
            ]
        ),
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
                    ],
                }
            ]
        },
    ),
    (
        "function-call-round-trip",
        req(
            [
                {"role": "user", "content": "Weather in Paris?"},
                {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            ],
            tools=[FUNCTION],
            tool_choice="required",
            max_output_tokens=300,
            temperature=0.3,
        ),
        {
            "messages": [
                text_user("Weather in Paris?"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}]},
            ],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "any"},
            "max_tokens": 300,
            "temperature": 0.3,
        },
    ),
    (
        "named-tool",
        req("Weather?", tools=[FUNCTION], tool_choice={"type": "function", "name": "weather"}),
        {
            "messages": [text_user("Weather?")],
            "tools": [ANTHROPIC_TOOL],
            "tool_choice": {"type": "tool", "name": "weather"},
        },
    ),
    (
        "mid-conversation-developer",
        req([{"role": "user", "content": "Hi"}, {"role": "developer", "content": "Answer in French."}]),
        {
            "messages": [
                text_user("Hi"),
                {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
            ]
        },
    ),
    (
        "json-schema-text-format",
        req("Hi", text={"format": {"type": "json_schema", "name": "output", "schema": WEATHER}}),
        {"messages": [text_user("Hi")], "output_config": {"format": {"type": "json_schema", "schema": WEATHER}}},
    ),
]


@pytest.mark.parametrize(("name", "body", "expected"), TABLE, ids=[t[0] for t in TABLE])
def test_responses_to_messages(name: str, body: dict[str, Any], expected: dict[str, Any]) -> None:
    RESPONSES_BODY.validate_python(body)
    assert incapable(Request.responses(body), "anthropic") is None
    got = responses_to_messages(body)
    assert got == expected
    ANTHROPIC_BODY.validate_python(messages_format.messages_body(got, model="claude-x", max_tokens=1024, stream=False))


REFUSED = [
    ("web-search", req("Hi", tools=[{"type": "web_search"}]), "built-in web_search tool"),
    ("file-search", req("Hi", tools=[{"type": "file_search", "vector_store_ids": ["vs"]}]), "built-in file_search"),
    ("previous-response", req("Hi", previous_response_id="resp_1"), "previous_response_id"),
    ("reasoning", req("Hi", reasoning={"effort": "high"}), "reasoning effort = high"),
    ("reasoning-minimal", req("Hi", reasoning={"effort": "minimal", "summary": "auto"}), "reasoning effort = minimal"),
    ("reasoning-unknown-option", req("Hi", reasoning={"summary": "auto", "budget": 9}), "reasoning options"),
    ("reasoning-item", req([{"type": "reasoning", "id": "rs_1", "summary": []}]), "reasoning item"),
    (
        "file-image",
        req([{"role": "user", "content": [{"type": "input_image", "file_id": "file-1", "detail": "auto"}]}]),
        "file_id",
    ),
    ("input-file", req([{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]), "input_file"),
    ("truncation-auto", req("Hi", truncation="auto"), "truncation"),
    ("verbosity", req("Hi", text={"verbosity": "low"}), "verbosity"),
    ("builtin-tool-choice", req("Hi", tool_choice={"type": "web_search_preview"}), "tool_choice"),
    ("background", req("Hi", background=True), "background"),
    ("top-logprobs", req("Hi", top_logprobs=2), "top_logprobs"),
]


@pytest.mark.parametrize(("name", "body", "reason"), REFUSED, ids=[r[0] for r in REFUSED])
def test_responses_requests_anthropic_cannot_carry_are_refused(name: str, body: dict[str, Any], reason: str) -> None:
    assert reason in refused(responses_to_messages, body)
    got = incapable(Request.responses(body), "anthropic")  # so a target on Anthropic's wire is skipped
    assert got is not None and reason in got, got


def test_codex_like_bookkeeping_does_not_stop_a_request() -> None:
    body = req(
        "Hi", store=False, include=["reasoning.encrypted_content"], prompt_cache_key="s1", parallel_tool_calls=True
    )
    assert incapable(Request.responses(body), "anthropic") is None


@pytest.mark.parametrize(
    "fields",
    [
        # what Codex CLI 0.171 sends with every turn (its tools aside): a summary asked of
        # whatever reasoning happens, and its session and turn ids
        {"reasoning": {"summary": "auto"}, "client_metadata": {"session_id": "s1", "turn_id": "t1"}},
        {"reasoning": {"effort": "none", "summary": "detailed"}},
        {"reasoning": {"effort": None}},
    ],
    ids=["codex", "effort-none", "effort-null"],
)
def test_a_reasoning_object_asking_no_effort_and_codex_metadata_are_left_out(fields: dict[str, Any]) -> None:
    body = req("Hi", **fields)
    assert incapable(Request.responses(body), "anthropic") is None
    assert responses_to_messages(body) == responses_to_messages(req("Hi"))


# ---------------------------------------------------------------- what the hub carries that chat could not

SIGNED = {"type": "thinking", "thinking": "The user wants the weather.", "signature": "sig=="}
EVERYTHING = {
    "model": "claude-x",
    "max_tokens": 2048,
    "stream": True,
    "system": [
        {"type": "text", "text": "billing"},
        {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "messages": [
        user(
            [
                {
                    "type": "text",
                    "text": "Paris is sunny.",
                    "citations": [
                        {
                            "type": "char_location",
                            "cited_text": "sunny",
                            "document_index": 0,
                            "start_char_index": 0,
                            "end_char_index": 5,
                        }
                    ],
                },
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}},
                {"type": "text", "text": "Weather?", "cache_control": CACHE},
            ]
        ),
        {
            "role": "assistant",
            "content": [
                SIGNED,
                {"type": "redacted_thinking", "data": "opaque=="},
                {"type": "text", "text": "Looking."},
                {**USE, "cache_control": CACHE},
            ],
        },
        user(
            [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": [{"type": "text", "text": "timeout", "cache_control": CACHE}],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again"},
            ]
        ),
        {"role": "system", "content": "Now in French."},
        {"role": "assistant", "content": "D'accord."},
    ],
    "tools": [
        {**ANTHROPIC_TOOL, "strict": True, "cache_control": CACHE},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
    ],
    "tool_choice": {"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
    "thinking": THINKING_ON,
    "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": WEATHER}},
    "context_management": CLEAR_TOOLS,
    "cache_control": CACHE,
    "stop_sequences": ["a", "b", "c", "d", "e"],
    "temperature": 1.0,
    "top_k": 40,
    "metadata": {"user_id": "u-42"},
    "service_tier": "auto",
}


def test_a_messages_request_crosses_to_messages_whole() -> None:
    """Messages -> canon -> Messages gives back the body (but the wire's model and stream):
    thinking, cache hints everywhere, citations, a tool result's error flag, a document,
    a built-in tool, Anthropic's own fields."""
    ANTHROPIC_BODY.validate_python({k: v for k, v in EVERYTHING.items() if k != "stream"})
    decoded = messages_format.decode_request(EVERYTHING)
    assert messages_format.encode_request(decoded) == {
        k: v for k, v in EVERYTHING.items() if k not in ("model", "stream")
    }
    assert hub.translate_request(anthropic(user("Hi")), Format.MESSAGES, Format.MESSAGES)[0] == {
        "max_tokens": 1024,
        "messages": [user("Hi")],
    }


def test_the_canon_holds_what_chat_cannot_carry() -> None:
    decoded = messages_format.decode_request(EVERYTHING)
    first, reply, results = decoded.messages[:3]
    assert isinstance(first.parts[0], canon.Text) and first.parts[0].citations[0]["cited_text"] == "sunny"
    assert first.parts[2] == canon.Opaque("messages", "document", EVERYTHING["messages"][0]["content"][2])
    assert first.parts[3] == canon.Text("Weather?", canon.Cache(CACHE))
    assert reply.parts[:2] == (canon.Thinking(SIGNED["thinking"], "sig=="), canon.Thinking("opaque==", redacted=True))
    assert reply.parts[3] == canon.ToolCall(
        "call_1", "weather", '{"city": "Paris"}', {"city": "Paris"}, canon.Cache(CACHE)
    )
    result = results.parts[0]
    assert isinstance(result, canon.ToolResult) and result.is_error and result.call_id == "call_1"
    assert (decoded.thinking, decoded.effort, decoded.cache) == (THINKING_ON, "low", canon.Cache(CACHE))
    assert decoded.output == canon.OutputSchema(WEATHER)
    assert decoded.tool_choice == canon.ToolChoice(canon.Choice.TOOL, "weather")
    assert decoded.parallel_tool_calls is False and decoded.user == "u-42"
    assert decoded.tools[1].builtin and decoded.own == {"context_management": CLEAR_TOOLS, "top_k": 40}
    assert decoded.aside == {"metadata": {"user_id": "u-42"}, "service_tier": "auto"}
    assert [m.where for m in decoded.messages] == [f"messages[{i}]" for i in range(5)]


# (Messages body, what the chat encoder says of it, word for word): thinking and cache hints
# are in canon now, and the chat encoder still refuses them as the translation did.
CHAT_CANNOT = [
    (
        anthropic(user("Hi"), thinking=THINKING_ON),
        "thinking (OpenAI's chat completions cannot carry Anthropic's thinking)",
    ),
    (anthropic(user("Hi"), cache_control=CACHE), "cache_control (no OpenAI counterpart)"),
    (
        anthropic(user([{"type": "text", "text": "Hi", "cache_control": CACHE}])),
        "messages[0]: cache_control (OpenAI caches on its own terms)",
    ),
    (
        anthropic(user("Hi"), system=[{"type": "text", "text": "S", "cache_control": CACHE}]),
        "system: cache_control (OpenAI caches on its own terms)",
    ),
    (
        anthropic(user("Hi"), tools=[{**ANTHROPIC_TOOL, "cache_control": CACHE}]),
        "tool weather: cache_control (OpenAI caches on its own terms)",
    ),
    (
        anthropic(user("Hi"), user([{"type": "text", "text": "x", "citations": [{"type": "char_location"}]}])),
        "messages[1]: citations",
    ),
    (
        anthropic(user("Hi"), {"role": "assistant", "content": [SIGNED]}),
        "messages[1]: a thinking block in an assistant message",
    ),
    (anthropic(user("Hi"), top_k=40), "top_k (no OpenAI counterpart)"),
    (
        anthropic(user("Hi"), output_config={"effort": "low"}),
        "output_config other than a json_schema format (effort has no chat counterpart)",
    ),
    (anthropic(user("Hi"), stop_sequences=["a", "b", "c", "d", "e"]), "5 stop sequences (OpenAI takes 4)"),
    (
        anthropic(user([{"type": "image", "source": {"type": "file", "file_id": "f1"}}])),
        "an image with a file source (only base64 and url sources translate)",
    ),
    (
        anthropic(user([{"type": "tool_result", "content": "18C"}])),
        "messages[0]: a tool_result without tool_use_id",
    ),
]


@pytest.mark.parametrize(("body", "reason"), CHAT_CANNOT)
def test_the_chat_encoder_refuses_what_it_cannot_carry_word_for_word(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(hub.Incapable) as e:
        messages_to_chat(body)
    assert str(e.value) == reason


ANTHROPIC_CANNOT = [
    (chat(user("Hi"), n=2), "n = 2 (Anthropic gives one answer per request)"),
    (chat(user("Hi"), logprobs=True), "logprobs (Anthropic gives none)"),
    (chat(user("Hi"), presence_penalty=0.1), "presence_penalty (Anthropic has no penalties)"),
    (chat(user("Hi"), modalities=["audio"]), "audio output (modalities)"),
    (chat(user("Hi"), web_search_options={}, prediction={"type": "content"}), "prediction (no Anthropic counterpart)"),
    (chat(user("Hi"), user([{"type": "input_audio", "input_audio": {}}])), "messages[1]: audio input"),
    (
        chat(
            user("Hi"), {"role": "assistant", "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}]}
        ),
        "messages[1]: tool call arguments that are not a JSON object",
    ),
    (
        chat(
            {"role": "system", "content": "S"}, user("Hi"), {"role": "assistant", "content": "x", "audio": {"id": "a"}}
        ),
        "messages[2]: an assistant audio reply",
    ),
    (
        chat(user("Hi"), tools=[{"type": "function", "function": {"parameters": WEATHER}}]),
        "a function tool without a name",
    ),
    # Responses: places are input items
    (
        req([{"role": "user", "content": "Hi"}, {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
        "input[1]: a input_file part",
    ),
    (
        req(
            [
                {"role": "user", "content": "Hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"},
            ]
        ),
        "input[1]: tool call arguments that are not JSON",
    ),
    (
        req(
            [
                {"role": "assistant", "content": "Looking."},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "[]"},
            ],
            instructions="Be brief.",
        ),
        "input[2]: tool call arguments that are not a JSON object",
    ),
    (req("Hi", temperature=1.5), "temperature = 1.5 (Anthropic takes 0 to 1)"),
    (req("Hi", reasoning={"effort": "low"}), "reasoning effort = low (Anthropic's thinking is not translated)"),
]


@pytest.mark.parametrize(("body", "reason"), ANTHROPIC_CANNOT)
def test_the_messages_encoder_refuses_naming_places_in_the_callers_body(body: dict[str, Any], reason: str) -> None:
    source = Format.RESPONSES if "input" in body else Format.CHAT
    with pytest.raises(hub.Incapable) as e:
        hub.translate_request(body, source, Format.MESSAGES)
    assert str(e.value) == reason


def test_no_request_of_another_format_is_encoded_for_the_responses_api() -> None:
    with pytest.raises(hub.Incapable, match="chat requests cannot be sent as responses"):
        hub.translate_request(chat(user("Hi")), Format.CHAT, Format.RESPONSES)
    with pytest.raises(hub.Incapable, match="messages requests cannot be sent as responses"):
        responses_format.encode_request(messages_format.decode_request(anthropic(user("Hi"))))


def test_the_registry_holds_each_format() -> None:
    assert hub.FORMATS == {
        Format.CHAT: chat_format,
        Format.RESPONSES: responses_format,
        Format.MESSAGES: messages_format,
        Format.GEMINI: gemini_format,
        Format.CONVERSE: converse_format,
    }
    assert formats.Incapable is hub.Incapable


def test_text_blocks_already_in_chats_shape_are_shared_not_copied() -> None:
    blocks = [{"type": "text", "text": str(i)} for i in range(3)]
    got = messages_to_chat(anthropic(user(blocks)))["messages"][0]["content"]
    assert got == blocks and all(a is b for a, b in zip(got, blocks, strict=True))
    request = messages_format.decode_request(anthropic(user(blocks)))
    assert hub.without_hints(request) == (request, ()) and hub.without_hints(request)[0] is request


blocks_st = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": texts}).map(dict)
    | st.fixed_dictionaries({"type": st.just("text"), "text": texts, "cache_control": st.just(CACHE)}),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(texts, blocks_st), min_size=1, max_size=6), st.one_of(st.none(), texts, blocks_st))
def test_any_text_conversation_crosses_messages_to_messages_whole(contents: list[Any], system: Any) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": c} for i, c in enumerate(contents)]
    }
    if system:
        body["system"] = system
    assert messages_format.encode_request(messages_format.decode_request(body)) == body
    # and without its hints, chat carries it: the same text, each cache hint said
    rest, hints = hub.without_hints(messages_format.decode_request(body))
    assert hints == (("cache_control",) if "cache_control" in json.dumps(body) else ())
    assert len(chat_format.encode_request(rest)["messages"]) == len(contents) + bool(system)
