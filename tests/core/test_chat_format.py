"""The chat format's wire: bodies, SSE frames, real providers' stream shapes, the token parameter
(and the Responses API's body)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capmon.core.providers import chat_format, responses_format
from capmon.core.providers.chat_format import Assembler, read_frame
from capmon.core.providers.classify import classify_response
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.sse import Frame, SSEParser
from capmon.core.providers.token_param import TokenParam
from capmon.core.types.failure import Kind
from tests.core.wire_shapes import STREAMS, UNSUPPORTED, Shape

pytestmark = pytest.mark.unit


def play(body: bytes, pieces: int = 1) -> tuple[Assembler, list[Any], Any, bool]:
    """Run a stream body through the parser the way the client reads it: (assembled answer,
    chunks that reached the caller, the failure or None, whether output was sent)."""
    parser = SSEParser()
    asm = Assembler()
    shown: list[Any] = []
    held: list[Any] = []
    output = finished = False
    step = max(1, len(body) // pieces)
    parts = [body[i : i + step] for i in range(0, len(body), step)] + [None]
    for part in parts:
        frames = parser.close() if part is None else parser.feed(part)
        for frame in frames:
            event = read_frame(frame, now=0.0)
            if event.kind is FrameKind.CHUNK:
                asm.add(event.chunk)
                finished = finished or bool(asm.finish_reason)
                if output or event.output:
                    output = True
                    shown += held + [event.chunk]
                    held = []
                else:
                    held.append(event.chunk)
            elif event.kind is FrameKind.DONE:
                return asm, shown + held, None, output
            elif event.kind in (FrameKind.ERROR, FrameKind.BROKEN):
                return asm, shown, event.failure, output
    if not finished:
        return asm, shown, "cut", output
    return asm, shown + held, None, output


@pytest.mark.parametrize("shape", STREAMS, ids=[s.name for s in STREAMS])
@pytest.mark.parametrize("pieces", [1, 7, 10_000], ids=["whole", "7-parts", "byte-by-byte"])
def test_stream_shapes(shape: Shape, pieces: int) -> None:
    asm, shown, failure, output = play(shape.body, pieces)
    if shape.kind is None:
        assert failure is None, failure
        assert asm.content == shape.text
        done = asm.completion()
        assert done["choices"][0]["finish_reason"] == shape.finish
        assert done["choices"][0]["message"].get("tool_calls", []) == shape.tool_calls
        for call in shape.tool_calls:
            json.loads(call["function"]["arguments"])
        if shape.usage is not None:
            assert done["usage"] == shape.usage
        return
    assert output == shape.after_output
    if failure == "cut":
        assert shape.kind is Kind.TRANSIENT
    else:
        assert failure.kind is shape.kind, failure
    if not shape.after_output:
        assert shown == []  # nothing of a failed attempt reaches the caller before output
    else:
        assert "".join(chat_format.chunk_text(c) for c in shown) == shape.text


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
def test_any_split_of_the_bytes_gives_the_same_frames(cuts: list[int]) -> None:
    body = b"".join(s.body for s in STREAMS[:6])
    whole = SSEParser()
    expected = whole.feed(body) + whole.close()
    parser, got, pos = SSEParser(), [], 0
    for n in cuts:
        got += parser.feed(body[pos : pos + n])
        pos += n
    got += parser.feed(body[pos:]) + parser.close()
    assert got == expected


def test_comments_are_dropped_and_event_names_and_ids_kept() -> None:
    frames = SSEParser().feed(b': hello\nid: 7\nretry: 100\nevent: error\ndata: {"a": 1}\n\ndata: 2\n\n')
    # An id belongs to its own frame (the control API numbers each one; the next has none).
    assert [(f.event, f.data, f.id) for f in frames] == [("error", '{"a": 1}', "7"), ("", "2", "")]


def test_multi_line_data_joins_as_the_spec_says() -> None:
    frames = SSEParser().feed(b'data: {"a":\ndata: 1}\n\n')
    assert [json.loads(f.data) for f in frames] == [{"a": 1}]


def test_garbage_never_raises() -> None:
    for data in ("", "null", "3", "[1, 2]", '"str"', "{", "[DONE]", '{"choices": "x"}', '{"error": 1}'):
        read_frame(Frame("", data))
        read_frame(Frame("error", data))


@pytest.mark.parametrize("name,status,body,refused", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_unsupported_token_parameter_shapes(name: str, status: int, body: Any, refused: str) -> None:
    failure = classify_response(status, {}, json.dumps(body).encode(), now=0.0)
    assert failure is not None and failure.kind is Kind.BAD_REQUEST
    sent = TokenParam(refused)
    assert chat_format.refused_token_param(failure, sent)
    assert not chat_format.refused_token_param(failure, sent.other)


def test_an_ordinary_bad_request_is_not_a_token_parameter_refusal() -> None:
    body = {
        "error": {
            "message": "Invalid value for 'temperature': must be at most 2.",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    failure = classify_response(400, {}, json.dumps(body).encode(), now=0.0)
    assert failure is not None and not chat_format.refused_token_param(failure, TokenParam.MAX_TOKENS)


def test_the_body_passes_every_caller_field_through_and_owns_model_n_and_the_cap() -> None:
    extra = {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "stop": ["\n"],
        "seed": 7,
        "user": "u1",
        "logprobs": True,
        "stream_options": {"include_usage": True},
        "reasoning_effort": "low",
        "some_future_field": {"x": 1},
        "model": "evil",
        "n": 5,
        "max_tokens": 99999,
        "max_completion_tokens": 99999,
        "stream": False,
    }
    body = chat_format.chat_body(
        ({"role": "user", "content": "hi"},),
        extra,
        model="m",
        token_param=TokenParam.MAX_TOKENS,
        max_tokens=256,
        temperature=None,
        stream=True,
    )
    for k in (
        "tools",
        "tool_choice",
        "response_format",
        "stop",
        "seed",
        "user",
        "logprobs",
        "stream_options",
        "reasoning_effort",
        "some_future_field",
    ):
        assert body[k] == extra[k]
    assert body["model"] == "m" and body["n"] == 1 and body["max_tokens"] == 256 and body["stream"] is True
    assert "max_completion_tokens" not in body
    body = chat_format.chat_body(
        (), {}, model="m", token_param=TokenParam.MAX_COMPLETION_TOKENS, max_tokens=8, temperature=0.2, stream=False
    )
    assert body == {"model": "m", "messages": [], "max_completion_tokens": 8, "n": 1, "temperature": 0.2}


def test_a_responses_body_passes_every_caller_field_and_owns_model_stream_and_the_cap() -> None:
    extra = {
        "input": [{"role": "user", "content": "hi"}],
        "instructions": "x",
        "tools": [{"type": "web_search"}],
        "metadata": {"a": "b"},
        "reasoning": {"effort": "low"},
        "model": "evil",
        "max_output_tokens": 9999,
        "stream": False,
        "store": False,
    }
    body = responses_format.responses_body(extra, model="m", max_output_tokens=64, stream=True)
    for k in ("input", "instructions", "tools", "metadata", "reasoning", "store"):
        assert body[k] == extra[k]
    assert body["model"] == "m" and body["max_output_tokens"] == 64 and body["stream"] is True
