from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from capmon.core.breaker import Admission, BreakerView, CircuitBreaker, State
from capmon.core.clock import LoopClock, ManualClock
from capmon.core.config import BreakerConfig
from capmon.core.events import BreakerChanged, Event, EventBus


class LowDraws(random.Random):
    """Every draw is 0.0: a RAMP breaker admits whatever its share."""

    def random(self) -> float:
        return 0.0


class Harness:
    def __init__(self, seed: int = 7, rng: random.Random | None = None, **cfg: object) -> None:
        self.clock = ManualClock()
        self.events: list[Event] = []
        self.config = BreakerConfig(**cfg)  # type: ignore[arg-type]
        self.breaker = CircuitBreaker(
            "m@sim/demo", "m", self.config, self.clock, self.events.append, rng=rng or random.Random(seed)
        )

    @property
    def changes(self) -> list[tuple[str, str]]:
        return [(e.old, e.new) for e in self.events if isinstance(e, BreakerChanged)]

    def fail(self, n: int = 1, hint: float | None = None, capacity: bool = True) -> None:
        for _ in range(n):
            adm = self.breaker.admit()
            assert adm is not None
            self.breaker.on_failure(adm, capacity=capacity, hint=hint)

    def succeed(self, n: int = 1) -> None:
        for _ in range(n):
            adm = self.breaker.admit()
            assert adm is not None
            self.breaker.on_success(adm)

    def trip(self, hint: float | None = None) -> None:
        self.fail(self.config.failure_threshold, hint=hint)
        assert self.breaker.state is State.OPEN

    def to_half_open(self) -> None:
        until = self.breaker.next_admit_at()
        assert until is not None
        self.clock.advance(until - self.clock.now())
        assert self.breaker.state is State.HALF_OPEN

    def to_ramp(self) -> None:
        self.to_half_open()
        self.succeed(self.config.half_open_probes)
        assert self.breaker.state is State.RAMP


# ------------------------------------------------------------------ closed


def test_starts_closed_and_admits() -> None:
    h = Harness()
    b = h.breaker
    assert b.state is State.CLOSED
    assert b.would_admit()
    assert b.next_admit_at() is None
    adm = b.admit()
    assert isinstance(adm, Admission)
    b.on_success(adm)
    v = b.view()
    assert isinstance(v, BreakerView)
    assert (v.state, v.manual, v.consecutive_failures, v.cooldown_until, v.ramp_share, v.trips) == (
        State.CLOSED, False, 0, None, None, 0,
    )
    assert h.events == []


def test_consecutive_capacity_failures_trip() -> None:
    h = Harness()
    h.fail(2)
    assert h.breaker.state is State.CLOSED
    assert h.breaker.view().consecutive_failures == 2
    h.fail(1)
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert v.cooldown_until == h.clock.now() + 300
    assert v.trips == 1 and v.total_trips == 1
    assert "3 capacity failures in a row" in v.reason
    assert h.breaker.admit() is None
    assert not h.breaker.would_admit()
    assert h.breaker.next_admit_at() == h.clock.now() + 300
    assert h.changes == [("closed", "open")]


def test_success_resets_consecutive_count() -> None:
    h = Harness()
    h.fail(2)
    h.succeed()
    assert h.breaker.view().consecutive_failures == 0
    h.fail(2)
    assert h.breaker.state is State.CLOSED


def test_transient_failures_and_releases_never_trip_a_closed_breaker() -> None:
    h = Harness()
    h.fail(2)
    h.fail(50, capacity=False)
    for _ in range(50):
        h.breaker.release(h.breaker.admit())  # type: ignore[arg-type]
    v = h.breaker.view()
    # Neither counted nor reset: they say nothing about capacity.
    assert v.state is State.CLOSED and v.consecutive_failures == 2


def test_failure_ratio_over_window_trips() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=10, ratio_window=60)
    for _ in range(4):
        h.succeed()
        h.fail()
    h.succeed()
    assert h.breaker.state is State.CLOSED  # 9 outcomes: not enough to judge
    h.fail()
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert "5 of 10" in v.reason


def test_failure_ratio_forgets_outcomes_older_than_the_window() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=10, ratio_window=60)
    for _ in range(4):
        h.succeed()
        h.fail()
    h.succeed()
    h.clock.advance(61)
    h.fail()
    assert h.breaker.state is State.CLOSED


def test_failure_ratio_below_threshold_does_not_trip() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=10)
    for _ in range(20):
        h.succeed(2)
        h.fail()
    assert h.breaker.state is State.CLOSED


# ------------------------------------------------------------------ cool-down


def test_cooldown_ends_lazily_into_half_open() -> None:
    h = Harness()
    h.trip()
    h.clock.advance(299.9)
    assert h.breaker.state is State.OPEN
    assert h.breaker.admit() is None
    h.clock.advance(0.1)
    assert h.breaker.would_admit()
    assert h.breaker.state is State.HALF_OPEN
    assert h.breaker.next_admit_at() is None
    assert h.changes == [("closed", "open"), ("open", "half-open")]
    assert h.breaker.view().reason == "cool-down over"


def test_cooldown_grows_on_each_retrip_and_is_capped() -> None:
    h = Harness(cooldown=100, cooldown_multiplier=3, cooldown_max=1000)
    h.trip()
    lengths = []
    for _ in range(5):
        lengths.append(h.breaker.next_admit_at() - h.clock.now())  # type: ignore[operator]
        h.to_half_open()
        h.fail()  # the probe fails: re-trip
    assert lengths == [100, 300, 900, 1000, 1000]
    assert h.breaker.view().trips == 6


def test_cooldown_growth_survives_many_retrips_without_overflow() -> None:
    h = Harness(cooldown=1, cooldown_multiplier=10, cooldown_max=50)
    h.trip()
    for _ in range(400):
        h.to_half_open()
        h.fail()
    assert h.breaker.next_admit_at() == h.clock.now() + 50


def test_cooldown_is_never_shorter_than_the_server_hint() -> None:
    h = Harness()
    h.fail(1, hint=10)
    h.fail(1, hint=700)
    h.fail(1, hint=20)
    # max of the hints of the failures that tripped it
    assert h.breaker.next_admit_at() == h.clock.now() + 700


def test_hint_wins_over_the_cap() -> None:
    h = Harness(cooldown_max=1800)
    h.trip(hint=3000)
    assert h.breaker.next_admit_at() == h.clock.now() + 3000


def test_hint_from_before_a_success_does_not_count() -> None:
    h = Harness()
    h.fail(1, hint=5000)
    h.succeed()
    h.trip()
    assert h.breaker.next_admit_at() == h.clock.now() + 300


@pytest.mark.parametrize("garbage", [-1.0, math.nan, math.inf])
def test_garbage_hints_are_ignored(garbage: float) -> None:
    h = Harness()
    h.trip(hint=garbage)
    assert h.breaker.next_admit_at() == h.clock.now() + 300


def test_ratio_trip_uses_the_largest_hint_in_the_window() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=4)
    h.fail(1, hint=400)
    h.succeed()
    h.fail(1, hint=50)
    h.fail(1)
    assert h.breaker.state is State.OPEN
    assert h.breaker.next_admit_at() == h.clock.now() + 400


# ------------------------------------------------------------------ half-open


def test_half_open_admits_at_most_half_open_probes() -> None:
    h = Harness(half_open_probes=2)
    h.trip()
    h.to_half_open()
    b = h.breaker
    p1, p2 = b.admit(), b.admit()
    assert p1 is not None and p2 is not None and p1.probe and p2.probe
    assert b.admit() is None
    assert not b.would_admit()
    assert b.view().probes_in_flight == 2
    b.release(p1)  # says nothing: frees the slot, is not a success
    assert b.view().probes_in_flight == 1
    p3 = b.admit()
    assert p3 is not None
    b.on_success(p2)
    assert b.state is State.HALF_OPEN  # needs two successful probes
    b.on_success(p3)
    assert b.state is State.RAMP
    assert h.changes[-1] == ("half-open", "ramp")


def test_would_admit_does_not_take_a_probe_slot() -> None:
    h = Harness(half_open_probes=1)
    h.trip()
    h.to_half_open()
    for _ in range(5):
        assert h.breaker.would_admit()
    assert h.breaker.admit() is not None
    assert not h.breaker.would_admit()


def test_capacity_failure_in_half_open_reopens_with_longer_cooldown() -> None:
    h = Harness()
    h.trip()
    h.to_half_open()
    h.fail(1, hint=5)
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert v.cooldown_until == h.clock.now() + 600
    assert v.reason == "probe failed (capacity)"
    assert h.changes[-1] == ("half-open", "open")


def test_transient_failure_in_half_open_reopens() -> None:
    h = Harness()
    h.trip()
    h.to_half_open()
    h.fail(1, capacity=False)
    assert h.breaker.state is State.OPEN
    assert h.breaker.view().reason == "probe failed (transient error)"


def test_probe_failure_hint_is_a_floor() -> None:
    h = Harness()
    h.trip()
    h.to_half_open()
    h.fail(1, hint=4000)
    assert h.breaker.next_admit_at() == h.clock.now() + 4000


# ------------------------------------------------------------------ ramp


def test_ramp_share_grows_linearly_and_admission_follows_it() -> None:
    h = Harness(seed=1234, ramp_start=0.1, ramp_duration=60)
    h.trip()
    h.to_ramp()
    b = h.breaker
    ramp_from = h.clock.now()
    for elapsed, share in [(0, 0.1), (20, 0.4), (40, 0.7)]:
        h.clock.advance(ramp_from + elapsed - h.clock.now())
        assert b.view().ramp_share == pytest.approx(share)
        admitted = 0
        for _ in range(4000):
            adm = b.admit()
            if adm is not None:
                admitted += 1
                b.on_success(adm)
        assert admitted / 4000 == pytest.approx(share, abs=0.03)
    assert b.state is State.RAMP


def test_ramp_completes_into_closed_and_forgets_the_cooldown_growth() -> None:
    h = Harness(ramp_duration=60)
    h.trip()
    h.to_half_open()
    h.fail()  # re-trip: 600 s
    h.to_ramp()
    assert h.breaker.view().trips == 2
    h.clock.advance(59.9)
    assert h.breaker.state is State.RAMP
    h.clock.advance(0.1)
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.trips == 0 and v.reason == "ramp complete"
    assert h.changes[-2:] == [("half-open", "ramp"), ("ramp", "closed")]
    h.trip()
    assert h.breaker.next_admit_at() == h.clock.now() + 300  # back to the base cool-down


def test_capacity_failures_in_a_row_during_ramp_reopen_with_longer_cooldown() -> None:
    h = Harness(rng=LowDraws())  # admit everything so the test does not depend on the draw
    h.trip()
    h.to_ramp()
    h.fail(2)
    assert h.breaker.state is State.RAMP  # a moment of fullness is not a relapse
    h.fail(1)
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert v.cooldown_until == h.clock.now() + 600
    assert v.reason == "3 capacity failures in a row during ramp"


def test_a_success_during_ramp_ends_the_failure_streak() -> None:
    h = Harness(rng=LowDraws())
    h.trip()
    h.to_ramp()
    for _ in range(5):
        h.fail(2)
        adm = h.breaker.admit()
        assert adm is not None
        h.breaker.on_success(adm)
    assert h.breaker.state is State.RAMP


def test_transient_failures_during_ramp_are_ignored() -> None:
    h = Harness(rng=LowDraws(), ramp_duration=60)
    h.trip()
    h.to_ramp()
    h.fail(10, capacity=False)
    assert h.breaker.state is State.RAMP


def test_zero_length_ramp_closes_at_once() -> None:
    h = Harness(ramp_duration=0)
    h.trip()
    h.to_half_open()
    h.succeed()
    assert h.breaker.state is State.CLOSED
    assert h.changes[-2:] == [("half-open", "ramp"), ("ramp", "closed")]


# ------------------------------------------------------------------ stale admissions


def test_late_success_from_before_a_trip_does_not_close_an_open_breaker() -> None:
    h = Harness()
    b = h.breaker
    early = [b.admit() for _ in range(5)]
    h.trip()
    for adm in early:
        b.on_success(adm)  # type: ignore[arg-type]
    assert b.state is State.OPEN
    h.to_half_open()
    b.on_success(early[0])  # type: ignore[arg-type]  # already reported: ignored
    assert b.state is State.HALF_OPEN


def test_stale_outcomes_do_not_count_as_probes() -> None:
    h = Harness()
    b = h.breaker
    early_ok, early_fail = b.admit(), b.admit()
    h.trip()
    h.to_half_open()
    b.on_success(early_ok)  # type: ignore[arg-type]
    assert b.state is State.HALF_OPEN
    b.on_failure(early_fail, capacity=True, hint=9999)  # type: ignore[arg-type]
    assert b.state is State.HALF_OPEN
    assert b.view().probes_in_flight == 0


def test_failure_arriving_after_the_ramp_completed_is_stale() -> None:
    h = Harness(rng=LowDraws(), ramp_duration=60)
    h.trip()
    h.to_ramp()
    adm = h.breaker.admit()
    assert adm is not None
    h.clock.advance(61)
    h.breaker.on_failure(adm, capacity=True)
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.consecutive_failures == 0


def test_failure_from_before_a_reset_is_stale() -> None:
    h = Harness(failure_threshold=1)
    adm = h.breaker.admit()
    h.breaker.reset()
    h.breaker.on_failure(adm, capacity=True)  # type: ignore[arg-type]
    assert h.breaker.state is State.CLOSED


def test_reporting_an_admission_twice_counts_once() -> None:
    h = Harness(half_open_probes=2)
    h.trip()
    h.to_half_open()
    p1 = h.breaker.admit()
    h.breaker.on_success(p1)  # type: ignore[arg-type]
    h.breaker.on_success(p1)  # type: ignore[arg-type]
    assert h.breaker.state is State.HALF_OPEN
    assert h.breaker.view().probes_in_flight == 0


# ------------------------------------------------------------------ by hand


def test_forced_open_admits_nothing_until_reset() -> None:
    h = Harness()
    b = h.breaker
    b.trip("maintenance")
    v = b.view()
    assert v.state is State.FORCED_OPEN and v.manual and v.reason == "maintenance"
    h.clock.advance(1e6)
    assert b.admit() is None and not b.would_admit() and b.next_admit_at() is None
    b.reset()
    assert b.state is State.CLOSED and not b.view().manual
    assert b.admit() is not None


def test_forced_closed_admits_everything_and_never_trips() -> None:
    h = Harness()
    b = h.breaker
    h.trip()
    b.force_close()
    assert b.view().manual
    h.fail(100, hint=9999)
    h.fail(100, capacity=False)
    assert b.state is State.FORCED_CLOSED
    assert b.view().consecutive_failures == 0
    h.clock.advance(1e6)
    assert b.state is State.FORCED_CLOSED


def test_reset_clears_counters_and_the_cooldown_growth() -> None:
    h = Harness()
    h.trip()
    h.to_half_open()
    h.fail()
    assert h.breaker.view().trips == 2
    h.breaker.reset()
    v = h.breaker.view()
    assert (v.state, v.consecutive_failures, v.trips, v.cooldown_until, v.reason) == (
        State.CLOSED, 0, 0, None, "reset by hand",
    )
    assert v.total_trips == 2  # history is kept for the dashboard
    h.trip()
    assert h.breaker.next_admit_at() == h.clock.now() + 300


def test_manual_changes_publish_manual_events() -> None:
    h = Harness()
    b = h.breaker
    b.trip()
    b.force_close()
    b.reset()
    manual = [(e.old, e.new, e.manual, e.reason) for e in h.events if isinstance(e, BreakerChanged)]
    assert manual == [
        ("closed", "forced-open", True, "tripped by hand"),
        ("forced-open", "forced-closed", True, "closed by hand"),
        ("forced-closed", "closed", True, "reset by hand"),
    ]


# ------------------------------------------------------------------ events


def test_every_transition_publishes_a_breaker_changed_event() -> None:
    h = Harness(ramp_duration=60)
    h.trip(hint=None)
    opened_at = h.clock.now()
    h.to_ramp()
    h.clock.advance(60)
    assert h.breaker.state is State.CLOSED
    assert h.changes == [("closed", "open"), ("open", "half-open"), ("half-open", "ramp"), ("ramp", "closed")]
    first = h.events[0]
    assert isinstance(first, BreakerChanged)
    assert first.target == "m@sim/demo" and first.model == "m"
    assert first.at == opened_at and first.wall == h.clock.wall() - (h.clock.now() - opened_at)
    assert first.cooldown_until == opened_at + 300 and not first.manual
    assert all(isinstance(e, BreakerChanged) and e.cooldown_until is None for e in h.events[1:])
    # each event starts where the previous one ended
    for prev, nxt in zip(h.events, h.events[1:]):
        assert prev.new == nxt.old  # type: ignore[attr-defined]


def test_works_with_the_event_bus_and_a_broken_subscriber() -> None:
    bus = EventBus()
    seen: list[Event] = []

    def broken(_: Event) -> None:
        raise RuntimeError("boom")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    clock = ManualClock()
    b = CircuitBreaker("t", "m", BreakerConfig(failure_threshold=1), clock, bus.publish)
    b.on_failure(b.admit(), capacity=True)  # type: ignore[arg-type]
    assert b.state is State.OPEN
    assert [type(e) for e in seen] == [BreakerChanged]


def test_a_raising_publish_callable_does_not_break_the_breaker() -> None:
    def publish(_: Event) -> None:
        raise RuntimeError("boom")

    b = CircuitBreaker("t", "m", BreakerConfig(failure_threshold=1), ManualClock(), publish)
    b.on_failure(b.admit(), capacity=True)  # type: ignore[arg-type]
    assert b.state is State.OPEN


# ------------------------------------------------------------------ fast-forwarded loop time


@pytest.mark.looptime
async def test_five_minute_cooldown_passes_in_fast_forwarded_time() -> None:
    started = time.perf_counter()
    events: list[Event] = []
    b = CircuitBreaker("m@sim/demo", "m", BreakerConfig(), LoopClock(), events.append, rng=random.Random(3))
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    for _ in range(3):
        b.on_failure(b.admit(), capacity=True)  # type: ignore[arg-type]
    assert b.state is State.OPEN
    assert b.next_admit_at() == pytest.approx(t0 + 300)

    await asyncio.sleep(299)
    assert b.state is State.OPEN
    await asyncio.sleep(2)  # 301 s after the trip
    assert b.state is State.HALF_OPEN

    probe = b.admit()
    assert probe is not None and probe.probe
    await asyncio.sleep(0.5)  # the probe's round trip
    b.on_success(probe)
    assert b.state is State.RAMP

    admitted = 0
    while b.state is State.RAMP:
        adm = b.admit()
        if adm is not None:
            admitted += 1
            b.on_success(adm)
        await asyncio.sleep(1)
    assert b.state is State.CLOSED
    assert 0 < admitted < 61  # a growing share of one attempt per second over the 60 s ramp
    assert loop.time() - t0 == pytest.approx(301.5 + 60, abs=1.01)
    assert [(e.old, e.new) for e in events if isinstance(e, BreakerChanged)] == [
        ("closed", "open"), ("open", "half-open"), ("half-open", "ramp"), ("ramp", "closed"),
    ]
    assert time.perf_counter() - started < 2.0
