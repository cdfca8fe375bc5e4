"""Anthropic's Messages wire (messages_format) and its API versions (anthropic_dialect):
bodies and headers, stream events read into the frames' Event vocabulary (in-stream errors
classified by type), and the answer they assemble into, checked against the anthropic SDK's
own models."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types as at
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from capmon.core.providers import anthropic_dialect, messages_format
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.messages_format import MessageAssembler
from capmon.core.providers.sse import SSEParser
from capmon.core.types.config import DEFAULT_VERSION, AnthropicVersion
from capmon.core.types.failure import Failure, Kind

pytestmark = pytest.mark.unit

EVENTS: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)


def sse(*events: dict[str, Any]) -> bytes:
    """Anthropic's framing: each event named by an ``event:`` line."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def start(msg_id: str = "msg_1", input_tokens: int = 12) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": 4},
        },
    }


def block(index: int, content_block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": content_block}


def delta(index: int, d: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": d}


def text(index: int, piece: str) -> dict[str, Any]:
    return delta(index, {"type": "text_delta", "text": piece})


def json_piece(index: int, piece: str) -> dict[str, Any]:
    return delta(index, {"type": "input_json_delta", "partial_json": piece})


def stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def end(reason: str = "end_turn", output_tokens: int = 9) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


PING = {"type": "ping"}
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}

TEXT_ANSWER = [start(), block(0, {"type": "text", "text": ""}), PING, text(0, "Hel"), text(0, "lo"), stop(0), *end()]
TOOL_ANSWER = [
    start(),
    block(0, {"type": "text", "text": ""}),
    text(0, "Let me look."),
    stop(0),
    block(1, {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
    json_piece(1, ""),
    json_piece(1, '{"city": "Pa'),
    json_piece(1, 'ris", "days"'),
    json_piece(1, ": 3}"),
    stop(1),
    *end("tool_use", 30),
]
THINKING_ANSWER = [
    start(),
    block(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, {"type": "thinking_delta", "thinking": "Two and "}),
    delta(0, {"type": "thinking_delta", "thinking": "two."}),
    delta(0, {"type": "signature_delta", "signature": "c2ln"}),
    stop(0),
    block(1, {"type": "text", "text": ""}),
    text(1, "4"),
    stop(1),
    *end(),
]


def play(body: bytes, pieces: int = 1) -> tuple[MessageAssembler, Failure | None, bool, bool]:
    """(assembled answer, the failure, whether output was seen, whether the stream ended)."""
    parser, asm = SSEParser(), MessageAssembler()
    output = False
    step = max(1, len(body) // pieces)
    for part in [body[i : i + step] for i in range(0, len(body), step)] + [None]:
        for frame in parser.close() if part is None else parser.feed(part):
            event = messages_format.read_frame(frame, now=0.0)
            if event.kind in (FrameKind.ERROR, FrameKind.BROKEN):
                return asm, event.failure, output, False
            if event.kind is FrameKind.CHUNK:
                assert event.chunk is not None
                asm.add(event.chunk)
                output = output or event.output
            if event.kind is FrameKind.DONE:
                return asm, None, output, True
    return asm, None, output, False


@pytest.mark.parametrize("pieces", [1, 9, 10_000], ids=["whole", "9-parts", "byte-by-byte"])
def test_a_text_answer_assembles_into_a_real_message(pieces: int) -> None:
    asm, failure, output, done = play(sse(*TEXT_ANSWER), pieces)
    assert (failure, output, done) == (None, True, True)
    message = at.Message.model_validate(asm.message())
    assert messages_format.text(asm.message()) == asm.text == "Hello"
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 12 and message.usage.output_tokens == 9
    assert messages_format.used_tokens(asm.message()) == 12 + 4 + 9


def test_a_tool_use_input_is_put_together_from_its_json_pieces() -> None:
    asm, failure, _, done = play(sse(*TOOL_ANSWER), 13)
    assert failure is None and done
    message = at.Message.model_validate(asm.message())
    tool = message.content[1]
    assert isinstance(tool, at.ToolUseBlock)
    assert (tool.id, tool.name, tool.input) == ("toolu_1", "weather", {"city": "Paris", "days": 3})
    assert message.stop_reason == "tool_use"


def test_thinking_keeps_its_signature() -> None:
    asm, _, _, _ = play(sse(*THINKING_ANSWER))
    message = at.Message.model_validate(asm.message())
    thinking = message.content[0]
    assert isinstance(thinking, at.ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("Two and two.", "c2ln")
    assert messages_format.text(asm.message()) == "4"


def test_tool_input_that_is_not_json_is_kept_not_lost() -> None:
    asm = MessageAssembler()
    for e in [start(), block(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}), json_piece(0, '{"a": ')]:
        asm.add(e)
    assert asm.message()["content"][0]["input"] == {"_raw": '{"a": '}


@pytest.mark.parametrize(
    ("events", "output"),
    [
        ([start(), OVERLOADED], False),
        ([start(), block(0, {"type": "text", "text": ""}), PING, OVERLOADED], False),
        ([start(), block(0, {"type": "text", "text": ""}), text(0, "Hi"), OVERLOADED], True),
    ],
    ids=["after-message-start", "after-an-empty-block", "after-text"],
)
def test_an_overload_inside_the_stream_is_capacity_before_or_after_output(
    events: list[dict[str, Any]], output: bool
) -> None:
    _, failure, seen, done = play(sse(*events))
    assert failure is not None and failure.kind is Kind.CAPACITY and failure.status == 529
    assert (seen, done) == (output, False)


@pytest.mark.parametrize(
    ("error_type", "kind", "status"),
    [
        ("overloaded_error", Kind.CAPACITY, 529),
        ("rate_limit_error", Kind.RATE_LIMITED, 429),
        ("api_error", Kind.TRANSIENT, 500),
        ("timeout_error", Kind.TRANSIENT, 504),
        ("not_found_error", Kind.BAD_REQUEST, 404),
        ("invalid_request_error", Kind.BAD_REQUEST, 400),
        ("authentication_error", Kind.AUTH, 401),
        ("permission_error", Kind.AUTH, 403),
        ("billing_error", Kind.QUOTA, 402),
        ("request_too_large", Kind.TOO_LARGE, 413),
    ],
)
def test_in_stream_errors_are_classified_by_their_type(error_type: str, kind: Kind, status: int) -> None:
    failure = messages_format.event_failure(
        {"type": "error", "error": {"type": error_type, "message": "something"}}, now=0.0
    )
    assert (failure.kind, failure.status, failure.code) == (kind, status, error_type)
    # ... and told back to an Anthropic client as the same type and status.
    assert messages_format.error_type(failure) == error_type
    assert messages_format.ERROR_STATUS[error_type] == status  # the table the gateway reads back (anthropic_errors.py)


def test_prompt_too_long_in_a_stream_is_too_large_and_goes_back_as_a_400() -> None:
    failure = messages_format.event_failure(
        {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 9 > 8"}}, now=0
    )
    assert failure.kind is Kind.TOO_LARGE
    told = messages_format.error_body(failure)["error"]["type"]
    assert told == "invalid_request_error" and messages_format.ERROR_STATUS[told] == 400


def test_an_error_body_is_the_sdks_error_response() -> None:
    body = messages_format.error_body(Failure(Kind.CAPACITY, "every model is at capacity"))
    parsed = at.ErrorResponse.model_validate(body) if hasattr(at, "ErrorResponse") else None
    from anthropic.types.shared.error_response import ErrorResponse

    assert ErrorResponse.model_validate(body).error.type == "overloaded_error"
    assert parsed is None or parsed.type == "error"


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        (b'event: ping\ndata: {"type": "ping"}\n\n', FrameKind.IGNORE),
        (b'event: future_event\ndata: {"type": "future_event"}\n\n', FrameKind.IGNORE),
        (b"event: message_delta\ndata: {not json\n\n", FrameKind.BROKEN),
        (b"data: [1, 2]\n\n", FrameKind.BROKEN),
        (b"event: error\ndata: \n\n", FrameKind.ERROR),
        (b'data: {"type": "message_stop"}\n\n', FrameKind.DONE),
    ],
    ids=["ping", "unknown-event", "not-json", "not-an-event", "error-without-data", "stop-without-event-line"],
)
def test_odd_frames_are_classified_never_raised(frame: bytes, kind: FrameKind) -> None:
    (f,) = SSEParser().feed(frame)
    assert messages_format.read_frame(f, now=0.0).kind is kind


def test_only_deltas_with_content_and_the_stop_reason_are_output() -> None:
    parser = SSEParser()
    events = [messages_format.read_frame(f, now=0.0) for f in parser.feed(sse(*TOOL_ANSWER))]
    flags = [(e.chunk or {}).get("type") for e in events if e.output]
    assert flags == ["content_block_delta"] * 4 + ["message_delta"]  # the empty json piece is no output


@pytest.mark.parametrize("event", TEXT_ANSWER[:2] + TEXT_ANSWER[3:] + TOOL_ANSWER + THINKING_ANSWER)
def test_the_test_streams_are_real_sdk_events(event: dict[str, Any]) -> None:
    EVENTS.validate_python(event)


def test_bodies_keep_the_callers_fields_and_own_model_cap_and_stream() -> None:
    body = messages_format.messages_body(
        {"model": "alias", "max_tokens": 99_999, "system": "be brief", "messages": [], "stream": False, "top_k": 5},
        model="claude-x",
        max_tokens=4096,
        stream=True,
    )
    assert body == {
        "system": "be brief",
        "messages": [],
        "top_k": 5,
        "model": "claude-x",
        "max_tokens": 4096,
        "stream": True,
    }
    headers = anthropic_dialect.request_headers("sk-ant-secret", AnthropicVersion.V2023_06_01)
    assert headers == {"x-api-key": "sk-ant-secret", "anthropic-version": "2023-06-01"}
    assert DEFAULT_VERSION is AnthropicVersion("2026-10-21")


@pytest.mark.parametrize(
    ("version", "fields", "refused"),
    [
        (AnthropicVersion.V2026_10_21, {"temperature": 1.0}, ("temperature",)),  # even at its default
        (AnthropicVersion.V2026_10_21, {"top_p": 0.9, "top_k": 40}, ("top_p", "top_k")),
        (AnthropicVersion.V2026_10_21, {"stop_sequences": ["x"]}, ()),
        (AnthropicVersion.V2023_06_01, {"temperature": 0.2, "top_p": 0.9, "top_k": 40}, ()),
    ],
)
def test_which_sampling_fields_a_version_refuses(
    version: AnthropicVersion, fields: dict[str, Any], refused: tuple[str, ...]
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    assert anthropic_dialect.refused_sampling(body, version) == refused
    assert anthropic_dialect.refused_sampling(anthropic_dialect.without(body, refused), version) == ()
    assert anthropic_dialect.without(body, refused)["messages"] == body["messages"]


DOC = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
CITED = {"type": "text", "text": "hi", "citations": [{"type": "char_location", "cited_text": "h"}]}


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ({"role": "assistant", "content": [DOC]}, "a document block in an assistant message"),
        ({"role": "user", "content": [CITED]}, "citations on a user text block"),
        ({"role": "user", "content": [DOC]}, None),
        ({"role": "assistant", "content": [CITED]}, None),
    ],
)
def test_what_2026_10_21_refuses_in_the_content(message: dict[str, Any], refused: str | None) -> None:
    body = {"messages": [message]}
    reason = anthropic_dialect.version_incapable(body, AnthropicVersion.V2026_10_21)
    assert (reason is None) == (refused is None)
    assert refused is None or (reason is not None and refused in reason)
    assert anthropic_dialect.version_incapable(body, AnthropicVersion.V2023_06_01) is None


def test_a_plain_answer_is_read_and_anything_else_left_to_the_classifier() -> None:
    message = {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "c"}
    assert messages_format.parse(200, json.dumps(message)) == message
    assert messages_format.parse(200, json.dumps(OVERLOADED)) is None
    assert messages_format.parse(529, json.dumps(message)) is None
    assert messages_format.parse(200, b"\xff not json") is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=40))
def test_any_split_of_a_tool_stream_assembles_the_same_message(cuts: list[int]) -> None:
    body = sse(*TOOL_ANSWER)
    parser, asm, at_ = SSEParser(), MessageAssembler(), 0
    for cut in cuts:
        for frame in parser.feed(body[at_ : at_ + cut]):
            event = messages_format.read_frame(frame, now=0.0)
            if event.chunk is not None:
                asm.add(event.chunk)
        at_ += cut
    for frame in parser.feed(body[at_:]) + parser.close():
        event = messages_format.read_frame(frame, now=0.0)
        if event.chunk is not None:
            asm.add(event.chunk)
    whole, _, _, _ = play(body)
    assert asm.message() == whole.message()
