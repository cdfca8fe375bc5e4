"""The pure parts of continuing a broken stream (capmon/core/routing/continuation.py): the
request that goes on with a partial answer, in each caller format, the refusal of a prefill,
and a splice that follows what the caller was sent."""

from __future__ import annotations

import pytest

from capmon.core.providers.chat_format import ChatSplice
from capmon.core.providers.messages_format import MessagesSplice
from capmon.core.routing.continuation import INSTRUCTION, continued_request, refuses_prefill
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Request

pytestmark = pytest.mark.unit


def test_the_partial_answer_goes_as_a_prefill_without_its_trailing_whitespace() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    request, trailing = continued_request(Request.anthropic(body), "The answer so far ", prefill=True)
    assert request.extra["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "The answer so far"}],
    }
    assert trailing == " " and body["messages"] == [{"role": "user", "content": "hi"}]  # the caller's body untouched


def test_without_a_prefill_the_instruction_follows_the_partial_answer_in_each_format() -> None:
    chat, _ = continued_request(Request.of("hi"), "So far", prefill=False)
    assert chat.messages[-2:] == ({"role": "assistant", "content": "So far"}, {"role": "user", "content": INSTRUCTION})
    responses, trailing = continued_request(Request.responses({"input": "hi"}), "So far ", prefill=False)
    assert responses.extra["input"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "So far "},
        {"role": "user", "content": INSTRUCTION},
    ]
    assert trailing == ""


def test_a_prefill_refusal_is_a_bad_request_that_names_it() -> None:
    said = "This model does not support assistant message prefill. The conversation must end with a user message."
    assert refuses_prefill(Failure(Kind.BAD_REQUEST, said, 400))
    assert refuses_prefill(Failure(Kind.BAD_REQUEST, "final assistant content cannot end with trailing whitespace"))
    assert not refuses_prefill(Failure(Kind.CAPACITY, said, 529))
    assert not refuses_prefill(Failure(Kind.BAD_REQUEST, "messages: field required", 400))


def test_a_chat_splice_drops_the_second_role_chunk_and_says_who_continued() -> None:
    splice = ChatSplice(prompt=5)
    for c in (
        {"id": "a", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"id": "a", "choices": [{"index": 0, "delta": {"content": "Hello"}}]},
    ):
        splice.out(c)
    splice.begin("medium", "")
    assert splice.fit({"id": "b", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}) == []
    [more] = splice.fit({"id": "b", "choices": [{"index": 0, "delta": {"content": " world"}}]})
    assert more["id"] == "a" and more["choices"][0]["delta"]["content"] == " world"
    [end] = splice.fit({"id": "b", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert end["capmon_continued"] == [{"model": "medium", "offset": 5}]


def test_a_half_tool_call_is_never_continued() -> None:
    splice = MessagesSplice(prompt=5)
    splice.out(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "t", "name": "x"}}
    )
    splice.out(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"a'}}
    )
    assert splice.partial().half_call and splice.partial().why_not is not None


def test_a_messages_break_between_blocks_numbers_the_next_block_after_the_callers() -> None:
    splice = MessagesSplice(prompt=5)
    splice.out({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    splice.out({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "One."}})
    splice.out({"type": "content_block_stop", "index": 0})
    splice.begin("claude", "")
    assert splice.fit({"type": "message_start", "message": {}}) == []
    [start] = splice.fit({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    assert start["index"] == 1
