"""Input lines -> items, or line errors.

A batch file is JSONL: one object per line with ``id``, ``messages`` and optionally
``model``, ``max_tokens``, ``temperature`` and ``metadata``. A line that cannot be an
item is not a reason to refuse the whole file: it becomes a :class:`LineError` that
fails that one item (with its line number) while the rest run.

Files are read as bytes and streamed line by line, so memory stays flat however long
the file is; the byte offset of every line is kept so an interrupted ingest can go on
from where it stopped, and every line's hash is kept so a file that changed since its
job was created is caught at the first line that differs.

A whole file that is not UTF-8 text (UTF-16, compressed, binary) is one error for the
file (:func:`sniff`), not one per line. A UTF-8 byte-order mark is accepted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from capmon.core.types.result import Request

_KNOWN_KEYS = ("id", "messages", "model", "max_tokens", "temperature", "metadata")


@dataclass(frozen=True, slots=True)
class Item:
    """One usable input line. ``messages`` and ``metadata`` stay JSON text: the runner
    decodes messages only when it sends, and metadata only goes back out on export."""

    line: int
    id: str
    messages_json: str
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    metadata_json: str | None = None


@dataclass(frozen=True, slots=True)
class LineError:
    """A line that cannot be sent. ``id`` is the line's own id when it had a usable one."""

    line: int
    id: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


Parsed = Item | LineError


def line_id(line: int) -> str:
    """The id an item without one is shown and stored by: the line it was first read from.
    It is a label, not its identity: a changed input matches such items by content."""
    return f"line-{line}"


_LINE_LABEL = re.compile(r"line-[0-9]+(\.[0-9]+)?")


def is_line_label(item_id: str) -> bool:
    """Whether a stored id is one capmon gave an item that had none (``line-12``, or
    ``line-12.2`` for a line added later where ``line-12`` was taken)."""
    return _LINE_LABEL.fullmatch(item_id) is not None


def _type_name(value: Any) -> str:
    return (
        "null"
        if value is None
        else {
            "str": "string",
            "int": "number",
            "float": "number",
            "bool": "boolean",
            "list": "list",
            "dict": "object",
        }.get(type(value).__name__, type(value).__name__)
    )


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    if _lone_surrogate(text) is not None:
        text = json.dumps(value)  # escaped: a message must be storable text
    return text if len(text) <= 40 else text[:37] + "..."


def _check_messages(messages: Any) -> str | None:
    """None when ``messages`` is a non-empty list of {role, content}; else what is wrong."""
    if not isinstance(messages, list):
        return f"messages: expected a list of {{role, content}} objects, got {_type_name(messages)}"
    if not messages:
        return "messages: expected at least one message, got an empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}]: expected an object with role and content, got {_type_name(m)} {_short(m)}"
        role = m.get("role")
        if not isinstance(role, str) or not role:
            return f"messages[{i}].role: expected a non-empty string, got {_type_name(role)}"
        if "content" not in m:
            return f"messages[{i}].content: missing"
        content = m["content"]
        if isinstance(content, list):
            if not all(isinstance(part, dict) for part in content):
                return f"messages[{i}].content: expected a string or a list of part objects"
        elif not isinstance(content, str):
            return (
                f"messages[{i}].content: expected a string or a list of parts, "
                f"got {_type_name(content)} {_short(content)}"
            )
    return None


def parse_line(line: int, raw: bytes | str, models: Collection[str] | None = None) -> Parsed:
    """Parse one input line (1-based ``line``). ``models``, when given, are the model
    names an item may ask for; any other name is refused here rather than silently
    ignored by the router."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        return LineError(line, line_id(line), f"not UTF-8 text (byte {e.start})")
    try:
        obj = json.loads(text)
    except ValueError as e:
        return LineError(
            line, line_id(line), f"not valid JSON: {getattr(e, 'msg', e)} (column {getattr(e, 'colno', '?')})"
        )
    if not isinstance(obj, dict):
        return LineError(line, line_id(line), f"expected a JSON object, got {_type_name(obj)}")

    raw_id = obj.get("id")
    if raw_id is None:
        item_id = line_id(line)
    elif isinstance(raw_id, str) and raw_id.strip():
        item_id = raw_id
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        item_id = str(raw_id)
    else:
        return LineError(
            line,
            line_id(line),
            f"id: expected a non-empty string or a whole number, got {_type_name(raw_id)} {_short(raw_id)}",
        )

    def bad(message: str) -> LineError:
        return LineError(line, item_id, message)

    if "messages" not in obj:
        close = [k for k in obj if k not in _KNOWN_KEYS]
        hint = f" (unknown key{'s' if len(close) > 1 else ''}: {', '.join(map(repr, close[:3]))})" if close else ""
        return bad(f"messages: missing{hint}")
    problem = _check_messages(obj["messages"])
    if problem:
        return bad(problem)

    model = obj.get("model")
    if model is not None:
        if not isinstance(model, str) or not model:
            return bad(f"model: expected a model name, got {_type_name(model)} {_short(model)}")
        if models is not None and model not in models:
            return bad(f"model: {model!r} is not in the config (models: {', '.join(models)})")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        return bad(f"max_tokens: expected a whole number >= 1, got {_short(max_tokens)}")
    temperature = obj.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))):
        return bad(f"temperature: expected a number, got {_short(temperature)}")
    metadata = obj.get("metadata")
    messages_json = json.dumps(obj["messages"], ensure_ascii=False, separators=(",", ":"))
    metadata_json = None if metadata is None else json.dumps(metadata, ensure_ascii=False, separators=(",", ":"))
    texts: tuple[tuple[str, str | None], ...] = (
        ("id", item_id),
        ("messages", messages_json),
        ("metadata", metadata_json),
    )
    for name, value in texts:
        bad_char = _lone_surrogate(value)
        if bad_char is not None:
            return LineError(
                line,
                line_id(line) if name == "id" else item_id,
                f"{name}: holds the escape {bad_char}, half of a UTF-16 pair and no character; "
                f"expected valid Unicode text",
            )
    return Item(
        line=line,
        id=item_id,
        messages_json=messages_json,
        model=model,
        max_tokens=max_tokens,
        temperature=float(temperature) if temperature is not None else None,
        metadata_json=metadata_json,
    )


def _lone_surrogate(text: str | None) -> str | None:
    """A JSON escape such as "\\ud800" decodes to half a UTF-16 pair, which cannot be stored or sent."""
    if text is None or text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"\\u{ord(text[e.start]):04x}"
    return None


UTF8_BOM = b"\xef\xbb\xbf"
_SNIFF_BYTES = 1 << 16

# Magic numbers of what people mistake for a JSONL file: (prefix, what it is, what to do).
_MAGIC = (
    (b"\xff\xfe\x00\x00", "UTF-32 text (a UTF-32 byte-order mark)", "convert it: iconv -f UTF-32 -t UTF-8"),
    (b"\x00\x00\xfe\xff", "UTF-32 text (a UTF-32 byte-order mark)", "convert it: iconv -f UTF-32 -t UTF-8"),
    (b"\xff\xfe", "UTF-16 text (it starts with a UTF-16 byte-order mark)", "convert it: iconv -f UTF-16 -t UTF-8"),
    (b"\xfe\xff", "UTF-16 text (it starts with a UTF-16 byte-order mark)", "convert it: iconv -f UTF-16 -t UTF-8"),
    (b"\x1f\x8b", "gzip-compressed", "decompress it first: gunzip"),
    (b"BZh", "bzip2-compressed", "decompress it first: bunzip2"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it first: unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it first: unzstd"),
    (b"PK\x03\x04", "a zip archive", "unzip it first"),
    (b"SQLite format 3\x00", "an SQLite database", "pass the JSONL file"),
)


def sniff(head: bytes) -> str | None:
    """What is wrong with a file whose first bytes are ``head``, when it cannot be UTF-8
    JSONL at all; None when it may be (single lines may still be bad)."""
    for magic, what, todo in _MAGIC:
        if head.startswith(magic):
            return f"is {what}; expected UTF-8 JSONL, one JSON object per line ({todo})"
    nul = head.find(b"\x00")
    if nul < 0:
        return None
    # UTF-16 without a byte-order mark: ASCII text has a NUL in every other byte.
    pairs = len(head) // 2
    if pairs:
        even, odd = head[0 : pairs * 2 : 2].count(0), head[1 : pairs * 2 : 2].count(0)
        if max(even, odd) >= 0.9 * pairs and min(even, odd) <= 0.1 * pairs:
            order = "LE" if odd > even else "BE"
            return (
                f"is UTF-16{order} text (every other byte is NUL); expected UTF-8 JSONL, one JSON object per line "
                f"(convert it: iconv -f UTF-16{order} -t UTF-8)"
            )
    return f"is not a text file (a NUL byte at offset {nul}); expected UTF-8 JSONL, one JSON object per line"


def sniff_file(path: Path) -> str | None:
    with open(path, "rb") as f:
        return sniff(f.read(_SNIFF_BYTES))


def line_hash(data: bytes) -> str:
    """A line's fingerprint. The line ending is left out: it is not part of the item."""
    return hashlib.blake2b(data.rstrip(b"\r\n"), digest_size=16).hexdigest()


class Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


@dataclass(frozen=True, slots=True)
class RawLine:
    line: int  # 1-based
    end: int  # byte offset just after this line: where reading goes on from
    data: bytes  # the line as read (a UTF-8 byte-order mark on line 1 left out)
    hash: str  # line_hash of the line exactly as it is in the file


def read_lines(path: Path, offset: int = 0, first_line: int = 1, hasher: Hasher | None = None) -> Iterator[RawLine]:
    """Stream the non-blank lines of ``path`` from byte ``offset`` (which starts line
    ``first_line``). Blank lines are not items, but they keep their line numbers, so
    the numbers in messages match what an editor shows. ``hasher``, when given, is fed
    every byte read, blank lines included."""
    with open(path, "rb") as f:
        f.seek(offset)
        pos = offset
        number = first_line
        for data in f:
            if hasher is not None:
                hasher.update(data)
            start = pos
            pos += len(data)
            if data.strip():
                text = data[len(UTF8_BOM) :] if start == 0 and data.startswith(UTF8_BOM) else data
                if text.strip():
                    yield RawLine(number, pos, text, line_hash(data))
            number += 1


class Stored(Protocol):
    """An item as a store holds it for sending (the runner's ``StoredItem``, batch compare's
    ``FallbackItem``)."""

    @property
    def id(self) -> str: ...
    @property
    def messages_json(self) -> str: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def temperature(self) -> float | None: ...


def request_of(item: Stored, *, model: str | None, job: str, **more: Any) -> Request:
    """The request that sends a stored item to ``model`` (None: the config's order) for
    ``job``; ``more``: what else the caller sets (batch compare's priority, deadline and pin)."""
    return Request(
        messages=tuple(json.loads(item.messages_json)),
        model=model,
        max_tokens=item.max_tokens,
        temperature=item.temperature,
        item_id=item.id,
        job=job,
        **more,
    )
