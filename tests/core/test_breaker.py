"""The circuit breaker on its own: trips, the client's probes, the evidence ramp, manual states.

Outcomes are fed to :meth:`CircuitBreaker.record` the way the state seam does it
(capmon/core/control/seam.py): with the generation and the clock time at which the attempt
was admitted, and whether the limiter took a capacity failure as news.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import pytest

from capmon.core.base.clock import LoopClock
from capmon.core.control.breaker import BreakerView, CircuitBreaker, State
from capmon.core.control.decisions import ramp_grown, ramp_opening
from capmon.core.control.policy import BreakerSignal
from capmon.core.types.config import BreakerConfig
from capmon.core.types.events import BreakerChanged, Event, EventBus, RampStep
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.unit

S = BreakerSignal
Sent = tuple[int, float]  # (generation, clock time) when an attempt was admitted


class Harness:
    def __init__(self, **cfg: object) -> None:
        self.clock = ManualClock()
        self.events: list[Event] = []
        self.config = BreakerConfig(**cfg)  # type: ignore[arg-type]
        self.breaker = CircuitBreaker("m@sim/demo", "m", self.config, self.clock, self.events.append)

    @property
    def changes(self) -> list[tuple[str, str]]:
        return [(e.old, e.new) for e in self.events if isinstance(e, BreakerChanged)]

    @property
    def steps(self) -> list[float]:
        return [e.share for e in self.events if isinstance(e, RampStep)]

    def sent(self) -> Sent:
        """An attempt admitted now."""
        return self.breaker.generation, self.clock.now()

    def record(
        self,
        sent: Sent,
        signal: BreakerSignal,
        *,
        hint: float | None = None,
        news: bool = True,
        probe: bool = False,
        basis: float = 8.0,
        floor: float = 1.0,
    ) -> None:
        self.breaker.record(
            sent[0], signal, sent_at=sent[1], hint=hint, news=news, probe=probe, basis=basis, floor=floor
        )

    def fail(
        self, n: int = 1, hint: float | None = None, signal: BreakerSignal = S.CAPACITY, news: bool = True
    ) -> None:
        for _ in range(n):
            self.record(self.sent(), signal, hint=hint, news=news)

    def succeed(self, n: int = 1) -> None:
        for _ in range(n):
            self.record(self.sent(), S.SUCCESS)

    def trip(self, hint: float | None = None) -> None:
        self.fail(self.config.failure_threshold, hint=hint)
        assert self.breaker.state is State.OPEN

    def wait_for_probe(self) -> float:
        """Advance to the due probe; returns how long that was."""
        due = self.breaker.probe_due_at()
        assert due is not None
        waited = due - self.clock.now()
        self.clock.advance(waited)
        return waited

    def probe(
        self, signal: BreakerSignal = S.SUCCESS, hint: float | None = None, basis: float = 8.0, floor: float = 1.0
    ) -> None:
        self.wait_for_probe()
        gen = self.breaker.begin_probe()
        assert gen is not None and self.breaker.state is State.HALF_OPEN
        self.record((gen, self.clock.now()), signal, hint=hint, news=False, probe=True, basis=basis, floor=floor)

    def to_ramp(self, basis: float = 8.0, floor: float = 1.0) -> None:
        for _ in range(self.config.half_open_probes):
            self.probe(basis=basis, floor=floor)
        assert self.breaker.state is State.RAMP


# ------------------------------------------------------------------ closed


def test_starts_closed_and_admits_everything() -> None:
    h = Harness()
    b = h.breaker
    assert b.state is State.CLOSED and b.state.admits
    assert b.share() == 1.0
    assert b.probe_due_at() is None and b.begin_probe() is None
    h.succeed()
    v = b.view()
    assert isinstance(v, BreakerView)
    assert (
        v.state,
        v.manual,
        v.consecutive_failures,
        v.next_probe_at,
        v.probe_interval,
        v.probes_failed,
        v.ramp_share,
        v.trips,
        v.total_trips,
    ) == (State.CLOSED, False, 0, None, None, 0, None, 0, 0)
    assert h.events == [] and b.generation == 0


def test_consecutive_capacity_failures_trip() -> None:
    h = Harness()
    h.fail(2)
    assert h.breaker.state is State.CLOSED
    assert h.breaker.view().consecutive_failures == 2
    h.fail(1)
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert v.next_probe_at == h.clock.now() + 2.0 and v.probe_interval == 2.0  # probe_interval, not a blind wait
    assert v.trips == 1 and v.total_trips == 1 and v.probes_failed == 0
    assert "3 capacity failures in a row" in v.reason
    assert h.breaker.probe_due_at() == h.clock.now() + 2.0
    assert h.changes == [("closed", "open")]


def test_a_silent_route_trips_at_once_from_closed_and_ramp_until_a_probe_answers() -> None:
    # issue 29 item 2: no response headers in time opens the breaker with one failure.
    h = Harness()
    h.fail(1, signal=S.SILENT)
    v = h.breaker.view()
    assert v.state is State.OPEN and "silent" in v.reason and v.next_probe_at == h.clock.now() + 2.0
    h.probe(S.SILENT)  # its probe is silent too: open again, the interval grown
    assert h.breaker.state is State.OPEN and h.breaker.view().probes_failed == 1
    h.to_ramp()
    h.fail(1, signal=S.SILENT)  # silent in the ramp: open at once as well
    assert h.breaker.state is State.OPEN
    assert h.changes == [("closed", "open"), ("open", "half-open"), ("half-open", "open")] + [
        ("open", "half-open"),
        ("half-open", "ramp"),
        ("ramp", "open"),
    ]


def test_open_admits_nothing_not_even_when_the_probe_is_due() -> None:
    h = Harness()
    h.trip()
    b = h.breaker
    assert not b.state.admits and b.share() == 0.0
    h.clock.advance(1e6)  # long past the due probe: still only the client's own probe may go
    assert b.state is State.OPEN and b.share() == 0.0
    assert b.begin_probe() is not None
    assert b.share() == 0.0  # nor while it is in flight


def test_a_success_resets_the_consecutive_count() -> None:
    h = Harness()
    h.fail(2)
    h.succeed()
    assert h.breaker.view().consecutive_failures == 0
    h.fail(2)
    assert h.breaker.state is State.CLOSED


def test_echoes_are_not_failures() -> None:
    # A capacity failure the limiter took as an echo of its own cut: the model is full, not down.
    h = Harness(failure_ratio=0.0, ratio_min_requests=1)
    h.fail(50, news=False)
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.consecutive_failures == 0


def test_transient_and_neutral_outcomes_never_trip_a_closed_breaker() -> None:
    h = Harness()
    h.fail(2)
    h.fail(50, signal=S.TRANSIENT)
    h.fail(50, signal=S.NEUTRAL)
    v = h.breaker.view()
    # Neither counted nor reset: they say nothing about capacity.
    assert v.state is State.CLOSED and v.consecutive_failures == 2


def test_connection_failures_count_even_when_not_news() -> None:
    h = Harness()
    h.fail(3, signal=S.DOWN, news=False)  # nothing reached the server: always a failure
    assert h.breaker.state is State.OPEN


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


def test_echoes_do_not_count_toward_the_failure_ratio() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=10)
    h.succeed(5)
    h.fail(100, news=False)
    h.fail(4)
    assert h.breaker.state is State.CLOSED  # 4 of 9
    h.fail()
    assert h.breaker.state is State.OPEN and "5 of 10" in h.breaker.view().reason


# ------------------------------------------------------------------ send order


def test_a_success_sent_before_the_streak_began_does_not_break_it() -> None:
    h = Harness()
    early = h.sent()  # still being served when the model went down
    h.clock.advance(1)
    h.fail(2)
    h.record(early, S.SUCCESS)
    assert h.breaker.view().consecutive_failures == 2
    h.fail(1)
    assert h.breaker.state is State.OPEN


def test_a_success_sent_after_the_streak_began_breaks_it() -> None:
    h = Harness()
    first = h.sent()
    h.clock.advance(1)
    later = h.sent()
    h.record(first, S.CAPACITY)
    h.record(later, S.SUCCESS)  # sent after the first failure was: the model served it
    assert h.breaker.view().consecutive_failures == 0


def test_the_hint_of_a_streak_a_success_did_not_break_still_counts() -> None:
    h = Harness()
    early = h.sent()
    h.clock.advance(1)
    h.fail(1, hint=500)
    h.record(early, S.SUCCESS)
    h.fail(2)
    assert h.breaker.probe_due_at() == h.clock.now() + 500


# ------------------------------------------------------------------ probes


def test_a_probe_is_due_probe_interval_after_the_trip_and_not_before() -> None:
    h = Harness(probe_interval=5)
    h.trip()
    b = h.breaker
    t0 = h.clock.now()
    assert b.probe_due_at() == t0 + 5
    h.clock.advance(4.9)
    assert b.begin_probe() is None and b.state is State.OPEN
    h.clock.advance(0.1)
    gen = b.begin_probe()
    assert gen == b.generation
    v = b.view()
    assert v.state is State.HALF_OPEN and v.next_probe_at is None and v.probe_interval == 5
    assert b.probe_due_at() is None
    assert h.changes[-1] == ("open", "half-open")
    assert "probing" in v.reason


def test_one_probe_at_a_time() -> None:
    h = Harness()
    h.trip()
    h.wait_for_probe()
    assert h.breaker.begin_probe() is not None
    for _ in range(5):
        assert h.breaker.begin_probe() is None
    h.clock.advance(1000)
    assert h.breaker.begin_probe() is None and h.breaker.state is State.HALF_OPEN


def test_each_failed_probe_multiplies_the_interval_up_to_the_cooldown() -> None:
    h = Harness(probe_interval=2, cooldown=60, cooldown_multiplier=3)
    h.trip()
    waits = []
    for n in range(6):
        waits.append(h.wait_for_probe())
        h.probe(S.CAPACITY)
        v = h.breaker.view()
        assert v.state is State.OPEN and v.probes_failed == n + 1 and v.reason == "probe failed (capacity)"
    assert waits == [2, 6, 18, 54, 60, 60]
    assert h.breaker.view().trips == 1  # failed probes are not trips
    assert h.changes[-2:] == [("open", "half-open"), ("half-open", "open")]


@pytest.mark.parametrize("signal", [S.CAPACITY, S.DOWN, S.TRANSIENT])
def test_any_failure_fails_a_probe(signal: BreakerSignal) -> None:
    h = Harness()
    h.trip()
    h.probe(signal)
    v = h.breaker.view()
    assert v.state is State.OPEN and v.probes_failed == 1 and v.probe_interval == 4.0
    assert v.reason == f"probe failed ({signal.value})"


def test_an_inconclusive_probe_is_repeated_after_the_same_interval() -> None:
    h = Harness()
    h.trip()
    h.probe(S.NEUTRAL)  # e.g. its key was refused: says nothing about the model
    v = h.breaker.view()
    assert v.state is State.OPEN and v.probes_failed == 0 and v.reason == "probe inconclusive"
    assert v.next_probe_at == h.clock.now() + 2.0


def test_interval_growth_survives_many_failed_probes_without_overflow() -> None:
    h = Harness(probe_interval=1, cooldown=50, cooldown_multiplier=10)
    h.trip()
    for _ in range(400):
        h.probe(S.CAPACITY)
    assert h.breaker.probe_due_at() == h.clock.now() + 50


def test_a_probe_is_never_sooner_than_the_server_hint() -> None:
    h = Harness()
    h.trip(hint=100)
    v = h.breaker.view()
    assert v.next_probe_at == h.clock.now() + 100 and v.probe_interval == 2.0
    h.probe(S.CAPACITY, hint=500)
    assert h.breaker.probe_due_at() == h.clock.now() + 500
    h.probe(S.CAPACITY)  # the schedule grew underneath the hints: 2 -> 4 -> 8
    assert h.breaker.probe_due_at() == h.clock.now() + 8


def test_a_hint_shorter_than_the_interval_changes_nothing() -> None:
    h = Harness(probe_interval=30)
    h.trip(hint=3)
    assert h.breaker.probe_due_at() == h.clock.now() + 30


def test_a_hint_is_capped_at_cooldown_max() -> None:
    h = Harness(cooldown_max=300)
    h.trip(hint=3000)
    assert h.breaker.probe_due_at() == h.clock.now() + 300
    h.probe(S.CAPACITY, hint=1e9)
    assert h.breaker.probe_due_at() == h.clock.now() + 300


def test_the_trip_waits_for_the_largest_hint_of_the_streak() -> None:
    h = Harness()
    h.fail(1, hint=10)
    h.fail(1, hint=700)
    h.fail(1, hint=20)
    assert h.breaker.probe_due_at() == h.clock.now() + 700


def test_a_hint_from_before_a_success_does_not_count() -> None:
    h = Harness()
    h.fail(1, hint=5000)
    h.succeed()
    h.trip()
    assert h.breaker.probe_due_at() == h.clock.now() + 2.0


@pytest.mark.parametrize("garbage", [-1.0, math.nan, math.inf, -math.inf])
def test_garbage_hints_are_ignored(garbage: float) -> None:
    h = Harness()
    h.trip(hint=garbage)
    assert h.breaker.probe_due_at() == h.clock.now() + 2.0
    h.probe(S.CAPACITY, hint=garbage)
    assert h.breaker.probe_due_at() == h.clock.now() + 4.0


def test_a_ratio_trip_waits_for_the_largest_hint_in_the_window() -> None:
    h = Harness(failure_threshold=100, failure_ratio=0.5, ratio_min_requests=4)
    h.fail(1, hint=400)
    h.succeed()
    h.fail(1, hint=50)
    h.fail(1)
    assert h.breaker.state is State.OPEN
    assert h.breaker.probe_due_at() == h.clock.now() + 400


def test_several_probes_must_succeed_before_the_ramp() -> None:
    h = Harness(half_open_probes=2, probe_interval=3)
    h.trip()
    h.probe(S.SUCCESS)
    v = h.breaker.view()
    assert v.state is State.OPEN and v.reason == "probe succeeded; another is needed"
    assert v.next_probe_at == h.clock.now() + 3  # the next probe after the same interval
    h.probe(S.SUCCESS)
    assert h.breaker.state is State.RAMP
    assert h.breaker.view().reason == "2 probe(s) succeeded"


# ------------------------------------------------------------------ ramp


def test_a_successful_probe_starts_the_ramp_at_ramp_start() -> None:
    h = Harness(ramp_start=0.25)
    h.trip()
    h.probe(S.CAPACITY)
    h.to_ramp(basis=8)
    v = h.breaker.view()
    assert v.state is State.RAMP and v.ramp_share == 0.25 and h.breaker.share() == 0.25
    assert v.next_probe_at is None and v.probe_interval is None and v.probes_failed == 0
    assert h.breaker.probe_due_at() is None
    assert h.changes[-1] == ("half-open", "ramp")


def test_each_clean_answer_adds_two_slots_so_a_round_of_them_triples_the_share() -> None:
    # basis 18 from 2 slots: rounds of 2 and 6 answers take it to 6 and 18 slots, and
    # every answer counts at once (TCP's window grows per ack; capmon's by two slots).
    h = Harness(ramp_start=2 / 18, ramp_duration=1e6)
    h.trip()
    h.to_ramp(basis=18)
    b = h.breaker
    for slots_before, round_size in [(2, 2), (6, 6)]:
        for k in range(round_size):
            assert b.state is State.RAMP and b.share() == pytest.approx((slots_before + 2 * k) / 18)
            h.succeed()
    v = b.view()
    assert v.state is State.CLOSED and v.reason == "ramp complete" and v.trips == 0
    assert h.steps == pytest.approx([4 / 18, 8 / 18, 16 / 18])  # one RampStep per doubling
    assert h.changes[-1] == ("ramp", "closed")


@pytest.mark.parametrize(
    ("basis", "ramp_start", "answers", "share"),
    [
        (24, 0.25, 0, 0.25),  # 6 of 24
        (24, 0.25, 1, 8 / 24),
        (24, 0.25, 6, 18 / 24),  # a round of 6: 18 of 24
        (24, 0.25, 8, 22 / 24),
        (24, 0.25, 9, 1.0),  # 6 -> 18 -> 24: a round and a half closes it (the sum's rounding too)
        (10, 0.25, 1, 0.45),  # 2.5 slots + 2
        (10, 0.25, 4, 1.0),  # 2.5 + 8 > 10: capped, closed
        (2, 0.25, 1, 1.0),  # 1 of 2 (the floor), then 2 of 2
    ],
)
def test_the_growth_table(basis: float, ramp_start: float, answers: int, share: float) -> None:
    h = Harness(ramp_start=ramp_start, ramp_duration=1e6)
    h.trip()
    h.to_ramp(basis=basis)
    h.succeed(answers)
    assert h.breaker.share() == pytest.approx(share)
    assert (h.breaker.state is State.CLOSED) == (share == 1.0)


def test_failures_in_a_ramp_that_showed_nothing_add_nothing_and_in_a_row_reopen_it() -> None:
    h = Harness(ramp_start=0.25, ramp_duration=1e6, failure_threshold=3)
    h.trip()
    h.to_ramp(basis=16)  # 4 of 16
    h.fail()
    assert h.breaker.share() == 0.25  # the failure adds nothing
    h.fail(news=False)  # an echo: not a failure
    assert h.breaker.state is State.RAMP and h.breaker.consecutive == 1
    h.fail(2)
    assert h.breaker.state is State.OPEN
    assert h.changes[-1] == ("ramp", "open")


def test_a_model_that_served_in_the_ramp_and_then_refused_closes_it() -> None:
    # It serves again and is full: the limiter's cut to what was in flight is what it holds,
    # and a share of that cut would hold back room it just showed.
    h = Harness(ramp_start=0.25, ramp_duration=1e6, failure_threshold=3)
    h.trip()
    h.to_ramp(basis=16)
    h.succeed()
    assert h.breaker.share() == 0.375
    h.fail(news=False)  # an echo of a cut: nothing
    assert h.breaker.state is State.RAMP
    h.fail()
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.reason == "full in the ramp: the limiter holds what it showed"
    assert h.changes[-1] == ("ramp", "closed")
    h2 = Harness(ramp_start=0.25, ramp_duration=1e6, failure_threshold=3)  # a survival shows it too
    h2.trip()
    h2.to_ramp(basis=16)
    gen = h2.breaker.generation
    assert h2.breaker.ramp_admitted(gen)
    h2.breaker.survived(gen, free=4)
    h2.fail()
    assert h2.breaker.state is State.CLOSED


@pytest.mark.parametrize(
    ("basis", "ramp_start", "floor", "share"),
    [
        (24, 0.25, 8, 1 / 3),  # the outage's flagship: max(8, 6) of 24
        (24, 0.25, 4, 0.25),  # a quarter is more than the floor
        (24, 0.5, 8, 0.5),
        (8, 0.25, 8, 1.0),  # the floor is the whole limit: no ramp
        (4, 0.25, 8, 1.0),  # learned less than the initial limit: the whole of it
        (0.5, 0.25, 1, 1.0),
    ],
)
def test_a_ramp_starts_at_no_fewer_slots_than_the_limiters_initial_limit(
    basis: float, ramp_start: float, floor: float, share: float
) -> None:
    assert ramp_opening(ramp_start, basis, floor) == pytest.approx(share)
    h = Harness(ramp_start=ramp_start, ramp_duration=1e6)
    h.trip()
    h.probe(basis=basis, floor=floor)
    b = h.breaker
    if share < 1.0:
        assert b.state is State.RAMP and b.share() == pytest.approx(share)
        h.succeed()  # grows from the floor
        assert b.share() == pytest.approx(share + 2 / basis)
    else:
        assert b.state is State.CLOSED and b.view().reason == "ramp complete"


def test_the_growth_rule_is_two_slots_of_the_basis_and_snaps_to_one() -> None:
    assert ramp_grown(0.25, 16) == 0.375
    assert ramp_grown(0.0, 8) == 0.25
    assert ramp_grown(0.8, 8) == 1.0
    assert ramp_grown(0.25, 0.5) == 1.0  # a basis below one is one slot
    share = 0.25
    for _ in range(18):
        share = ramp_grown(share, 48)
    assert share == 1.0  # 0.25 + 18 * 2 / 48 summed is 0.9999999999999997


def test_ramp_duration_is_a_ceiling_on_the_ramp() -> None:
    h = Harness(ramp_start=0.25, ramp_duration=60)
    h.trip()
    h.to_ramp(basis=8)
    b = h.breaker
    h.clock.advance(30)  # no traffic at all: time alone raises the share
    assert b.view().ramp_share == pytest.approx(0.625)
    h.succeed(1)  # a clean answer: the evidence share, 0.5, below the time share
    assert b.share() == pytest.approx(0.625)
    h.clock.advance(29.9)
    assert b.state is State.RAMP
    h.clock.advance(0.2)
    assert b.state is State.CLOSED and b.view().reason == "ramp complete"


def test_evidence_is_not_held_back_by_time() -> None:
    h = Harness(ramp_start=0.25, ramp_duration=60)
    h.trip()
    h.to_ramp(basis=8)
    h.clock.advance(1)
    h.succeed(2)
    assert h.breaker.share() == 0.75  # one clean round beats a second of time (0.2625)


def test_the_ramp_completing_forgets_the_interval_growth() -> None:
    h = Harness(ramp_duration=60)
    h.trip()
    h.to_ramp()
    h.fail(3)  # re-trip during the ramp
    assert h.breaker.view().trips == 2
    h.to_ramp()
    h.clock.advance(60)
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.trips == 0 and v.total_trips == 2
    h.trip()
    assert h.breaker.probe_due_at() == h.clock.now() + 2.0  # back to the first interval


def test_capacity_failures_in_a_row_during_ramp_retrip() -> None:
    h = Harness()
    h.trip()
    h.to_ramp()
    h.fail(2)
    assert h.breaker.state is State.RAMP  # a moment of fullness is not a relapse
    h.fail(1)
    v = h.breaker.view()
    assert v.state is State.OPEN
    assert v.reason == "3 capacity failures in a row during ramp"
    assert h.changes[-1] == ("ramp", "open")


def test_a_retrip_lengthens_the_first_probe_interval_up_to_the_cooldown() -> None:
    h = Harness(probe_interval=2, cooldown=60, cooldown_multiplier=2)
    h.trip()
    firsts = []
    for _ in range(6):
        firsts.append(h.wait_for_probe())
        h.to_ramp()
        h.fail(3)
    assert firsts == [2, 4, 8, 16, 32, 60]
    assert h.breaker.view().trips == 7 and h.breaker.view().probe_interval == 60


def test_many_retrips_in_a_row_do_not_overflow() -> None:
    h = Harness(probe_interval=1, cooldown=50, cooldown_multiplier=10, failure_threshold=1)
    h.trip()
    for _ in range(400):  # 10 ** 400 is past a float
        h.to_ramp()
        h.fail(1)
    assert h.breaker.probe_due_at() == h.clock.now() + 50


def test_a_success_during_ramp_ends_the_failure_streak() -> None:
    h = Harness(ramp_duration=1e6)
    h.trip()
    h.to_ramp(basis=64)
    h.fail(2)
    h.succeed()
    assert h.breaker.state is State.RAMP and h.breaker.consecutive == 0
    h.fail()  # not the third in a row: it served since (and full now, the ramp is done)
    assert h.breaker.state is State.CLOSED


def test_a_success_sent_before_a_ramp_streak_does_not_end_it() -> None:
    h = Harness(ramp_duration=1e6)
    h.trip()
    h.to_ramp()
    early = h.sent()
    h.clock.advance(1)
    h.fail(2)
    h.record(early, S.SUCCESS)
    h.fail(1)
    assert h.breaker.state is State.OPEN


def test_echoes_transient_and_neutral_outcomes_during_ramp_are_ignored() -> None:
    h = Harness(ramp_start=0.25, ramp_duration=1e6)
    h.trip()
    h.to_ramp()
    h.fail(10, news=False)
    h.fail(10, signal=S.TRANSIENT)
    h.fail(10, signal=S.NEUTRAL)
    assert h.breaker.state is State.RAMP and h.breaker.share() == 0.25


def test_connection_failures_during_ramp_retrip() -> None:
    h = Harness(ramp_duration=1e6)
    h.trip()
    h.to_ramp()
    h.fail(3, signal=S.DOWN, news=False)
    assert h.breaker.state is State.OPEN


@pytest.mark.parametrize("cfg", [{"ramp_duration": 0}, {"ramp_start": 1.0}])
def test_a_ramp_with_nothing_to_do_closes_at_once(cfg: dict[str, float]) -> None:
    h = Harness(**cfg)
    h.trip()
    h.probe(S.SUCCESS)
    assert h.breaker.state is State.CLOSED
    assert h.changes[-2:] == [("half-open", "ramp"), ("ramp", "closed")]


# ------------------------------------------------------------------ stale outcomes


def test_late_successes_from_before_a_trip_neither_close_nor_probe() -> None:
    h = Harness()
    early = [h.sent() for _ in range(5)]
    h.trip()
    for sent in early:
        h.record(sent, S.SUCCESS)
    assert h.breaker.state is State.OPEN
    h.wait_for_probe()
    assert h.breaker.begin_probe() is not None
    for sent in early:
        h.record(sent, S.SUCCESS, probe=True)  # even one claiming to be a probe: wrong generation
        h.record(sent, S.CAPACITY, hint=9999)
    assert h.breaker.state is State.HALF_OPEN


def test_a_failure_arriving_after_the_ramp_completed_is_stale() -> None:
    h = Harness(ramp_duration=60)
    h.trip()
    h.to_ramp()
    during = h.sent()
    h.clock.advance(61)
    h.record(during, S.CAPACITY)
    v = h.breaker.view()
    assert v.state is State.CLOSED and v.consecutive_failures == 0


def test_a_failure_from_before_a_reset_is_stale() -> None:
    h = Harness(failure_threshold=1)
    before = h.sent()
    h.breaker.reset()
    h.record(before, S.CAPACITY)
    assert h.breaker.state is State.CLOSED


def test_a_probe_outcome_after_a_manual_action_is_stale() -> None:
    h = Harness()
    h.trip()
    h.wait_for_probe()
    gen = h.breaker.begin_probe()
    assert gen is not None
    h.breaker.trip("maintenance")
    h.record((gen, h.clock.now()), S.SUCCESS, probe=True)
    assert h.breaker.state is State.FORCED_OPEN
    h.breaker.reset()
    h.record((gen, h.clock.now()), S.CAPACITY, probe=True)
    assert h.breaker.state is State.CLOSED and h.breaker.view().consecutive_failures == 0


def test_every_state_change_starts_a_new_generation() -> None:
    h = Harness(ramp_duration=60)
    h.trip()
    h.probe(S.CAPACITY)
    h.to_ramp()
    h.clock.advance(60)
    assert h.breaker.state is State.CLOSED
    h.breaker.trip()
    h.breaker.force_close()
    h.breaker.reset()
    assert h.breaker.generation == len(h.changes) == 9


# ------------------------------------------------------------------ by hand


def test_forced_open_admits_nothing_until_reset() -> None:
    h = Harness()
    b = h.breaker
    b.trip("maintenance")
    v = b.view()
    assert v.state is State.FORCED_OPEN and v.manual and v.reason == "maintenance"
    h.clock.advance(1e6)
    assert b.share() == 0.0 and b.probe_due_at() is None and b.begin_probe() is None
    h.succeed(10)
    assert b.state is State.FORCED_OPEN
    b.reset()
    assert b.state is State.CLOSED and not b.view().manual and b.share() == 1.0


def test_tripping_an_open_breaker_by_hand_stops_its_probes() -> None:
    h = Harness()
    h.trip()
    h.breaker.trip()
    h.clock.advance(1e6)
    assert h.breaker.probe_due_at() is None and h.breaker.begin_probe() is None


def test_forced_closed_admits_everything_and_never_trips() -> None:
    h = Harness()
    b = h.breaker
    h.trip()
    b.force_close()
    assert b.view().manual and b.share() == 1.0
    h.fail(100, hint=9999)
    h.fail(100, signal=S.DOWN)
    h.fail(100, signal=S.TRANSIENT)
    assert b.state is State.FORCED_CLOSED
    assert b.view().consecutive_failures == 0
    h.clock.advance(1e6)
    assert b.state is State.FORCED_CLOSED and b.probe_due_at() is None


def test_reset_clears_counters_and_the_interval_growth() -> None:
    h = Harness()
    h.trip()
    h.probe(S.CAPACITY)
    h.to_ramp()
    h.fail(3)
    v = h.breaker.view()
    assert v.trips == 2 and v.probe_interval == 4.0
    h.breaker.reset()
    v = h.breaker.view()
    assert (v.state, v.consecutive_failures, v.trips, v.next_probe_at, v.probes_failed, v.reason) == (
        State.CLOSED,
        0,
        0,
        None,
        0,
        "reset by hand",
    )
    assert v.total_trips == 2  # history is kept for the dashboard
    h.trip()
    assert h.breaker.probe_due_at() == h.clock.now() + 2.0


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
    h.trip()
    opened_at = h.clock.now()
    h.probe(S.CAPACITY)
    h.to_ramp()
    h.clock.advance(60)
    assert h.breaker.state is State.CLOSED
    assert h.changes == [
        ("closed", "open"),
        ("open", "half-open"),
        ("half-open", "open"),
        ("open", "half-open"),
        ("half-open", "ramp"),
        ("ramp", "closed"),
    ]
    changed = [e for e in h.events if isinstance(e, BreakerChanged)]
    first = changed[0]
    assert first.target == "m@sim/demo" and first.model == "m" and not first.manual
    assert first.at == opened_at and first.wall == h.clock.wall() - (h.clock.now() - opened_at)
    # cooldown_until is the next probe on every move to open, and only there
    assert first.cooldown_until == opened_at + 2.0
    assert changed[2].cooldown_until == changed[2].at + 4.0
    assert [e.cooldown_until is None for e in changed] == [e.new != "open" for e in changed]
    for prev, nxt in itertools.pairwise(changed):  # each event starts where the previous one ended
        assert prev.new == nxt.old


def test_a_ramp_step_publishes_its_share() -> None:
    h = Harness(ramp_start=0.25, ramp_duration=1e6)
    h.trip()
    h.to_ramp(basis=8)
    h.clock.advance(3)
    h.succeed(2)
    step = h.events[-1]
    assert isinstance(step, RampStep)
    assert (step.target, step.model, step.share, step.at, step.wall) == (
        "m@sim/demo",
        "m",
        0.5,
        h.clock.now(),
        h.clock.wall(),
    )
    assert "clean round" in step.reason


def test_works_with_the_event_bus_and_a_broken_subscriber() -> None:
    bus = EventBus()
    seen: list[Event] = []

    def broken(_: Event) -> None:
        raise RuntimeError("boom")

    bus.subscribe(broken)
    bus.subscribe(seen.append)
    clock = ManualClock()
    b = CircuitBreaker("t", "m", BreakerConfig(failure_threshold=1), clock, bus.publish)
    b.record(b.generation, S.CAPACITY, sent_at=clock.now())
    assert b.state is State.OPEN
    assert [type(e) for e in seen] == [BreakerChanged]


def test_a_raising_publish_callable_does_not_break_the_breaker() -> None:
    def publish(_: Event) -> None:
        raise RuntimeError("boom")

    clock = ManualClock()
    cfg = BreakerConfig(failure_threshold=1, ramp_start=0.25, ramp_duration=1e6)
    b = CircuitBreaker("t", "m", cfg, clock, publish)
    b.record(b.generation, S.CAPACITY, sent_at=clock.now())
    assert b.state is State.OPEN
    clock.advance(2)
    gen = b.begin_probe()
    assert gen is not None
    b.record(gen, S.SUCCESS, sent_at=clock.now(), probe=True, basis=8)
    assert b.state is State.RAMP
    for _ in range(2):  # a ramp step publishes too
        b.record(b.generation, S.SUCCESS, sent_at=clock.now())
    assert b.share() == 0.75


# ------------------------------------------------------------------ fast-forwarded loop time


@pytest.mark.looptime
async def test_an_outage_is_found_over_within_one_probe_interval() -> None:
    """A model down for 100 s: the interval doubles from 2 s up to the 60 s cooldown (each
    probe takes 0.5 s), and the first probe after the model came back finds it."""
    started = time.perf_counter()
    events: list[Event] = []
    clock = LoopClock()
    b = CircuitBreaker("m@sim/demo", "m", BreakerConfig(), clock, events.append)
    t0 = clock.now()
    for _ in range(3):
        b.record(b.generation, S.CAPACITY, sent_at=clock.now())
    assert b.state is State.OPEN
    probes = []
    while b.state is State.OPEN:
        due = b.probe_due_at()
        assert due is not None
        await asyncio.sleep(due - clock.now())
        gen = b.begin_probe()
        assert gen is not None
        probes.append(round(clock.now() - t0, 3))
        await asyncio.sleep(0.5)  # the probe's round trip
        up = clock.now() - t0 >= 100
        b.record(gen, S.SUCCESS if up else S.CAPACITY, sent_at=clock.now(), probe=True, basis=8)
    assert probes == [2.0, 6.5, 15.0, 31.5, 64.0, 124.5]
    assert probes[-1] - 100 < 60.5
    assert b.state is State.RAMP
    assert time.perf_counter() - started < 10.0  # fast-forwarded: minutes of loop time, not of ours


@pytest.mark.looptime
async def test_steady_traffic_ramps_up_in_round_trips_an_idle_ramp_in_ramp_duration() -> None:
    started = time.perf_counter()
    clock = LoopClock()
    b = CircuitBreaker("m", "m", BreakerConfig(failure_threshold=1, ramp_start=0.25, ramp_duration=60), clock)

    async def recover() -> float:
        b.record(b.generation, S.CAPACITY, sent_at=clock.now())
        await asyncio.sleep(b.probe_due_at() - clock.now())  # type: ignore[operator]
        gen = b.begin_probe()
        assert gen is not None
        b.record(gen, S.SUCCESS, sent_at=clock.now(), probe=True, basis=8)
        assert b.state is State.RAMP
        return clock.now()

    # Steady traffic: every round trip (0.5 s) all of the ramp's slots succeed.
    ramp_from = await recover()
    shares = []
    while b.state is State.RAMP:
        share = b.share()
        shares.append(share)
        slots = math.ceil(share * 8)
        sent = [(b.generation, clock.now()) for _ in range(slots)]
        await asyncio.sleep(0.5)
        for gen, at in sent:
            b.record(gen, S.SUCCESS, sent_at=at, basis=8)
    assert shares[:2] == [0.25, 0.75] and len(shares) <= 3
    assert clock.now() - ramp_from == pytest.approx(0.5 * len(shares))

    # No traffic: the ceiling closes it.
    ramp_from = await recover()
    while b.state is State.RAMP:
        await asyncio.sleep(1)
    assert clock.now() - ramp_from == pytest.approx(60, abs=1.01)
    assert time.perf_counter() - started < 10.0  # fast-forwarded: minutes of loop time, not of ours


# ------------------------------------------------------------------ survivals


def test_survivals_add_a_slot_each_while_the_ramp_is_fewer_than_ramp_lead_ahead() -> None:
    # A ramp at 12 of 24 whose 12 requests went out together: a survival adds a slot only
    # while fewer than ramp_lead of its requests are young (out, not yet survived) and fewer
    # than ramp_lead of its slots unused, so the ramp runs that far ahead of what the model
    # showed, however many requests wait.
    h = Harness(ramp_start=0.5, ramp_duration=1e6, ramp_lead=4)
    h.trip()
    h.to_ramp(basis=24)
    b = h.breaker
    gen = b.generation
    assert all(b.ramp_admitted(gen) for _ in range(12)) and not b.ramp_admitted(gen - 1)
    grew = [b.survived(gen, free=0) for _ in range(12)]
    assert grew == [False] * 8 + [True] * 4 and b.share() == pytest.approx(16 / 24)
    assert all(b.ramp_admitted(gen) for _ in range(4))  # the four new slots' requests
    assert not b.survived(gen, free=4)  # four slots unused (say, the waiting work went elsewhere)
    assert [b.survived(gen, free=0) for _ in range(3)] == [True] * 3 and b.share() == pytest.approx(19 / 24)
    # One answered before it survived is young no more; one refused, after the model showed
    # it serves again, says it is at its room: the ramp is done (the limiter's cut is the limit).
    assert b.ramp_admitted(gen) and b.ramp_admitted(gen)
    b.record(gen, S.SUCCESS, sent_at=h.clock.now(), young=True)
    assert b.share() == pytest.approx(21 / 24)  # two slots by the answer
    b.record(gen, S.CAPACITY, sent_at=h.clock.now(), young=True)
    assert b.state is State.CLOSED and not b.survived(gen, free=0)
    # A ramp whose model showed nothing yet, refused: no growth by survivals after it.
    h = Harness(ramp_start=0.5, ramp_duration=1e6, ramp_lead=4)
    h.trip()
    h.to_ramp(basis=24)
    b = h.breaker
    gen = b.generation
    assert b.ramp_admitted(gen)
    h.fail()
    assert b.state is State.RAMP and not b.survived(gen, free=0) and b.share() == 0.5


def test_survivals_close_the_ramp_once_its_share_is_whole_and_count_nowhere_else() -> None:
    h = Harness(ramp_start=0.5, ramp_duration=1e6, ramp_lead=8)
    h.trip()
    assert not h.breaker.ramp_admitted(h.breaker.generation)  # open: no ramp to count in
    assert not h.breaker.survived(h.breaker.generation, free=0)
    h.to_ramp(basis=8)
    b = h.breaker
    gen = b.generation
    assert not b.survived(gen - 1, free=0)  # admitted before the ramp: stale
    for _ in range(4):
        assert b.survived(gen, free=0)
    assert b.state is State.CLOSED and b.view().reason == "ramp complete"
    assert not b.survived(gen, free=0) and not b.survived(b.generation, free=0)  # closed
    assert h.changes[-1] == ("ramp", "closed")


def test_a_probe_that_survived_starts_the_ramp_before_its_answer() -> None:
    h = Harness(ramp_start=0.5, ramp_duration=1e6)
    h.trip()
    h.wait_for_probe()
    b = h.breaker
    assert not b.probe_survived(b.generation, basis=8, floor=1)  # open: no probe out
    gen = b.begin_probe()
    assert gen is not None
    assert not b.probe_survived(gen - 1, basis=8, floor=1)  # not this probe
    assert b.probe_survived(gen, basis=8, floor=1)
    assert b.state is State.RAMP and b.share() == 0.5
    assert b.view().reason == "1 probe(s) admitted (still out past the time a refusal takes)"
    h.record((gen, h.clock.now()), S.CAPACITY, probe=True)  # its answer, late: stale
    assert b.state is State.RAMP and not b.probe_survived(gen, basis=8, floor=1)


def test_with_two_probes_needed_a_survival_is_one_of_them() -> None:
    h = Harness(half_open_probes=2)
    h.trip()
    h.wait_for_probe()
    b = h.breaker
    gen = b.begin_probe()
    assert gen is not None and b.probe_survived(gen, basis=8, floor=1)
    assert b.state is State.OPEN and b.view().reason == "probe succeeded; another is needed"
    h.probe(basis=8)
    assert b.state is State.RAMP
