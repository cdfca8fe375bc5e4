"""Snapshots and events as JSON and back: what a gateway serves on its control API and
a remote dashboard reads (capmon/gateway, capmon/tui). One format for both sides.

Readers are lenient the way a client of a newer server must be: unknown fields are
dropped, missing ones take their defaults, an unknown event type is skipped.

Writers redact every free-text field (a reason, a message: a provider's words or what
a person typed) for the :class:`Audience` that reads them.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any

from capmon.core.base.secrets import redact
from capmon.core.types import events as ev
from capmon.core.types.snapshot import EngineSnapshot


class Audience(enum.Enum):
    """Who reads a snapshot or an event, and so how much of a key they may see."""

    OPERATOR = "operator"  # the gateway's admin: keys masked, their first characters kept
    CLIENT = "client"  # anyone else: no part of any key, only its alias


def _is_free_text(name: str) -> bool:
    return name in ("reason", "message") or name.endswith("_reason")


def _redacted(data: Any, hints: bool) -> Any:
    if isinstance(data, dict):
        return {
            k: redact(v, hints=hints) if isinstance(v, str) and _is_free_text(k) else _redacted(v, hints)
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [_redacted(x, hints) for x in data]
    return data


def to_json(obj: Any) -> Any:
    """A dataclass, enum, tuple or mapping as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_json(v) for k, v in obj.items()}
    return obj


def event_to_json(event: ev.Event, audience: Audience = Audience.OPERATOR) -> dict[str, Any]:
    data: dict[str, Any] = _redacted(to_json(event), audience is Audience.OPERATOR)
    return {"type": type(event).__name__, **data}


_EVENTS: dict[str, type[ev.Event]] = {
    cls.__name__: cls
    for cls in vars(ev).values()
    if isinstance(cls, type) and issubclass(cls, ev.Event) and not cls.__name__.startswith("_") and cls is not ev.Event
}


def _build(cls: Any, data: Mapping[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        kwargs[f.name] = _value(hints[f.name], data[f.name])
    return cls(**kwargs)


def _value(tp: Any, raw: Any) -> Any:
    if raw is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], raw) if len(inner) == 1 else raw
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_value(args[0], x) for x in raw)
        return tuple(raw)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(raw)
    if dataclasses.is_dataclass(tp):
        return _build(tp, raw)
    return raw


def event_from_json(data: Mapping[str, Any]) -> ev.Event | None:
    cls = _EVENTS.get(str(data.get("type")))
    if cls is None:
        return None
    try:
        return _build(cls, data)  # type: ignore[no-any-return]
    except (TypeError, ValueError):
        return None


def snapshot_to_json(snap: EngineSnapshot, audience: Audience = Audience.OPERATOR) -> dict[str, Any]:
    return _redacted(to_json(snap), audience is Audience.OPERATOR)  # type: ignore[no-any-return]


def snapshot_from_json(data: Mapping[str, Any]) -> EngineSnapshot:
    """A snapshot as a gateway served it. Raises ValueError when it is no snapshot."""
    try:
        return _build(EngineSnapshot, data)  # type: ignore[no-any-return]
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise ValueError(f"not a capmon snapshot: {e}") from None
