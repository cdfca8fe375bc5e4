"""The yardstick: how fast a perfect client could finish N items on a scenario.

The ideal client knows every model's capacity in advance (slots over time, service
times) and is never rejected. It runs the same number of workers as the peers and is
a greedy list scheduler that prefers the first model:

* whenever a worker is free and an item is left, the item goes to the most preferred
  model that has a free slot *now*; it spills to the next model only when every model
  before it is full; when no model has a free slot the worker waits for the next slot
  to free or the next schedule phase to add slots;
* a request takes the model's mean service time at the moment it is admitted,
  ``(base_latency + per_token * answer_tokens) * latency_factor`` (the simulator's noise
  is symmetric around 1, so the mean is exact on average);
* a schedule phase that removes slots does not cut requests already running (the
  simulator does not either): it only refuses new ones.

In a phase where capacity does not change this is the closed form

    c_1 = min(S_1, W),  c_i = min(S_i, W - (c_1 + ... + c_{i-1}))
    X   = sum_i c_i / T_i                      (items per second)
    makespan ~= N / X,  preferred share = (c_1 / T_1) / X

with ``W`` workers, ``S_i`` slots and ``T_i`` mean service time of the i-th model in
preference order; across phases X changes at each phase boundary and the makespan is
where the integral of X reaches N, plus the last requests' tail. The event simulation
below computes exactly that, tail included.

It also gives the per-item latency of an ideal *first-come-first-served* client, the
yardstick for p50 / p99: an item's latency runs from a worker picking it up (the moment
that worker is free) to its answer; a worker that finds every model full waits, and the
worker that has waited longest gets the next free slot (on the most preferred model that
has one). Which worker waits changes no start time, so the makespan and the shares are
the same as above; only FCFS order decides who waits how long.

**The informed oracle** (``ideal(..., informed=True)``) is the same scheduler with less
knowledge: no client can learn that a model has more room before a request has shown
it, so it learns of every *increase* in a model's capacity one round trip after it
happens, and of every *decrease* at once (a rejection says so). The slots it may use on
model ``m`` at time ``t`` are

    min(slots(t), slots(t - T_m))

with ``T_m`` the model's mean service time at ``t`` (``service_time``, the round trip that
shows the new room). The capacity a model has when the run starts (at ``offset``) counts
as known: it is the starting state, not an increase, so ``slots(s)`` for any ``s`` before
``offset`` is taken as ``slots(offset)``. A rise at ``b`` becomes usable at ``b + T_m``, so
the simulation also wakes then. On a scenario whose capacity never rises during the
run (a constant one, or one that only falls) both oracles give the same schedule.
"""

from __future__ import annotations

import collections
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from capmon.core.base import text
from capmon.sim.scenario import ModelSpec, Scenario


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by capmon's one definition
    (``capmon.core.base.text.percentile``: nearest rank, no interpolation, the dashboard's and
    the report's too); NaN for no values, so a table shows it as missing."""
    found = text.percentile(sorted(values), q)
    return float("nan") if found is None else found


@dataclass(frozen=True, slots=True)
class Send:
    """One request the schedule sent: when, where, and when its answer came (scenario clock),
    so a benchmark can replay the schedule as a simulator's counters over time."""

    at: float
    model: str
    until: float


@dataclass(frozen=True)
class Ideal:
    makespan: float  # seconds from the first request to the last answer
    served: dict[str, int]  # items per model
    preferred: str
    # Per item, from a worker picking it up to its answer, for the FCFS ideal client
    # (see the module docstring), in the order the answers came.
    latencies: tuple[float, ...] = ()
    informed: bool = False  # the informed oracle (learns of a rise one round trip late)
    sends: tuple[Send, ...] = field(default=(), compare=False, repr=False)  # in the order sent

    @property
    def preferred_share(self) -> float:
        total = sum(self.served.values())
        return self.served.get(self.preferred, 0) / total if total else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies, 0.99)


def _phase_at(spec: ModelSpec, t: float, repeat: float):
    if not spec.schedule:
        return None
    tt = t % repeat if repeat > 0 else t
    found = None
    for p in spec.schedule:
        if p.at > tt:
            break
        found = p
    return found


def slots_at(spec: ModelSpec, t: float, repeat: float) -> int:
    p = _phase_at(spec, t, repeat)
    return spec.slots if p is None or p.slots is None else p.slots


def service_time(spec: ModelSpec, t: float, repeat: float) -> float:
    p = _phase_at(spec, t, repeat)
    factor = 1.0 if p is None or p.latency_factor is None else p.latency_factor
    return (spec.base_latency + spec.per_token * spec.answer_tokens) * factor


# A time exactly one round trip after a phase boundary must read as after it, whatever the
# floating-point rounding of (b + T) - T.
_EPS = 1e-9


def _model_boundaries(spec: ModelSpec, repeat: float, start: float, horizon: float) -> list[float]:
    """The model's phase start times (scenario clock) in (start, start + horizon]."""
    out: list[float] = []
    for p in spec.schedule:
        if repeat > 0:
            k = int(start // repeat)
            while k * repeat + p.at <= start + horizon:
                t = k * repeat + p.at
                if t > start:
                    out.append(t)
                k += 1
        elif start < p.at <= start + horizon:
            out.append(p.at)
    return out


def _service_times(spec: ModelSpec) -> set[float]:
    """Every mean service time the model has, in any of its phases."""
    return {service_time(spec, at, 0.0) for at in (0.0, *(p.at for p in spec.schedule))}


def _wakes(scn: Scenario, start: float, horizon: float, informed: bool) -> list[float]:
    """When the simulation must look again although no request ends: every phase start
    in (start, start + horizon], and for the informed oracle each of those plus the
    model's round trip (when it learns of a rise; every service time the model has in any
    phase, a superset of the one that applies: a wake that changes nothing is harmless)."""
    out: set[float] = set()
    for m in scn.models:
        for b in _model_boundaries(m, scn.repeat, start, horizon):
            out.add(b)
            if informed:
                out.update(b + rt for rt in _service_times(m))
    return sorted(out)


def known_slots(spec: ModelSpec, t: float, repeat: float, offset: float) -> int:
    """The slots the informed oracle may use on the model at ``t``: a fall at once, a rise
    one round trip (the mean service time at ``t``) after it; the capacity at ``offset``
    (the run's start) is known from the start."""
    seen = max(t - service_time(spec, t, repeat) + _EPS, offset)
    return min(slots_at(spec, t, repeat), slots_at(spec, seen, repeat))


class _Buckets:
    """Per model, a requests-per-minute bucket (see ``ideal``'s ``rpm``)."""

    def __init__(self, rpm: Mapping[str, float], offset: float) -> None:
        self.rate = {name: r / 60.0 for name, r in rpm.items() if r > 0}
        self.size = {name: float(r) for name, r in rpm.items() if r > 0}
        self.tokens = dict(self.size)
        self.at = {name: offset for name in self.rate}

    def _refill(self, name: str, t: float) -> None:
        self.tokens[name] = min(self.size[name], self.tokens[name] + (t - self.at[name]) * self.rate[name])
        self.at[name] = t

    def has(self, name: str, t: float) -> bool:
        if name not in self.rate:
            return True
        self._refill(name, t)
        return self.tokens[name] >= 1.0 - _EPS

    def take(self, name: str) -> None:
        if name in self.rate:
            self.tokens[name] -= 1.0

    def next_token(self, t: float) -> float | None:
        """When the next empty bucket has a request's worth again; None when none is empty."""
        out = None
        for name, rate in self.rate.items():
            self._refill(name, t)
            if self.tokens[name] < 1.0 - _EPS:
                at = t + (1.0 - self.tokens[name]) / rate + _EPS
                out = at if out is None else min(out, at)
        return out


def ideal(
    scn: Scenario,
    items: int,
    workers: int,
    offset: float = 0.0,
    *,
    informed: bool = False,
    start: int | None = None,
    rpm: Mapping[str, float] | None = None,
) -> Ideal:
    """The perfect greedy schedule of ``items`` over ``workers``; ``offset`` is the
    scenario clock (seconds since the simulator started) when the first item is sent.
    ``informed``: the oracle that learns of a rise in capacity one round trip late
    (``known_slots``, the module docstring) instead of the one that knows every model's
    capacity the moment it changes. ``start``: for its first round trip on each model it
    sends no more than that many at once (a client's initial concurrency limit, before any
    answer has shown it more): the floor any client that starts there meets. ``rpm``: per
    model, a requests-per-minute bucket it may not send above (a minute's worth at the start,
    refilled continuously, as capmon's and as a provider's per-minute quota): a model whose
    bucket is empty is full until its next request's worth comes in."""
    models = scn.models
    repeat = scn.repeat

    def usable(m: ModelSpec, t: float) -> int:
        n = known_slots(m, t, repeat, offset) if informed else slots_at(m, t, repeat)
        if start is not None and t < offset + service_time(m, offset, repeat) - _EPS:
            n = min(n, start)  # nothing answered yet: no more than a client starts with
        return n

    buckets = _Buckets(rpm or {}, offset)
    in_flight = {m.name: 0 for m in models}
    served = {m.name: 0 for m in models}
    done: list[tuple[float, int, str, float]] = []  # heap of (finish time, seq, model, picked up at)
    waiting: collections.deque[float] = collections.deque()  # workers holding an item: when they picked it up
    latencies: list[float] = []
    sends: list[Send] = []
    boundaries = _wakes(scn, offset, 3600.0, informed)
    if start is not None:  # the first answers: the starting capacity is known from then on
        boundaries = sorted({*boundaries, *(offset + service_time(m, offset, repeat) for m in models)})
    t = offset
    left = items
    idle = workers
    seq = 0
    finished_at = offset
    while left > 0 or waiting or done:
        # Every idle worker picks an item up now; then the longest-waiting worker gets
        # the next free slot, on the most preferred model that has one.
        while idle > 0 and left > 0:
            idle -= 1
            left -= 1
            waiting.append(t)
        while waiting:
            m = next((m for m in models if in_flight[m.name] < usable(m, t) and buckets.has(m.name, t)), None)
            if m is None:
                break  # every model is full: wait for an event
            picked = waiting.popleft()
            until = t + service_time(m, t, repeat)
            sends.append(Send(t, m.name, until))
            in_flight[m.name] += 1
            served[m.name] += 1
            buckets.take(m.name)
            heapq.heappush(done, (until, seq, m.name, picked))
            seq += 1
        next_done = done[0][0] if done else None
        next_phase = next((b for b in boundaries if b > t), None)
        refill = buckets.next_token(t) if waiting else None
        if refill is not None and (next_phase is None or refill < next_phase):
            next_phase = refill
        if next_done is None and next_phase is None:
            raise ValueError(f"scenario {scn.name!r} never has capacity for the remaining {left + len(waiting)} items")
        if next_done is not None and (next_phase is None or next_done <= next_phase):
            t, _, name, picked = heapq.heappop(done)
            in_flight[name] -= 1
            idle += 1
            latencies.append(t - picked)
            finished_at = t
        else:
            t = next_phase  # type: ignore[assignment]
    return Ideal(
        makespan=finished_at - offset,
        served=served,
        preferred=models[0].name,
        latencies=tuple(latencies),
        informed=informed,
        sends=tuple(sends),
    )
