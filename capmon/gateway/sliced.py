"""A big request body read as JSON in slices, its arrays counted as they are read.

``json.loads`` of a 16 MiB body holds the event loop for the whole parse (a third of a
second and more) and builds every object before anything can look at them: a body of
600,000 tiny content blocks becomes 150 MB of dicts, and only then can a check refuse
it. This reader walks the few levels where what the gateway limits lives (the messages,
their content blocks, the tools: a :class:`Paths` tree) in Python, hands every other
value to the C scanner of :data:`capmon.gateway.fields.DECODER` (strings, numbers and
whole subtrees, parsed exactly as ``json.loads`` parses them), and:

* counts the items of each counted array as it reads them, and stops at the first item
  past its kind's limit (:class:`Counter`), before that item is built;
* gives the loop back every :data:`SLICE` characters (at an item or member boundary), so
  other requests, ``/health`` among them, are served while it reads.

It reads what ``json.loads`` reads (the same whitespace, the same C string and value
scanners, one string object per key name, the last of a repeated key kept) and refuses
what it refuses, with the same ``ValueError``s (:class:`json.JSONDecodeError`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from capmon.gateway.fields import DECODER

# Where a value is, for an error's param: keys, and the list an item is being read into
# (its index is the list's length then: so an array costs one entry, not one per item).
Trail = list["str | list[Any]"]

SLICE = 4 * 1024  # characters read between two returns to the event loop (a millisecond at most)

_WS = re.compile(r"[ \t\n\r]*")  # JSON's whitespace, as json.decoder reads it
_WS_CHARS = frozenset(" \t\n\r")  # a token's next character is looked up here first: most bodies have none
# json.decoder's own C scanners (neither in typeshed's stubs): a string's body, and any value.
_scanstring: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
_scan_once: Callable[[str, int], tuple[Any, int]] = DECODER.scan_once  # type: ignore[attr-defined]
_Walk = Generator[None, None, tuple[Any, int]]


class Counter(Protocol):
    """What the reader counts into and against: a kind's count so far (one cell, which the
    reader adds each item to, every array of the kind alike: a tool result's blocks count
    while its message's own are being read), the most of a kind a body may hold, and the
    error that stops the read at the first item past it."""

    def cell(self, kind: Any) -> list[int]: ...

    def limit(self, kind: Any) -> int: ...

    def past(self, kind: Any, trail: Trail) -> Exception: ...


@dataclass(frozen=True)
class Paths:
    """One key path's place in a body's counted paths (a tree from the body down): the kind
    an array here counts (None: not counted), and the keys below it that lead to a counted
    array. An object is read in Python only where keys lead on, and an array where it is
    counted or keys lead on; everything else goes to the C scanner whole (the items of a
    counted array, unless a counted path goes through them: a tool result's own blocks).
    Arrays on a path add nothing to it (``messages[3].content`` is at ``messages.content``)."""

    kind: Any = None
    below: Mapping[str, Paths] = field(default_factory=dict)

    @classmethod
    def of(cls, counted: Mapping[tuple[str, ...], Any]) -> Paths:
        """The tree of ``counted``: key paths (``("messages", "content")``) and their kinds."""

        def node(prefix: tuple[str, ...]) -> Paths:
            keys = dict.fromkeys(p[len(prefix)] for p in counted if len(p) > len(prefix) and p[: len(prefix)] == prefix)
            return cls(counted.get(prefix), {k: node((*prefix, k)) for k in keys})

        return node(())


def _skip(text: str, idx: int) -> int:
    """Past the whitespace at ``idx``."""
    found = _WS.match(text, idx)
    return found.end() if found is not None else idx


def an_object(text: str) -> bool:
    """Whether ``text`` starts as a JSON object does (whitespace aside)."""
    start = _skip(text, 0)
    return text[start : start + 1] == "{"


class _Reader:
    def __init__(self, text: str, counter: Counter) -> None:
        self.text = text
        self.counter = counter
        self.trail: Trail = []
        self.memo: dict[str, str] = {}  # one string per key name, as json.loads keeps them
        self.mark = 0  # where the last slice ended

    def body(self, paths: Paths) -> _Walk:
        text = self.text
        start = _skip(text, 0)
        if text[start : start + 1] == "{":
            value, end = yield from self._object(start + 1, paths)
        else:  # not an object: nothing to count (the caller refuses it)
            value, end = self._scalar(start)
        end = _skip(text, end)
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
        return value, end

    def _scalar(self, idx: int) -> tuple[Any, int]:
        """A value the C scanner reads whole (a string, a number, a subtree not walked)."""
        try:
            return _scan_once(self.text, idx)
        except StopIteration as e:
            raise json.JSONDecodeError("Expecting value", self.text, e.value) from None

    def _object(self, idx: int, paths: Paths) -> _Walk:
        text, trail, memo, below = self.text, self.trail, self.memo, paths.below
        out: dict[str, Any] = {}
        if text[idx : idx + 1] in _WS_CHARS:
            idx = _skip(text, idx)
        if text[idx : idx + 1] == "}":
            return out, idx + 1
        trail.append("")
        while True:
            if text[idx : idx + 1] != '"':
                raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, idx)
            key, idx = _scanstring(text, idx + 1, True)
            key = memo.setdefault(key, key)
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)
            if text[idx : idx + 1] != ":":
                raise json.JSONDecodeError("Expecting ':' delimiter", text, idx)
            idx += 1
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)
            sub = below.get(key)
            c = text[idx : idx + 1]
            if sub is not None and c == "{" and sub.below:
                trail[-1] = key
                out[key], idx = yield from self._object(idx + 1, sub)
            elif sub is not None and c == "[":
                trail[-1] = key
                out[key], idx = yield from self._array(idx + 1, sub)
            else:
                out[key], idx = self._scalar(idx)
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)
            c = text[idx : idx + 1]
            if c == "}":
                trail.pop()
                return out, idx + 1
            if c != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, idx)
            if idx - self.mark >= SLICE:
                self.mark = idx
                yield
            idx += 1
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)

    def _array(self, idx: int, paths: Paths) -> _Walk:
        text, kind = self.text, paths.kind
        out: list[Any] = []
        count, limit = ([0], -1) if kind is None else (self.counter.cell(kind), self.counter.limit(kind))
        if text[idx : idx + 1] in _WS_CHARS:
            idx = _skip(text, idx)
        if text[idx : idx + 1] == "]":
            return out, idx + 1
        self.trail.append(out)
        while True:
            if limit >= 0:  # a counted array
                count[0] += 1
                if count[0] > limit:  # one more than the body may hold: stop before it is built
                    raise self.counter.past(kind, self.trail[:-1])
            c = text[idx : idx + 1]
            if c == "{" and paths.below:
                value, idx = yield from self._object(idx + 1, paths)
            elif c == "[":  # an array in an array: on the same path
                value, idx = yield from self._array(idx + 1, paths)
            else:
                value, idx = self._scalar(idx)
            out.append(value)
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)
            c = text[idx : idx + 1]
            if c == "]":
                self.trail.pop()
                return out, idx + 1
            if c != ",":
                raise json.JSONDecodeError("Expecting ',' delimiter", text, idx)
            if idx - self.mark >= SLICE:
                self.mark = idx
                yield
            idx += 1
            if text[idx : idx + 1] in _WS_CHARS:
                idx = _skip(text, idx)


async def read(text: str, paths: Paths, counter: Counter) -> Any:
    """The JSON value of ``text``, the items of each array at one of ``paths``' counted
    paths counted against ``counter`` before they are built: the first item past a limit
    raises the counter's error. Raises ``ValueError`` as ``json.loads`` does (and whatever
    the decoder's hooks raise)."""
    walk = _Reader(text, counter).body(paths)
    while True:
        try:
            next(walk)
        except StopIteration as done:
            value, _ = done.value
            return value
        await asyncio.sleep(0)  # a slice read: whatever else is ready runs before the next
