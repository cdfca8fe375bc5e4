"""One strict parser per field the gateway reads from outside: the JSON body, the
per-request headers (``x-capmon-deadline``, ``x-capmon-priority``,
``x-capmon-first-token-timeout``) and the control
API's event number (``Last-Event-ID`` / ``?since=``).

A value that does not parse is an :class:`ApiError` 400 in the OpenAI shape whose
``param`` names the field (``messages[3].content``), raised here, at the edge, so that
nothing the provider would refuse, or that the core cannot read, gets past the
gateway. Parsers take exactly the form they document: ``float()`` and ``int()`` read
``1_0``, ``+5``, ``nan``, ``²`` and 5,000-digit strings, so none of them is used on
raw text.
"""

from __future__ import annotations

import codecs
import enum
import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from capmon.core.base.secrets import carries_key
from capmon.gateway.errors import ApiError

E = TypeVar("E", bound=enum.Enum)

# Seconds: ASCII digits with an optional fraction. No sign, exponent, underscore or
# word (nan, inf); the lengths bound the value (under 32 years) and the work.
_SECONDS = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")
# An event number: bounded ASCII digits, far past any gateway's lifetime of events.
_EVENT_NUMBER = re.compile(r"[0-9]{1,18}")
_BETA = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_BETAS = 32
_HEADER_SHOWN = 40  # characters of a refused value repeated in the error


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message[:300], "invalid_request_error", code, param)


def type_name(value: object) -> str:
    """What a JSON value is, in JSON's words (``int`` and ``number`` kept apart)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "list", str: "string", int: "int", float: "number"}.get(
        type(value), type(value).__name__
    )


# ------------------------------------------------------------------------- the body


class _NotJson(ValueError):
    """A JSON text Python would read but the JSON standard does not allow."""


def _no_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity, which no JSON encoder writes back
        raise _NotJson(f"{text[:20]} is out of range for a JSON number")
    return value


# One decoder for every body (json.loads with hooks builds a new one per call); the
# sliced reader (capmon/gateway/sliced.py) uses its scanner for what it does not walk.
DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


_UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


def _not_utf8(what: str) -> ApiError:
    return bad(f"the request body must be JSON encoded as UTF-8; {what}")


class BodyText:
    """A body's text, decoded piece by piece as the body arrives (a big body is never held
    as bytes and text at once, nor decoded in one go): UTF-8 only (RFC 8259 §8.1), a UTF-8
    byte order mark tolerated. ``json.loads(bytes)`` would guess UTF-16 and UTF-32 too."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._parts: list[str] = []
        self._head = b""  # the body's first byte, until there are two to tell UTF-16 by
        self._size = 0  # bytes decoded

    def add(self, piece: bytes) -> None:
        if self._size == 0 and len(self._head) + len(piece) < 2:
            self._head += piece
            return
        self._decode(self._head + piece if self._head else piece)
        self._head = b""

    def text(self) -> str:
        """The whole text, once the last piece is in."""
        if self._head:  # a body of one byte
            self._decode(self._head)
            self._head = b""
        self._decode(b"", final=True)
        text = "".join(self._parts)
        self._parts = []
        return text.removeprefix("\ufeff")

    def _decode(self, piece: bytes, *, final: bool = False) -> None:
        if (self._size == 0 and piece[:2] in _UTF16_MARKS) or b"\x00" in piece:  # no JSON text holds a NUL byte
            raise _not_utf8("this looks like UTF-16 or UTF-32")
        held = len(self._decoder.getstate()[0])  # the first bytes of a character cut between pieces
        try:
            self._parts.append(self._decoder.decode(piece, final=final))
        except UnicodeDecodeError as e:
            raise _not_utf8(f"byte {self._size - held + e.start} is not UTF-8") from None
        self._size += len(piece)


def unreadable(e: Exception) -> ApiError:
    """What a body the JSON reader refused with ``e`` gets."""
    if isinstance(e, _NotJson):
        return bad(f"We could not parse the JSON body of your request: {e}.")
    # ValueError, or RecursionError: nested past the parser's depth
    return bad("We could not parse the JSON body of your request: expected a JSON object.")


def an_object(body: object) -> dict[str, Any]:
    """``body`` when it is a JSON object (a request body must be one)."""
    if not isinstance(body, dict):
        raise bad(f"expected a JSON object as the request body, got {type_name(body)}")
    return body


def json_object(text: str, *, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request body (its text) that must be a JSON object. ``empty``: what an empty body
    means (None: an empty body is refused like any other non-object)."""
    if empty is not None and not text.strip():
        return empty
    try:
        body = DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise unreadable(e) from None
    return an_object(body)


def _expected(param: str, what: str, value: object) -> ApiError:
    return bad(f"{param}: expected {what}, got {type_name(value)}", param)


def string(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _expected(name, "a string", value)
    return value


def flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _expected(name, "true or false", value)
    return value


def number(body: Mapping[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _expected(name, "a number", value)
    return value


def positive_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        shown = repr(value)[:40] if isinstance(value, int) and not isinstance(value, bool) else type_name(value)
        raise bad(f"{name}: expected a whole number of at least 1, got {shown}", name)
    whole: int = value
    return whole


def _parts(value: list[Any], param: str) -> None:
    for j, part in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise _expected(where, "a content part (an object)", part)
        if not isinstance(part.get("type"), str):
            raise _expected(f"{where}.type", "a string", part.get("type"))


def _content(message: Mapping[str, Any], param: str) -> None:
    """A message's content as OpenAI takes it: a string, a list of parts, or null."""
    content = message.get("content")
    if isinstance(content, list):
        _parts(content, f"{param}.content")
    elif content is not None and not isinstance(content, str):
        raise _expected(f"{param}.content", "a string or a list of content parts", content)


def _role(message: Mapping[str, Any], param: str) -> None:
    if "role" not in message:
        raise bad(f"{param}.role: missing; every message needs a role", f"{param}.role", "missing_required_parameter")
    if not isinstance(message["role"], str):
        raise _expected(f"{param}.role", "a string", message["role"])


def _each_message(body: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each message of a non-empty list of objects with a string role, and where it is."""
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise bad("messages: expected a non-empty list of message objects", "messages")
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _expected(param, "a message object", message)
        _role(message, param)
        yield param, message


def messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Chat messages: a non-empty list of objects, each with a string role, content a
    string, a list of content parts or null, and, where present, a string name and
    tool_call_id and a list of tool calls."""
    for param, message in _each_message(body):
        _content(message, param)
        for name in ("name", "tool_call_id"):
            if message.get(name) is not None and not isinstance(message[name], str):
                raise _expected(f"{param}.{name}", "a string", message[name])
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise _expected(f"{param}.tool_calls", "a list of tool calls", calls)
            for j, call in enumerate(calls):
                if not isinstance(call, dict):
                    raise _expected(f"{param}.tool_calls[{j}]", "a tool call object", call)
    value: list[dict[str, Any]] = body["messages"]
    return value


def response_input(body: Mapping[str, Any]) -> None:
    """The Responses API's ``input``: a string, or a list of items, each an object with
    a string type or role; a message's content is a string or a list of parts."""
    value = body.get("input")
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _expected("input", "a string or a list of input items", value)
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _expected(param, "an input item (an object)", item)
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise _expected(f"{param}.type", "a string", kind)
        if "role" in item or kind in (None, "message"):
            _role(item, param)
            _content(item, param)


# "system": a mid-conversation system message (the SDK's SystemMessageParam; Claude Code
# sends one under the mid-conversation-system beta), text only like the top-level prompt.
ANTHROPIC_ROLES = ("user", "assistant", "system")


def anthropic_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Anthropic's messages: a non-empty list of objects, each with role user, assistant
    or system and content a string or a list of content blocks (objects with a string
    type; a system message's are text blocks)."""
    for param, message in _each_message(body):
        if message["role"] not in ANTHROPIC_ROLES:
            shown = repr(message["role"])[:40]
            raise bad(f"{param}.role: expected 'user', 'assistant' or 'system', got {shown}", f"{param}.role")
        content = message.get("content")
        if message["role"] == "system":
            _system_text(content, f"{param}.content")
        elif isinstance(content, list):
            _parts(content, f"{param}.content")
        elif not isinstance(content, str):
            raise _expected(f"{param}.content", "a string or a list of content blocks", content)
    value: list[dict[str, Any]] = body["messages"]
    return value


def _system_text(value: object, param: str) -> None:
    """A system prompt: a string or a list of text blocks."""
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _expected(param, "a string or a list of text blocks", value)
    for j, block in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise bad(f'{where}: expected a text block ({{"type": "text", "text": ...}})', where)
        if not isinstance(block.get("text"), str):
            raise _expected(f"{where}.text", "a string", block.get("text"))


def anthropic_system(body: Mapping[str, Any]) -> str | list[dict[str, Any]] | None:
    """Anthropic's top-level system prompt: a string or a list of text blocks."""
    value = body.get("system")
    if value is not None:
        _system_text(value, "system")
    return value


def required_positive_int(body: Mapping[str, Any], name: str) -> int:
    """A whole number of at least 1 that the request must carry (Anthropic's max_tokens)."""
    value = positive_int(body, name)
    if value is None:
        raise bad(f"{name}: Field required (a whole number of at least 1)", name, "missing_required_parameter")
    return value


def _list_of(body: Mapping[str, Any], name: str, kind: type, what: str) -> list[Any] | None:
    """A list whose every item is a ``kind`` (``what``, for the error); None when absent."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _expected(name, f"a list of {what}s", value)
    for j, item in enumerate(value):
        if not isinstance(item, kind):
            raise _expected(f"{name}[{j}]", f"a{'n' if what[0] in 'aeiou' else ''} {what}", item)
    return value


def strings(body: Mapping[str, Any], name: str) -> list[str] | None:
    """A list of strings (stop_sequences); None when absent."""
    return _list_of(body, name, str, "string")


def objects(body: Mapping[str, Any], name: str) -> list[dict[str, Any]] | None:
    """A list of objects (Anthropic's tools); None when absent."""
    return _list_of(body, name, dict, "object")


def typed_object(body: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """An object with a string ``type`` (Anthropic's tool_choice, thinking); None when absent."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _expected(name, "an object", value)
    if not isinstance(value.get("type"), str):
        raise _expected(f"{name}.type", "a string", value.get("type"))
    return value


# ---------------------------------------------------------------------- the headers


def _shown(raw: str) -> str:
    return repr(raw[:_HEADER_SHOWN])


def seconds(raw: str | None, name: str, *, zero: bool = False) -> float | None:
    """A positive duration in seconds (``60``, ``2.5``); None when absent. ``zero``: 0 is
    taken too (a limit switched off)."""
    if raw is None:
        return None
    text = raw.strip(" \t")
    value = float(text) if _SECONDS.fullmatch(text) else -1.0
    if value < 0 or (value == 0 and not zero):
        example = "30, 2.5 or 0 for none" if zero else "30 or 2.5"
        raise bad(
            f"{name}: expected seconds as digits with an optional decimal point (e.g. {example}), got {_shown(raw)}",
            name,
        )
    return value


def truth(raw: str | None, name: str) -> bool | None:
    """``true`` or ``false`` (any case); None when absent."""
    if raw is None:
        return None
    text = raw.strip(" \t").lower()
    if text in ("true", "false"):
        return text == "true"
    raise bad(f"{name}: expected true or false, got {_shown(raw)}", name)


def choice(raw: str | None, name: str, of: type[E]) -> E | None:
    """One of an enum's values, case-insensitive; None when absent."""
    if raw is None:
        return None
    text = raw.strip(" \t").lower()
    for member in of:
        if member.value == text:
            return member
    allowed = " or ".join(str(m.value) for m in of)
    raise bad(f"{name}: expected {allowed}, got {_shown(raw)}", name)


def event_number(raw: str | None, name: str) -> int | None:
    """An event's number (``Last-Event-ID``, ``?since=``): bounded digits; None when absent."""
    if raw is None:
        return None
    text = raw.strip(" \t")
    if not _EVENT_NUMBER.fullmatch(text):
        raise bad(f"{name}: expected the number of an event (up to 18 digits), got {_shown(raw)}", name)
    return int(text)


def betas(raw: str | None, name: str) -> tuple[str, ...]:
    """Anthropic's ``anthropic-beta``: feature names, comma-separated (as the SDKs send
    them), each a short token; anything else is a 400 naming the header."""
    if raw is None or not raw.strip():
        return ()
    names = [b.strip() for b in raw.split(",")]
    if len(names) > MAX_BETAS or not all(_BETA.fullmatch(b) for b in names):
        raise bad(
            f"{name}: expected beta feature names separated by commas (at most {MAX_BETAS}), got {_shown(raw)}",
            name,
        )
    return tuple(dict.fromkeys(names))


# A client's request id (``x-request-id`` / ``x-client-request-id``): kept when it is
# printable ASCII without spaces and at most this long, so it is safe in a header, a log
# line and a database; anything else is replaced, never refused (an id is no reason to fail).
MAX_REQUEST_ID = 128
_REQUEST_ID = re.compile(rf"[!-~]{{1,{MAX_REQUEST_ID}}}")


def request_id(raw: str | None) -> str | None:
    """A client's own request id when it is sane, else None (the gateway makes one). An id
    the redactor would change (a key capmon holds, or anything shaped like a key) is not
    sane: it is echoed in the reply, the access log, events, traces and the audit, and
    replaced whole rather than redacted in place, so every id stays unique and the one the
    reply carries is the one every record names."""
    if raw is None or not _REQUEST_ID.fullmatch(raw) or carries_key(raw):
        return None
    return raw
