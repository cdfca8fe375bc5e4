"""OpenAI chat completions <-> Anthropic Messages: request tables both ways (refusals
included), round trips, answers and streams, every produced shape checked against the
SDK's own models (anthropic's and openai's)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anthropic.types as at
import pytest
from anthropic.types import message_create_params
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk, completion_create_params
from pydantic import TypeAdapter

from capmon.core.base.exceptions import BrokenAnswer
from capmon.core.providers import anthropic_wire as aw
from capmon.core.providers import formats
from capmon.core.providers import translate_chat_anthropic as tr
from capmon.core.providers.anthropic_wire import MessageAssembler
from capmon.core.providers.openai_wire import Assembler
from capmon.core.types.config import ClientConfig, DropRule
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request
from tests.core.test_anthropic_wire import OVERLOADED, TEXT_ANSWER, TOOL_ANSWER, json_piece
from tests.core.test_formats import target

pytestmark = pytest.mark.unit

ANTHROPIC_BODY: TypeAdapter[Any] = TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)
CHAT_BODY: TypeAdapter[Any] = TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming)
EVENT: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)

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
    with pytest.raises(tr.Untranslatable) as e:
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
    got = tr.chat_to_messages(chat_body)
    assert got == expected
    ANTHROPIC_BODY.validate_python(aw.messages_body(got, model="claude-x", max_tokens=1024, stream=False))


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
    got = tr.messages_to_chat(body)
    CHAT_BODY.validate_python({"model": "gpt-x", **got})
    # Chat -> Messages of what came back is the row again: the meaning went both ways.
    assert tr.chat_to_messages({"model": "gpt-x", **got}) == {**anthropic_fields, "max_tokens": body["max_tokens"]}


def test_a_developer_prompt_and_several_system_parts_become_one_system() -> None:
    body = chat(
        {"role": "developer", "content": "Rule one."},
        {"role": "system", "content": [{"type": "text", "text": "Rule two."}]},
        user("Hi"),
    )
    assert tr.chat_to_messages(body)["system"] == [
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
    assert tr.messages_to_chat(body)["messages"] == [
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
    got = tr.messages_to_chat(body)["messages"]
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
    assert reason in refused(tr.chat_to_messages, body)
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
    assert reason in refused(tr.messages_to_chat, body)
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
    assert tr.without_hints(body) == (rest, hints)
    if hints:
        refused(tr.messages_to_chat, body)  # the translation alone never drops them silently
        tr.messages_to_chat(rest)
        # a target on OpenAI's wire: the hints dropped, or (by the rule) the target skipped naming them
        assert incapable(Request.anthropic(body), "openai") is None
        why = incapable(Request.anthropic(body), "openai", hints=DropRule.SKIP)
        assert why is not None and all(h in why for h in hints), why
    else:
        refused(tr.messages_to_chat, rest)
        assert incapable(Request.anthropic(rest), "openai") is not None


def test_sampling_a_2026_target_refuses_is_named_after_translation() -> None:
    translated = tr.chat_to_messages(chat(user("Hi"), temperature=1.0, top_p=1.0))
    assert aw.refused_sampling(translated, aw.AnthropicVersion.V2026_10_21) == ("temperature", "top_p")
    assert aw.refused_sampling(translated, aw.AnthropicVersion.V2023_06_01) == ()


texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(st.lists(texts, min_size=1, max_size=6), st.one_of(st.none(), texts))
def test_a_text_conversation_survives_a_round_trip(turns: list[str], system: str | None) -> None:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    back = tr.messages_to_chat({"model": "c", **tr.chat_to_messages(chat(*messages))})
    assert back["messages"] == messages


# ---------------------------------------------------------------- answers

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [{"type": "text", "text": "Let me look."}, USE],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5},
}


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ],
)
def test_an_anthropic_answer_as_a_chat_completion(stop: str, finish: str) -> None:
    completion = tr.message_to_completion({**MESSAGE, "stop_reason": stop}, created=1767225600)
    parsed = ChatCompletion.model_validate(completion)
    assert parsed.choices[0].finish_reason == finish
    assert parsed.choices[0].message.content == "Let me look."
    call = parsed.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert (call.id, json.loads(call.function.arguments)) == ("call_1", {"city": "Paris"})  # type: ignore[union-attr]
    assert parsed.usage is not None and parsed.usage.prompt_tokens == 45 and parsed.usage.completion_tokens == 20
    assert parsed.usage.prompt_tokens_details is not None and parsed.usage.prompt_tokens_details.cached_tokens == 30


@pytest.mark.parametrize(
    ("finish", "stop"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use"), ("content_filter", "refusal")],
)
def test_a_chat_completion_as_an_anthropic_answer(finish: str, stop: str) -> None:
    completion = tr.message_to_completion(MESSAGE, created=1)
    completion["choices"][0]["finish_reason"] = finish
    message = at.Message.model_validate(tr.completion_to_message(completion))
    assert message.stop_reason == stop
    assert [b.type for b in message.content] == ["text", "tool_use"]
    # Usage comes back as it went: the cached and cache-written parts apart again.
    assert message.usage.model_dump(exclude_none=True) == {**MESSAGE["usage"]}


def test_a_refusal_answer_is_a_refusal() -> None:
    completion = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-x",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": "I can't help."},
                "finish_reason": "stop",
            }
        ],
    }
    message = at.Message.model_validate(tr.completion_to_message(completion))
    assert (message.stop_reason, aw.message_text(message.model_dump())) == ("refusal", "I can't help.")


def test_an_answer_with_arguments_that_are_not_an_object_is_untranslatable() -> None:
    completion = tr.message_to_completion(MESSAGE, created=1)
    completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    with pytest.raises(tr.Untranslatable, match="not a JSON object"):
        tr.completion_to_message(completion)


# ---------------------------------------------------------------- streams


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-x",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def tool_delta(index: int, **fields: Any) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": index, **fields}]})


USAGE_CHUNK = {
    **chunk({}),
    "choices": [],
    "usage": {
        "prompt_tokens": 50,
        "completion_tokens": 7,
        "total_tokens": 57,
        "prompt_tokens_details": {"cached_tokens": 40},
    },
}
CHAT_TEXT = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, "stop"),
    USAGE_CHUNK,
]
CHAT_TOOLS = [
    chunk({"role": "assistant", "content": None}),
    tool_delta(0, id="call_1", type="function", function={"name": "weather", "arguments": ""}),
    tool_delta(0, function={"arguments": '{"ci'}),
    tool_delta(0, function={"arguments": 'ty": "Paris"}'}),
    tool_delta(1, id="call_2", type="function", function={"name": "weather", "arguments": '{"city":'}),
    tool_delta(1, function={"arguments": ' "Rome"}'}),
    chunk({}, "tool_calls"),
    USAGE_CHUNK,
]


def to_messages(chunks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], MessageAssembler]:
    s = tr.ChatToMessagesStream()
    events = [e for c in chunks for e in s.feed(c)] + s.close()
    asm = MessageAssembler()
    for e in events:
        EVENT.validate_python(e)
        asm.add(e)
    return events, asm


def test_a_chat_text_stream_as_anthropic_events() -> None:
    events, asm = to_messages(CHAT_TEXT)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    message = at.Message.model_validate(asm.message())
    assert (aw.message_text(asm.message()), message.stop_reason) == ("Hello", "end_turn")
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        10,
        40,
        7,
    )


def test_a_chat_tool_stream_as_anthropic_events_with_argument_pieces() -> None:
    events, asm = to_messages(CHAT_TOOLS)
    pieces = [e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"]
    assert pieces == ['{"ci', 'ty": "Paris"}', '{"city":', ' "Rome"}']
    message = at.Message.model_validate(asm.message())
    assert [(b.id, b.input) for b in message.content if isinstance(b, at.ToolUseBlock)] == [
        ("call_1", {"city": "Paris"}),
        ("call_2", {"city": "Rome"}),
    ]
    assert message.stop_reason == "tool_use"


def to_chat(events: list[dict[str, Any]], **kw: Any) -> tuple[list[dict[str, Any]], Assembler]:
    s = tr.MessagesToChatStream(created=1767225600, **kw)
    chunks = [c for e in events for c in s.feed(e)]
    asm = Assembler()
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
        asm.add(c)
    return chunks, asm


def test_an_anthropic_text_stream_as_chat_chunks_ending_as_openais() -> None:
    chunks, asm = to_chat(TEXT_ANSWER)
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9
    done = ChatCompletion.model_validate(asm.completion() | {"id": "x", "created": 1, "model": "claude-x"})
    assert done.choices[0].message.content == "Hello"
    assert done.usage is not None and done.usage.prompt_tokens == 16


def test_an_anthropic_tool_stream_as_chat_tool_call_deltas() -> None:
    chunks, asm = to_chat(TOOL_ANSWER, include_usage=False)
    pieces = [
        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]
    assert pieces == ["", '{"city": "Pa', 'ris", "days"', ": 3}"]
    completion = asm.completion()
    call = completion["choices"][0]["message"]["tool_calls"][0]
    assert (call["id"], json.loads(call["function"]["arguments"])) == ("toolu_1", {"city": "Paris", "days": 3})
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["choices"] for c in chunks)  # no usage chunk when the caller did not ask


def test_an_error_after_output_never_ends_as_a_completed_answer() -> None:
    events = [*TEXT_ANSWER[:4], OVERLOADED]  # message_start, block, ping, "Hel", then the overload
    s = tr.MessagesToChatStream(created=1)
    chunks = [c for e in events[:-1] for c in s.feed(e)]
    assert not any(c["choices"][0]["finish_reason"] for c in chunks)
    # The reader stops at the error (the attempt fails the stream); an Anthropic client
    # is told in Anthropic's shape.
    failure = aw.event_failure(OVERLOADED, now=0.0)
    from anthropic.types.shared.error_response import ErrorResponse

    assert ErrorResponse.model_validate(aw.error_body(failure)).error.type == "overloaded_error"
    # The other way: the chat side failed after text; close() is never called, so no message_stop.
    other = tr.ChatToMessagesStream()
    sent = [e for c in CHAT_TEXT[:2] for e in other.feed(c)]
    assert "message_stop" not in [e["type"] for e in sent]


def test_stream_round_trip_keeps_the_answer() -> None:
    chunks, asm = to_chat(TOOL_ANSWER)
    events, back = to_messages(chunks)
    original = MessageAssembler()
    for e in TOOL_ANSWER:
        original.add(e)
    assert back.message()["content"] == original.message()["content"]
    assert back.message()["stop_reason"] == "tool_use"


# ---------------------------------------------------------------- streams across formats: how they end


def codec(caller: Format, target_wire: Format, **extra: Any) -> formats.Codec:
    """The one translator an attempt uses (capmon/core/providers/formats.py), end checks included."""
    return formats.stream_codec(Request((), format=caller, extra=extra), target_wire, created=1)


def run(c: formats.Codec, events: list[dict[str, Any]]) -> tuple[list[Mapping[str, Any]], BrokenAnswer | None]:
    """What the caller is sent, event by event, and the broken answer that stopped it (its
    end comes only from ``close``, which the attempt calls once the wire's own end came)."""
    out: list[Mapping[str, Any]] = []
    try:
        for e in events:
            out += c.feed(e)
        out += c.close()
    except BrokenAnswer as e:
        return out, e
    return out, None


def chat_broken(arguments: list[str]) -> list[dict[str, Any]]:
    """A chat stream of one call of ``weather`` whose arguments come in ``arguments``, finished
    as a whole one is: finish reason tool_calls, usage."""
    head = tool_delta(0, id="call_1", type="function", function={"name": "weather", "arguments": ""})
    pieces = [tool_delta(0, function={"arguments": a}) for a in arguments]
    return [chunk({"role": "assistant", "content": None}), head, *pieces, chunk({}, "tool_calls"), USAGE_CHUNK]


def messages_broken(arguments: list[str]) -> list[dict[str, Any]]:
    """TOOL_ANSWER with the tool_use block's pieces replaced by ``arguments``."""
    pieces = [json_piece(1, a) for a in arguments]
    return [*TOOL_ANSWER[:5], *pieces, *TOOL_ANSWER[-3:]]


def test_a_chat_stream_whose_tool_call_is_not_json_never_ends_as_a_messages_answer() -> None:
    out, broken = run(codec(Format.MESSAGES, Format.CHAT), chat_broken(['{"city": "Par']))
    assert broken is not None and broken.failure.kind is Kind.TRANSIENT and broken.failure.status == 200
    assert "weather (call_1)" in broken.failure.reason and "not JSON" in broken.failure.reason
    # the call's pieces went out; the block's stop, the stop reason and message_stop did not
    assert [e["type"] for e in out] == ["message_start", "content_block_start", "content_block_delta"]


def test_a_chat_call_is_checked_when_the_next_begins_before_its_block_stops() -> None:
    events = chat_broken(['{"city": "Par'])
    events.insert(3, tool_delta(1, id="call_2", type="function", function={"name": "weather", "arguments": "{}"}))
    out, broken = run(codec(Format.MESSAGES, Format.CHAT), events)
    assert broken is not None and "weather (call_1)" in broken.failure.reason
    assert "content_block_stop" not in [e["type"] for e in out]


@pytest.mark.parametrize("arguments", [["[1, 2]"], ['"Paris"'], ["{", "}}"]], ids=["array", "string", "extra-brace"])
def test_chat_arguments_that_are_no_json_object_break_the_answer(arguments: list[str]) -> None:
    out, broken = run(codec(Format.MESSAGES, Format.CHAT), chat_broken(arguments))
    assert broken is not None and "message_stop" not in [e["type"] for e in out]


def test_a_whole_chat_tool_stream_still_ends_as_anthropics_does() -> None:
    out, broken = run(codec(Format.MESSAGES, Format.CHAT), CHAT_TOOLS)
    assert broken is None
    assert [e["type"] for e in out][-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert out[-2]["delta"]["stop_reason"] == "tool_use"  # type: ignore[index]
    # no arguments at all is an empty object, as for Anthropic's own tool_use without input
    assert run(codec(Format.MESSAGES, Format.CHAT), chat_broken([]))[1] is None


def test_the_messages_end_waits_for_close_even_after_the_finish_reason() -> None:
    c = codec(Format.MESSAGES, Format.CHAT)
    sent = [e["type"] for event in CHAT_TOOLS for e in c.feed(event)]
    assert "message_delta" not in sent and "message_stop" not in sent
    assert [e["type"] for e in c.close()][-2:] == ["message_delta", "message_stop"]


def test_an_anthropic_tool_block_that_is_not_json_never_ends_as_a_chat_answer() -> None:
    out, broken = run(
        codec(Format.CHAT, Format.MESSAGES, stream_options={"include_usage": True}),
        messages_broken(['{"city": "Pa', "ris"]),
    )
    assert broken is not None and "weather (toolu_1)" in broken.failure.reason
    assert out and not any(c["choices"] and c["choices"][0]["finish_reason"] for c in out)
    assert not any(c.get("usage") for c in out)  # the closing usage chunk did not go out either
    pieces = [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in out[2:]]
    assert pieces == ["", '{"city": "Pa', "ris"]  # the call and its pieces went out, then nothing


def test_an_anthropic_tool_block_never_stopped_is_checked_at_the_end() -> None:
    events = [
        e for e in messages_broken(['{"city": "Pa']) if not (e["type"] == "content_block_stop" and e["index"] == 1)
    ]
    c = codec(Format.CHAT, Format.MESSAGES)
    sent = [x for e in events for x in c.feed(e)]
    assert not any(x["choices"][0]["finish_reason"] for x in sent)  # message_stop's finish is held
    with pytest.raises(BrokenAnswer, match="weather"):
        c.close()


def test_the_chat_end_waits_for_close_after_message_stop() -> None:
    c = codec(Format.CHAT, Format.MESSAGES, stream_options={"include_usage": True})
    sent = [x for e in TOOL_ANSWER for x in c.feed(e)]
    assert not any(x["choices"] and x["choices"][0]["finish_reason"] for x in sent)
    end = c.close()
    assert end[0]["choices"][0]["finish_reason"] == "tool_calls" and end[1]["usage"]["completion_tokens"] == 30


def test_a_plain_answer_with_a_broken_tool_call_is_broken_in_both_directions() -> None:
    completion = tr.message_to_completion(MESSAGE, created=1)
    completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"city": "Par'
    with pytest.raises(BrokenAnswer, match=r"weather \(call_1\).*not JSON"):
        formats.answer_in(Format.MESSAGES, Format.CHAT, completion, created=1)
    for not_object in ('{"city": "Par', ["Paris"]):  # an input that is no object, whatever its shape
        message = {**MESSAGE, "content": [{**USE, "input": not_object}]}
        for caller in (Format.CHAT, Format.RESPONSES):
            with pytest.raises(BrokenAnswer, match=r"weather \(call_1\)"):
                formats.answer_in(caller, Format.MESSAGES, message, created=1)
    assert formats.answer_in(
        Format.MESSAGES, Format.MESSAGES, {**MESSAGE, "content": [{**USE, "input": "x"}]}, created=1
    )
