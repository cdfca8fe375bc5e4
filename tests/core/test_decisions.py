"""The decisions of an admission and a settle (capmon/core/control/decisions.py), as tables: what
every store of the state seam applies. tests/fleet/test_state_equivalence.py holds the
memory and Redis stores to them together."""

from __future__ import annotations

import math

import pytest

from capmon.core.control import decisions as d
from capmon.core.control.breaker import State
from capmon.core.control.decisions import DEFAULT_QUOTA_PARK, Gates, KeyState, Outcome, Room, Verdict
from capmon.core.control.policy import BreakerSignal, LimiterSignal
from capmon.core.types.failure import Cause, Failure, Kind

pytestmark = pytest.mark.unit

NOW = 100.0
OPEN_GATES = Gates(NOW, 1.0, KeyState.OK, None, 0.0)
ROOM = Room(4.0, 0, None, None)


def fail(kind: Kind, hint: float | None = None, code: str | None = None) -> Failure:
    return Failure(kind, f"{kind.value} happened", 400, code, hint)


@pytest.mark.parametrize(
    ("gates", "room", "verdict", "retry_at"),
    [
        (OPEN_GATES, ROOM, Verdict.OK, 0.0),
        (Gates(NOW, 0.0, KeyState.DISABLED, None, 500.0), ROOM, Verdict.STATE, 0.0),  # the breaker first
        (Gates(NOW, 1.0, KeyState.DISABLED, None, 500.0), ROOM, Verdict.DISABLED, 0.0),
        (Gates(NOW, 1.0, KeyState.PARKED, 300.0, 500.0), ROOM, Verdict.PARKED, 300.0),
        (Gates(NOW, 1.0, KeyState.OK, None, 500.0), ROOM, Verdict.HINT, 500.0),
        (Gates(NOW, 1.0, KeyState.OK, None, NOW), ROOM, Verdict.OK, 0.0),  # a hint that ends now is over
        (OPEN_GATES, Room(4.0, 4, None, None), Verdict.FULL, 0.0),
        (Gates(NOW, 0.35, KeyState.OK, None, 0.0), Room(4.0, 2, None, None), Verdict.FULL, 0.0),  # ceil(1.4)
        (Gates(NOW, 0.35, KeyState.OK, None, 0.0), Room(4.0, 1, None, None), Verdict.OK, 0.0),
        (OPEN_GATES, Room(4.0, 4, 100.0, 200.0), Verdict.FULL, 0.0),  # a slot before the buckets
        (OPEN_GATES, Room(4.0, 0, 100.0, 200.0), Verdict.RPM, 200.0),
        (OPEN_GATES, Room(4.0, 0, 0.0, 200.0), Verdict.TPM, 300.0),
    ],
)
def test_an_admission_checks_the_gates_then_a_slot_then_the_buckets(
    gates: Gates, room: Room, verdict: Verdict, retry_at: float
) -> None:
    decision = d.admit(gates, room)
    assert (decision.verdict, decision.retry_at) == (verdict, retry_at)
    assert decision.admitted is (verdict is Verdict.OK)


@pytest.mark.parametrize(
    ("share", "limit", "slots", "shown"),
    [
        (1.0, 4.0, 4, None),
        (1.0, 4.9, 4, None),
        (0.35, 4.0, 2, 2),
        (0.01, 4.0, 1, 1),
        (0.5, 0.5, 0, 0),
        (0.0, 4.0, 4, None),
    ],
)
def test_a_ramp_admits_its_share_of_the_limit_and_at_least_one(
    share: float, limit: float, slots: int, shown: int | None
) -> None:
    assert d.slots(share, limit) == slots
    assert d.ramp_slots(share, limit) == shown


@pytest.mark.parametrize(
    ("failure", "breaker", "limiter", "key", "block_for"),
    [
        (None, BreakerSignal.SUCCESS, LimiterSignal.OK, None, None),
        (fail(Kind.CAPACITY, 5.0), BreakerSignal.CAPACITY, LimiterSignal.OVERLOAD, None, 5.0),
        (fail(Kind.CAPACITY, 5000.0), BreakerSignal.CAPACITY, LimiterSignal.OVERLOAD, None, 60.0),  # capped
        (fail(Kind.RATE_LIMITED, 2.0), BreakerSignal.NEUTRAL, LimiterSignal.OVERLOAD, None, 2.0),
        (fail(Kind.RATE_LIMITED), BreakerSignal.NEUTRAL, LimiterSignal.OVERLOAD, None, None),
        (fail(Kind.QUOTA, 30.0), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, (KeyState.PARKED, 30.0), None),
        (fail(Kind.QUOTA), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, (KeyState.PARKED, DEFAULT_QUOTA_PARK), None),
        (
            fail(Kind.QUOTA, 0.0),
            BreakerSignal.NEUTRAL,
            LimiterSignal.NEUTRAL,
            (KeyState.PARKED, DEFAULT_QUOTA_PARK),
            None,
        ),
        (fail(Kind.AUTH, 30.0), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, (KeyState.DISABLED, 0.0), None),
        (fail(Kind.TRANSIENT), BreakerSignal.TRANSIENT, LimiterSignal.NEUTRAL, None, None),
        (fail(Kind.UNREACHABLE, None, Cause.REFUSED), BreakerSignal.DOWN, LimiterSignal.NEUTRAL, None, None),
        (fail(Kind.TOO_LARGE), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, None, None),
        (fail(Kind.BAD_REQUEST, 9.0), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, None, None),
        (fail(Kind.OVERSIZED), BreakerSignal.NEUTRAL, LimiterSignal.NEUTRAL, None, None),
    ],
)
def test_a_settle_plan_follows_the_policy_table(
    failure: Failure | None,
    breaker: BreakerSignal,
    limiter: LimiterSignal,
    key: tuple[KeyState, float] | None,
    block_for: float | None,
) -> None:
    plan = d.plan_settle(Outcome(failure), probe=False, cost=300, max_hint=60.0)
    assert (plan.breaker, plan.limiter, plan.block_for) == (breaker, limiter, block_for)
    assert (None if plan.key is None else (plan.key.state, plan.key.park_for)) == key
    if plan.key is not None:
        assert failure is not None and plan.key.reason == failure.reason
    probe = d.plan_settle(Outcome(failure), probe=True, cost=0, max_hint=60.0)
    assert probe.limiter is LimiterSignal.NEUTRAL and probe.block_for is None  # a probe: no limiter, no block
    assert probe.breaker is breaker and probe.key == plan.key


@pytest.mark.parametrize("garbage", [math.inf, -1.0, math.nan])
def test_a_garbage_hint_is_dropped_by_every_decision(garbage: float) -> None:
    capacity = d.plan_settle(Outcome(fail(Kind.CAPACITY, garbage)), probe=False, cost=0, max_hint=60.0)
    assert capacity.hint is None and capacity.block_for is None
    quota = d.plan_settle(Outcome(fail(Kind.QUOTA, garbage)), probe=False, cost=0, max_hint=60.0)
    assert quota.key is not None and quota.key.park_for == DEFAULT_QUOTA_PARK


@pytest.mark.parametrize(
    ("outcome", "tokens", "rpm_back"),
    [
        (Outcome(None, used_tokens=120), 180, False),
        (Outcome(None, used_tokens=500), 0, False),
        (Outcome(None), 0, False),
        (Outcome(None, unused=True), 300, True),
        (Outcome(None, unused=True, used_tokens=120), 300, True),  # given back whole, not twice
        (Outcome(fail(Kind.CAPACITY), used_tokens=120), 0, False),
        (Outcome(None, cancelled=True), 0, False),
    ],
)
def test_what_a_settle_refunds(outcome: Outcome, tokens: int, rpm_back: bool) -> None:
    plan = d.plan_settle(outcome, probe=False, cost=300, max_hint=60.0)
    assert (plan.refund_tokens, plan.refund_request) == (tokens, rpm_back)


def test_a_cancelled_attempt_says_nothing() -> None:
    plan = d.plan_settle(Outcome(fail(Kind.AUTH), cancelled=True), probe=False, cost=300, max_hint=60.0)
    assert (plan.breaker, plan.limiter, plan.key, plan.block_for) == (
        BreakerSignal.NEUTRAL,
        LimiterSignal.NEUTRAL,
        None,
        None,
    )


def test_a_streak_checkpoints_only_where_it_may_begin() -> None:
    down = d.plan_settle(Outcome(fail(Kind.UNREACHABLE, None, Cause.REFUSED)), probe=False, cost=0, max_hint=60.0)
    full = d.plan_settle(Outcome(fail(Kind.CAPACITY)), probe=False, cost=0, max_hint=60.0)
    assert d.starts_streak(down, news=False, admits=True, streak=0)
    assert d.starts_streak(full, news=True, admits=True, streak=0)
    assert not d.starts_streak(full, news=False, admits=True, streak=0)  # an echo
    assert not d.starts_streak(full, news=True, admits=True, streak=1)  # already under way
    assert not d.starts_streak(full, news=True, admits=False, streak=0)
    probe = d.plan_settle(Outcome(fail(Kind.UNREACHABLE, None, Cause.REFUSED)), probe=True, cost=0, max_hint=60.0)
    assert not d.starts_streak(probe, news=False, admits=True, streak=0)


def test_a_streaks_checkpoint_keeps_the_lesson_of_a_full_target_not_of_a_failing_one() -> None:
    keeps = d.checkpoint_keeps_lesson
    assert keeps(True, None, 25, 1, 8.0)  # slow start's first rejection above where it started: it holds 24
    assert keeps(True, None, 9, 1, 8.0)
    assert not keeps(True, None, 8, 1, 8.0)  # below where it started: perhaps an outage
    assert not keeps(True, None, 1, 1, 8.0)
    assert keeps(True, 24, 25, 1, 8.0)  # growth above the capacity refuted
    assert keeps(True, 24, 30, 1, 8.0)
    assert not keeps(True, 24, 24, 1, 8.0)  # below what it held
    assert not keeps(True, 24, 10, 1, 8.0)
    assert keeps(True, 2, 1, 2, 8.0)  # at the limiter's min a rejection says min
    assert not keeps(False, None, 25, 1, 8.0)  # an echo, or a connection failure, teaches nothing


def test_a_hint_blocks_the_target_only_with_nothing_of_ours_left_there() -> None:
    assert d.not_before_after(0.0, NOW, 5.0, 0) == NOW + 5.0
    assert d.not_before_after(0.0, NOW, 5.0, 1) == 0.0
    assert d.not_before_after(NOW + 30.0, NOW, 5.0, 0) == NOW + 30.0  # never shortened
    assert d.not_before_after(7.0, NOW, None, 0) == 7.0


def test_a_trip_restores_the_limiter_only_from_closed_or_ramp() -> None:
    assert d.trip_restores(State.CLOSED, State.OPEN) and d.trip_restores(State.RAMP, State.OPEN)
    assert not d.trip_restores(State.HALF_OPEN, State.OPEN)
    assert not d.trip_restores(State.CLOSED, State.CLOSED)


def test_news_is_a_rejection_sent_since_the_last_cut_or_an_endpoint_down() -> None:
    assert d.overload_is_news(LimiterSignal.OVERLOAD, 3, 3)
    assert not d.overload_is_news(LimiterSignal.OVERLOAD, 2, 3)
    assert not d.overload_is_news(LimiterSignal.NEUTRAL, 3, 3)
    down = d.plan_settle(Outcome(fail(Kind.UNREACHABLE, None, Cause.REFUSED)), probe=False, cost=0, max_hint=60.0)
    assert d.reports_news(down, False) and not d.reports_news(
        d.plan_settle(Outcome(None), probe=False, cost=0, max_hint=1.0), False
    )
