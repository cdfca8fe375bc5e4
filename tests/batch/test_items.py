"""Input lines -> items or line errors; streaming reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capmon.batch.items import Item, LineError, parse_line, read_lines

MSG = [{"role": "user", "content": "hi"}]


def test_a_full_item_keeps_every_field() -> None:
    raw = json.dumps(
        {
            "id": "a1",
            "messages": MSG,
            "model": "small",
            "max_tokens": 64,
            "temperature": 0.2,
            "metadata": {"k": [1, "é"]},
        }
    ).encode()
    it = parse_line(3, raw, ["flagship", "small"])
    assert isinstance(it, Item)
    assert (it.line, it.id, it.model, it.max_tokens, it.temperature) == (3, "a1", "small", 64, 0.2)
    assert json.loads(it.messages_json) == MSG and json.loads(it.metadata_json or "") == {"k": [1, "é"]}


def test_an_item_without_an_id_gets_a_stable_one_from_its_line() -> None:
    assert parse_line(12, json.dumps({"messages": MSG})).id == "line-12"
    assert parse_line(12, json.dumps({"id": None, "messages": MSG})).id == "line-12"
    assert parse_line(5, json.dumps({"id": 7, "messages": MSG})).id == "7"


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'"just text"', "expected a JSON object, got string"),
        (b"\xff\xfe{}", "not UTF-8"),
        (
            json.dumps({"id": "x", "messages": "hello"}),
            "messages: expected a list of {role, content} objects, got string",
        ),
        (json.dumps({"id": "x", "messages": []}), "messages: expected at least one message"),
        (
            json.dumps({"id": "x", "messages": ["hello"]}),
            "messages[0]: expected an object with role and content, got string",
        ),
        (json.dumps({"id": "x", "messages": [{"content": "hi"}]}), "messages[0].role: expected a non-empty string"),
        (json.dumps({"id": "x", "messages": [{"role": "user"}]}), "messages[0].content: missing"),
        (
            json.dumps({"id": "x", "messages": [{"role": "user", "content": 3}]}),
            "messages[0].content: expected a string or a list of parts, got number 3",
        ),
        (json.dumps({"id": "x", "mesages": MSG}), "messages: missing (unknown key: 'mesages')"),
        (json.dumps({"id": "x", "messages": MSG, "max_tokens": "10"}), "max_tokens: expected a whole number >= 1"),
        (json.dumps({"id": "x", "messages": MSG, "max_tokens": 0}), "max_tokens: expected a whole number >= 1"),
        (json.dumps({"id": "x", "messages": MSG, "model": 4}), "model: expected a model name"),
        (
            json.dumps({"id": "x", "messages": MSG, "model": "gpt-9"}),
            "'gpt-9' is not in the config (models: flagship, small)",
        ),
        (json.dumps({"id": [1], "messages": MSG}), "id: expected a non-empty string or a whole number"),
        (json.dumps({"id": "x", "messages": MSG, "temperature": "hot"}), "temperature: expected a number"),
    ],
)
def test_a_bad_line_says_what_is_wrong_with_its_line_number(raw: bytes | str, expected: str) -> None:
    err = parse_line(9, raw, ["flagship", "small"])
    assert isinstance(err, LineError), err
    assert err.line == 9 and expected in err.message, err.message
    assert str(err).startswith("line 9: ")


def test_a_bad_line_keeps_its_own_id_when_it_had_one() -> None:
    err = parse_line(4, json.dumps({"id": "keep-me", "messages": 5}))
    assert isinstance(err, LineError) and err.id == "keep-me"
    assert parse_line(4, "{oops").id == "line-4"


def test_multimodal_content_parts_are_accepted() -> None:
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": "x"}}],
        }
    ]
    assert isinstance(parse_line(1, json.dumps({"id": "m", "messages": parts})), Item)


def test_reading_streams_lines_keeps_numbers_over_blank_lines_and_resumes_at_an_offset(tmp_path: Path) -> None:
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'{"a":1}\n\n  \n{"b":2}\n{"c":3}')  # no newline at the end
    lines = list(read_lines(p))
    assert [(r.line, r.data.strip()) for r in lines] == [(1, b'{"a":1}'), (4, b'{"b":2}'), (5, b'{"c":3}')]
    again = list(read_lines(p, lines[1].end, lines[1].line + 1))
    assert [(r.line, r.data) for r in again] == [(5, b'{"c":3}')]
