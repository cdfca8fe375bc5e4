from __future__ import annotations

import random
import threading

import pytest

from capmon.core.control.backoff import Backoff
from capmon.core.types import events as ev
from capmon.core.types.config import BackoffConfig
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.stats import Outcome, RollingStats

pytestmark = pytest.mark.unit

CAPACITY = Failure(Kind.CAPACITY, "overloaded", 503)


def waits_at(b: Backoff, n: int, failure: Failure, times: int) -> list[float]:
    """The wait after the ``n``-th failure of ``times`` fresh requests."""
    out = []
    for _ in range(times):
        s = b.schedule()
        for _ in range(n - 1):
            s.next_wait(failure)
        out.append(s.next_wait(failure))
    return out


def test_full_jitter_stays_under_the_capped_exponential() -> None:
    b = Backoff(BackoffConfig(base=0.5, cap=8.0), random.Random(1))
    assert [b.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    for n in range(1, 10):
        waits = waits_at(b, n, CAPACITY, 200)
        assert all(0 <= w <= b.ceiling(n) for w in waits)
        assert min(waits) < b.ceiling(n) * 0.2  # full jitter reaches near zero


def test_a_hint_is_a_floor_with_spread() -> None:
    b = Backoff(BackoffConfig(hint_spread=0.5), random.Random(2))
    waits = waits_at(b, 1, Failure(Kind.RATE_LIMITED, "slow down", 429, retry_after=2.0), 500)
    assert all(2.0 <= w <= 3.0 for w in waits)
    assert max(waits) - min(waits) > 0.8  # clients told the same number spread out


def test_transient_waits_are_short() -> None:
    b = Backoff(BackoffConfig(base=0.5, cap=30, transient_cap=5), random.Random(3))
    assert b.ceiling(10, Kind.TRANSIENT) == 5.0


def test_rolling_windows_and_sparkline() -> None:
    s = RollingStats()
    for second in range(300):
        s.record(1000.0 + second, Outcome.OK, 0.1)
        if second % 10 == 0:
            s.record(1000.0 + second, Outcome.CAPACITY)
        if second % 30 == 0:
            s.record(1000.0 + second, Outcome.RATE_LIMITED)
    now = 1299.5
    w10, w60, w300 = s.windows(now)
    assert (w10.ok, w60.ok, w300.ok) == (10, 60, 300)
    assert w60.capacity == 6 and w60.rate_limited == 2
    assert w300.p50 == 0.1
    spark = s.spark(now)
    assert len(spark) == 24 and sum(spark) == 12 + 4
    assert s.window(now + 1000, 60).requests == 0  # old buckets drop out


def test_bus_delivers_to_every_subscriber_from_many_threads_and_survives_a_broken_one() -> None:
    bus = ev.EventBus(history=10)
    got: list[ev.Event] = []
    lock = threading.Lock()

    def good(e: ev.Event) -> None:
        with lock:
            got.append(e)

    def broken(e: ev.Event) -> None:
        raise RuntimeError("boom")

    bus.subscribe(broken)
    unsubscribe = bus.subscribe(good)

    def worker(n: int) -> None:
        for i in range(500):
            bus.publish(ev.Notice(at=float(i), wall=0.0, level="info", message=f"{n}-{i}"))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2000 and bus.published == 2000 and bus.subscriber_errors == 2000
    assert len(bus.recent()) == 10
    unsubscribe()
    bus.publish(ev.Notice(at=0.0, wall=0.0, level="info", message="after"))
    assert len(got) == 2000
