"""The state seam in memory: one admit() and one settle() per attempt over breaker, key,
hints, buckets and limiter (capmon/core/control/seam.py), and the wait queue on top of it.

Three targets: m1 and m2 share the key ``a`` at endpoint ``ep``; m1 also has key ``b``.
Time is a ManualClock; the calls are async but never wait, so nothing sleeps.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from typing import Any

import pytest

from capmon.core.base.clock import LoopClock
from capmon.core.control.breaker import State
from capmon.core.control.decisions import DEFAULT_QUOTA_PARK
from capmon.core.control.limiter import Slot
from capmon.core.control.seam import Admission, KeyState, MemoryState, MemoryTarget, TargetSpec
from capmon.core.routing.waiting import GATE_SLACK, INTERACTIVE, MAX_NAP, WaitQueue
from capmon.core.types.config import BreakerConfig, ClientConfig, Config, LimiterConfig, ModelConfig
from capmon.core.types.events import BreakerChanged, Event, KeyParked, ModelPinned
from capmon.core.types.failure import Cause, Failure, Kind
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.unit

A1, A2, B1 = "m1@ep/a", "m2@ep/a", "m1@ep/b"


def capacity(hint: float | None = None) -> Failure:
    return Failure(Kind.CAPACITY, "Selected model is at capacity", 503, "server_is_overloaded", hint)


def rate_limited(hint: float | None = None) -> Failure:
    return Failure(Kind.RATE_LIMITED, "Rate limit reached", 429, "rate_limit_exceeded", hint)


def quota(hint: float | None = None) -> Failure:
    return Failure(Kind.QUOTA, "You exceeded your current quota", 429, "insufficient_quota", hint)


AUTH = Failure(Kind.AUTH, "Incorrect API key provided", 401, "invalid_api_key")
DOWN = Failure(Kind.UNREACHABLE, "connection refused", None, Cause.REFUSED)
TRANSIENT = Failure(Kind.TRANSIENT, "502 bad gateway", 502)


class World:
    def __init__(
        self,
        *,
        breaker: BreakerConfig | None = None,
        limiter: LimiterConfig | None = None,
        rpm: int = 0,
        tpm: int = 0,
        clock: Any = None,
    ) -> None:
        self.clock = clock or ManualClock()
        self.events: list[Event] = []
        m1 = ModelConfig(name="m1", endpoints=("ep",), rpm=rpm, tpm=tpm)
        m2 = ModelConfig(name="m2", endpoints=("ep",))
        self.config = Config(
            models=(m1, m2),
            breaker=breaker or BreakerConfig(),
            limiter=limiter or LimiterConfig(),
            client=ClientConfig(retry_budget=0.5),
        )
        specs = [
            TargetSpec(A1, m1, ("ep", "a"), "a"),
            TargetSpec(A2, m2, ("ep", "a"), "a"),
            TargetSpec(B1, m1, ("ep", "b"), "b"),
        ]
        self.state = MemoryState(self.config, specs, self.clock, self.events.append)

    def t(self, tid: str = A1) -> MemoryTarget:
        return self.state.target(tid)

    async def admit(self, tid: str = A1, cost: int = 1) -> Admission:
        adm = await self.t(tid).admit(cost)
        assert adm is not None, f"{tid} did not admit"
        return adm

    async def attempt(self, failure: Failure | None, tid: str = A1, **kw: Any) -> bool:
        """One whole attempt: admitted, then settled at once."""
        return await self.t(tid).settle(await self.admit(tid), failure, **kw)

    async def grow(self, to: float, tid: str = A1) -> None:
        """Slow start until the limiter is at ``to`` (its max, say): a target learned above
        its initial limit, whose ramp after a trip has slots to grow into."""
        t = self.t(tid)
        while t.limiter.limit < to:
            held = []
            while (adm := await t.admit(1)) is not None:
                held.append(adm)
            t.press()  # the next was turned away: work waits for more room, as the router says
            for adm in held:
                await t.settle(adm, None)
        assert t.limiter.limit == to

    async def trip(self, tid: str = A1) -> None:
        """Trip the breaker the way a real outage does: news capacity failures in a row."""
        for _ in range(self.config.breaker.failure_threshold):
            assert await self.attempt(capacity(), tid) is True
        assert self.t(tid).breaker.state is State.OPEN

    async def probe(self, failure: Failure | None = None, tid: str = A1) -> Admission:
        t = self.t(tid)
        due = t.probe_due_at()
        assert due is not None
        self.clock.advance(due - self.clock.now())
        adm = await t.begin_probe()
        assert adm is not None and adm.probe
        await t.settle(adm, failure)
        return adm

    def changes(self, tid: str = A1) -> list[tuple[str, str]]:
        return [(e.old, e.new) for e in self.events if isinstance(e, BreakerChanged) and e.target == tid]

    def key_events(self) -> list[KeyParked]:
        return [e for e in self.events if isinstance(e, KeyParked)]


# ------------------------------------------------------------------ admission


async def test_admit_takes_a_slot_and_says_where_it_stood() -> None:
    w = World(limiter=LimiterConfig(initial=4))
    adm = await w.admit(cost=100)
    assert (adm.target, adm.generation, adm.probe, adm.slot, adm.cost, adm.at, adm.settled) == (
        A1,
        0,
        False,
        Slot(1, 0),
        100,
        w.clock.now(),
        False,
    )
    more = [await w.admit() for _ in range(3)]
    assert [a.slot.position for a in more] == [2, 3, 4]
    assert await w.t().admit(1) is None  # the limiter is full
    assert await w.t(B1).admit(1) is not None  # another key's target has its own limiter
    assert await w.t().settle(more[0], None) is False
    assert w.t().limiter.in_flight == 3
    assert await w.t().admit(1) is not None


async def test_an_open_breaker_admits_nothing_and_waits_for_its_probe() -> None:
    w = World()
    await w.trip()
    t = w.t()
    assert await t.admit(1) is None
    assert t.ready_at(w.clock.now(), 1) is None  # no time opens it: only the probe
    assert t.probe_due_at() == w.clock.now() + 2.0
    assert await t.begin_probe() is None  # not due yet
    w.clock.advance(2.0)
    assert await t.admit(1) is None  # due: still only the client's own probe goes
    probe = await t.begin_probe()
    assert probe is not None and probe.probe and probe.cost == 0
    assert t.breaker.state is State.HALF_OPEN
    assert await t.admit(1) is None and await t.begin_probe() is None  # one probe at a time
    assert t.limiter.in_flight == 1


async def test_a_probe_is_settled_through_the_same_table() -> None:
    w = World()
    await w.trip()
    limit = w.t().limiter.limit
    await w.probe(capacity(hint=40))
    t = w.t()
    v = t.view()
    assert v.breaker.state is State.OPEN and v.breaker.probes_failed == 1
    assert t.probe_due_at() == w.clock.now() + 40  # the hint holds off the next probe ...
    assert t.not_before == 0.0  # ... but a probe's hint never blocks the target itself
    await w.probe(DOWN)
    assert t.probe_due_at() == w.clock.now() + 8.0  # 2 -> 4 -> 8
    adm = await w.probe(None)
    assert t.breaker.state is State.CLOSED and adm.settled  # no ramp: its floor, the initial limit, is all of it
    assert t.limiter.limit == limit and t.limiter.in_flight == 0  # a probe says nothing about concurrency


async def test_a_cancelled_probe_is_repeated_after_the_same_interval() -> None:
    w = World()
    await w.trip()
    t = w.t()
    w.clock.advance(2.0)
    adm = await t.begin_probe()
    assert adm is not None
    assert await t.settle(adm, None, cancelled=True) is False
    v = t.view().breaker
    assert v.state is State.OPEN and v.probes_failed == 0 and v.next_probe_at == w.clock.now() + 2.0
    assert t.limiter.in_flight == 0


async def test_the_ramp_admits_its_share_of_the_learned_concurrency() -> None:
    w = World(breaker=BreakerConfig(ramp_start=0.125, ramp_duration=1e6), limiter=LimiterConfig(initial=2, max=16))
    await w.grow(16)
    await w.trip()
    await w.probe()
    t = w.t()
    assert t.limiter.limit == 16.0 and t.view().ramp_slots == 2  # max(2, ceil(0.125 * 16))
    first = [await w.admit(), await w.admit()]
    assert await t.admit(1) is None  # the ramp's share is used up, though the limiter has room
    for adm in first:
        await t.settle(adm, None)
    assert t.view().breaker.ramp_share == 0.375 and t.view().ramp_slots == 6  # two slots per clean answer: tripled
    second = [await w.admit() for _ in range(6)]
    assert await t.admit(1) is None
    for adm in second:
        await t.settle(adm, None)
    v = t.view()
    assert v.breaker.state is State.CLOSED and v.ramp_slots is None
    assert w.changes()[-3:] == [("open", "half-open"), ("half-open", "ramp"), ("ramp", "closed")]


# ------------------------------------------------------------------ keys


async def test_an_auth_failure_disables_the_key_for_every_target_that_shares_it() -> None:
    w = World()
    assert await w.attempt(AUTH) is False
    for tid in (A1, A2):
        t = w.t(tid)
        assert not t.usable() and await t.admit(1) is None
        assert t.ready_at(w.clock.now(), 1) is None  # only a person brings it back
        v = t.view()
        assert (v.key_state, v.key_until, v.key_reason) == (KeyState.DISABLED, None, AUTH.reason)
    assert w.t(B1).usable() and await w.t(B1).admit(1) is not None  # another key: untouched
    v = w.t().view()
    assert v.breaker.state is State.CLOSED and v.breaker.consecutive_failures == 0  # says nothing about the model
    assert v.limiter.limit == 8.0
    [e] = w.key_events()
    assert (e.target, e.model, e.key_alias, e.kind, e.until, e.reason) == (A1, "m1", "a", "auth", None, AUTH.reason)
    w.clock.advance(1e6)
    assert await w.t(A2).admit(1) is None


async def test_a_disabled_key_is_not_probed() -> None:
    w = World()
    await w.trip()
    await w.attempt(AUTH, A2)  # the same key fails for another model
    w.clock.advance(2.0)
    assert await w.t().begin_probe() is None
    assert w.t().breaker.state is State.OPEN


async def test_a_quota_parks_one_target_until_the_hint() -> None:
    w = World()
    t0 = w.clock.now()
    await w.attempt(quota(hint=120))
    t = w.t()
    assert await t.admit(1) is None
    v = t.view()
    assert (v.key_state, v.key_until) == (KeyState.PARKED, t0 + 120)
    assert t.usable()  # parked, not disabled: time brings it back
    assert t.ready_at(w.clock.now(), 1) == t0 + 120
    assert await w.t(A2).admit(1) is not None  # the same key for another model: a quota is per model
    [e] = w.key_events()
    assert (e.kind, e.until) == ("quota", t0 + 120)
    w.clock.advance(119.9)
    assert await t.admit(1) is None
    w.clock.advance(0.2)
    assert await t.admit(1) is not None and t.view().key_state is KeyState.OK


@pytest.mark.parametrize("hint", [None, 0.0])
async def test_a_quota_without_a_hint_parks_for_an_hour(hint: float | None) -> None:
    w = World()
    await w.attempt(quota(hint))
    assert w.t().view().key_until == w.clock.now() + DEFAULT_QUOTA_PARK == w.clock.now() + 3600


async def test_a_targets_standing_is_its_views_key_and_breaker() -> None:
    """``standing(now)`` (what ``targets.held`` reads before a request waits) says what
    ``view()`` says of the key and the breaker, in every state that holds a target."""

    def same(tid: str = A1) -> None:
        t = w.t(tid)
        s, v = t.standing(w.clock.now()), t.view()
        assert (s.key_state, s.key_until, s.key_reason) == (v.key_state, v.key_until, v.key_reason)
        assert (s.breaker, s.breaker_reason) == (v.breaker.state, v.breaker.reason)

    w = World()
    same()
    await w.attempt(quota(hint=120))
    same()
    w.clock.advance(121)  # the park lifts by time
    same()
    await w.trip()
    same()
    w.t().trip("by hand")
    same()
    await w.attempt(AUTH, A2)  # the key, for every model it serves
    same(A1)
    same(A2)


# ------------------------------------------------------------------ server hints


async def test_a_hint_stops_the_target_when_nothing_of_ours_is_in_flight() -> None:
    w = World()
    t0 = w.clock.now()
    assert await w.attempt(capacity(hint=30)) is True
    t = w.t()
    assert t.not_before == t0 + 30 and t.view().not_before == t0 + 30
    assert await t.admit(1) is None
    assert t.ready_at(w.clock.now(), 1) == t0 + 30
    assert await w.t(A2).admit(1) is not None  # only this target
    w.clock.advance(30)
    assert await t.admit(1) is not None
    assert t.breaker.view().consecutive_failures == 1


async def test_a_hint_does_not_stop_a_target_that_is_serving_others_of_ours() -> None:
    w = World()
    busy = await w.admit()
    await w.attempt(capacity(hint=30))
    t = w.t()
    ready = t.ready_at(w.clock.now(), 1)
    assert t.not_before == 0.0 and ready is not None and ready <= w.clock.now()  # merely full: the limiter cut
    await t.settle(busy, None)


async def test_a_rate_limit_hint_stops_the_target_too_a_transient_one_does_not() -> None:
    w = World()
    await w.attempt(Failure(Kind.TRANSIENT, "502", 502, None, 30))
    assert w.t().not_before == 0.0
    await w.attempt(rate_limited(hint=20))
    assert w.t().not_before == w.clock.now() + 20


async def test_a_server_hint_stops_a_target_no_longer_than_cooldown_max() -> None:
    w = World(breaker=BreakerConfig(cooldown_max=1800))
    t0 = w.clock.now()
    await w.attempt(capacity(hint=86400))
    assert w.t().not_before <= t0 + 1800
    w.clock.advance(1800)
    assert await w.t().admit(1) is not None


# ------------------------------------------------------------------ buckets


async def test_an_rpm_bucket_gates_admission_and_says_when_it_refills() -> None:
    w = World(rpm=2)
    t = w.t()
    await w.admit()
    await w.admit()
    assert await t.admit(1) is None
    assert t.ready_at(w.clock.now(), 1) == pytest.approx(w.clock.now() + 30)  # 2 a minute
    assert await w.t(B1).admit(1) is not None  # each target has its own bucket
    w.clock.advance(30)
    assert await t.admit(1) is not None


async def test_a_tpm_bucket_charges_the_cost_up_front_and_a_refusal_costs_nothing() -> None:
    w = World(rpm=10, tpm=1000)
    t = w.t()
    assert t.tpm is not None and t.rpm is not None
    await w.admit(cost=600)
    assert await t.admit(600) is None
    assert t.rpm.available == pytest.approx(9)  # the refused admission took no request token
    assert t.ready_at(w.clock.now(), 600) == pytest.approx(w.clock.now() + 12)  # 200 tokens at 1000 a minute
    assert await t.admit(400) is not None


async def test_a_success_refunds_the_tokens_it_did_not_use() -> None:
    w = World(tpm=1000)
    t = w.t()
    assert t.tpm is not None
    await t.settle(await w.admit(cost=600), None, used_tokens=100)
    assert t.tpm.available == pytest.approx(900)
    await t.settle(await w.admit(cost=300), None, used_tokens=None)  # no usage reported: no refund
    assert t.tpm.available == pytest.approx(600)
    await t.settle(await w.admit(cost=100), None, used_tokens=5000)  # used more than charged: nothing back
    assert t.tpm.available == pytest.approx(500)
    await t.settle(await w.admit(cost=100), capacity(), used_tokens=0)  # failures keep their charge
    assert t.tpm.available == pytest.approx(400)


# ------------------------------------------------------------------ settle: the policy table


@pytest.mark.parametrize(
    ("failure", "news", "consecutive", "limit", "key"),
    [
        (None, False, 0, 10.0, KeyState.OK),  # slow start: 4 of 8 busy, two slots more
        (capacity(), True, 1, 3.0, KeyState.OK),  # position 4: the target holds 3
        (rate_limited(), True, 0, 3.0, KeyState.OK),  # full, but says nothing about the model being down
        (DOWN, True, 1, 8.0, KeyState.OK),  # never reached the server: news for the breaker only
        (TRANSIENT, False, 0, 8.0, KeyState.OK),
        (quota(), False, 0, 8.0, KeyState.PARKED),
        (AUTH, False, 0, 8.0, KeyState.DISABLED),
        (Failure(Kind.TOO_LARGE, "context_length_exceeded", 400), False, 0, 8.0, KeyState.OK),
        (Failure(Kind.BAD_REQUEST, "bad role", 422), False, 0, 8.0, KeyState.OK),
        (Failure(Kind.OVERSIZED, "answer too large", 200), False, 0, 8.0, KeyState.OK),
    ],
    ids=lambda x: x.kind.value if isinstance(x, Failure) else None,
)
async def test_settle_applies_the_policy_table(
    failure: Failure | None, news: bool, consecutive: int, limit: float, key: KeyState
) -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    held = [await w.admit() for _ in range(4)]
    assert await t.settle(held[-1], failure) is news
    v = t.view()
    assert v.breaker.state is State.CLOSED and v.breaker.consecutive_failures == consecutive
    assert v.limiter.limit == limit and v.limiter.in_flight == 3
    assert v.key_state is key
    assert t.not_before == 0.0


async def test_only_a_full_limit_turning_work_away_presses_the_limiter() -> None:
    w = World(limiter=LimiterConfig(initial=4, max=16))
    t = w.t()
    held = [await w.admit() for _ in range(4)]
    await t.settle(held.pop(), capacity())  # position 4: it holds 3, a learned limit
    assert (t.limiter.limit, t.limiter.capacity) == (3.0, 3)
    for adm in held:
        await t.settle(adm, None, cancelled=True)
    held = [await w.admit() for _ in range(2)]
    t.press()  # turned away with a slot free (a ramp's share, a bucket, a hint): not the limit
    await t.settle(held.pop(), None)
    assert t.limiter.limit == 3.0
    held += [await w.admit() for _ in range(2)]
    assert await t.admit(1) is None
    t.press()  # the full limit turned it away: the answers out now may grow it
    await t.settle(held.pop(), None)
    assert t.limiter.limit == pytest.approx(3 + 1 / 3)


async def test_echoes_do_not_count_toward_a_trip() -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    held = [await w.admit() for _ in range(8)]
    assert await t.settle(held.pop(), capacity()) is True
    for adm in held:  # sent before the cut: the model is full, not down
        assert await t.settle(adm, capacity()) is False
    v = t.view()
    assert v.breaker.state is State.CLOSED and v.breaker.consecutive_failures == 1
    assert (v.limiter.limit, v.limiter.capacity, v.limiter.in_flight) == (7.0, 7, 0)


async def test_a_success_sent_before_the_streak_does_not_break_it() -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    early, other = await w.admit(), await w.admit()
    w.clock.advance(1)
    assert await w.attempt(capacity()) is True  # position 3: the limit goes to 2
    await t.settle(other, None, cancelled=True)  # room for the next one
    assert await w.attempt(capacity()) is True
    await t.settle(early, None)  # it was sent before the model went down
    assert t.breaker.view().consecutive_failures == 2
    assert await w.attempt(capacity()) is True
    assert t.breaker.state is State.OPEN


async def test_a_cancelled_settle_is_neutral() -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    await w.attempt(capacity())
    await w.attempt(capacity())
    before = t.view()
    adm = await w.admit()
    assert await t.settle(adm, capacity(hint=60), cancelled=True) is False  # cancellation wins over the outcome
    after = t.view()
    assert after.breaker == before.breaker and after.limiter == before.limiter
    assert t.not_before == 0.0 and adm.settled
    assert await t.settle(await w.admit(), AUTH, cancelled=True) is False
    assert t.usable() and w.key_events() == []


async def test_a_second_settle_is_ignored() -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    other = await w.admit()
    adm = await w.admit()
    assert await t.settle(adm, capacity()) is True
    before = t.view()
    assert await t.settle(adm, capacity()) is False
    assert await t.settle(adm, None) is False
    assert t.view() == before and t.limiter.in_flight == 1  # the slot was not freed twice
    await t.settle(other, None)
    assert t.limiter.in_flight == 0


async def test_an_admission_from_before_a_manual_action_settles_harmlessly() -> None:
    w = World()
    t = w.t()
    early = [await w.admit() for _ in range(3)]
    t.trip("maintenance")
    for adm in early:
        await t.settle(adm, None)
    assert t.breaker.state is State.FORCED_OPEN and t.limiter.in_flight == 0
    t.reset("done")
    late = [await w.admit() for _ in range(3)]
    t.trip("again")
    t.reset("done")
    for adm in late:
        await t.settle(adm, capacity())
    assert t.breaker.state is State.CLOSED and t.breaker.view().consecutive_failures == 0


# ------------------------------------------------------------------ an outage is not a full model


async def test_a_trip_restores_what_the_limiter_knew_before_the_outage() -> None:
    w = World(breaker=BreakerConfig(ramp_start=0.25, ramp_duration=1e6), limiter=LimiterConfig(initial=8, min=2))
    t = w.t()
    held = [await w.admit() for _ in range(7)]
    assert await t.settle(held.pop(), capacity()) is True  # position 7: the target holds 6
    for adm in held:
        await t.settle(adm, None, cancelled=True)
    await w.attempt(None)  # the model is fine: the streak ends
    assert (t.limiter.limit, t.limiter.capacity) == (6.0, 6)
    # The outage: everything rejected. Each rejection cuts the limiter further ...
    for _ in range(2):
        assert await w.attempt(capacity()) is True
    assert t.limiter.limit == 2.0  # its min
    late = await w.admit()  # ... and one sent just before the trip is still out
    assert await w.attempt(capacity()) is True
    # ... but the trip says it was an outage: back to the capacity learned before it.
    assert t.breaker.state is State.OPEN
    assert (t.limiter.limit, t.limiter.capacity) == (6.0, 6)
    assert await t.settle(late, capacity()) is False and t.limiter.limit == 6.0  # an echo of the outage
    await w.probe()
    # The ramp aims at the capacity learned before, but never below the initial limit (8):
    # that is all of the 6, so no ramp.
    assert t.breaker.state is State.CLOSED and t.limiter.limit == 6.0


async def test_an_outage_right_after_slow_starts_first_rejection_keeps_the_capacity_it_taught() -> None:
    # The benchmark's outage: slow start grows past its initial limit, its first rejection
    # (position 7: the target holds 6) begins a streak, and the model goes down before any
    # request sent after that answers: nothing ends the streak, the outage's rejections
    # continue it to a trip.
    w = World(breaker=BreakerConfig(ramp_start=0.25, ramp_duration=1e6), limiter=LimiterConfig(initial=4, min=1))
    t = w.t()
    held = [await w.admit() for _ in range(4)]
    while t.limiter.limit < 8:
        t.press()  # work waits for more room
        await t.settle(held.pop(0), None)  # slow start: one more slot per answer
        while (adm := await t.admit(1)) is not None:
            held.append(adm)
    top = next(a for a in held if a.slot.position == 7)
    assert await t.settle(top, capacity()) is True
    assert (t.limiter.limit, t.limiter.capacity) == (6.0, 6)
    for adm in held:
        if adm is not top:  # gone before they answer (cancelled: they say nothing)
            await t.settle(adm, None, cancelled=True)
    for _ in range(2):  # the outage: sent after the cut and rejected, each cutting further
        assert await w.attempt(capacity()) is True
    assert t.breaker.state is State.OPEN
    # A full target's answer is not the outage's: the trip restores what it taught, not the
    # slow start before it (which would grow past 6 again, and ramp above it).
    assert (t.limiter.limit, t.limiter.capacity) == (6.0, 6)
    await w.probe()
    assert t.view().ramp_slots == 4  # max(4, ceil(0.25 * 6)): never fewer than the initial limit


async def test_a_trip_by_connection_failures_keeps_what_the_limiter_learned() -> None:
    w = World(limiter=LimiterConfig(initial=8))
    t = w.t()
    held = [await w.admit() for _ in range(4)]
    await t.settle(held.pop(), capacity())  # a checkpoint is taken here: (limit 8, capacity unknown)
    for adm in held:
        await t.settle(adm, None, cancelled=True)
    await w.attempt(None)  # the streak ends
    assert (t.limiter.limit, t.limiter.capacity) == (3.0, 3)
    for _ in range(3):  # later the endpoint goes away
        assert await w.attempt(DOWN) is True
    assert t.breaker.state is State.OPEN
    assert (t.limiter.limit, t.limiter.capacity) == (3.0, 3)  # connection failures taught the limiter nothing


# ------------------------------------------------------------------ by hand


async def test_reset_clears_key_state_hints_and_the_breaker() -> None:
    w = World()
    t = w.t()
    await w.attempt(capacity())
    await w.attempt(capacity())
    await w.attempt(capacity(hint=1000))  # trips, and the hint stops the target
    assert t.breaker.state is State.OPEN and t.not_before == w.clock.now() + 1000
    await w.attempt(AUTH, A2)  # disables key a for m1 and m2
    t.reset("fixed")
    v = t.view()
    assert (v.breaker.state, v.breaker.reason, v.key_state, v.not_before) == (State.CLOSED, "fixed", KeyState.OK, 0.0)
    assert await t.admit(1) is not None
    assert w.t(A2).usable()  # the key was the problem, and it is cleared for every model it serves


async def test_reset_clears_a_quota_park_of_that_target_only() -> None:
    w = World()
    await w.attempt(quota(), A1)
    await w.attempt(quota(), A2)
    w.t(A1).reset("topped up")
    assert await w.t(A1).admit(1) is not None
    assert await w.t(A2).admit(1) is None and w.t(A2).view().key_state is KeyState.PARKED


async def test_forced_states_by_hand() -> None:
    w = World()
    t = w.t()
    t.trip("maintenance")
    assert await t.admit(1) is None and t.ready_at(w.clock.now(), 1) is None
    w.clock.advance(1e6)
    assert await t.begin_probe() is None
    t.force_close("trust me")
    for _ in range(20):
        await w.attempt(capacity())
    assert t.breaker.state is State.FORCED_CLOSED
    await w.attempt(AUTH)
    assert await t.admit(1) is None  # a forced-closed breaker does not bring back a disabled key


# ------------------------------------------------------------------ views and the store


async def test_the_view_shows_every_gate() -> None:
    w = World(breaker=BreakerConfig(ramp_duration=1e6), limiter=LimiterConfig(initial=2, max=8))
    t = w.t()
    await w.grow(8)
    v = t.view()
    assert (
        v.breaker.state,
        v.limiter.limit,
        v.limiter.in_flight,
        v.limiter.capacity,
        v.ramp_slots,
        v.key_state,
        v.key_until,
        v.key_reason,
        v.not_before,
    ) == (State.CLOSED, 8.0, 0, None, None, KeyState.OK, None, "", 0.0)
    await w.trip()
    await w.probe()
    await w.attempt(quota(hint=50))
    v = t.view()
    assert (v.breaker.state, v.ramp_slots, v.key_state, v.key_until) == (
        State.RAMP,
        4,  # half (ramp_start) of the 8 learned
        KeyState.PARKED,
        w.clock.now() + 50,
    )


async def test_ready_at_is_the_latest_time_gate() -> None:
    w = World(rpm=1)
    t = w.t()
    now = w.clock.now()
    assert t.ready_at(now, 1) == now  # every gate open
    await w.attempt(capacity(hint=10))  # not before +10, and the bucket refills at +60
    assert t.ready_at(now, 1) == pytest.approx(now + 60)
    await w.t(A2).settle(await w.admit(A2), quota(hint=500))
    assert t.ready_at(now, 1) == pytest.approx(now + 60)  # another target's park is not this one's


async def test_memory_state_holds_the_pin_and_the_retry_budget() -> None:
    w = World()
    s = w.state
    assert s.pinned is None
    s.pin("m2")
    s.pin(None)
    assert [e.model for e in w.events if isinstance(e, ModelPinned)] == ["m2", None]
    assert s.target(A1) is w.t(A1)
    with pytest.raises(KeyError):
        s.target("nope@ep/a")
    assert sum(s.spend_retry() for _ in range(20)) == 10  # min_tokens
    for _ in range(4):
        s.on_request()  # at 0.5 a first attempt: two retries
    assert [s.spend_retry() for _ in range(3)] == [True, True, False]
    assert (s.budget.requests, s.budget.retries) == (4, 12)
    calls: list[int] = []
    s.set_listener(lambda: calls.append(1))
    await s.aclose()


# ------------------------------------------------------------------ waiting for a slot (the queue on the state)


def queue_over(t: MemoryTarget, clock: LoopClock) -> WaitQueue[Admission]:
    """The router's wiring of the wait queue, for one target and requests of cost 1."""
    q: WaitQueue[Admission]

    async def give_back(adm: Admission) -> None:
        await t.settle(adm, None, cancelled=True)
        q.kick()

    q = WaitQueue(
        clock, lambda key: t.admit(1), give_back, lambda key, now: t.ready_at(now, 1), lambda key: (INTERACTIVE, "all")
    )
    return q


async def finish(t: MemoryTarget, q: WaitQueue[Admission], adm: Admission, failure: Failure | None = None) -> None:
    await t.settle(adm, failure)
    q.kick()


def one_slot_world(n: int = 1) -> tuple[MemoryTarget, WaitQueue[Admission], LoopClock]:
    clock = LoopClock()
    w = World(limiter=LimiterConfig(initial=n, min=1, max=n), clock=clock)
    t = w.t()
    return t, queue_over(t, clock), clock


@pytest.mark.looptime
async def test_waiters_are_served_first_come_first_served() -> None:
    t, q, _ = one_slot_world()
    held = await t.admit(1)
    assert held is not None
    order: list[int] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(i * 0.01)  # queue in the order 0, 1, 2, ...
        adm = await q.wait(i, i, 100)
        order.append(i)
        await asyncio.sleep(1)
        await finish(t, q, adm)

    tasks = [asyncio.create_task(worker(i)) for i in range(5)]
    await asyncio.sleep(0.5)
    assert len(q) == 5
    await finish(t, q, held)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert t.limiter.in_flight == 0 and len(q) == 0
    await q.aclose()


async def test_a_waiter_past_its_deadline_times_out_even_if_its_own_timer_never_fires() -> None:
    # The queue's clock runs ahead of the loop's (a ManualClock: each nap is instant), so the
    # wait's own asyncio timeout (loop time) would not fire for 5 real seconds; the queue's
    # timer finds the waiter past its deadline and times it out at its next nap.
    clock = ManualClock()
    w = World(limiter=LimiterConfig(initial=1, min=1, max=1), clock=clock)
    t = w.t()
    q = queue_over(t, clock)  # type: ignore[arg-type]
    held = await t.admit(1)
    assert held is not None
    started = clock.now()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(q.wait(1, 1, 5.0), 2.0)
    # the queue's clock says it was the queue (wait_for's timeout would leave it far past this)
    assert 5.0 <= clock.now() - started <= 5.0 + MAX_NAP
    assert len(q) == 0
    await finish(t, q, held)
    await q.aclose()


@pytest.mark.looptime
async def test_a_gate_a_hair_ahead_is_waited_for_not_spun_on() -> None:
    # A gate (a back-off, a hint) that opens 0.9 ns from now: asyncio runs a timer up to its
    # clock's resolution early, so a timer set for the gate itself fired with the gate still
    # shut, was set again, and the queue spun with loop time standing still (seen in CI).
    loop = asyncio.get_running_loop()
    gate = loop.time() + 9e-10
    passes = 0

    async def admit(key: object) -> str | None:
        nonlocal passes
        passes += 1
        return "slot" if loop.time() >= gate else None

    async def release(grant: str) -> None:
        return None

    q: WaitQueue[str] = WaitQueue(LoopClock(), admit, release, lambda key, now: gate, lambda key: (INTERACTIVE, "all"))
    assert await asyncio.wait_for(q.wait(1, 1, 10.0), 5.0) == "slot"
    assert passes <= 3
    await q.aclose()


@pytest.mark.looptime
async def test_a_cancelled_waiter_does_not_leak_a_slot() -> None:
    t, q, _ = one_slot_world()
    held = await t.admit(1)
    assert held is not None
    waiter = asyncio.create_task(q.wait(1, 1, 100))
    await asyncio.sleep(1)
    assert len(q) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(q) == 0
    await finish(t, q, held)
    assert t.limiter.in_flight == 0
    assert await t.admit(1) is not None
    await q.aclose()


@pytest.mark.looptime
async def test_a_waiter_cancelled_just_after_being_handed_a_slot_passes_it_on() -> None:
    t, q, _ = one_slot_world()
    held = await t.admit(1)
    assert held is not None
    first = asyncio.create_task(q.wait(1, "first", 100))
    second = asyncio.create_task(q.wait(2, "second", 100))
    await asyncio.sleep(1)
    await finish(t, q, held)
    await asyncio.sleep(0)  # the dispatch pass hands the slot to `first`, which has not run yet
    assert len(q) == 1 and not first.done() and t.limiter.in_flight == 1
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    adm = await asyncio.wait_for(second, timeout=1)  # the slot went on to the next in line
    assert t.limiter.in_flight == 1 and len(q) == 0
    await finish(t, q, adm)
    assert t.limiter.in_flight == 0
    await q.aclose()


@pytest.mark.looptime
async def test_a_waiter_wakes_when_a_time_gate_opens() -> None:
    clock = LoopClock()
    w = World(clock=clock)
    t = w.t()
    q = queue_over(t, clock)
    await t.settle(await w.admit(), capacity(hint=30))
    t0 = clock.now()
    adm = await q.wait(1, 1, 100)
    waited = clock.now() - t0
    assert 30 <= waited <= 30 + GATE_SLACK + 1e-6  # not before the hint, and promptly after it
    await finish(t, q, adm)
    await q.aclose()


@pytest.mark.looptime
async def test_many_workers_never_exceed_the_limit() -> None:
    t, q, _ = one_slot_world(4)
    seq = itertools.count()
    peak = 0

    async def worker(i: int) -> None:
        nonlocal peak
        for _ in range(5):
            adm = await t.admit(1) if not len(q) else None  # as the router: nobody jumps the queue
            if adm is None:
                adm = await q.wait(next(seq), i, 1000)
            peak = max(peak, t.limiter.in_flight)
            await asyncio.sleep(0.1 + (i % 3) * 0.05)
            await finish(t, q, adm)

    await asyncio.gather(*(worker(i) for i in range(20)))
    assert peak == 4 and t.limiter.in_flight == 0 and len(q) == 0
    assert t.limiter.limit == 4.0
    await q.aclose()


async def test_an_admission_above_the_learned_capacity_is_an_ask() -> None:
    w = World(limiter=LimiterConfig(initial=4, max=16))
    t = w.t()
    held = [await w.admit() for _ in range(4)]
    assert not any(a.ask for a in held)  # nothing learned yet: slow start, not an ask
    await t.settle(held.pop(), capacity())  # it holds 3
    for adm in held:
        await t.settle(adm, None, cancelled=True)
    held = [await w.admit() for _ in range(3)]
    assert not any(a.ask for a in held)
    t.limiter.mirror(dataclasses.replace(t.limiter.learned(), limit=4.0))  # a pressed limit asked for one more
    above = await w.admit()
    assert above.slot.position == 4 and above.ask
