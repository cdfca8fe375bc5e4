"""OpenAI Responses API on Anthropic Messages: the request table (refusals included),
answers and streams back, checked against both SDKs' models."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import message_create_params
from openai.types import responses as rt
from openai.types.responses import response_create_params
from pydantic import TypeAdapter

from capmon.core.base.exceptions import BrokenAnswer
from capmon.core.providers import anthropic_wire as aw
from capmon.core.providers import formats
from capmon.core.providers import translate_responses_anthropic as tr
from capmon.core.providers.anthropic_wire import MessageAssembler
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request
from tests.core.test_anthropic_wire import TEXT_ANSWER, TOOL_ANSWER, end, json_piece, start
from tests.core.test_translate_chat_anthropic import ANTHROPIC_TOOL, PNG, WEATHER, incapable, refused

pytestmark = pytest.mark.unit

ANTHROPIC_BODY: TypeAdapter[Any] = TypeAdapter(message_create_params.MessageCreateParamsNonStreaming)
RESPONSES_BODY: TypeAdapter[Any] = TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming)
RESPONSES_EVENT: TypeAdapter[Any] = TypeAdapter(rt.ResponseStreamEvent)

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
    got = tr.responses_to_messages(body)
    assert got == expected
    ANTHROPIC_BODY.validate_python(aw.messages_body(got, model="claude-x", max_tokens=1024, stream=False))


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
    assert reason in refused(tr.responses_to_messages, body)
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
    assert tr.responses_to_messages(body) == tr.responses_to_messages(req("Hi"))


MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30},
}


@pytest.mark.parametrize(
    ("stop", "status", "reason"),
    [
        ("tool_use", "completed", None),
        ("end_turn", "completed", None),
        ("max_tokens", "incomplete", "max_output_tokens"),
        ("refusal", "incomplete", "content_filter"),
    ],
)
def test_an_anthropic_answer_as_a_response(stop: str, status: str, reason: str | None) -> None:
    response = rt.Response.model_validate(tr.message_to_response({**MESSAGE, "stop_reason": stop}, created=1767225600))
    assert response.status == status
    assert (response.incomplete_details.reason if response.incomplete_details else None) == reason
    assert response.output_text == "Looking."
    call = response.output[1]
    assert isinstance(call, rt.ResponseFunctionToolCall)
    assert (call.call_id, json.loads(call.arguments)) == ("toolu_1", {"city": "Paris"})
    assert response.usage is not None and (
        response.usage.input_tokens,
        response.usage.input_tokens_details.cached_tokens,
    ) == (40, 30)


def blocks_of(response: rt.Response) -> list[dict[str, Any]]:
    """A Responses answer's output read as Messages content blocks: what it says, in order."""
    blocks: list[dict[str, Any]] = []
    for item in response.output:
        if isinstance(item, rt.ResponseOutputMessage):
            blocks += [{"type": "text", "text": p.text} for p in item.content if isinstance(p, rt.ResponseOutputText)]
        elif isinstance(item, rt.ResponseFunctionToolCall):
            blocks.append(
                {"type": "tool_use", "id": item.call_id, "name": item.name, "input": json.loads(item.arguments)}
            )
    return blocks


@pytest.mark.parametrize("stop", ["tool_use", "end_turn", "max_tokens", "refusal"])
def test_an_anthropic_answer_as_a_response_says_all_it_said(stop: str) -> None:
    message = {**MESSAGE, "stop_reason": stop}
    if stop in ("end_turn", "max_tokens", "refusal"):
        message["content"] = message["content"][:1]
    response = rt.Response.model_validate(tr.message_to_response(message, created=1))
    assert blocks_of(response) == message["content"]
    assert response.usage is not None
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens) == (40, 30, 20)


def stream(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    s = tr.MessagesToResponsesStream(created=1767225600)
    out = [r for e in events for r in s.feed(e)]
    for r in out:
        RESPONSES_EVENT.validate_python(r)
    assert [r["sequence_number"] for r in out] == list(range(len(out)))
    return out


def test_an_anthropic_text_stream_as_responses_events() -> None:
    out = stream(TEXT_ANSWER)
    assert [r["type"] for r in out] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = rt.Response.model_validate(out[-1]["response"])
    assert final.output_text == "Hello" and final.usage is not None and final.usage.output_tokens == 9


def test_an_anthropic_tool_stream_as_function_call_argument_deltas() -> None:
    out = stream(TOOL_ANSWER)
    pieces = [r["delta"] for r in out if r["type"] == "response.function_call_arguments.delta"]
    assert pieces == ['{"city": "Pa', 'ris", "days"', ": 3}"]
    final = rt.Response.model_validate(out[-1]["response"])
    call = final.output[1]
    assert isinstance(call, rt.ResponseFunctionToolCall) and json.loads(call.arguments) == {"city": "Paris", "days": 3}
    # The answer read back is the answer that was streamed.
    original = MessageAssembler()
    for e in TOOL_ANSWER:
        original.add(e)
    assert blocks_of(final) == original.message()["content"]


def test_a_stream_cut_by_max_tokens_ends_incomplete() -> None:
    events = [start(), {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]
    events += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Lo"}}]
    events += [{"type": "content_block_stop", "index": 0}, *end("max_tokens")]
    out = stream(events)
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_error_after_output_never_completes_the_response() -> None:
    out = stream(TEXT_ANSWER[:4])  # message_start, block, ping, one text delta: then the overload
    assert "response.completed" not in [r["type"] for r in out]
    assert any(r["type"] == "response.output_text.delta" for r in out)


def test_an_anthropic_tool_block_that_is_not_json_never_completes_the_response() -> None:
    """Through the one codec an attempt uses: the call's deltas go out, but neither its
    arguments' ``.done``, its ``output_item.done`` nor ``response.completed``."""
    events = [*TOOL_ANSWER[:5], json_piece(1, '{"city": "Pa'), *TOOL_ANSWER[-3:]]
    c = formats.stream_codec(Request((), format=Format.RESPONSES), Format.MESSAGES, created=1)
    sent: list[Any] = []
    with pytest.raises(BrokenAnswer, match=r"weather \(toolu_1\).*not JSON") as broken:
        for e in events:
            sent += c.feed(e)
    assert broken.value.failure.kind is Kind.TRANSIENT
    types = [r["type"] for r in sent]
    assert types[-2:] == ["response.output_item.added", "response.function_call_arguments.delta"]
    assert not {"response.function_call_arguments.done", "response.completed"} & set(types)


def test_the_responses_end_waits_for_close_after_message_stop() -> None:
    c = formats.stream_codec(Request((), format=Format.RESPONSES), Format.MESSAGES, created=1)
    sent = [r for e in TOOL_ANSWER for r in c.feed(e)]
    assert sent[-1]["type"] == "response.output_item.done"
    (done,) = c.close()
    assert done["type"] == "response.completed" and done["sequence_number"] == len(sent)
