"""The sliced reader of big bodies (capmon/gateway/sliced.py) against ``json.loads``, and
its counts against those of a body parsed whole (capmon/gateway/shape.py): the same value
for every text, the same refusals, the same counts, in whatever whitespace; and the body's
bytes decoded piece by piece (fields.BodyText) as they are at once."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from capmon.gateway import fields, shape, sliced
from capmon.gateway.errors import ApiError
from capmon.gateway.shape import BodyLimits, Counted, Tally

UNLIMITED = BodyLimits(messages=10**9, content_blocks=10**9, tools=10**9)
SHAPES = {"chat": shape.CHAT, "responses": shape.RESPONSES, "messages": shape.MESSAGES}

# Keys of the counted paths come up often, so the counts are exercised, not just the parse.
_keys = st.sampled_from(["messages", "content", "tools", "system", "input", "tool_calls", "output", "type", "x", ""])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys | st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)
_bodies = st.dictionaries(_keys, _json, max_size=5)
# How a client may lay a body out: compact, the json module's default, indented, with \r\n.
_layouts = st.sampled_from(
    [
        {"separators": (",", ":")},
        {},
        {"indent": 2},
        {"indent": "\t", "separators": (" , ", " : ")},
    ]
)


def read(text: str, of: shape.Shape, limits: BodyLimits = UNLIMITED) -> tuple[Any, dict[Counted, int]]:
    """What the sliced reader makes of ``text``, and what it counted."""
    tally = Tally(of, limits)
    value = asyncio.run(sliced.read(text, of.paths, tally))
    return value, tally.counts


def whole(body: dict[str, Any], of: shape.Shape, limits: BodyLimits = UNLIMITED) -> dict[Counted, int]:
    tally = Tally(of, limits)
    tally.body(body)
    return {kind: n for kind, n in tally.counts.items() if n}


@settings(max_examples=300, deadline=None)
@given(_bodies, _layouts, st.sampled_from(sorted(SHAPES)))
@example(
    {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [{"type": "text"}] * 3}] * 2}]},
    {"indent": 1},
    "messages",
)
def test_a_body_reads_as_json_loads_reads_it_and_counts_as_a_parsed_one(
    body: dict[str, Any], layout: dict[str, Any], of: str
) -> None:
    text = json.dumps(body, **layout).replace("\n", "\r\n")
    value, counts = read(text, SHAPES[of])
    assert value == json.loads(text)
    assert {k: n for k, n in counts.items() if n} == whole(value, SHAPES[of])


def outcome(text: str) -> Any:
    """What the sliced reader and json.loads make of ``text``: the value, or ValueError."""
    try:
        return read(text, shape.MESSAGES)[0]
    except ValueError:
        return ValueError


def expected(text: str) -> Any:
    try:
        return fields.DECODER.decode(text)
    except ValueError:
        return ValueError


# Broken where the reader walks (the body, messages, their content, a tool result's content)
# and where the C scanner reads: every one refused as json.loads refuses it.
BROKEN = [
    '{"messages": [1,]}',
    '{"messages": [{"content": [{"type": "text"},]}]}',
    '{"messages": [{"content": [{"content": [1 2]}]}]}',
    '{"messages": [{"role": "user",}]}',
    '{"messages": [{"role" "user"}]}',
    '{"messages": [{role: "user"}]}',
    '{"messages": [1] "x": 2}',
    '{"a": 1,}',
    '{"a": 1} {}',
    '{"a": 1',
    '{"messages": [',
    '{"messages": [{"content": [',
    '{"messages": [{"content": ["a\x01"]}]}',
    '{"messages": [{"content": ["\\q"]}]}',
    '{"tools": [{"a": [1,]}]}',
    '{"messages": [NaN]}',
    '{"messages": [1e999]}',
    "{,}",
    " ",
    "",
]


@pytest.mark.parametrize("text", BROKEN)
def test_a_broken_body_is_refused_wherever_it_breaks(text: str) -> None:
    assert outcome(text) is ValueError and expected(text) is ValueError


@settings(max_examples=300, deadline=None)
@given(
    _bodies,
    st.integers(0, 10**6),
    st.sampled_from(["", ",", "]", "}", ":", '"', "x", " ,", "NaN", ",]", ",}"]),
    st.booleans(),
)
def test_a_broken_body_is_refused_as_json_loads_refuses_it(
    body: dict[str, Any], where: int, splice: str, replace: bool
) -> None:
    """A text cut short, or with stray characters spliced in (in place of one, or between
    two): both readers refuse it (ValueError), or both read the same value."""
    text = json.dumps(body, separators=(",", ":"))
    at = where % (len(text) + 1)
    broken = text[:at] + splice + text[at + (1 if replace or not splice else 0) :]
    assert outcome(broken) == expected(broken), broken


@settings(max_examples=200, deadline=None)
@given(_bodies, st.sampled_from(sorted(SHAPES)), st.integers(0, 6), st.integers(0, 6), st.integers(0, 6))
def test_both_readers_refuse_the_same_bodies_for_the_same_kind(
    body: dict[str, Any], of: str, messages: int, blocks: int, tools: int
) -> None:
    limits = BodyLimits(messages=messages, content_blocks=blocks, tools=tools)
    text = json.dumps(body)
    try:
        whole(body, SHAPES[of], limits)
        whole_refused = None
    except ApiError as e:
        whole_refused = e
    try:
        read(text, SHAPES[of], limits)
        sliced_refused = None
    except ApiError as e:
        sliced_refused = e
    assert (whole_refused is None) == (sliced_refused is None), (whole_refused, sliced_refused)
    if whole_refused is not None and sliced_refused is not None:
        assert whole_refused.code == sliced_refused.code == "array_above_max_length"
        over = [k for k, n in whole(body, SHAPES[of]).items() if n > limits.of(k)]
        if len(over) == 1:  # one kind past its limit: both name it, and the same array
            assert f"gateway.{over[0].value}" in whole_refused.message
            assert f"gateway.{over[0].value}" in sliced_refused.message
            assert whole_refused.param == sliced_refused.param


def test_the_read_stops_at_the_first_item_past_a_limit_and_names_its_array() -> None:
    """Nothing past the limit is read: the text after it is not even JSON."""
    text = '{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, 1, 2, 3, NOT JSON'
    with pytest.raises(ApiError) as refused:
        read(text, shape.MESSAGES, BodyLimits(messages=5, content_blocks=2, tools=5))
    assert refused.value.param == "messages[0].content" and refused.value.status == 400
    assert "more than 2 content blocks" in refused.value.message
    assert "gateway.max_content_blocks" in refused.value.message
    nested = '{"messages": [{"role": "user", "content": [{"type": "tool_result", "content": [1, 2, !'
    with pytest.raises(ApiError) as refused:
        read(nested, shape.MESSAGES, BodyLimits(messages=5, content_blocks=2, tools=5))
    assert refused.value.param == "messages[0].content[0].content"


def test_the_reader_gives_the_loop_back_while_it_reads() -> None:
    """A body of many slices' worth is read in many steps, and the loop runs between them."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 20_000}]}
    text = json.dumps(body)

    async def run() -> tuple[Any, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        value = await sliced.read(text, shape.MESSAGES.paths, Tally(shape.MESSAGES, UNLIMITED))
        ticker.cancel()
        return value, ticks

    value, ticks = asyncio.run(run())
    assert value == body
    assert ticks >= len(text) // (sliced.SLICE + 100)  # the other task ran after every slice (items end them)


def at_once(raw: bytes) -> str:
    """A body's text as the gateway always read it (decoded whole), or its refusal's message."""
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in raw:
        return "ERR this looks like UTF-16 or UTF-32"
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        return f"ERR byte {e.start} is not UTF-8"


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=40),
    st.lists(st.integers(0, 200), max_size=6),
    st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-32"]),
)
@example("é€", [1, 2, 3, 4], "utf-8")
@example("", [], "utf-8")
@example("7", [0, 0], "utf-8")
def test_a_body_decoded_piece_by_piece_is_the_body_decoded_at_once(text: str, cuts: list[int], codec: str) -> None:
    raw = text.encode(codec)
    for body in (raw, raw[: len(raw) // 2] + b"\xff" + raw[len(raw) // 2 :], raw + b"\xe2\x82"):
        pieces, last = [], 0
        for cut in sorted(c % (len(body) + 1) for c in cuts):
            pieces.append(body[last:cut])
            last = cut
        pieces.append(body[last:])
        decoded = fields.BodyText()
        try:
            for piece in pieces:
                decoded.add(piece)
            got = decoded.text()
        except ApiError as e:
            got = "ERR " + e.message.removeprefix("the request body must be JSON encoded as UTF-8; ")
        assert got == at_once(body), (body, pieces)
