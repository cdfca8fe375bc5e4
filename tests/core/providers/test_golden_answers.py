"""Answers and streams through the canonical hub (capmon/core/providers/hub.py): every move
between formats is ``target.encode(source.decode(x))``.

The pair translators' answer and stream tests (tests/core/test_translate_chat_anthropic.py,
tests/core/test_translate_responses_anthropic.py) with the same inputs and expectations,
calling the hub; golden outputs (golden_answers.json, written by the pair translators,
translate_chat_anthropic and translate_responses_anthropic, when the hub replaced them: each
output, per event fed, in key order, which the gateway serialises as it is); and what the
hub carries that a pair translation could not (thinking, citations, a stop reason it does
not know: a Messages answer or stream through the hub and back is itself)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anthropic.types as at
import pytest
from anthropic.types.shared.error_response import ErrorResponse
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types import responses as rt
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import TypeAdapter

from capmon.core.base.exceptions import BrokenAnswer
from capmon.core.providers import chat_format, formats, hub, messages_format, responses_format
from capmon.core.providers.chat_format import Assembler
from capmon.core.providers.messages_format import MessageAssembler
from capmon.core.types import canon
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format, Request
from tests.core.test_messages_format import (
    OVERLOADED,
    TEXT_ANSWER,
    THINKING_ANSWER,
    TOOL_ANSWER,
    block,
    delta,
    end,
    json_piece,
    start,
    stop,
    text,
)

pytestmark = pytest.mark.unit

EVENT: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)
RESPONSES_EVENT: TypeAdapter[Any] = TypeAdapter(rt.ResponseStreamEvent)
GOLDEN = json.loads((Path(__file__).parent / "golden_answers.json").read_text())

USE = {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}


def to_completion(message: Mapping[str, Any], *, created: int) -> dict[str, Any]:
    return hub.translate_answer(message, Format.MESSAGES, Format.CHAT, created=created)


def to_message(completion: Mapping[str, Any]) -> dict[str, Any]:
    return hub.translate_answer(completion, Format.CHAT, Format.MESSAGES, created=0)


def to_response(message: Mapping[str, Any], *, created: int) -> dict[str, Any]:
    return hub.translate_answer(message, Format.MESSAGES, Format.RESPONSES, created=created)


def in_order(obj: Any) -> str:
    """A value as the gateway writes it: key order counts."""
    return json.dumps(obj)


# ---------------------------------------------------------------- golden outputs


@pytest.mark.parametrize(
    "case", GOLDEN["answers"], ids=[f"{c['source']}-to-{c['target']}-{c['name']}" for c in GOLDEN["answers"]]
)
def test_an_answer_across_formats_is_what_the_pair_translators_gave(case: dict[str, Any]) -> None:
    source, target = Format(case["source"]), Format(case["target"])
    if "error" in case:
        with pytest.raises(hub.Incapable) as e:
            hub.translate_answer(case["input"], source, target, created=case["created"])
        assert str(e.value) == case["error"]
        return
    got = hub.translate_answer(case["input"], source, target, created=case["created"])
    assert in_order(got) == in_order(case["output"])


@pytest.mark.parametrize(
    "case",
    GOLDEN["streams"],
    ids=[f"{c['source']}-to-{c['target']}-{c['name']}-usage-{c['include_usage']}" for c in GOLDEN["streams"]],
)
def test_a_stream_across_formats_is_what_the_pair_translators_gave(case: dict[str, Any]) -> None:
    t = hub.Translation(
        Format(case["source"]), Format(case["target"]), created=case["created"], include_usage=case["include_usage"]
    )
    assert [in_order(t.feed(e)) for e in case["input"]] == [in_order(out) for out in case["output"]]
    assert in_order(t.close()) == in_order(case["close"])
    assert t.close() == [] or case["source"] != "chat"  # chat's end is said once


# ---------------------------------------------------------------- answers (test_translate_chat_anthropic)

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
    completion = to_completion({**MESSAGE, "stop_reason": stop}, created=1767225600)
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
    completion = to_completion(MESSAGE, created=1)
    completion["choices"][0]["finish_reason"] = finish
    message = at.Message.model_validate(to_message(completion))
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
    message = at.Message.model_validate(to_message(completion))
    assert (message.stop_reason, messages_format.text(message.model_dump())) == ("refusal", "I can't help.")


def test_an_answer_with_arguments_that_are_not_an_object_is_untranslatable() -> None:
    completion = to_completion(MESSAGE, created=1)
    completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = "[1, 2]"
    with pytest.raises(hub.Incapable, match="not a JSON object"):
        to_message(completion)


# ---------------------------------------------------------------- streams (test_translate_chat_anthropic)


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
    s = hub.Translation(Format.CHAT, Format.MESSAGES, created=1)
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
    assert (messages_format.text(asm.message()), message.stop_reason) == ("Hello", "end_turn")
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
    s = hub.Translation(Format.MESSAGES, Format.CHAT, created=1767225600, **kw)
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
    s = hub.Translation(Format.MESSAGES, Format.CHAT, created=1)
    chunks = [c for e in events[:-1] for c in s.feed(e)]
    assert not any(c["choices"][0]["finish_reason"] for c in chunks)
    # The reader stops at the error (the attempt fails the stream); an Anthropic client
    # is told in Anthropic's shape.
    failure = messages_format.event_failure(OVERLOADED, now=0.0)
    assert ErrorResponse.model_validate(messages_format.error_body(failure)).error.type == "overloaded_error"
    # The other way: the chat side failed after text; close() is never called, so no message_stop.
    other = hub.Translation(Format.CHAT, Format.MESSAGES, created=1)
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
    completion = to_completion(MESSAGE, created=1)
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


# ---------------------------------------------------------------- answers (test_translate_responses_anthropic)

RESPONSES_MESSAGE = {
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
    response = rt.Response.model_validate(to_response({**RESPONSES_MESSAGE, "stop_reason": stop}, created=1767225600))
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
    message = {**RESPONSES_MESSAGE, "stop_reason": stop}
    if stop in ("end_turn", "max_tokens", "refusal"):
        message["content"] = message["content"][:1]
    response = rt.Response.model_validate(to_response(message, created=1))
    assert blocks_of(response) == message["content"]
    assert response.usage is not None
    usage = response.usage
    assert (usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens) == (40, 30, 20)


# ---------------------------------------------------------------- streams (test_translate_responses_anthropic)


def stream(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    s = hub.Translation(Format.MESSAGES, Format.RESPONSES, created=1767225600)
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


# ---------------------------------------------------------------- what the hub carries whole

CITATION = {
    "type": "char_location",
    "cited_text": "Paris is sunny.",
    "document_index": 0,
    "document_title": "Forecast",
    "start_char_index": 0,
    "end_char_index": 15,
}
RICH = {
    "id": "msg_r",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "thinking", "thinking": "The forecast says sunny.", "signature": "c2ln"},
        {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
        {"type": "text", "text": "Sunny in Paris.", "citations": [CITATION]},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "Paris weather"}},
        USE,
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5},
}


def test_a_messages_answer_with_thinking_and_citations_goes_through_the_hub_whole() -> None:
    at.Message.model_validate(RICH)
    answer = messages_format.decode_answer(RICH)
    thinking, redacted, cited, server, call = answer.parts
    assert thinking == canon.Thinking("The forecast says sunny.", "c2ln")
    assert redacted == canon.Thinking("ZW5jcnlwdGVk", redacted=True)
    assert isinstance(cited, canon.Text) and cited.citations == (CITATION,)
    assert isinstance(server, canon.Opaque) and server.kind == "server_tool_use"
    assert isinstance(call, canon.ToolCall) and call.input == {"city": "Paris"}
    assert answer.usage == canon.Usage(input=10, cache_write=5, cache_read=30, output=20)
    assert messages_format.encode_answer(answer, created=1) == RICH
    assert hub.translate_answer(RICH, Format.MESSAGES, Format.MESSAGES, created=1) == RICH


def test_what_chat_and_responses_cannot_carry_is_left_out_as_before() -> None:
    """Thinking and a server tool's use are left out of chat and Responses answers; the
    Responses items keep their block's index (thinking counts)."""
    completion = to_completion(RICH, created=1)
    assert completion["choices"][0]["message"]["content"] == "Sunny in Paris."
    assert [c["id"] for c in completion["choices"][0]["message"]["tool_calls"]] == ["call_1"]
    response = to_response(RICH, created=1)
    assert [item["id"] for item in response["output"]] == ["msg_r_2", "msg_r_4"]


def test_a_stop_reason_the_hub_does_not_know_crosses_as_none_and_comes_back_as_itself() -> None:
    message = {**MESSAGE, "stop_reason": "a_newer_reason"}
    answer = messages_format.decode_answer(message)
    assert (answer.stop, answer.stop_other) == (None, "a_newer_reason")
    assert messages_format.encode_answer(answer, created=1) == message
    assert to_completion(message, created=1)["choices"][0]["finish_reason"] == "stop"
    assert to_response(message, created=1)["status"] == "completed"


RICH_STREAM = [
    start(),
    *THINKING_ANSWER[1:6],  # the thinking block with its signature
    block(1, {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}),
    stop(1),
    block(2, {"type": "text", "text": ""}),
    text(2, "Sunny"),
    delta(2, {"type": "citations_delta", "citation": CITATION}),
    text(2, " in Paris."),
    stop(2),
    block(3, {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
    json_piece(3, '{"city": '),
    json_piece(3, '"Paris"}'),
    stop(3),
    {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 30, "cache_creation_input_tokens": 7},
    },
    {"type": "message_stop"},
]


def test_a_messages_stream_with_thinking_and_citations_goes_through_the_hub_whole() -> None:
    for e in RICH_STREAM:
        EVENT.validate_python(e)
    decoder, encoder = messages_format.stream_decoder(), messages_format.stream_encoder(created=1, include_usage=False)
    canonical = [c for e in RICH_STREAM for c in decoder.feed(e)]
    assert canon.PartDelta(2, citation=CITATION) in canonical
    assert canon.PartDelta(0, signature="c2ln") in canonical
    assert [out for c in canonical for out in encoder.feed(c)] == RICH_STREAM
    t = hub.Translation(Format.MESSAGES, Format.MESSAGES, created=1)
    assert [out for e in [*RICH_STREAM[:3], {"type": "ping"}, *RICH_STREAM[3:]] for out in t.feed(e)] == RICH_STREAM
    assert t.close() == []


def test_a_responses_answer_or_stream_is_never_decoded() -> None:
    with pytest.raises(hub.Incapable, match="only by a Responses caller"):
        responses_format.decode_answer({"object": "response", "output": []})
    with pytest.raises(hub.Incapable, match="only by a Responses caller"):
        hub.Translation(Format.RESPONSES, Format.CHAT, created=1)


def test_the_registry_names_every_format() -> None:
    assert set(hub.FORMATS) == set(Format)
    assert hub.FORMATS[Format.CHAT] is chat_format


# ---------------------------------------------------------------- properties

counts = st.one_of(st.none(), st.integers(0, 10**6))
words = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)
blocks = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, words),
    st.builds(lambda t: {"type": "text", "text": t, "citations": [CITATION]}, words),
    st.builds(lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, words, words),
    st.builds(lambda d: {"type": "redacted_thinking", "data": d}, words),
    st.builds(
        lambda i, n, x: {"type": "tool_use", "id": i, "name": n, "input": x},
        words,
        words,
        st.dictionaries(words, st.one_of(st.integers(), words, st.none()), max_size=3),
    ),
)
usages = st.fixed_dictionaries(
    {},
    optional={
        "input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**6),
        "cache_read_input_tokens": st.integers(0, 10**6),
        "cache_creation_input_tokens": st.integers(0, 10**6),
    },
)
stops = st.one_of(st.none(), st.sampled_from([*canon.Stop, "a_newer_reason"]).map(str))
messages = st.builds(
    lambda i, m, content, reason, sequence, usage: {
        "id": i,
        "type": "message",
        "role": "assistant",
        "model": m,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage,
    },
    words,
    words,
    st.lists(blocks, max_size=5),
    stops,
    st.one_of(st.none(), words),
    usages,
)


@settings(max_examples=150, deadline=None)
@given(messages)
def test_any_messages_answer_goes_through_the_hub_whole(message: dict[str, Any]) -> None:
    assert messages_format.encode_answer(messages_format.decode_answer(message), created=0) == message
    # and crosses to chat and Responses saying what its text and calls said
    completion = ChatCompletion.model_validate(to_completion(message, created=1))
    texts = [b["text"] for b in message["content"] if b["type"] == "text"]
    calls = [b for b in message["content"] if b["type"] == "tool_use"]
    assert completion.choices[0].message.content == ("".join(texts) if texts or not calls else None)
    response = rt.Response.model_validate(to_response(message, created=1))
    assert len(response.output) == len(texts) + len(calls)


@settings(max_examples=150, deadline=None)
@given(messages, st.booleans())
def test_any_messages_answer_streamed_goes_through_the_hub_whole(message: dict[str, Any], usage: bool) -> None:
    """The answer as Anthropic would stream it (each block started, in one delta, stopped)
    comes out of a decoder and an encoder as it went in."""
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": head}]
    for i, b in enumerate(message["content"]):
        if b["type"] == "tool_use":
            events += [block(i, {**b, "input": {}}), json_piece(i, json.dumps(b["input"])), stop(i)]
        elif b["type"] == "text":
            events += [block(i, {"type": "text", "text": ""}), text(i, b["text"]), stop(i)]
        else:
            events += [block(i, b), stop(i)]
    reason = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events += [{"type": "message_delta", "delta": reason, "usage": message["usage"] if usage else {}}]
    events += [{"type": "message_stop"}]
    t = hub.Translation(Format.MESSAGES, Format.MESSAGES, created=0)
    assert [out for e in events for out in t.feed(e)] == events
