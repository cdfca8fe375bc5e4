"""Everything read from Redis, parsed strictly, and a target's state written back.

Redis is shared with whoever can reach it, so nothing read from it is trusted: each
field a capmon process reads (a target's hash, a key's state, the pin, the retry
budget, the registry, a script's answer, a pub/sub message) has one parser here, and
a value no capmon process would write raises :class:`Garbage`, the one error a
decoder raises. The store treats it like a Redis fault: it degrades, names the key
once, repairs the key from what it knows and rejoins (ARCHITECTURE.md, "The fleet").

Times in a hash are Redis's clock; ``offset`` converts them to this process's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capmon.core.base import secrets
from capmon.core.base.exceptions import CapmonError
from capmon.core.control.breaker import BreakerRecord, State
from capmon.core.control.limiter import Learned
from capmon.core.control.seam import MemoryTarget
from capmon.core.types.capability import Feature
from capmon.core.types.snapshot import FleetProcess

# What Lua's %.17g and %.6f write, and nothing else: float() alone would also take
# "nan", "inf", "1_0" and " 3 ", none of which a capmon script writes.
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_BIG = 2.0**53  # an integer beyond this is not one a counter reaches
TEXT_MAX = 4096  # a reason, an id, a model name: longer is not something a process wrote
ROLES = ("gateway", "batch", "dashboard", "library")


class Garbage(CapmonError):
    """A value in Redis that no capmon process writes: a field that does not parse, a
    key of the wrong type, a malformed message. ``where`` is the Redis key (or the
    channel); ``suspects`` are the keys to check when Redis only said WRONGTYPE."""

    def __init__(self, where: str, field: str, value: object, why: str, suspects: tuple[str, ...] = ()) -> None:
        self.where = where
        self.field = field
        self.suspects = suspects or (where,)
        shown = secrets.redact(repr(value))[:80]
        super().__init__(f"{where}: {field} = {shown}: {why}" if field else f"{where}: {why}")


def number(raw: object, where: str, field: str, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A field's text (or a script's integer reply) as a finite number within [lo, hi]."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str) and _NUMBER.fullmatch(raw):
        value = float(raw)
    else:
        raise Garbage(where, field, raw, "not a number")
    if not (math.isfinite(value) and lo <= value <= hi):
        raise Garbage(where, field, raw, f"out of range [{lo:g}, {hi:g}]")
    return value


def integer(raw: object, where: str, field: str, lo: float = 0, hi: float = _BIG) -> int:
    value = number(raw, where, field, lo, hi)
    if not value.is_integer():
        raise Garbage(where, field, raw, "not an integer")
    return int(value)


def text(raw: object, where: str, field: str) -> str:
    if not isinstance(raw, str) or len(raw) > TEXT_MAX or "\x00" in raw:
        raise Garbage(where, field, raw, "not a short string")
    return raw


def state(raw: object, where: str, field: str) -> State:
    try:
        return State(text(raw, where, field))
    except ValueError:
        raise Garbage(where, field, raw, f"not one of {', '.join(s.value for s in State)}") from None


def _num(lo: float = -math.inf, hi: float = math.inf) -> Callable[[str, str, str], float]:
    return lambda raw, where, field: number(raw, where, field, lo, hi)


def _int(lo: float = 0) -> Callable[[str, str, str], int]:
    return lambda raw, where, field: integer(raw, where, field, lo)


_NONNEG = _num(0.0)
_TIME = _NONNEG  # Redis's clock: seconds since the epoch, 0 for none

# Every field of a target's hash that a script or a process reads (lua/*.lua, this
# module), with its parser and its value when absent ("" is absent too: the scripts
# write '' for "none"). A field not listed is ignored.
TARGET_FIELDS: dict[str, tuple[Callable[[str, str, str], Any], Any]] = {
    "id": (text, ""),
    "keyref": (text, ""),
    "run": (text, ""),
    "ver": (_int(), 0),
    "origin": (text, ""),
    "state": (state, State.CLOSED),
    "gen": (_int(), 0),
    "reason": (text, ""),
    "next_probe": (_TIME, 0.0),
    "interval": (_NONNEG, 0.0),
    "pfail": (_int(), 0),
    "psucc": (_int(), 0),
    "trips": (_int(), 0),
    "total_trips": (_int(), 0),
    "ramp_from": (_TIME, 0.0),
    "ramp_share": (_num(0.0, 1.0), 1.0),
    "basis": (_NONNEG, 1.0),
    "limit": (_NONNEG, 1.0),
    "capacity": (_int(-1), -1),
    "epoch": (_int(), 0),
    "hold": (_NONNEG, 1.0),
    "below": (_int(), 0),
    "ceiling": (_int(), 0),
    "cuts": (_int(), 0),
    "probe_owner": (text, ""),
    "probe_until": (_TIME, 0.0),
    "not_before": (_TIME, 0.0),
    "park_until": (_TIME, 0.0),
    "park_reason": (text, ""),
    "streak": (_int(), 0),
    "streak_from": (_TIME, 0.0),
    "streak_hint": (_NONNEG, 0.0),
    "saved": (_int(), 0),
    "s_limit": (_NONNEG, 1.0),
    "s_capacity": (_int(-1), -1),
    "s_hold": (_NONNEG, 1.0),
    "refused_in": (_NONNEG, 0.0),
    "refusals": (_int(), 0),
}


@dataclass(frozen=True, slots=True)
class SharedTarget:
    """A target's hash, every field parsed (times on Redis's clock)."""

    id: str
    run: str
    ver: int
    origin: str
    state: State
    gen: int
    reason: str
    next_probe: float
    interval: float
    pfail: int
    psucc: int
    trips: int
    total_trips: int
    ramp_from: float
    ramp_share: float
    basis: float
    limit: float
    capacity: int
    epoch: int
    hold: float
    below: int
    ceiling: int
    probe_owner: str
    probe_until: float
    not_before: float
    park_until: float
    park_reason: str
    refused_in: float  # seconds the fleet's latest refusal took (capmon/core/control/survival.py)
    refusals: int  # refusals timed so far: a new one when this grows

    def record(self, offset: float) -> BreakerRecord:
        """The breaker's record; ``offset`` converts Redis time to this clock."""
        return BreakerRecord(
            state=self.state,
            generation=self.gen,
            reason=self.reason,
            next_probe=self.next_probe + offset if self.state is State.OPEN and self.next_probe > 0 else None,
            interval=self.interval,
            probes_failed=self.pfail,
            probe_successes=self.psucc,
            trips=self.trips,
            total_trips=self.total_trips,
            ramp_from=self.ramp_from + offset,
            ramp_share=self.ramp_share,
            basis=self.basis,
        )

    def learned(self) -> Learned:
        return Learned(
            limit=self.limit,
            capacity=None if self.capacity < 0 else self.capacity,
            epoch=self.epoch,
            hold=self.hold,
            below=self.below,
            ceiling=self.ceiling,
        )


_KEPT = SharedTarget.__slots__


def target(h: Mapping[str, str], where: str, expect_id: str | None = None) -> SharedTarget | None:
    """A target's hash parsed, or None when it is empty (missing). A hash that has
    fields but no generation, or another target's id, is garbage too."""
    if not isinstance(h, Mapping):
        raise Garbage(where, "", h, "not a hash")
    if not h:
        return None
    if "gen" not in h:
        raise Garbage(where, "gen", None, "missing")
    values: dict[str, Any] = {}
    for name, (parse, default) in TARGET_FIELDS.items():
        raw = h.get(name)
        value = default if raw is None or raw == "" else parse(raw, where, name)
        if name in _KEPT:
            values[name] = value
    if expect_id is not None and values["id"] not in ("", expect_id):
        raise Garbage(where, "id", values["id"], f"not {expect_id}")
    return SharedTarget(**values)


def flat_hash(raw: object, where: str) -> dict[str, str]:
    """A hash as a script returns it (one JSON object), as HGETALL does (a dict) or as a
    flat [field, value, ...] list: a dict of strings, or Garbage."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw else {}
        except ValueError:
            raise Garbage(where, "", raw, "not a JSON object") from None
    if isinstance(raw, dict):
        items = list(raw.items())
    elif isinstance(raw, list | tuple):
        if len(raw) % 2:
            raise Garbage(where, "", raw, "an odd field list")
        items = list(zip(raw[::2], raw[1::2], strict=True))
    else:
        raise Garbage(where, "", raw, "not a hash")
    out: dict[str, str] = {}
    for k, v in items:
        if isinstance(v, bool) or not isinstance(k, str) or not isinstance(v, str | int | float):
            raise Garbage(where, str(k)[:40], v, "not a string")
        # cjson writes a Lua number it holds as one (HINCRBY's answer): its text is what Redis holds
        out[k] = v if isinstance(v, str) else f"{v:.17g}" if isinstance(v, float) else str(v)
    return out


def key_disabled(raw: object, where: str) -> str:
    """A key's ``disabled`` field: the reason, or '' when the key is usable."""
    return "" if raw is None else text(raw, where, "disabled")


@dataclass(frozen=True, slots=True)
class KeyNews:
    """A key's state as Redis said it: the disabled reason ('' when usable) and the
    key's version, raised by every change (lua/lib.lua, ``key_state``)."""

    disabled: str
    ver: int


def key_fields(raw_disabled: object, raw_ver: object, where: str) -> KeyNews:
    """A key's hash as read field by field (``disabled``, ``ver``)."""
    return KeyNews(key_disabled(raw_disabled, where), 0 if raw_ver is None else integer(raw_ver, where, "ver"))


def key_news(raw: object, where: str) -> KeyNews:
    """A key's state as a script returns or publishes it: ``"<version>:<reason>"``."""
    value = text(raw, where, "disabled")
    ver, sep, reason = value.partition(":")
    if not sep:
        raise Garbage(where, "disabled", raw, "not <version>:<reason>")
    return KeyNews(reason, integer(ver, where, "disabled"))


def pin(raw: object, where: str) -> str | None:
    if raw is None or raw == "":
        return None
    value = text(raw, where, "pin")
    if len(value) > 256 or not value.isprintable():
        raise Garbage(where, "pin", raw, "not a model name")
    return value


def lesson_field(raw: object, where: str) -> tuple[str, Feature]:
    """A field of the lessons hash: ``"<deployment>|<feature>"`` (:func:`lesson_key`)."""
    value = text(raw, where, "lesson")
    deployment, sep, name = value.rpartition("|")
    if not sep or not deployment or not deployment.isprintable():
        raise Garbage(where, "lesson", raw, "not <deployment>|<feature>")
    return deployment, feature(name, where, "lesson")


def lesson_key(deployment: str, f: Feature) -> str:
    return f"{deployment}|{f.value}"


def feature(raw: object, where: str, field: str) -> Feature:
    try:
        return Feature(text(raw, where, field))
    except ValueError:
        raise Garbage(where, field, raw, f"not one of {', '.join(f.value for f in Feature)}") from None


def lessons(raw: object, where: str) -> list[tuple[str, Feature, str]]:
    """The lessons hash (what providers taught the fleet about the features each deployment
    lacks): (deployment, feature, the provider's words) each."""
    return [(*lesson_field(k, where), text(v, where, "lesson.why")) for k, v in flat_hash(raw, where).items()]


def budget(raw_balance: object, raw_ver: object, where: str, cap: float) -> tuple[float, int] | None:
    """The fleet's retry budget (balance, version), or None when Redis has none yet."""
    if raw_balance is None:
        return None
    balance = number(raw_balance, where, "balance", 0.0, cap)
    return balance, 0 if raw_ver is None else integer(raw_ver, where, "ver")


def process(h: Mapping[str, str], where: str, this: str) -> FleetProcess:
    """A live process as the registry holds it (``this``: this process's id)."""
    role = text(h.get("role", "library"), where, "role")
    if role not in ROLES:
        raise Garbage(where, "role", role, f"not one of {', '.join(ROLES)}")
    degraded = h.get("degraded", "0")
    if degraded not in ("0", "1"):
        raise Garbage(where, "degraded", degraded, "not 0 or 1")
    pid = text(h.get("id", ""), where, "id")
    return FleetProcess(
        id=pid,
        host=text(h.get("host", ""), where, "host"),
        pid=integer(h.get("pid", "0"), where, "pid"),
        role=role,
        in_flight=integer(h.get("in_flight", "0"), where, "in_flight"),
        started=number(h.get("started", "0"), where, "started", 0.0),
        seen=number(h.get("seen", "0"), where, "seen", 0.0),
        degraded=degraded == "1",
        this=pid == this,
    )


# ------------------------------------------------------------ pub/sub messages


@dataclass(frozen=True, slots=True)
class TargetNews:
    """A target's hash after a move (``k = b``); ``key``: the key's state if sent."""

    hash: SharedTarget
    key: KeyNews | None


@dataclass(frozen=True, slots=True)
class SlotFreed:
    id: str
    to: str


@dataclass(frozen=True, slots=True)
class Pinned:
    model: str | None
    origin: str


@dataclass(frozen=True, slots=True)
class Lesson:
    """A provider taught a process that a deployment lacks a feature (``k = lesson``)."""

    deployment: str
    feature: Feature
    why: str
    origin: str


Message = TargetNews | SlotFreed | Pinned | Lesson


def message(data: object, channel: str) -> Message:
    """One pub/sub message, or Garbage whose ``field`` names its kind of fault."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise Garbage(channel, "message", data, "not UTF-8") from None
    if not isinstance(data, str):
        raise Garbage(channel, "message", data, "not text")
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):
        raise Garbage(channel, "message", data, "not JSON") from None
    if not isinstance(msg, dict):
        raise Garbage(channel, "message", data, "not a JSON object")
    kind = msg.get("k")
    if kind == "b":
        h = target(flat_hash(msg.get("h"), f"{channel} b"), f"{channel} b")
        if h is None:
            raise Garbage(channel, "b.h", msg.get("h"), "empty")
        disabled, kv = msg.get("disabled"), msg.get("kv")
        if disabled is None:
            return TargetNews(h, None)
        where = f"{channel} b"
        # no version (a process of an older release): older than anything read since
        return TargetNews(h, KeyNews(key_disabled(disabled, where), -1 if kv is None else integer(kv, where, "kv")))
    if kind == "freed":
        return SlotFreed(text(msg.get("id"), channel, "freed.id"), text(msg.get("to", ""), channel, "freed.to"))
    if kind == "pin":
        return Pinned(pin(msg.get("model"), channel), text(msg.get("origin", ""), channel, "pin.origin"))
    if kind == "lesson":
        deployment, f = lesson_field(msg.get("d"), channel)
        why = text(msg.get("why"), channel, "lesson.why")
        return Lesson(deployment, f, why, text(msg.get("origin", ""), channel, "lesson.origin"))
    raise Garbage(channel, "k", kind, "not a kind of message")


# ------------------------------------------------------------ written to Redis


def _record_fields(rec: BreakerRecord, now: float) -> dict[str, object]:
    return {
        "state": rec.state.value,
        "gen": rec.generation,
        "reason": rec.reason,
        # an open breaker always has a probe time (0 would read as none, and leave it stuck open)
        "next_in": max(0.0, (rec.next_probe if rec.next_probe is not None else now) - now)
        if rec.state is State.OPEN
        else -1,
        "interval": rec.interval,
        "pfail": rec.probes_failed,
        "psucc": rec.probe_successes,
        "trips": rec.trips,
        "total_trips": rec.total_trips,
        "ramp_share": rec.ramp_share,
        "ramp_ago": max(0.0, now - rec.ramp_from),
        "basis": rec.basis,
    }


def transition(rec: BreakerRecord, from_gen: int, now: float) -> str:
    """A move of the local breaker, for the compare-and-set in the scripts: a ramp
    step keeps the generation; anything else carries the breaker's new one."""
    fields = _record_fields(rec, now)
    fields["from"] = from_gen
    fields["step"] = rec.generation == from_gen
    return json.dumps(fields)


def seed(
    target: MemoryTarget, now: float, key_ref: str, probe_in: float, parked: tuple[float, str] | None, learned: Learned
) -> str:
    """What one process knows of a target, to rebuild it in a Redis that lost it
    (``learned``: the fleet's learning as last heard, not a degraded process's share)."""
    rec = target.breaker.export()
    fields = _record_fields(rec, now)
    fields.update(
        id=target.id,
        keyref=key_ref,
        limit=learned.limit,
        capacity=-1 if learned.capacity is None else learned.capacity,
        epoch=learned.epoch,
        hold=learned.hold,
        below=learned.below,
        ceiling=learned.ceiling,
        cuts=0,
        probe_owner="",
        probe_in=probe_in,
        park_in=parked[0] - now if parked is not None and parked[0] > now else -1,
        park_reason=parked[1] if parked is not None else "",
        not_before_in=target.not_before - now if target.not_before > now else -1,
    )
    return json.dumps(fields)
