"""The shape of a proxied request's body: its messages, content blocks and tools, counted
against the gateway's limits (``[gateway] max_messages``, ``max_content_blocks``,
``max_tools``) before anything expands the body.

What a body costs in memory is set by how many objects it holds, not by its bytes: a
16 MiB body of 600,000 tiny text blocks parses into 150 MB of dicts, and every later step
(the checks, the prompt estimate, a translation for another wire) walks or copies each
block again. So the counts are taken while the body is read: a body up to
:data:`READ_AT_ONCE` is parsed whole (its worst case is a few tens of MB) and counted;
a bigger one is read in slices (capmon/gateway/sliced.py), counted as it is read, and
refused at the first item past a limit, before that item is built. Either way a body
over a limit is a 400 ``array_above_max_length`` (OpenAI's code for an array too long)
naming the array, the limit's key and the count, in the route's API's shape.

What counts, by API (a key path: the keys from the body down to an array, whose items
count; arrays on the way add nothing):

* chat completions: messages ``messages``; content blocks ``messages[].content`` and
  ``messages[].tool_calls``; tools ``tools`` and ``functions``;
* Responses: messages its ``input`` items; content blocks ``input[].content`` and
  ``input[].output``; tools ``tools``;
* Messages (and count_tokens): messages ``messages``; content blocks ``messages[].content``,
  a block's own ``content`` (a tool result's) and ``system``; tools ``tools``;
* Gemini's generateContent: messages ``contents``; content blocks ``contents[].parts`` and
  ``systemInstruction.parts``; tools ``tools[].functionDeclarations``;
* Bedrock's Converse: messages ``messages``; content blocks ``messages[].content`` and
  ``system``; tools ``toolConfig.tools``.

A key given twice in a body read in slices counts both times (json keeps the last): more
is counted, never less.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capmon.gateway import fields, sliced
from capmon.gateway.errors import ApiError
from capmon.gateway.sliced import Paths, Trail

READ_AT_ONCE = 1024 * 1024  # characters: a body up to this is parsed whole, a bigger one in slices


class Counted(enum.Enum):
    """What a limit counts; the value is its config key under ``[gateway]``."""

    MESSAGES = "max_messages"
    CONTENT_BLOCKS = "max_content_blocks"
    TOOLS = "max_tools"


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The most of each a request may carry (``[gateway]``)."""

    messages: int
    content_blocks: int
    tools: int

    def of(self, kind: Counted) -> int:
        if kind is Counted.MESSAGES:
            return self.messages
        return self.content_blocks if kind is Counted.CONTENT_BLOCKS else self.tools


@dataclass(frozen=True)
class Shape:
    """Where one API's counted arrays are, and what its messages are called."""

    paths: Paths
    messages: str  # "messages", or the Responses API's "input items"

    def noun(self, kind: Counted) -> str:
        return {Counted.MESSAGES: self.messages, Counted.CONTENT_BLOCKS: "content blocks"}.get(kind, "tools")


_M, _B, _T = Counted.MESSAGES, Counted.CONTENT_BLOCKS, Counted.TOOLS
CHAT = Shape(
    Paths.of(
        {
            ("messages",): _M,
            ("messages", "content"): _B,
            ("messages", "tool_calls"): _B,
            ("tools",): _T,
            ("functions",): _T,
        }
    ),
    "messages",
)
RESPONSES = Shape(
    Paths.of({("input",): _M, ("input", "content"): _B, ("input", "output"): _B, ("tools",): _T}), "input items"
)
MESSAGES = Shape(
    Paths.of(
        {
            ("messages",): _M,
            ("messages", "content"): _B,
            ("messages", "content", "content"): _B,
            ("system",): _B,
            ("tools",): _T,
        }
    ),
    "messages",
)
GEMINI = Shape(
    Paths.of(
        {
            ("contents",): _M,
            ("contents", "parts"): _B,
            ("systemInstruction", "parts"): _B,
            ("tools", "functionDeclarations"): _T,
        }
    ),
    "contents",
)
CONVERSE = Shape(
    Paths.of(
        {
            ("messages",): _M,
            ("messages", "content"): _B,
            ("system",): _B,
            ("toolConfig", "tools"): _T,
        }
    ),
    "messages",
)
GEMINI_COUNT = Shape(  # :countTokens: contents, or a whole request under generateContentRequest
    Paths.of(
        {
            ("contents",): _M,
            ("contents", "parts"): _B,
            ("generateContentRequest", "contents"): _M,
            ("generateContentRequest", "contents", "parts"): _B,
            ("generateContentRequest", "systemInstruction", "parts"): _B,
            ("generateContentRequest", "tools", "functionDeclarations"): _T,
        }
    ),
    "contents",
)


def param(trail: Sequence[str | int | list[Any]]) -> str:
    """A value's place as the errors name it: ``messages[3].content``. An index is a number,
    or the list the item was being read into (its length)."""
    out = ""
    for step in trail:
        if isinstance(step, str):
            out += f".{step}" if out else step
        else:
            out += f"[{step if isinstance(step, int) else len(step)}]"
    return out


def _over(shape: Shape, kind: Counted, limit: int, count: str, where: Sequence[str | int | list[Any]]) -> ApiError:
    at = param(where)
    return ApiError(
        400,
        f"{at}: the request has {count} {shape.noun(kind)}, more than this gateway takes "
        f"(at most {limit}: gateway.{kind.value})",
        "invalid_request_error",
        "array_above_max_length",
        at,
    )


class Tally:
    """One body's counts against the limits (a :class:`capmon.gateway.sliced.Counter`)."""

    def __init__(self, shape: Shape, limits: BodyLimits) -> None:
        self.shape = shape
        self.limits = limits
        self._cells = {kind: [0] for kind in Counted}

    @property
    def counts(self) -> dict[Counted, int]:
        return {kind: cell[0] for kind, cell in self._cells.items()}

    def cell(self, kind: Counted) -> list[int]:
        return self._cells[kind]

    def limit(self, kind: Counted) -> int:
        return self.limits.of(kind)

    def past(self, kind: Counted, trail: Trail) -> ApiError:
        """A body read in slices stops at the first item past a limit: the limit is all
        that is known of the count."""
        limit = self.limits.of(kind)
        return _over(self.shape, kind, limit, f"more than {limit}", trail)

    def body(self, body: dict[str, Any]) -> None:
        """Count a body parsed whole; past a limit, raise with the whole count. Counting
        looks up only the counted keys; where the count went past the limit (in the body's
        order, the array the sliced reader would name) is looked for only then."""
        self._walk(body, self.shape.paths)
        counts = self.counts
        over = [kind for kind in Counted if counts[kind] > self.limits.of(kind)]
        if over:
            self._cells = {kind: [0] for kind in Counted}
            where = self._passing(body, self.shape.paths, over[0], [])
            self._cells = {kind: [n] for kind, n in counts.items()}
            raise _over(self.shape, over[0], self.limits.of(over[0]), str(counts[over[0]]), where or [])

    def _walk(self, value: object, paths: Paths) -> None:
        """Count as the sliced reader does (capmon/gateway/sliced.py): the same tree. A
        body's values are plain dicts and lists (JSON's)."""
        if type(value) is dict:
            for key, sub in paths.below.items():
                inner = value.get(key)
                if type(inner) is list or type(inner) is dict:
                    self._walk(inner, sub)
            return
        if type(value) is not list:
            return
        if paths.kind is not None:
            self._cells[paths.kind][0] += len(value)
        below = paths.below
        for item in value:
            if type(item) is list:  # an array in an array: on the same path
                self._walk(item, paths)
            elif below and type(item) is dict:
                for key, sub in below.items():  # looked up here: most items lead nowhere
                    inner = item.get(key)
                    if type(inner) is list or type(inner) is dict:
                        self._walk(inner, sub)

    def _passing(self, value: object, paths: Paths, kind: Counted, trail: list[str | int]) -> list[str | int] | None:
        """Where, in the body's order, the count of ``kind`` goes past its limit."""
        if type(value) is dict:
            for key, inner in value.items():
                if key in paths.below:
                    found = self._passing(inner, paths.below[key], kind, [*trail, key])
                    if found is not None:
                        return found
            return None
        if type(value) is not list:
            return None
        for i, item in enumerate(value):  # item by item, as the sliced reader counts
            if paths.kind is not None:
                self._cells[paths.kind][0] += 1
                if self._cells[kind][0] > self.limits.of(kind):
                    return trail
            if type(item) is list or (paths.below and type(item) is dict):
                found = self._passing(item, paths, kind, [*trail, i])
                if found is not None:
                    return found
        return None


class BodyReader:
    """The gateway's reader of proxied bodies, against its limits. A body read in slices
    gives the loop back between slices; one such read at a time, so however many big
    bodies arrive at once, one slice runs between the loop's other work (the rest wait
    their turn as text, which they hold already)."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self._sliced = asyncio.Lock()

    async def read(self, text: str, shape: Shape) -> dict[str, Any]:
        """A proxied request's body (its text: :class:`capmon.gateway.fields.BodyText`): a
        JSON object within the limits. A 400 in the OpenAI shape when it is not JSON, not an
        object, or past a limit."""
        tally = Tally(shape, self.limits)
        if len(text) <= READ_AT_ONCE:
            body = fields.json_object(text)
            tally.body(body)
            return body
        if not sliced.an_object(text):  # refused before a big array of anything is built
            raise fields.bad("expected a JSON object as the request body")
        async with self._sliced:
            try:
                value = await sliced.read(text, shape.paths, tally)
            except (ValueError, RecursionError) as e:
                raise fields.unreadable(e) from None
        return fields.an_object(value)
