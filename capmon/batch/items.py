"""Input lines -> items, or line errors.

A batch file is JSONL: one object per line with ``id``, ``messages`` and optionally
``model``, ``max_tokens``, ``temperature`` and ``metadata``. A line that cannot be an
item is not a reason to refuse the whole file: it becomes a :class:`LineError` that
fails that one item (with its line number) while the rest run.

Files are read as bytes and streamed line by line, so memory stays flat however long
the file is; the byte offset of every line is kept so an interrupted ingest can go on
from where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterator, Union

# A kind of failure of our own, beside the client's (capacity, bad_request, ...):
# the line itself was unusable, so nothing was ever sent for it.
BAD_INPUT = "bad_input"

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


Parsed = Union[Item, LineError]


def line_id(line: int) -> str:
    """The stable id of an item that has none: it depends only on its line number."""
    return f"line-{line}"


def _type_name(value: Any) -> str:
    return "null" if value is None else {"str": "string", "int": "number", "float": "number", "bool": "boolean",
                                         "list": "list", "dict": "object"}.get(type(value).__name__, type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
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
            return f"messages[{i}].content: expected a string or a list of parts, got {_type_name(content)} {_short(content)}"
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
        return LineError(line, line_id(line), f"not valid JSON: {getattr(e, 'msg', e)} (column {getattr(e, 'colno', '?')})")
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
        return LineError(line, line_id(line), f"id: expected a non-empty string or a whole number, got {_type_name(raw_id)} {_short(raw_id)}")

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
    return Item(
        line=line,
        id=item_id,
        messages_json=json.dumps(obj["messages"], ensure_ascii=False, separators=(",", ":")),
        model=model,
        max_tokens=max_tokens,
        temperature=float(temperature) if temperature is not None else None,
        metadata_json=None if metadata is None else json.dumps(metadata, ensure_ascii=False, separators=(",", ":")),
    )


@dataclass(frozen=True, slots=True)
class RawLine:
    line: int  # 1-based
    end: int  # byte offset just after this line: where reading goes on from
    data: bytes


def read_lines(path: Path, offset: int = 0, first_line: int = 1) -> Iterator[RawLine]:
    """Stream the non-blank lines of ``path`` from byte ``offset`` (which starts line
    ``first_line``). Blank lines are not items, but they keep their line numbers, so
    the numbers in messages match what an editor shows."""
    with open(path, "rb") as f:
        f.seek(offset)
        pos = offset
        number = first_line
        for data in f:
            pos += len(data)
            if data.strip():
                yield RawLine(number, pos, data)
            number += 1

