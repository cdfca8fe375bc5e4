"""AWS's event stream framing (Bedrock's ConverseStream), over botocore's decoder: one frame
per message however the bytes are split; exceptions and errors as frames the format classifies
by their type; a bad CRC or a message cut short a broken stream, never data, never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capmon.core.providers import aws_eventstream, converse_format
from capmon.core.providers.aws_eventstream import EventStreamFraming
from capmon.core.providers.frames import FrameKind
from capmon.core.providers.sse import Frame
from capmon.core.types.failure import Kind
from tests.support import eventstream as es

MESSAGES = [*es.converse_stream("Hello, world", pieces=3), es.exception("throttlingException", "Too many tokens")]
STREAM = b"".join(MESSAGES)
NAMES = ["messageStart", *["contentBlockDelta"] * 3, "contentBlockStop", "messageStop", "metadata"]
EXPECTED = [*NAMES, ":exception:throttlingException"]


def read(pieces: list[bytes]) -> list[Frame]:
    framing = EventStreamFraming()
    frames = [f for piece in pieces for f in framing.feed(piece)]
    return frames + framing.close()


def test_each_message_is_one_frame_its_event_type_and_payload() -> None:
    frames = read([STREAM])
    assert [f.event for f in frames] == EXPECTED
    assert json.loads(frames[1].data)["delta"] == {"text": "Hell"}
    kinds = [converse_format.read_frame(f, now=0).kind for f in frames]
    assert kinds == [*[FrameKind.CHUNK] * 6, FrameKind.DONE, FrameKind.ERROR]


def test_split_at_every_byte_boundary_the_frames_are_the_same() -> None:
    whole = read([STREAM])
    assert read([bytes([b]) for b in STREAM]) == whole
    for cut in range(len(STREAM) + 1):
        assert read([STREAM[:cut], STREAM[cut:]]) == whole, cut


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=10))
def test_split_anywhere_any_number_of_times_the_frames_are_the_same(cuts: list[int]) -> None:
    edges = [0, *sorted(cuts), len(STREAM)]
    assert [f.event for f in read([STREAM[a:b] for a, b in zip(edges, edges[1:], strict=False)])] == EXPECTED


def _broken(frames: list[Frame]) -> None:
    assert aws_eventstream.special(frames[-1]) == (aws_eventstream.Special.BROKEN, "")
    event = converse_format.read_frame(frames[-1], now=0)
    assert event.kind is FrameKind.BROKEN and event.failure is not None and event.failure.kind is Kind.TRANSIENT


@settings(max_examples=120, deadline=None)
@given(st.integers(min_value=0, max_value=len(STREAM) - 1), st.integers(min_value=1, max_value=255))
def test_any_corrupted_byte_is_a_broken_stream_never_data_never_a_crash(at: int, flip: int) -> None:
    """A byte changed anywhere: the messages before it come whole, the one it is in never
    does (a CRC covers every byte of it), and the stream is broken from there."""
    corrupted = STREAM[:at] + bytes([STREAM[at] ^ flip]) + STREAM[at + 1 :]
    starts = [sum(len(m) for m in MESSAGES[:i]) for i in range(len(MESSAGES) + 1)]
    hit = max(i for i, start in enumerate(starts) if start <= at)
    frames = read([corrupted])
    assert [f.event for f in frames[:hit]] == EXPECTED[:hit]
    assert len(frames) == hit + 1
    _broken(frames)


def test_a_corrupted_message_crc_after_output_breaks_the_stream_and_nothing_follows() -> None:
    bad = bytearray(MESSAGES[2])
    bad[-1] ^= 0xFF
    framing = EventStreamFraming()
    frames = framing.feed(MESSAGES[0] + MESSAGES[1] + bytes(bad))
    assert [f.event for f in frames[:2]] == NAMES[:2]
    _broken(frames)
    assert "ChecksumMismatch" in frames[-1].data
    assert framing.feed(b"".join(MESSAGES[3:])) == [] and framing.close() == []


@pytest.mark.parametrize("keep", [1, 11, 12, 40, -1])
def test_a_message_cut_short_is_a_broken_stream_at_close(keep: int) -> None:
    framing = EventStreamFraming()
    frames = framing.feed(MESSAGES[0] + MESSAGES[1][:keep])
    assert [f.event for f in frames] == ["messageStart"]
    closing = framing.close()
    assert len(closing) == 1 and "cut short" in closing[0].data
    _broken(closing)


def test_a_whole_stream_leaves_nothing_at_close() -> None:
    framing = EventStreamFraming()
    assert len(framing.feed(STREAM)) == len(EXPECTED) and framing.close() == []


def test_the_padding_field_is_no_part_of_the_event() -> None:
    frame = read([es.event("contentBlockDelta", {"delta": {"text": "a"}, "contentBlockIndex": 0})])[0]
    assert "p" in json.loads(frame.data)
    event = converse_format.read_frame(frame, now=0)
    assert event.chunk == {"contentBlockDelta": {"delta": {"text": "a"}, "contentBlockIndex": 0}}


def test_an_error_message_is_a_frame_of_its_code_and_message() -> None:
    frames = read([es.error("InternalFailure", "We encountered an internal error.")])
    assert frames == [Frame(":error:InternalFailure", json.dumps({"message": "We encountered an internal error."}))]
    event = converse_format.read_frame(frames[0], now=0)
    assert event.kind is FrameKind.ERROR and event.failure is not None
    assert event.failure.kind is Kind.TRANSIENT and "We encountered an internal error." in event.failure.reason


def test_an_event_type_this_reader_does_not_know_is_ignored() -> None:
    frame = read([es.event("somethingNew", {"x": 1})])[0]
    assert converse_format.read_frame(frame, now=0).kind is FrameKind.IGNORE
