"""The capacity-learning limiter, the rpm / tpm buckets and the retry budget.

Waiting for a slot is the wait queue's business now (capmon/core/routing/waiting.py); the
first-come-first-served and no-leak tests for it are in tests/core/test_state.py.
"""

from __future__ import annotations

import pytest

from capmon.core.control.decisions import overload_is_news
from capmon.core.control.limiter import AdaptiveLimiter, Budget, LimiterView, Slot, TokenBucket
from capmon.core.control.policy import LimiterSignal
from capmon.core.types.config import LimiterConfig
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.unit

OK, OVERLOAD, NEUTRAL = LimiterSignal.OK, LimiterSignal.OVERLOAD, LimiterSignal.NEUTRAL


def limiter(
    initial: int = 8, min: int = 1, max: int = 64, decrease: float = 0.5, max_limit: int | None = None
) -> AdaptiveLimiter:
    return AdaptiveLimiter(LimiterConfig(initial=initial, min=min, max=max, decrease=decrease), max_limit)


def is_news(lim: AdaptiveLimiter, slot: Slot) -> bool:
    """Whether an overload of ``slot`` would be news (sent since the last cut), as a settle
    decides it (decisions.overload_is_news, over the limiter's epoch)."""
    return overload_is_news(OVERLOAD, slot.epoch, lim.epoch)


def fill(lim: AdaptiveLimiter) -> list[Slot]:
    """Take every free slot."""
    return [lim.take() for _ in range(lim.room())]


def drain(lim: AdaptiveLimiter, slots: list[Slot]) -> None:
    """End everything still held without teaching the limiter anything."""
    while slots:
        lim.release(slots.pop(), NEUTRAL)


def learned(capacity: int) -> AdaptiveLimiter:
    """A limiter whose first rejection taught it ``capacity``, with nothing in flight."""
    lim = limiter(initial=capacity + 1)
    slots = fill(lim)
    assert lim.release(slots.pop(), OVERLOAD)
    drain(lim, slots)
    assert (lim.limit, lim.capacity, lim.in_flight) == (capacity, capacity, 0)
    return lim


def successes_to_grow(lim: AdaptiveLimiter) -> tuple[int, list[Slot]]:
    """Keep the limiter full of requests that succeed, while work waits for more room,
    until one more slot opens. Returns how many successes that took, and the slots
    still held."""
    held = fill(lim)
    start = int(lim.limit)
    n = 0
    while int(lim.limit) <= start:
        lim.release(held.pop(0), OK, pressed=True)
        n += 1
        held.append(lim.take())
    return n, held


# ------------------------------------------------------------------ slots


def test_starts_at_initial_and_admits_up_to_the_limit() -> None:
    lim = limiter(initial=4)
    assert lim.limit == 4.0 and lim.room() == 4
    slots = fill(lim)
    assert [s.position for s in slots] == [1, 2, 3, 4] and {s.epoch for s in slots} == {0}
    assert lim.in_flight == 4 and lim.room() == 0
    assert lim.view() == LimiterView(limit=4.0, in_flight=4, capacity=None, min=1, max=64)


def test_max_limit_caps_the_config_max() -> None:
    lim = limiter(initial=8, max=64, max_limit=3)
    assert (lim.limit, lim.max) == (3.0, 3)
    assert limiter(max_limit=0).max == 64  # 0 is "no cap", as in ModelConfig.max_concurrency
    tiny = limiter(initial=1, min=2, max=64, max_limit=1)
    assert (tiny.min, tiny.max, tiny.limit) == (1, 1, 1.0)


def test_room_under_a_ramp_cap() -> None:
    lim = limiter(initial=8)
    assert (lim.room(2), lim.room(2.5), lim.room(100), lim.room(None)) == (2, 2, 8, 8)
    held = [lim.take() for _ in range(3)]
    assert lim.room(2) == 0 and lim.room() == 5  # never negative
    drain(lim, held)


def test_a_neutral_outcome_changes_nothing_but_frees_the_slot() -> None:
    lim = limiter(initial=4)
    slots = fill(lim)
    assert lim.release(slots[-1], NEUTRAL) is False
    assert lim.limit == 4.0 and lim.in_flight == 3 and lim.capacity is None and lim.cuts == 0


def test_release_without_take_raises_and_never_goes_negative() -> None:
    lim = limiter()
    with pytest.raises(RuntimeError):
        lim.release(Slot(1, 0), OK)
    assert lim.in_flight == 0


# ------------------------------------------------------------------ slow start


def test_slow_start_adds_two_per_success_so_the_limit_triples_each_round_trip() -> None:
    lim = limiter(initial=4)
    slots = fill(lim)
    for _ in range(4):  # one round trip: each of the four slots completes and is reused
        assert lim.release(slots.pop(0), OK) is False
        slots.extend(lim.take() for _ in range(lim.room()))
    assert lim.limit == 12.0 and lim.capacity is None


def test_slow_start_grows_a_limit_half_in_use_whether_or_not_work_waits() -> None:
    lim = limiter(initial=8)
    for _ in range(100):
        lim.release(lim.take(), OK)  # 1 of 8 in use: says nothing about capacity
    assert lim.limit == 8.0
    held = [lim.take() for _ in range(4)]
    lim.release(held.pop(), OK)  # half of it in use counts as used: the limit is only a guess yet
    assert lim.limit == 10.0


def test_a_learned_limit_grows_only_while_work_waits_for_more() -> None:
    lim = learned(8)
    held = [lim.take() for _ in range(8)]
    for _ in range(100):  # all 8 in use, but nothing else wants the target
        lim.release(held.pop(0), OK)
        held.append(lim.take())
    assert lim.limit == 8.0
    lim.release(held.pop(), OK, pressed=True)  # work was turned away by the full limit
    assert lim.limit == 8.125  # one round trip (8 answers) asks for one slot more


def test_slow_start_stops_at_max() -> None:
    lim = limiter(initial=2, max=4)
    for _ in range(200):
        slots = fill(lim)
        for s in slots:
            lim.release(s, OK, pressed=True)
    assert lim.limit == 4.0


# ------------------------------------------------------------------ learning the capacity


def test_a_rejection_that_is_news_at_position_p_says_the_target_holds_p_minus_1() -> None:
    lim = limiter(initial=8)
    slots = fill(lim)
    assert lim.release(slots[5], OVERLOAD) is True  # position 6
    assert (lim.limit, lim.capacity, lim.cuts) == (5.0, 5, 1)
    assert lim.view() == LimiterView(limit=5.0, in_flight=7, capacity=5, min=1, max=64)


def test_echoes_of_a_cut_change_nothing() -> None:
    lim = limiter(initial=8)
    slots = fill(lim)
    first = slots.pop(5)
    assert is_news(lim, first)
    lim.release(first, OVERLOAD)
    assert not any(is_news(lim, s) for s in slots)  # all sent before the cut
    for s in slots:
        assert lim.release(s, OVERLOAD) is False
    assert (lim.limit, lim.capacity, lim.cuts, lim.in_flight) == (5.0, 5, 1, 0)
    assert is_news(lim, lim.take())  # sent after it: news again


def test_over_the_limit_after_a_cut_waits_for_completions() -> None:
    lim = limiter(initial=8)
    slots = fill(lim)
    lim.release(slots.pop(), OVERLOAD)  # limit 7, 7 still in flight
    assert lim.room() == 0
    lim.release(slots.pop(), NEUTRAL)
    assert lim.room() == 1


def test_more_rejections_in_a_row_below_the_capacity_cut_multiplicatively() -> None:
    lim = learned(5)
    slots = fill(lim)  # positions 1..5, sent after the cut
    assert lim.release(slots.pop(3), OVERLOAD) is True  # position 4: someone else is taking room too
    assert (lim.limit, lim.capacity) == (2.5, 2)  # 5 * 0.5, not 3
    drain(lim, slots)
    slots = fill(lim)
    assert lim.release(slots.pop(), OVERLOAD) is True  # position 2
    assert (lim.limit, lim.capacity) == (1.0, 1)  # min(1, 2.5 * 0.5)
    assert lim.cuts == 3


def test_a_success_between_rejections_makes_the_next_one_exact_again() -> None:
    lim = learned(5)
    lim.release(lim.take(), OK)
    slots = fill(lim)
    lim.release(slots.pop(3), OVERLOAD)  # position 4
    assert (lim.limit, lim.capacity) == (3.0, 3)


def test_cuts_stop_at_min() -> None:
    lim = limiter(initial=8, min=3)
    for _ in range(10):
        slots = fill(lim)
        lim.release(slots.pop(0), OVERLOAD)  # position 1: "holds nothing"
        drain(lim, slots)
    assert lim.limit == 3.0 and lim.capacity == 3


def test_at_the_learned_capacity_it_asks_for_one_more_slot_once_a_round_trip() -> None:
    lim = learned(4)
    n, held = successes_to_grow(lim)
    assert n == 5  # about one round trip at the limit (1/4 + 1/4.25 + ...), then one request goes above it
    assert lim.capacity == 4
    drain(lim, held)


def test_growth_at_the_capacity_needs_work_waiting() -> None:
    lim = learned(4)
    held = fill(lim)
    for _ in range(50):
        lim.release(held.pop(0), OK)
        held.append(lim.take())
    assert lim.limit == 4.0


def test_each_refused_ask_above_the_capacity_doubles_the_patience_up_to_a_cap() -> None:
    lim = learned(4)
    counts = []
    for _ in range(6):
        n, held = successes_to_grow(lim)
        counts.append(n)
        probe = lim.take()
        assert probe.position == 5
        assert lim.release(probe, OVERLOAD) is True  # refused: back to what it holds
        assert (lim.limit, lim.capacity) == (4.0, 4)
        drain(lim, held)
    assert counts[:3] == [5, 9, 18]  # about 1, 2 and 4 round trips of 4 answers
    assert counts[2:] == [18] * 4  # capped: one refused ask per 4 round trips at most


def test_an_ask_served_starts_a_climb_that_doubles_each_round_trip() -> None:
    lim = learned(4)
    _, held = successes_to_grow(lim)
    ask = lim.take()
    assert ask.position == 5
    lim.release(ask, OK, pressed=True)
    assert lim.capacity == 5  # the target holds more than it did
    held.append(lim.take())
    for _ in range(len(held)):  # one round trip of clean answers at the limit
        lim.release(held.pop(0), OK, pressed=True)
        held.extend(lim.take() for _ in range(lim.room()))
    assert lim.limit >= 9.0 and lim.capacity >= 5
    drain(lim, held)


def test_a_refused_climb_keeps_what_was_in_flight_and_asks_again_after_a_round_trip() -> None:
    lim = learned(4)
    _, held = successes_to_grow(lim)
    lim.release(lim.take(), OK, pressed=True)  # served at 5: climbing
    drain(lim, held)
    held = fill(lim)
    assert [s.position for s in held][-1] == int(lim.limit)
    top = held.pop()
    lim.release(top, OVERLOAD)  # refused at the top: the target holds what was below it
    assert (lim.limit, lim.capacity) == (top.position - 1, top.position - 1)
    drain(lim, held)
    n, held = successes_to_grow(lim)
    assert n == top.position  # the patience starts again at about one round trip
    drain(lim, held)


# ------------------------------------------------------------------ a ceiling remembered from before a drop


def dropped(before: int, after: int) -> AdaptiveLimiter:
    """A limiter that had learned ``before`` when a rejection at ``after + 1`` said the
    target holds only ``after`` now, with nothing in flight."""
    lim = learned(before)
    slots = fill(lim)
    assert lim.release(slots.pop(after), OVERLOAD) is True  # position after + 1
    drain(lim, slots)
    assert (lim.limit, lim.capacity, lim.learned().ceiling) == (after, after, before)
    return lim


def refuse_ask(lim: AdaptiveLimiter) -> int:
    """Work waits: the limiter asks for one slot more, and the target refuses it. Returns
    how many clean answers the ask waited for."""
    n, held = successes_to_grow(lim)
    ask = lim.take()
    assert lim.asks(ask)
    assert lim.release(ask, OVERLOAD) is True
    drain(lim, held)
    return n


def test_below_a_remembered_ceiling_every_refused_ask_is_followed_by_another_a_round_trip_later() -> None:
    lim = dropped(24, 12)
    counts, ceilings = [], []
    for _ in range(7):
        counts.append(refuse_ask(lim))
        ceilings.append(lim.learned().ceiling)
        assert (lim.limit, lim.capacity) == (12.0, 12)
    # Each refusal halves the distance to the ceiling; once it is gone the patience
    # doubles as for any learned capacity (MAX_HOLD): log2(12) + 2 asks a round trip apart.
    assert ceilings == [18, 15, 13, 0, 0, 0, 0]
    one, two, four = counts[0], counts[5], counts[6]
    assert counts[:5] == [one] * 5 and one <= 13  # about one round trip of 12 answers each
    assert two > 1.8 * one and four > 3.6 * one


def test_a_limit_learned_at_12_below_a_remembered_24_climbs_back_once_an_ask_is_served() -> None:
    lim = dropped(24, 12)
    refuse_ask(lim)  # still 12
    n, held = successes_to_grow(lim)  # a round trip later, the next ask ...
    assert n <= 13
    ask = lim.take()
    lim.release(ask, OK, pressed=True)  # ... is served: the target has room again
    assert lim.capacity == 13
    rounds = 0
    while lim.limit < 24:  # round trips of clean answers, work waiting
        rounds += 1
        held.extend(lim.take() for _ in range(lim.room()))
        for _ in range(len(held)):
            lim.release(held.pop(0), OK, pressed=True)
            held.extend(lim.take() for _ in range(lim.room()))
    assert rounds == 1  # the climb triples per round trip: 13 and more, within one
    drain(lim, held)
    held = fill(lim)
    assert lim.release(held.pop(24), OVERLOAD) is True  # the climb's top: the target holds 24
    assert (lim.limit, lim.capacity, lim.learned().ceiling) == (24.0, 24, 0)  # back: forgotten
    drain(lim, held)


def test_below_a_ceiling_nothing_grows_with_nothing_pressing() -> None:
    lim = dropped(24, 12)
    held = fill(lim)
    for _ in range(200):
        lim.release(held.pop(0), OK)
        held.append(lim.take())
    assert (lim.limit, lim.capacity, lim.learned().ceiling) == (12.0, 12, 24)
    drain(lim, held)


def test_a_permanent_drop_costs_a_bounded_number_of_refused_asks() -> None:
    # 500 round trips at 6 of a remembered 48, work waiting all along: the asks a round trip
    # apart are log2(42) + 2, then one per MAX_HOLD round trips as at any learned capacity.
    lim = dropped(48, 6)
    answers = refused = 0
    while answers < 500 * 6:
        answers += refuse_ask(lim) + 1
        refused += 1
    assert lim.learned().ceiling == 0
    assert refused <= 500 / 4 + 8
    steady = learned(6)
    answers = refused_steady = 0
    while answers < 500 * 6:
        answers += refuse_ask(steady) + 1
        refused_steady += 1
    assert refused - refused_steady <= 8


def test_a_ceiling_is_only_what_the_target_held_before_a_drop() -> None:
    lim = learned(8)
    refuse_ask(lim)  # a refused ask at the capacity: no drop, no ceiling
    assert lim.learned().ceiling == 0
    lim = limiter(initial=8)  # before anything is learned, a first rejection remembers nothing
    slots = fill(lim)
    lim.release(slots.pop(3), OVERLOAD)
    drain(lim, slots)
    assert (lim.capacity, lim.learned().ceiling) == (3, 0)


# ------------------------------------------------------------------ an outage is not a capacity signal


def test_restore_forgets_what_a_failure_streak_taught() -> None:
    lim = learned(6)
    lim.checkpoint()
    for _ in range(3):  # the outage: every request rejected
        slots = fill(lim)
        assert lim.release(slots.pop(0), OVERLOAD)
        drain(lim, slots)
    assert lim.limit == 1.0
    late = lim.take()  # sent during the outage, still in flight when the breaker trips
    lim.restore()
    assert (lim.limit, lim.capacity) == (6.0, 6)
    assert not is_news(lim, late) and lim.release(late, OVERLOAD) is False  # an echo of the outage
    assert lim.limit == 6.0
    slots = fill(lim)
    lim.release(slots.pop(), OVERLOAD)  # the next news is exact: the streak was forgotten too
    assert (lim.limit, lim.capacity) == (5.0, 5)


def test_restore_brings_back_the_patience() -> None:
    lim = learned(4)
    first, held = successes_to_grow(lim)
    drain(lim, held)
    lim = learned(4)
    lim.checkpoint()
    for _ in range(3):
        _, held = successes_to_grow(lim)
        lim.release(lim.take(), OVERLOAD)
        drain(lim, held)
    lim.restore()
    again, held = successes_to_grow(lim)
    assert again == first


def test_restore_without_a_checkpoint_does_nothing_and_a_checkpoint_is_used_once() -> None:
    lim = learned(5)
    slot = lim.take()
    lim.restore()
    assert (lim.limit, lim.capacity) == (5.0, 5) and is_news(lim, slot)
    lim.checkpoint()
    lim.restore()
    drain(lim, [slot])
    slots = fill(lim)
    lim.release(slots.pop(1), OVERLOAD)  # learns 1
    drain(lim, slots)
    lim.restore()  # the checkpoint is spent: what was learned since stays
    assert (lim.limit, lim.capacity) == (1.0, 1)


# ------------------------------------------------------------------ token bucket


def test_token_bucket_starts_full_and_refills_at_the_rate() -> None:
    clock = ManualClock()
    rpm = TokenBucket(60, clock)  # one per second, burst of one minute
    for _ in range(60):
        assert rpm.try_take(1)
    assert not rpm.try_take(1)
    assert rpm.available_at(1) == pytest.approx(clock.now() + 1)
    assert rpm.available_at(5) == pytest.approx(clock.now() + 5)
    clock.advance(0.5)
    assert not rpm.try_take(1)
    clock.advance(0.5)
    assert rpm.try_take(1)
    clock.advance(3600)
    assert rpm.available == 60  # never more than the burst


def test_token_bucket_waiting_until_available_at_is_enough() -> None:
    clock = ManualClock()
    tpm = TokenBucket(10_000, clock, burst=1000)
    assert tpm.try_take(1000)
    at = tpm.available_at(333.3)
    clock.advance(at - clock.now())
    assert tpm.try_take(333.3)


def test_token_bucket_refund() -> None:
    clock = ManualClock()
    tpm = TokenBucket(6000, clock)
    assert tpm.try_take(4096)  # charged max_tokens up front
    tpm.refund(4096 - 300)  # the reply used 300
    assert tpm.available == pytest.approx(6000 - 300)
    tpm.refund(10_000)
    assert tpm.available == 6000  # capped
    with pytest.raises(ValueError):
        tpm.refund(-1)


def test_token_bucket_request_larger_than_the_bucket_waits_for_a_full_bucket() -> None:
    clock = ManualClock()
    tpm = TokenBucket(600, clock)  # 10 per second
    assert tpm.try_take(100)
    assert tpm.available_at(1000) == pytest.approx(clock.now() + 10)  # until full, not forever
    clock.advance(10)
    assert tpm.try_take(1000)
    assert tpm.available == pytest.approx(-400)  # in debt: the next request waits longer
    assert tpm.available_at(1) == pytest.approx(clock.now() + 40.1)


def test_token_bucket_survives_a_clock_that_goes_back() -> None:
    clock = ManualClock()
    rpm = TokenBucket(60, clock)
    assert rpm.try_take(60)
    clock.advance(-100)  # a fresh fast-forwarded loop starts its own time
    assert rpm.available == 0
    clock.advance(1)
    assert rpm.available == pytest.approx(1)


def test_token_bucket_rejects_bad_arguments() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        TokenBucket(0, clock)
    with pytest.raises(ValueError):
        TokenBucket(60, clock, burst=0)
    with pytest.raises(ValueError):
        TokenBucket(60, clock).try_take(-1)
    with pytest.raises(ValueError):
        TokenBucket(60, clock).available_at(float("nan"))


# ------------------------------------------------------------------ retry budget


def test_budget_allows_the_minimum_then_ratio_per_request() -> None:
    budget = Budget(0.2, min_tokens=10)
    assert all(budget.try_spend() for _ in range(10))
    assert not budget.try_spend()
    for _ in range(5):
        budget.on_request()
    assert budget.try_spend()  # five first attempts earn one retry
    assert not budget.try_spend()
    assert (budget.requests, budget.retries, budget.refused) == (5, 11, 2)


def test_budget_does_not_bank_an_unbounded_burst() -> None:
    budget = Budget(0.5, min_tokens=10, max_tokens=20)
    for _ in range(1000):
        budget.on_request()
    assert budget.balance == 20


def test_budget_never_allows_more_than_min_plus_ratio_per_request() -> None:
    budget = Budget(0.1, min_tokens=10)
    for i in range(10_000):
        budget.on_request()
        if i % 2:
            budget.try_spend()
        assert budget.retries <= 10 + 0.1 * budget.requests + 1e-9


def test_budget_rejects_negative_arguments() -> None:
    with pytest.raises(ValueError):
        Budget(-0.1)
    with pytest.raises(ValueError):
        Budget(0.1, min_tokens=-1)
