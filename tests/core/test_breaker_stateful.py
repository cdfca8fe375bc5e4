"""Random sequences against the breaker and the limiter, checking invariants.

The default run is kept short; ``pytest -m slow`` runs the long variants.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from capmon.core.breaker import Admission, CircuitBreaker, State
from capmon.core.clock import ManualClock
from capmon.core.config import BreakerConfig, LimiterConfig
from capmon.core.events import BreakerChanged
from capmon.core.limiter import AdaptiveLimiter, Budget, TokenBucket

FAST = settings(max_examples=100, stateful_step_count=40, deadline=None)
SLOW = settings(max_examples=1000, stateful_step_count=100, deadline=None)  # ~30 s each

hints = st.none() | st.floats(0, 5000, allow_nan=False) | st.sampled_from([-1.0, math.nan, math.inf])
# which outstanding admission ends next, counted from the newest: mostly recent
# ones (so a half-open probe gets its outcome), sometimes stale ones
picks = st.integers(0, 3) | st.integers(0, 10**6)
outcomes = st.sampled_from(["ok", "capacity", "transient", "release"])
dts = st.sampled_from([0.0, 0.1, 1.0, 5.0, 30.0, 61.0, 300.0, 2000.0]) | st.floats(0, 4000)


class BreakerMachine(RuleBasedStateMachine):
    @initialize(
        threshold=st.integers(1, 4),
        probes=st.integers(1, 3),
        cooldown=st.sampled_from([0.0, 5.0, 30.0, 300.0]),
        multiplier=st.sampled_from([1.0, 2.0, 3.0]),
        cooldown_max=st.sampled_from([10.0, 60.0, 1800.0]),
        ratio=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
        ratio_min=st.integers(1, 8),
        ramp_start=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
        ramp_duration=st.sampled_from([0.0, 10.0, 60.0]),
        seed=st.integers(0, 2**32 - 1),
    )
    def setup(self, threshold: int, probes: int, cooldown: float, multiplier: float, cooldown_max: float,
              ratio: float, ratio_min: int, ramp_start: float, ramp_duration: float, seed: int) -> None:
        self.cfg = BreakerConfig(
            failure_threshold=threshold, half_open_probes=probes, cooldown=cooldown,
            cooldown_multiplier=multiplier, cooldown_max=cooldown_max, failure_ratio=ratio,
            ratio_min_requests=ratio_min, ramp_start=ramp_start, ramp_duration=ramp_duration,
        )
        self.clock = ManualClock()
        self.events: list[BreakerChanged] = []
        self.b = CircuitBreaker("t", "m", self.cfg, self.clock, self.events.append, rng=random.Random(seed))
        self.outstanding: list[Admission] = []
        self.open_floor = -math.inf  # the tripping failure's hint: OPEN lasts at least until then
        self.largest_hint = 0.0

    # ------------------------------------------------------------ steps

    # Every step is one rule with an ``action`` rather than a rule each: hypothesis'
    # swarm testing turns whole rules off for a run, and a run without, say,
    # successes or time passing never leaves OPEN, so most runs would test nothing
    # past the first trip. Repeats in ``actions`` weight the draw; manual states
    # are sticky until a reset, so they are drawn rarely.
    @rule(
        action=st.sampled_from(
            ["attempt"] * 4 + ["finish"] * 3 + ["admit"] * 2 + ["probe"] * 4 + ["advance"] * 3 + ["by_hand"]
        ),
        n=st.integers(1, 4),
        i=picks,
        outcome=outcomes,
        hint=hints,
        dt=dts,
        manual=st.sampled_from(["trip", "force_close", "reset", "reset"] + [None] * 10),
    )
    def step(self, action: str, n: int, i: int, outcome: str, hint: float | None, dt: float,
             manual: str | None) -> None:
        if action == "admit":
            for _ in range(n):
                self._admit()
        elif action == "finish":
            if self.outstanding:
                self._finish(self.outstanding.pop(-1 - i % len(self.outstanding)), outcome, hint)
        elif action == "attempt":  # a whole attempt in one step: admitted, then ended at once
            adm = self._admit()
            if adm is not None:
                self._finish(self._take_back(adm), outcome, hint)
        elif action == "probe":
            # Recovery needs every probe to succeed, which random outcomes rarely
            # give: this makes HALF_OPEN -> RAMP -> CLOSED common enough to test.
            while self.b.state is State.HALF_OPEN:
                adm = self._admit()
                if adm is None:  # every probe slot is held by an unfinished probe
                    break
                assert adm.probe
                self._finish(self._take_back(adm), "ok", None)
        elif action == "advance":
            self.clock.advance(dt)
        elif manual is not None:
            self._by_hand(manual)

    def _admit(self) -> Admission | None:
        before = self.b.state
        would = self.b.would_admit()
        adm = self.b.admit()
        if before in (State.FORCED_OPEN, State.OPEN):
            assert adm is None
        if before in (State.FORCED_CLOSED, State.CLOSED):
            assert adm is not None
        if before is State.HALF_OPEN:
            assert (adm is not None) == would
        if adm is not None:
            assert would
            self.outstanding.append(adm)
        return adm

    def _take_back(self, adm: Admission) -> Admission:
        self.outstanding.remove(adm)
        return adm

    def _finish(self, adm: Admission, outcome: str, hint: float | None) -> None:
        before = self.b.state
        n = len(self.events)
        if outcome == "ok":
            self.b.on_success(adm)
        elif outcome == "release":
            self.b.release(adm)
        else:
            if hint is not None and math.isfinite(hint) and hint >= 0:
                self.largest_hint = max(self.largest_hint, hint)
            self.b.on_failure(adm, capacity=outcome == "capacity", hint=hint)
        after = self.b.state
        opened = any(e.new == State.OPEN.value for e in self.events[n:])
        if before.manual:
            assert after is before  # manual states ignore every outcome
        if outcome in ("ok", "release"):
            assert not opened
        if outcome == "transient" and before is not State.HALF_OPEN:
            assert not opened  # transient errors trip nothing outside half-open
        if opened:
            self._check_trip(n, hint)

    def _check_trip(self, n_events: int, hint: float | None) -> None:
        """The outcome just reported tripped the breaker: check its cool-down."""
        e = [e for e in self.events[n_events:] if e.new == State.OPEN.value][-1]
        assert e.cooldown_until is not None
        cfg = self.cfg
        assert e.cooldown_until >= e.at + min(cfg.cooldown, cfg.cooldown_max)
        assert e.cooldown_until <= e.at + max(cfg.cooldown_max, self.largest_hint) + 1e-9
        self.open_floor = -math.inf  # a new trip: the previous floor no longer applies
        if hint is not None and math.isfinite(hint) and hint >= 0:
            assert e.cooldown_until >= e.at + hint
            self.open_floor = e.at + hint

    def _by_hand(self, action: str) -> None:
        if action == "trip":
            self.b.trip()
            assert self.b.state is State.FORCED_OPEN and self.b.view().manual
            assert self.b.admit() is None
        elif action == "force_close":
            self.b.force_close()
            assert self.b.state is State.FORCED_CLOSED and self.b.view().manual
            assert self.b.admit() is not None
        else:
            self.b.reset()
            v = self.b.view()
            assert v.state is State.CLOSED and v.consecutive_failures == 0 and v.trips == 0 and not v.manual

    # ------------------------------------------------------------ invariants

    @invariant()
    def view_is_consistent(self) -> None:
        v = self.b.view()
        now = self.clock.now()
        assert 0 <= v.probes_in_flight <= self.cfg.half_open_probes
        assert v.manual == (v.state in (State.FORCED_OPEN, State.FORCED_CLOSED))
        if v.state is State.OPEN:
            assert v.cooldown_until is not None and v.cooldown_until > now
            assert v.cooldown_until >= self.open_floor
        else:
            assert v.cooldown_until is None
        if v.state is State.CLOSED:
            assert 0 <= v.consecutive_failures < self.cfg.failure_threshold
        if v.state is State.RAMP:
            assert v.ramp_share is not None and self.cfg.ramp_start <= v.ramp_share < 1.0
        else:
            assert v.ramp_share is None
        if v.state is State.FORCED_OPEN:
            assert not self.b.would_admit()
        if v.state is State.FORCED_CLOSED:
            assert self.b.would_admit()

    @invariant()
    def events_form_a_chain(self) -> None:
        current = self.b.state.value  # first: reading it may apply a due move
        state = State.CLOSED.value
        for e in self.events:
            assert e.old == state
            assert e.new != e.old or e.manual
            state = e.new
        assert state == current


class LimiterMachine(RuleBasedStateMachine):
    """The limiter, a token bucket and a retry budget under random use."""

    @initialize(
        lo=st.integers(1, 4),
        span=st.integers(0, 20),
        initial=st.integers(1, 30),
        decrease=st.sampled_from([0.01, 0.3, 0.5, 0.9, 0.99]),
        max_limit=st.none() | st.integers(0, 10),
        ratio=st.sampled_from([0.0, 0.1, 0.5, 2.0]),
        min_tokens=st.sampled_from([0.0, 1.0, 10.0]),
    )
    def setup(self, lo: int, span: int, initial: int, decrease: float, max_limit: int | None,
              ratio: float, min_tokens: float) -> None:
        cfg = LimiterConfig(initial=min(max(initial, lo), lo + span), min=lo, max=lo + span, decrease=decrease)
        self.clock = ManualClock()
        self.lim = AdaptiveLimiter(cfg, self.clock, max_limit)
        self.decrease = decrease
        self.bucket = TokenBucket(600, self.clock, burst=100)
        self.budget = Budget(ratio, min_tokens=min_tokens)

    # Acquire and release are one rule (see BreakerMachine.step for why).
    @rule(
        action=st.sampled_from(["acquire", "acquire", "release", "release", "release_all"]),
        outcome=st.sampled_from(["ok", "ok", "overload", "neutral"]),
    )
    def traffic(self, action: str, outcome: str) -> None:
        if action == "acquire":
            expected = self.lim.in_flight < int(self.lim.limit)
            before = self.lim.in_flight
            assert self.lim.try_acquire() == expected
            assert self.lim.in_flight == before + expected
        elif self.lim.in_flight == 0:
            with pytest.raises(RuntimeError):
                self.lim.release("ok")
        else:
            for _ in range(self.lim.in_flight if action == "release_all" else 1):
                self._release(outcome)

    def _release(self, outcome: str) -> None:
        before = self.lim.limit
        in_flight = self.lim.in_flight
        self.lim.release(outcome)
        after = self.lim.limit
        assert self.lim.in_flight == in_flight - 1
        if outcome == "ok":
            assert after >= before
        elif outcome == "neutral":
            assert after == before
        else:
            assert after == before or after == pytest.approx(max(self.lim.min, before * self.decrease))

    @rule(amount=st.floats(0, 300))
    def take(self, amount: float) -> None:
        at = self.bucket.available_at(amount)
        assert at >= self.clock.now()
        if at == self.clock.now():
            assert self.bucket.try_take(amount)
        else:
            assert not self.bucket.try_take(amount)
            self.clock.advance(at - self.clock.now())
            assert self.bucket.try_take(amount)

    @rule(amount=st.floats(0, 300))
    def refund(self, amount: float) -> None:
        self.bucket.refund(amount)

    @rule(dt=st.floats(0, 100))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def first_attempt(self) -> None:
        self.budget.on_request()

    @rule()
    def retry(self) -> None:
        self.budget.try_spend()

    @invariant()
    def bounds(self) -> None:
        assert self.lim.min <= self.lim.limit <= self.lim.max
        assert self.lim.in_flight >= 0 and self.lim.waiting == 0
        assert self.bucket.available <= self.bucket.capacity
        b = self.budget
        assert 0 <= b.balance <= b.max_tokens
        assert b.retries <= b.min_tokens + b.ratio * b.requests + 1e-6


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = FAST
TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = FAST


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_breaker_machine_long() -> None:
    run_state_machine_as_test(BreakerMachine, settings=SLOW)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_limiter_machine_long() -> None:
    run_state_machine_as_test(LimiterMachine, settings=SLOW)
