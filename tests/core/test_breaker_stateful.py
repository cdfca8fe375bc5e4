"""Random sequences against the breaker and the limiter, checking invariants.

The default runs are short and derandomized (the same examples every run, so they
never flake); ``pytest -m slow`` runs long, random variants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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

from capmon.core.control.breaker import CircuitBreaker, State
from capmon.core.control.limiter import AdaptiveLimiter, Budget, Slot, TokenBucket
from capmon.core.control.policy import BreakerSignal, LimiterSignal
from capmon.core.types.config import BreakerConfig, LimiterConfig
from capmon.core.types.events import BreakerChanged, Event, RampStep
from tests.core.test_limiter import is_news
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.unit

FAST = settings(max_examples=100, stateful_step_count=40, deadline=None, derandomize=True)
SLOW = settings(max_examples=1000, stateful_step_count=100, deadline=None, derandomize=False)

hints = st.none() | st.floats(0, 5000, allow_nan=False) | st.sampled_from([-1.0, math.nan, math.inf])
# which outstanding attempt ends next, counted from the newest: mostly recent ones,
# sometimes old (stale) ones
picks = st.integers(0, 3) | st.integers(0, 10**6)
outcomes = st.sampled_from(["ok", "ok", "capacity", "capacity", "echo", "down", "transient", "neutral"])
dts = st.sampled_from([0.0, 0.1, 1.0, 2.0, 5.0, 30.0, 61.0, 300.0, 2000.0]) | st.floats(0, 4000)

SIGNALS = {
    "ok": (BreakerSignal.SUCCESS, True),
    "capacity": (BreakerSignal.CAPACITY, True),
    "echo": (BreakerSignal.CAPACITY, False),  # the limiter took it as an echo of its own cut
    "down": (BreakerSignal.DOWN, False),
    "transient": (BreakerSignal.TRANSIENT, True),
    "neutral": (BreakerSignal.NEUTRAL, True),
}


def clean(hint: float | None) -> float | None:
    return hint if hint is not None and math.isfinite(hint) and hint >= 0 else None


@dataclass(frozen=True)
class Sent:
    generation: int
    at: float
    probe: bool


class BreakerMachine(RuleBasedStateMachine):
    """The breaker with a model of the state seam around it: user attempts are admitted
    only while its share allows (a RAMP admits ceil(share * basis) at once), probes only
    through begin_probe()."""

    @initialize(
        threshold=st.integers(1, 4),
        probes=st.integers(1, 3),
        probe_interval=st.sampled_from([0.0, 1.0, 2.0, 10.0]),
        cooldown=st.sampled_from([0.0, 5.0, 30.0, 300.0]),
        multiplier=st.sampled_from([1.0, 2.0, 3.0]),
        cooldown_max=st.sampled_from([0.0, 10.0, 60.0, 1800.0]),
        ratio=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
        ratio_min=st.integers(1, 8),
        ramp_start=st.sampled_from([0.1, 0.25, 0.25, 0.5, 0.0, 1.0]),
        ramp_duration=st.sampled_from([1e6, 60.0, 1e6, 0.0]),
        basis=st.integers(1, 16),
    )
    def setup(
        self,
        threshold: int,
        probes: int,
        probe_interval: float,
        cooldown: float,
        multiplier: float,
        cooldown_max: float,
        ratio: float,
        ratio_min: int,
        ramp_start: float,
        ramp_duration: float,
        basis: int,
    ) -> None:
        self.cfg = BreakerConfig(
            failure_threshold=threshold,
            half_open_probes=probes,
            probe_interval=probe_interval,
            cooldown=cooldown,
            cooldown_multiplier=multiplier,
            cooldown_max=cooldown_max,
            failure_ratio=ratio,
            ratio_min_requests=ratio_min,
            ramp_start=ramp_start,
            ramp_duration=ramp_duration,
        )
        self.basis = basis
        self.clock = ManualClock()
        self.events: list[Event] = []
        self.b = CircuitBreaker("t", "m", self.cfg, self.clock, self.events.append)
        self.outstanding: list[Sent] = []
        self.floor: tuple[int, float] = (-1, -math.inf)  # (generation, time): no probe before it while OPEN
        self.generation = 0
        self.ramp: tuple[int, float] = (-1, 0.0)  # (generation, share) last seen in a ramp
        self.largest_hint = 0.0

    @property
    def changes(self) -> list[BreakerChanged]:
        return [e for e in self.events if isinstance(e, BreakerChanged)]

    # ------------------------------------------------------------ steps

    # Every step is one rule with an ``action`` rather than a rule each: hypothesis'
    # swarm testing turns whole rules off for a run, and a run without, say,
    # successes or time passing never leaves OPEN, so most runs would test nothing
    # past the first trip. Repeats weight the draw; manual states are sticky until
    # a reset, so they are drawn rarely.
    @rule(
        action=st.sampled_from(
            ["attempt"] * 4
            + ["finish"] * 3
            + ["admit"] * 2
            + ["probe"] * 4
            + ["hold_probe"]
            + ["round"] * 3
            + ["recover"] * 2
            + ["advance"] * 3
            + ["by_hand"]
        ),
        n=st.integers(1, 4),
        i=picks,
        outcome=outcomes,
        hint=hints,
        dt=dts,
        manual=st.sampled_from(["trip", "force_close", "reset", "reset"]),
    )
    def step(self, action: str, n: int, i: int, outcome: str, hint: float | None, dt: float, manual: str) -> None:
        if action == "admit":
            for _ in range(n):
                self._admit()
        elif action == "finish":
            if self.outstanding:
                self._finish(self.outstanding.pop(-1 - i % len(self.outstanding)), outcome, hint)
        elif action == "attempt":  # a whole attempt in one step: admitted, then ended at once
            sent = self._admit()
            if sent is not None:
                self._finish(self._take_back(sent), outcome, hint)
        elif action in ("probe", "hold_probe"):
            sent = self._begin_probe()
            if sent is not None and action == "probe":
                # Recovery needs probes to succeed, which random outcomes rarely give.
                self._finish(self._take_back(sent), outcome if i % 4 == 0 else "ok", hint)
                if self.b.state is State.RAMP:
                    self._round(n % 3, outcome, hint)
        elif action == "round":
            self._round(i, outcome, hint)
        elif action == "recover":
            # Probe until the ramp starts, then n rounds: clean but one, which has a failure
            # (or fails throughout: a model still down trips again).
            for _ in range(self.cfg.half_open_probes):
                sent = self._begin_probe()
                if sent is None:
                    break
                self._finish(self._take_back(sent), "ok", None)
            relapse = outcome in ("capacity", "down") and i % 2 == 0
            for k in range(n):
                if self.b.state is not State.RAMP:
                    break
                bad = k == i % 4
                self._round(0 if bad else self.basis, outcome, hint, every=relapse)
        elif action == "advance":
            self.clock.advance(dt)
        else:
            self._by_hand(manual)

    def _round(self, i: int, outcome: str, hint: float | None, every: bool = False) -> None:
        """Fill the free slots, then end them all: successes but the i-th (a clean round
        when i is past the end), or all with ``outcome``."""
        sent = [s for s in (self._admit() for _ in range(self.basis)) if s is not None]
        for k, s in enumerate(sent):
            self._finish(self._take_back(s), outcome if every or k == i else "ok", hint)

    def _slots(self) -> int:
        share = self.b.share()
        if share <= 0.0:
            return 0
        return self.basis if share >= 1.0 else max(1, math.ceil(share * self.basis))

    def _admit(self) -> Sent | None:
        state = self.b.state
        slots = self._slots()
        if state in (State.OPEN, State.HALF_OPEN, State.FORCED_OPEN):
            assert slots == 0, f"{state} admits {slots}"
        if sum(1 for s in self.outstanding if not s.probe) >= slots:
            return None
        sent = Sent(self.b.generation, self.clock.now(), False)
        self.outstanding.append(sent)
        return sent

    def _begin_probe(self) -> Sent | None:
        due = self.b.probe_due_at()
        if due is None:
            assert self.b.begin_probe() is None  # not open: nothing to probe
            return None
        if due > self.clock.now():
            assert self.b.begin_probe() is None  # too early
            self.clock.advance(due - self.clock.now())
        gen = self.b.begin_probe()
        assert gen is not None and gen == self.b.generation and self.b.state is State.HALF_OPEN
        assert self.b.begin_probe() is None  # one at a time
        sent = Sent(gen, self.clock.now(), True)
        self.outstanding.append(sent)
        return sent

    def _take_back(self, sent: Sent) -> Sent:
        self.outstanding.remove(sent)
        return sent

    def _finish(self, sent: Sent, outcome: str, hint: float | None) -> None:
        signal, news = SIGNALS[outcome]
        before = self.b.view()  # applies any move time made due
        gen = self.b.generation
        n = len(self.events)
        h = clean(hint)
        if h is not None:
            self.largest_hint = max(self.largest_hint, h)
        self.b.record(
            sent.generation, signal, sent_at=sent.at, hint=hint, news=news, probe=sent.probe, basis=self.basis
        )
        after = self.b.view()
        new = self.events[n:]
        if sent.generation != gen or before.state.manual:
            assert not new and self.b.generation == gen and after == before  # stale or manual: ignored
            return
        opened = [e for e in new if isinstance(e, BreakerChanged) and e.new == State.OPEN.value]
        if sent.probe:
            assert before.state is State.HALF_OPEN
            assert after.state is not State.HALF_OPEN  # a probe's outcome always ends the probing
            assert before.probe_interval is not None
            if signal is BreakerSignal.SUCCESS:
                assert after.state in (State.OPEN, State.RAMP, State.CLOSED)
                assert after.probes_failed == (before.probes_failed if after.state is State.OPEN else 0)
            else:
                assert after.state is State.OPEN
                grown = min(self.cfg.cooldown, max(before.probe_interval, 1e-3) * self.cfg.cooldown_multiplier)
                failed = signal is not BreakerSignal.NEUTRAL
                assert after.probe_interval == (grown if failed else before.probe_interval)
                assert after.probes_failed == before.probes_failed + failed
        else:
            assert before.state in (State.CLOSED, State.RAMP)
            if signal in (BreakerSignal.SUCCESS, BreakerSignal.TRANSIENT, BreakerSignal.NEUTRAL) or not (
                news or signal is BreakerSignal.DOWN
            ):
                assert not opened, f"{outcome} opened the breaker"
            if opened:
                assert after.trips == before.trips + 1 and after.total_trips == before.total_trips + 1
        if opened:
            e = opened[-1]
            v = self.b.view()
            assert e.cooldown_until is not None and v.next_probe_at == e.cooldown_until
            assert v.probe_interval is not None
            wait = e.cooldown_until - e.at
            assert wait >= v.probe_interval - 1e-9
            assert wait <= max(v.probe_interval, self.cfg.cooldown_max) + 1e-9  # a hint is capped
            floor = e.at + min(h, self.cfg.cooldown_max) if h is not None else -math.inf
            assert e.cooldown_until >= floor - 1e-9  # never sooner than the hint
            self.floor = (self.b.generation, floor)

    def _by_hand(self, action: str) -> None:
        if action == "trip":
            self.b.trip()
            assert self.b.state is State.FORCED_OPEN and self.b.view().manual
        elif action == "force_close":
            self.b.force_close()
            assert self.b.state is State.FORCED_CLOSED and self.b.view().manual
        else:
            self.b.reset()
            v = self.b.view()
            assert v.state is State.CLOSED and v.consecutive_failures == 0 and v.trips == 0 and not v.manual

    # ------------------------------------------------------------ invariants

    @invariant()
    def view_is_consistent(self) -> None:
        v = self.b.view()
        cfg = self.cfg
        assert v.manual == (v.state in (State.FORCED_OPEN, State.FORCED_CLOSED))
        assert (v.state is State.OPEN) == (v.next_probe_at is not None) == (self.b.probe_due_at() is not None)
        if v.state is State.OPEN:
            assert v.next_probe_at is not None
            floor_gen, floor = self.floor
            if floor_gen == self.b.generation:
                assert v.next_probe_at >= floor - 1e-9
        if v.state in (State.OPEN, State.HALF_OPEN):
            assert v.probe_interval is not None and 0.0 <= v.probe_interval <= cfg.cooldown
        else:
            assert v.probe_interval is None
        if v.state is State.CLOSED:
            assert 0 <= v.consecutive_failures < cfg.failure_threshold
        share = self.b.share()
        if v.state is State.RAMP:
            assert v.ramp_share is not None and cfg.ramp_start <= v.ramp_share < 1.0 and share == v.ramp_share
            gen, last = self.ramp
            if gen == self.b.generation:
                assert v.ramp_share >= last  # a ramp's share never shrinks
            self.ramp = (self.b.generation, v.ramp_share)
        else:
            assert v.ramp_share is None
            assert share == (1.0 if v.state in (State.CLOSED, State.FORCED_CLOSED) else 0.0)
        probes = [s for s in self.outstanding if s.probe and s.generation == self.b.generation]
        assert len(probes) == (1 if v.state is State.HALF_OPEN else 0)  # exactly the one probe while probing
        if v.state is State.HALF_OPEN:
            assert self.b.begin_probe() is None
        assert 0 <= v.trips <= v.total_trips
        assert v.probes_failed >= 0

    @invariant()
    def generations_count_the_changes(self) -> None:
        self.b.state  # noqa: B018 - reading it applies a due move first
        assert self.b.generation >= self.generation
        self.generation = self.b.generation
        assert self.b.generation == len(self.changes)

    @invariant()
    def events_form_a_chain(self) -> None:
        current = self.b.state.value  # first: reading it may apply a due move
        state = State.CLOSED.value
        for e in self.changes:
            assert e.old == state
            assert e.new != e.old or e.manual
            state = e.new
        assert state == current
        for step in self.events:
            if isinstance(step, RampStep):
                assert self.cfg.ramp_start < step.share < 1.0


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
    def setup(
        self, lo: int, span: int, initial: int, decrease: float, max_limit: int | None, ratio: float, min_tokens: float
    ) -> None:
        cfg = LimiterConfig(initial=min(max(initial, lo), lo + span), min=lo, max=lo + span, decrease=decrease)
        self.clock = ManualClock()
        self.lim = AdaptiveLimiter(cfg, max_limit)
        self.outstanding: list[Slot] = []
        self.saved: tuple[float, int | None] | None = None
        self.bucket = TokenBucket(600, self.clock, burst=100)
        self.budget = Budget(ratio, min_tokens=min_tokens)

    # Take and release are one rule (see BreakerMachine.step for why).
    @rule(
        action=st.sampled_from(["take", "take", "take", "release", "release", "release_all", "checkpoint", "restore"]),
        i=picks,
        outcome=st.sampled_from(["ok", "ok", "overload", "neutral"]),
        cap=st.none() | st.floats(0, 40),
    )
    def traffic(self, action: str, i: int, outcome: str, cap: float | None) -> None:
        lim = self.lim
        if action == "take":
            room = lim.room(cap)
            assert 0 <= room <= lim.room()
            if room:
                slot = lim.take()
                assert slot.position == lim.in_flight and is_news(lim, slot)
                self.outstanding.append(slot)
            else:
                assert lim.in_flight >= min(int(lim.limit + 1e-9), int(cap + 1e-9) if cap is not None else 10**9)
        elif action == "checkpoint":
            lim.checkpoint()
            self.saved = (lim.limit, lim.capacity)
        elif action == "restore":
            lim.restore()
            if self.saved is not None:
                assert (lim.limit, lim.capacity) == self.saved
                assert not any(is_news(lim, s) for s in self.outstanding)  # whatever was in flight is an echo
            self.saved = None
        elif not self.outstanding:
            with pytest.raises(RuntimeError):
                lim.release(Slot(1, 0), LimiterSignal.OK)
        else:
            for _ in range(len(self.outstanding) if action == "release_all" else 1):
                self._release(self.outstanding.pop(-1 - i % len(self.outstanding)), outcome)

    def _release(self, slot: Slot, outcome: str) -> None:
        lim = self.lim
        signal = {"ok": LimiterSignal.OK, "overload": LimiterSignal.OVERLOAD, "neutral": LimiterSignal.NEUTRAL}[outcome]
        limit, capacity, cuts, news, in_flight = lim.limit, lim.capacity, lim.cuts, is_news(lim, slot), lim.in_flight
        assert lim.release(slot, signal) == (signal is LimiterSignal.OVERLOAD and news)
        assert lim.in_flight == in_flight - 1
        if signal is LimiterSignal.NEUTRAL or (signal is LimiterSignal.OVERLOAD and not news):
            assert (lim.limit, lim.capacity, lim.cuts) == (limit, capacity, cuts)  # echoes change nothing
        elif signal is LimiterSignal.OVERLOAD:
            assert lim.limit <= limit and lim.cuts == cuts + 1 and lim.capacity is not None
            assert lim.capacity <= max(lim.min, slot.position - 1) or lim.capacity == capacity
            assert not is_news(lim, slot)  # later rejections of the same round are echoes
        else:
            assert lim.limit >= limit
            assert (lim.capacity is None) == (capacity is None)
            if capacity is not None:
                assert lim.capacity is not None and lim.capacity >= capacity  # a success never lowers it

    @rule(amount=st.floats(0, 300))
    def take_tokens(self, amount: float) -> None:
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
        lim = self.lim
        assert lim.min <= lim.limit <= lim.max
        assert lim.in_flight == len(self.outstanding) >= 0
        assert lim.capacity is None or lim.min <= lim.capacity <= lim.max
        assert lim.view().limit == lim.limit and lim.view().in_flight == lim.in_flight
        assert self.bucket.available <= self.bucket.capacity
        b = self.budget
        assert 0 <= b.balance <= b.max_tokens
        assert b.retries <= b.min_tokens + b.ratio * b.requests + 1e-6


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = FAST
TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(FAST, max_examples=60)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_breaker_machine_long() -> None:
    run_state_machine_as_test(BreakerMachine, settings=SLOW)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_limiter_machine_long() -> None:
    run_state_machine_as_test(LimiterMachine, settings=SLOW)
