"""Google's stream framing: SSE events ended with ``\\r\\n\\r\\n``, and the raw pretty-printed
error object Google writes after some chunks, read whole however the bytes are split."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capmon.core.providers import gemini_format
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.google_sse import GoogleFraming
from capmon.core.providers.sse import Frame


def chunk(text: str) -> dict[str, object]:
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}], "responseId": "r"}


ERROR = {
    "error": {
        "code": 503,
        "message": 'The model is overloaded {"really"} \\ [sic]. Please try again later.',
        "status": "UNAVAILABLE",
    }
}
STREAM = (
    f"data: {json.dumps(chunk('Hel'))}\r\n\r\ndata: {json.dumps(chunk('lo {'))}\r\n\r\n{json.dumps(ERROR, indent=2)}\n"
).encode()
EXPECTED = [json.dumps(chunk("Hel")), json.dumps(chunk("lo {")), json.dumps(ERROR, indent=2)]


def read(pieces: list[bytes]) -> list[Frame]:
    framing = GoogleFraming()
    frames = [f for piece in pieces for f in framing.feed(piece)]
    return frames + framing.close()


def test_chunks_then_the_raw_error_are_three_frames() -> None:
    frames = read([STREAM])
    assert [f.data for f in frames] == EXPECTED
    kinds = [gemini_format.read_frame(f, now=0).kind for f in frames]
    assert kinds == [FrameKind.CHUNK, FrameKind.CHUNK, FrameKind.ERROR]


def test_split_at_every_byte_the_frames_are_the_same() -> None:
    assert [f.data for f in read([bytes([b]) for b in STREAM])] == EXPECTED
    for cut in range(len(STREAM) + 1):
        assert [f.data for f in read([STREAM[:cut], STREAM[cut:]])] == EXPECTED, cut


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=8))
def test_split_anywhere_any_number_of_times_the_frames_are_the_same(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(STREAM)]
    assert [f.data for f in read([STREAM[a:b] for a, b in zip(edges, edges[1:], strict=False)])] == EXPECTED


def test_sse_after_a_raw_object_and_comments_and_names_go_on() -> None:
    stream = (
        b": keep-alive\r\n\r\n"
        b'{"error": {"code": 500, "message": "x", "status": "INTERNAL"}}'
        b"\r\nevent: message\r\ndata: " + json.dumps(chunk("after")).encode() + b"\r\n\r\n"
    )
    frames = read([stream])
    assert [f.event for f in frames] == ["", "message"]
    assert json.loads(frames[0].data)["error"]["status"] == "INTERNAL" and json.loads(frames[1].data) == chunk("after")


def test_an_array_wrapped_raw_error_is_one_frame() -> None:
    raw = json.dumps([ERROR], indent=2).encode()
    frames = read([f"data: {json.dumps(chunk('a'))}\r\n\r\n".encode(), raw])
    event = gemini_format.read_frame(frames[1], now=0)
    assert event.kind is FrameKind.ERROR and event.failure is not None and event.failure.status == 503


@pytest.mark.parametrize("fragment", [b"{", b"  {\n", b'{\n  "error": {\n    "code": 503,', b'{"a": "}'])
def test_a_fragment_that_never_closes_is_garbage_at_close_never_a_crash(fragment: bytes) -> None:
    framing = GoogleFraming()
    assert framing.feed(f"data: {json.dumps(chunk('a'))}\r\n\r\n".encode())[0].data == json.dumps(chunk("a"))
    assert framing.feed(fragment) == []
    frames = framing.close()
    assert len(frames) == 1
    event = gemini_format.read_frame(frames[0], now=0)
    assert event.kind is FrameKind.BROKEN and event.failure is not None


def test_a_last_event_without_its_blank_line_comes_at_close() -> None:
    assert [f.data for f in read([b"data: " + json.dumps(chunk("end")).encode()])] == [json.dumps(chunk("end"))]
    assert read([b"\r\n", b"  "]) == []
