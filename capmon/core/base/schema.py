"""TOML files -> frozen dataclasses, each field checked against what it declares.

Config files (``capmon/core/types/config.py``) and simulator scenarios
(``capmon/sim/scenario.py``) declare their fields with :func:`spec` (a range, choices,
non-empty, printable, how to say what is expected) and read a parsed document with
:class:`Loader`. Every error is a ConfigError naming the file, the key
(``models[1].max_tokens``) and what was expected, on one line; an unknown key is
refused with the closest valid name. Only fields declared with :func:`spec` are read
from the file (``Config.path``, ``Scenario.source`` are not).
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capmon.core.base.exceptions import ConfigError

_SPEC = "capmon.schema"  # the metadata key that marks a field as read from the file


def spec(
    default: Any = dataclasses.MISSING,
    *,
    doc: str = "",
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    choices: Sequence[str] | None = None,
    nonempty: bool = False,
    printable: bool = False,
    expected: str | None = None,
    missing: str | None = None,
    each: Mapping[str, Any] | None = None,
    factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field read from a TOML file.

    ``min`` / ``max``: inclusive bounds, ``above``: an exclusive lower bound (numbers).
    ``choices``: the strings allowed. ``nonempty``: a string that is not blank, or a list
    with at least one item. ``printable``: a name without control characters.
    ``expected``: how a type error says what was expected ("a finite number"; ``{key}``
    is replaced by the key). ``missing``: the whole message when a field without a
    default is left out. ``each``: these same options for every item of a list."""
    meta = {
        _SPEC: True,
        "doc": doc,
        "min": min,
        "max": max,
        "above": above,
        "choices": choices,
        "nonempty": nonempty,
        "printable": printable,
        "expected": expected,
        "missing": missing,
        "each": dict(each or {}),
    }
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_toml(text: str, file: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, "", f"not valid TOML: {e}") from None


def read_text(path: str | os.PathLike[str]) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(str(p), "", "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(p), "", f"cannot read: {e}") from None


_TYPE_WORDS = {int: "a whole number", float: "a number", str: "a string", bool: "true or false"}


def describe(tp: Any) -> str:
    """What a value of type ``tp`` is called in an error: "a whole number", "a list of strings"."""
    if tp in _TYPE_WORDS:
        return _TYPE_WORDS[tp]
    if dataclasses.is_dataclass(tp):
        return "a table"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        return f"a list of {describe(typing.get_args(tp)[0]).removeprefix('a ')}s"
    if origin in (Mapping, dict) or tp is Mapping:
        return "a table of strings"
    return str(tp)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_text(name: object) -> str:
    """A key as TOML writes it: bare when it can be, quoted otherwise (``""``, ``"my key"``),
    so an error about an empty or odd key still names it."""
    text = str(name)
    if _BARE_KEY.fullmatch(text):
        return text
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif not ch.isprintable():
            out.append(f"\\u{ord(ch):04X}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def got(value: Any) -> str:
    """A value as an error shows it: its repr, cut to 60 characters, and its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _optional(tp: Any) -> Any:
    """``X | None`` -> ``X`` (TOML has no null: a field that may be None may be left out)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner
    return tp


class Loader:
    """Reads one file's document into dataclasses declared with :func:`spec`."""

    def __init__(self, file: str) -> None:
        self.file = file

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.file, key, message)

    def table(self, cls: Any, raw: Any, key: str) -> Any:
        if not isinstance(raw, dict):
            raise self.fail(key, f"expected a table, got {got(raw)}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get(_SPEC)}
        for name in raw:
            if name not in fields:
                where = f"{key}.{key_text(name)}" if key else key_text(name)
                close = difflib.get_close_matches(str(name), list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"
                raise self.fail(where, f"unknown key{hint}")
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            where = f"{key}.{name}" if key else name
            if name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise self.fail(where, f.metadata["missing"] or f"missing; expected {describe(hints[name])}")
                continue
            kwargs[name] = self.value(_optional(hints[name]), raw[name], where, f.metadata)
        return cls(**kwargs)

    def value(self, tp: Any, raw: Any, key: str, meta: Mapping[str, Any]) -> Any:
        if dataclasses.is_dataclass(tp):
            return self.table(tp, raw, key)

        def wrong() -> ConfigError:
            expected = meta.get("expected")
            return self.fail(key, f"expected {expected.format(key=key) if expected else describe(tp)}, got {got(raw)}")

        origin = typing.get_origin(tp)
        if origin is tuple:
            (inner, *_rest) = typing.get_args(tp)
            if not isinstance(raw, list) or (meta.get("nonempty") and not raw):
                raise wrong()
            each = meta.get("each") or {}
            return tuple(self.value(inner, item, f"{key}[{i}]", each) for i, item in enumerate(raw))
        if origin in (Mapping, dict) or origin is typing.get_origin(Mapping[str, str]):
            if not isinstance(raw, dict):
                raise wrong()
            for k, v in raw.items():
                if not isinstance(v, str):
                    raise self.fail(f"{key}.{key_text(k)}", f"expected a string, got {got(v)}")
            return dict(raw)
        if tp is bool:
            if not isinstance(raw, bool):
                raise wrong()
            return raw
        if tp is str:
            return self._string(raw, key, meta, wrong)
        if isinstance(tp, type) and issubclass(tp, enum.Enum):  # a StrEnum: its values are the choices
            if not isinstance(raw, str):
                raise wrong()
            try:
                return tp(raw)
            except ValueError:
                close = difflib.get_close_matches(raw, [str(m.value) for m in tp], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise self.fail(key, f"expected {describe(tp)}, got {raw!r}{hint}") from None
        if tp is int:
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise wrong()
            value: Any = raw
        elif tp is float:
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise wrong()
            value = float(raw)
            if value != value or value in (float("inf"), float("-inf")):
                raise self.fail(key, f"expected a finite number, got {got(raw)}")
        else:  # pragma: no cover - a schema bug, not a user error
            raise TypeError(f"unsupported field type {tp!r}")
        lo, hi, above = meta.get("min"), meta.get("max"), meta.get("above")
        if lo is not None and value < lo:
            raise self.fail(key, f"expected {describe(tp)} >= {lo:g}, got {raw!r}")
        if hi is not None and value > hi:
            raise self.fail(key, f"expected {describe(tp)} <= {hi:g}, got {raw!r}")
        if above is not None and value <= above:
            raise self.fail(key, f"expected {describe(tp)} > {above:g}, got {raw!r}")
        return value

    def _string(self, raw: Any, key: str, meta: Mapping[str, Any], wrong: typing.Callable[[], ConfigError]) -> str:
        if not isinstance(raw, str):
            raise wrong()
        choices = meta.get("choices")
        if choices and raw not in choices:
            raise self.fail(key, f"expected one of {', '.join(choices)}, got {raw!r}")
        if meta.get("nonempty") and not raw.strip():
            raise self.fail(key, "expected a non-empty string")
        if meta.get("printable") and not raw.isprintable():
            raise self.fail(key, f"expected a name without control characters, got {raw!r}")
        return raw


# ---------------------------------------------------------------- the schema as a reference


@dataclass(frozen=True)
class KeyDoc:
    """One key of a table as a reference shows it (:func:`document`)."""

    name: str
    kind: str  # what its value is: "a number", "a list of strings", "a table"
    default: str | None  # as TOML writes it ("" for a table: its own keys' defaults); None: must be given
    allowed: str  # its range, choices and rules ("at least 0.001", "one of: httpx, aiohttp"); "": any
    doc: str


@dataclass(frozen=True)
class TableDoc:
    """One table of a schema: ``""`` (the file itself), ``client`` (``[client]``), ``models``
    (``[[models]]``: an array of tables), ``endpoints.keys`` (each item of an endpoint's keys)."""

    path: str
    array: bool
    doc: str  # the doc of the key that holds it ("" for the file itself)
    keys: tuple[KeyDoc, ...]


def document(cls: Any) -> tuple[TableDoc, ...]:
    """Every table of the schema rooted at the dataclass ``cls``, the file itself first, then
    each table before the tables inside it, every key in declaration order with its kind,
    default, what is allowed and its ``doc``: what the loader reads, so a reference built
    from it cannot drift from the loader."""
    out: list[TableDoc] = []
    _document(cls, "", False, "", out)
    return tuple(out)


def _document(cls: Any, path: str, array: bool, doc: str, out: list[TableDoc]) -> None:
    hints = typing.get_type_hints(cls)
    keys: list[KeyDoc] = []
    nested: list[tuple[Any, str, bool, str]] = []
    for f in dataclasses.fields(cls):
        if not f.metadata.get(_SPEC):
            continue
        tp = _optional(hints[f.name])
        meta = f.metadata
        keys.append(KeyDoc(f.name, _kind(tp), _default(f), _allowed(tp, meta), meta["doc"]))
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        if dataclasses.is_dataclass(inner):
            nested.append((inner, f"{path}.{f.name}" if path else f.name, inner is not tp, meta["doc"]))
    out.append(TableDoc(path, array, doc, tuple(keys)))
    for inner, sub, is_array, sub_doc in nested:
        _document(inner, sub, is_array, sub_doc, out)


def _kind(tp: Any) -> str:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "a string"  # its values are the choices (_allowed)
    return describe(tp)


def _default(f: dataclasses.Field[Any]) -> str | None:
    if f.default is not dataclasses.MISSING:
        return toml_text(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return toml_text(f.default_factory())
    return None


def toml_text(value: Any) -> str:
    """A default as TOML writes it: ``60.0``, ``"aiohttp"``, ``false``, ``[]``; ``""`` for a
    table (its keys have their own defaults); ``"(not set)"`` for None (TOML has no null:
    the key is left out)."""
    if value is None:
        return "(not set)"
    if dataclasses.is_dataclass(value):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return toml_text(value.value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key_text(k)} = {toml_text(v)}" for k, v in value.items()) + "}" if value else "{}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    raise TypeError(f"no TOML text for {value!r}")  # pragma: no cover - a schema bug


def _allowed(tp: Any, meta: Mapping[str, Any]) -> str:
    rules: list[str] = []
    choices = meta.get("choices")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        choices = [str(m.value) for m in tp]
    if choices:
        rules.append("one of: " + ", ".join(choices))
    lo, hi, above = meta.get("min"), meta.get("max"), meta.get("above")
    if lo is not None and hi is not None:
        rules.append(f"{lo:g} to {hi:g}")
    else:
        if lo is not None:
            rules.append(f"at least {lo:g}")
        if above is not None:
            rules.append(f"above {above:g}")
        if hi is not None:
            rules.append(f"at most {hi:g}")
    if meta.get("nonempty"):
        rules.append("not empty")
    if meta.get("printable"):
        rules.append("no control characters")
    each = meta.get("each")
    if each:
        inner = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        if text := _allowed(inner, each):
            rules.append(f"each item: {text}")
    return "; ".join(rules)
