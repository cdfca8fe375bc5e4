"""A target's shared hash (strings, Redis time) to and from the core's types (this
process's clock): the breaker's record, the limiter's learning, a pending move, a seed."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from capmon.core.breaker import BreakerRecord, State
from capmon.core.limiter import Learned
from capmon.core.state import MemoryTarget


def fnum(h: Mapping[str, str], key: str, default: float = 0.0) -> float:
    raw = h.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) else default


def record_of(h: Mapping[str, str], offset: float) -> BreakerRecord:
    """The breaker's record from a hash; ``offset`` converts Redis time to this clock."""
    state = State(h.get("state", "closed"))
    next_probe = fnum(h, "next_probe")
    return BreakerRecord(
        state=state,
        generation=int(fnum(h, "gen")),
        reason=h.get("reason", ""),
        next_probe=next_probe + offset if state is State.OPEN and next_probe > 0 else None,
        interval=fnum(h, "interval"),
        probes_failed=int(fnum(h, "pfail")),
        probe_successes=int(fnum(h, "psucc")),
        trips=int(fnum(h, "trips")),
        total_trips=int(fnum(h, "total_trips")),
        ramp_from=fnum(h, "ramp_from") + offset,
        ramp_share=fnum(h, "ramp_share", 1.0),
        basis=fnum(h, "basis", 1.0),
    )


def learned_of(h: Mapping[str, str]) -> Learned:
    capacity = int(fnum(h, "capacity", -1))
    return Learned(
        limit=fnum(h, "limit", 1.0),
        capacity=None if capacity < 0 else capacity,
        epoch=int(fnum(h, "epoch")),
        hold=fnum(h, "hold", 4.0),
        below=int(fnum(h, "below")),
    )


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
        cuts=0,
        probe_owner="",
        probe_in=probe_in,
        park_in=parked[0] - now if parked is not None and parked[0] > now else -1,
        park_reason=parked[1] if parked is not None else "",
        not_before_in=target.not_before - now if target.not_before > now else -1,
    )
    return json.dumps(fields)
