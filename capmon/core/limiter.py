"""How much to send to a target: adaptive concurrency, rpm / tpm buckets, retry budget.

* :class:`AdaptiveLimiter` keeps a concurrency limit per target that adapts by AIMD:
  +1 per round trip of successes, times ``decrease`` on a capacity or rate-limit
  error, at most once per round trip. Requests over the limit queue locally (FIFO),
  so a full model turns into waiting instead of rejected requests.
* :class:`TokenBucket` is an rpm or tpm bucket that charges up front (tpm charges
  ``max_tokens``; :meth:`TokenBucket.refund` gives back what a request did not use).
* :class:`Budget` bounds transient retries to a share of first attempts, so a
  flaky upstream does not turn into a retry storm.

None of these are thread-safe: use them from the thread that runs the event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass
from enum import Enum

from capmon.core.clock import Clock
from capmon.core.config import LimiterConfig


class Outcome(str, Enum):
    """What a finished request tells the limiter. Plain strings work too."""

    OK = "ok"  # answered: additive increase
    OVERLOAD = "overload"  # capacity or rate_limited: multiplicative decrease
    NEUTRAL = "neutral"  # anything else: no change


@dataclass(frozen=True, slots=True)
class LimiterView:
    limit: float
    in_flight: int
    waiting: int
    min: int
    max: int


class AdaptiveLimiter:
    """AIMD concurrency limit with a FIFO queue.

    ``max_limit`` (a model's ``max_concurrency``) lowers ``config.max``; None or 0
    means no extra cap.
    """

    def __init__(self, config: LimiterConfig, clock: Clock, max_limit: int | None = None) -> None:
        hi = config.max if not max_limit else min(config.max, max_limit)
        self.max = max(1, hi)
        self.min = min(config.min, self.max)
        self.decrease = config.decrease
        self._clock = clock  # kept for symmetry with the other per-target parts
        self._limit = float(min(max(config.initial, self.min), self.max))
        self._in_flight = 0
        # FIFO waiters in acquire(); a woken waiter already holds its slot.
        self._waiters: deque[asyncio.Future[None]] = deque()
        # wait_for_room() callers (a router watching several targets); no slot held.
        self._room_waiters: list[asyncio.Future[None]] = []
        # Completions still owed by requests that were in flight at the last
        # decrease: their overloads describe the old limit, so they do not count.
        self._before_decrease = 0
        self.decreases = 0
        self._slow_start = True

    # ------------------------------------------------------------ reading

    @property
    def limit(self) -> float:
        return self._limit

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def waiting(self) -> int:
        # Cancelled waiters may sit in the deque until their task runs; not counted.
        return sum(1 for f in self._waiters if not f.done())

    def has_room(self) -> bool:
        """Whether ``try_acquire()`` would succeed now."""
        return self._in_flight < int(self._limit) and self.waiting == 0

    def view(self) -> LimiterView:
        return LimiterView(self._limit, self._in_flight, self.waiting, self.min, self.max)

    # ------------------------------------------------------------ slots

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody is queued ahead (keeps FIFO fair)."""
        if not self.has_room():
            return False
        self._in_flight += 1
        return True

    async def acquire(self) -> None:
        """Wait, first come first served, for a slot. Cancelling the wait never
        leaks a slot."""
        if self.try_acquire():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self._in_flight -= 1
            else:
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass
            self._wake()
            raise

    async def wait_for_room(self) -> None:
        """Return once ``has_room()`` is True. Takes no slot: the caller must still
        ``try_acquire()`` and may lose the race, so call it in a loop."""
        if self.has_room():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._room_waiters.append(fut)
        try:
            await fut
        finally:
            if fut in self._room_waiters:
                self._room_waiters.remove(fut)

    def release(self, outcome: Outcome | str) -> bool:
        """Free a slot and adapt the limit to how the request ended.

        Returns True when an overload was taken as news (the limit decreased), False
        for an echo of one already acted on: the router counts only news toward the
        breaker, so a model that is merely full is not mistaken for one that is down.
        """
        if self._in_flight <= 0:
            raise RuntimeError("release() without a matching acquire()")
        try:
            kind = Outcome(outcome)
        except ValueError:
            kind = None  # still free the slot below, then complain
        busy = self._in_flight  # including the request that just ended
        self._in_flight -= 1
        old_request = self._before_decrease > 0
        if old_request:
            self._before_decrease -= 1
        if kind is Outcome.OK:
            # Only grow a limit that is being used: a limit that grew while traffic
            # was light would take several overloads to come back down.
            if busy >= self._limit / 2:
                # Slow start (as TCP): until the first overload the limit doubles every
                # round trip, so a model with room is found in a few round trips.
                step = 1.0 if self._slow_start else 1.0 / self._limit
                self._limit = min(float(self.max), self._limit + step)
        news = False
        if kind is Outcome.OVERLOAD and not old_request:
            self._limit = max(float(self.min), self._limit * self.decrease)
            self._before_decrease = self._in_flight
            self.decreases += 1
            self._slow_start = False
            news = True
        self._wake()
        if kind is None:
            raise ValueError(f"unknown outcome {outcome!r}; expected ok, overload or neutral")
        return news

    def _wake(self) -> None:
        while self._waiters and self._in_flight < int(self._limit):
            fut = self._waiters.popleft()
            if fut.done():  # cancelled while queued
                continue
            self._in_flight += 1
            fut.set_result(None)
        if self._room_waiters and self.has_room():
            waiters, self._room_waiters = self._room_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)


class TokenBucket:
    """A requests- or tokens-per-minute bucket that charges up front.

    Holds at most ``burst`` (default: one minute's worth) and refills continuously.
    A request larger than the whole bucket is let through when the bucket is full,
    leaving it in debt, so it is slowed down rather than refused forever.
    """

    def __init__(self, rate_per_minute: float, clock: Clock, burst: float | None = None) -> None:
        if not rate_per_minute > 0:
            raise ValueError(f"rate_per_minute must be > 0, got {rate_per_minute!r}")
        self.rate_per_minute = float(rate_per_minute)
        self._per_second = self.rate_per_minute / 60.0
        self.capacity = float(rate_per_minute if burst is None else burst)
        if not self.capacity > 0:
            raise ValueError(f"burst must be > 0, got {burst!r}")
        self._clock = clock
        self._tokens = self.capacity
        self._at = clock.now()

    @property
    def available(self) -> float:
        self._refill(self._clock.now())
        return self._tokens

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self._per_second)
        # A clock that went back (a fresh fast-forwarded loop) restarts from here.
        self._at = now

    def _need(self, amount: float) -> float:
        if amount < 0 or not math.isfinite(amount):
            raise ValueError(f"amount must be a finite number >= 0, got {amount!r}")
        return min(amount, self.capacity)

    def _enough(self, need: float) -> bool:
        # Tolerate float rounding, so waiting until available_at() is always enough.
        return self._tokens >= need - 1e-9 * max(1.0, need)

    def try_take(self, amount: float) -> bool:
        need = self._need(amount)
        self._refill(self._clock.now())
        if not self._enough(need):
            return False
        self._tokens -= amount
        return True

    def available_at(self, amount: float) -> float:
        """Clock time when ``try_take(amount)`` will succeed (if nobody else takes)."""
        need = self._need(amount)
        now = self._clock.now()
        self._refill(now)
        if self._enough(need):
            return now
        return now + (need - self._tokens) / self._per_second

    def refund(self, amount: float) -> None:
        """Give back tokens charged but not used (never above the bucket's size)."""
        if amount < 0 or not math.isfinite(amount):
            raise ValueError(f"refund must be a finite number >= 0, got {amount!r}")
        self._refill(self._clock.now())
        self._tokens = min(self.capacity, self._tokens + amount)


class Budget:
    """Retry budget: each first attempt earns ``ratio`` of a retry; a retry spends one.

    The balance starts at ``min_tokens`` so that a quiet client can still retry a
    little, and is capped at ``max_tokens`` (default ``max(min_tokens, 100)``) so a long
    calm period does not bank an unbounded burst of retries. Over any run, retries
    never exceed ``min_tokens + ratio * requests``.
    """

    def __init__(self, ratio: float, min_tokens: float = 10.0, max_tokens: float | None = None) -> None:
        if ratio < 0 or min_tokens < 0:
            raise ValueError("ratio and min_tokens must be >= 0")
        self.ratio = float(ratio)
        self.min_tokens = float(min_tokens)
        self.max_tokens = float(max(min_tokens, 100.0) if max_tokens is None else max(max_tokens, min_tokens))
        self._balance = self.min_tokens
        self.requests = 0
        self.retries = 0
        self.refused = 0

    @property
    def balance(self) -> float:
        return self._balance

    def on_request(self) -> None:
        """Call once per first attempt."""
        self.requests += 1
        self._balance = min(self.max_tokens, self._balance + self.ratio)

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when it is spent."""
        if self._balance >= 1.0 - 1e-9:  # five requests at 0.2 earn a whole retry
            self._balance = max(0.0, self._balance - 1.0)
            self.retries += 1
            return True
        self.refused += 1
        return False
