from __future__ import annotations

import asyncio
import time

import pytest

from capmon.core.clock import LoopClock, ManualClock
from capmon.core.config import LimiterConfig
from capmon.core.limiter import AdaptiveLimiter, Budget, LimiterView, Outcome, TokenBucket


def limiter(initial: int = 8, min: int = 1, max: int = 64, decrease: float = 0.5, max_limit: int | None = None) -> AdaptiveLimiter:
    return AdaptiveLimiter(LimiterConfig(initial=initial, min=min, max=max, decrease=decrease), ManualClock(), max_limit)


def fill(lim: AdaptiveLimiter) -> int:
    n = 0
    while lim.try_acquire():
        n += 1
    return n


# ------------------------------------------------------------------ AIMD


def test_starts_at_initial_and_admits_up_to_the_limit() -> None:
    lim = limiter(initial=4)
    assert lim.limit == 4.0
    assert fill(lim) == 4
    assert lim.in_flight == 4 and not lim.has_room()
    assert lim.view() == LimiterView(limit=4.0, in_flight=4, waiting=0, min=1, max=64)


def test_max_limit_caps_the_config_max() -> None:
    lim = limiter(initial=8, max=64, max_limit=3)
    assert (lim.limit, lim.max) == (3.0, 3)
    assert limiter(max_limit=0).max == 64  # 0 is "no cap", as in ModelConfig.max_concurrency
    tiny = limiter(initial=1, min=2, max=64, max_limit=1)
    assert (tiny.min, tiny.max, tiny.limit) == (1, 1, 1.0)


def test_slow_start_doubles_the_limit_each_round_trip_until_the_first_overload() -> None:
    lim = limiter(initial=4)
    fill(lim)
    for _ in range(4):  # one round trip of successes
        lim.release("ok")
        lim.try_acquire()
    assert lim.limit == 8.0
    fill(lim)
    lim.release("overload")
    assert lim.limit == 4.0  # from now on: additive increase


def test_additive_increase_is_one_per_round_trip_of_successes() -> None:
    lim = limiter(initial=8)
    fill(lim)
    lim.release("overload")  # leaves slow start: limit 4, three echoes still in flight
    for _ in range(7):
        lim.release("neutral")
    assert lim.limit == 4.0 and lim.in_flight == 0
    fill(lim)
    for _ in range(4):  # one round trip: every slot completes once and is reused
        lim.release("ok")
        lim.try_acquire()
    assert 4.9 < lim.limit < 5.0  # 1/4 + 1/4.25 + 1/4.48 + 1/4.7
    lim.release(Outcome.OK)
    assert lim.limit > 5.0
    assert fill(lim) == 2 and lim.in_flight == 5  # int(limit) == 5 now


def test_limit_that_is_not_used_does_not_grow() -> None:
    lim = limiter(initial=8)
    for _ in range(100):
        assert lim.try_acquire()
        lim.release("ok")  # 1 of 8 in use: the limit says nothing about capacity
    assert lim.limit == 8.0


def test_increase_stops_at_max() -> None:
    lim = limiter(initial=2, max=4)
    for _ in range(200):
        fill(lim)
        lim.release("ok")
    assert lim.limit == 4.0


def test_multiplicative_decrease_at_most_once_per_round_trip() -> None:
    lim = limiter(initial=8)
    assert fill(lim) == 8
    lim.release("overload")
    assert lim.limit == 4.0
    for _ in range(7):  # the other seven were sent at the old limit: no further decrease
        lim.release("overload")
    assert lim.limit == 4.0 and lim.decreases == 1
    assert fill(lim) == 4  # a new round trip at the new limit
    lim.release("overload")
    assert lim.limit == 2.0 and lim.decreases == 2


def test_decrease_stops_at_min() -> None:
    lim = limiter(initial=8, min=3)
    for _ in range(10):
        fill(lim)
        while lim.in_flight:
            lim.release("overload")
    assert lim.limit == 3.0


def test_neutral_outcome_changes_nothing_but_frees_the_slot() -> None:
    lim = limiter(initial=4)
    fill(lim)
    lim.release("neutral")
    assert lim.limit == 4.0 and lim.in_flight == 3


def test_unknown_outcome_frees_the_slot_then_raises() -> None:
    lim = limiter()
    lim.try_acquire()
    with pytest.raises(ValueError, match="unknown outcome"):
        lim.release("capacity")
    assert lim.in_flight == 0


def test_release_without_acquire_raises_and_never_goes_negative() -> None:
    lim = limiter()
    with pytest.raises(RuntimeError):
        lim.release("ok")
    assert lim.in_flight == 0


def test_over_limit_after_decrease_waits_for_completions() -> None:
    lim = limiter(initial=8)
    fill(lim)
    lim.release("overload")  # limit 4, 7 still in flight
    assert not lim.try_acquire()
    for _ in range(3):
        lim.release("neutral")
    assert not lim.try_acquire()  # 4 in flight, limit 4
    lim.release("neutral")
    assert lim.try_acquire()


# ------------------------------------------------------------------ waiting (asyncio)


@pytest.mark.looptime
async def test_waiters_are_served_first_come_first_served() -> None:
    lim = AdaptiveLimiter(LimiterConfig(initial=1, min=1, max=1), LoopClock())
    await lim.acquire()
    order: list[int] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(i * 0.01)  # queue in the order 0, 1, 2, ...
        await lim.acquire()
        order.append(i)
        await asyncio.sleep(1)
        lim.release("neutral")

    tasks = [asyncio.create_task(worker(i)) for i in range(5)]
    await asyncio.sleep(0.5)
    assert lim.waiting == 5
    assert not lim.try_acquire()  # no jumping the queue
    lim.release("neutral")
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]
    assert lim.in_flight == 0 and lim.waiting == 0


@pytest.mark.looptime
async def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    lim = AdaptiveLimiter(LimiterConfig(initial=1, min=1, max=1), LoopClock())
    await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(1)
    assert lim.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert lim.waiting == 0
    lim.release("ok")
    assert lim.in_flight == 0
    assert lim.try_acquire()


@pytest.mark.looptime
async def test_waiter_cancelled_just_after_being_handed_a_slot_gives_it_back() -> None:
    lim = AdaptiveLimiter(LimiterConfig(initial=1, min=1, max=1), LoopClock())
    await lim.acquire()
    first = asyncio.create_task(lim.acquire())
    second = asyncio.create_task(lim.acquire())
    await asyncio.sleep(1)
    lim.release("neutral")  # hands the slot to `first`, which has not run yet
    assert lim.in_flight == 1
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, timeout=1)  # the slot went on to the next in line
    assert lim.in_flight == 1 and lim.waiting == 0
    lim.release("neutral")
    assert lim.in_flight == 0


@pytest.mark.looptime
async def test_wait_for_room_wakes_when_a_slot_frees() -> None:
    clock = LoopClock()
    lim = AdaptiveLimiter(LimiterConfig(initial=1, min=1, max=1), clock)
    await lim.wait_for_room()  # room now: returns at once
    assert lim.try_acquire()

    async def finish_later() -> None:
        await asyncio.sleep(30)
        lim.release("ok")

    asyncio.create_task(finish_later())
    t0 = clock.now()
    started = time.perf_counter()
    await lim.wait_for_room()
    assert clock.now() - t0 == pytest.approx(30)
    assert lim.has_room() and lim.in_flight == 0  # wait_for_room takes no slot
    assert time.perf_counter() - started < 2.0


@pytest.mark.looptime
async def test_cancelled_wait_for_room_leaves_nothing_behind() -> None:
    lim = AdaptiveLimiter(LimiterConfig(initial=1, min=1, max=1), LoopClock())
    assert lim.try_acquire()
    task = asyncio.create_task(lim.wait_for_room())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lim._room_waiters == []
    lim.release("ok")
    assert lim.has_room()


@pytest.mark.looptime
async def test_many_workers_never_exceed_the_limit() -> None:
    lim = AdaptiveLimiter(LimiterConfig(initial=4, min=1, max=4), LoopClock())
    peak = 0

    async def worker(i: int) -> None:
        nonlocal peak
        for _ in range(5):
            await lim.acquire()
            peak = max(peak, lim.in_flight)
            await asyncio.sleep(0.1 + (i % 3) * 0.05)
            lim.release("ok")

    await asyncio.gather(*(worker(i) for i in range(20)))
    assert peak == 4 and lim.in_flight == 0 and lim.waiting == 0


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


def test_token_bucket_rejects_bad_arguments() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        TokenBucket(0, clock)
    with pytest.raises(ValueError):
        TokenBucket(60, clock, burst=0)
    with pytest.raises(ValueError):
        TokenBucket(60, clock).try_take(-1)


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
