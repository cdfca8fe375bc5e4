"""How much to send to a target: adaptive concurrency, rpm / tpm buckets, retry budget.

* :class:`AdaptiveLimiter` learns a target's real concurrency from its answers. Every
  admission records its *position* (how many of our requests were in flight there,
  itself included) and the *epoch* (how many times the limit was cut) when it was
  sent. A rejection of a request sent before the last cut is an echo of that cut, not
  news, and changes nothing. A rejection that is news at position ``p`` says the
  target holds ``p - 1``: the limit goes straight there instead of halving, and that
  becomes the learned capacity. A full target therefore turns into local queueing,
  not into rejected requests.

  Before the first rejection the limit is a guess: it grows by two slots per clean answer
  while half of it is in use (slow start: it triples every round trip). Once a capacity
  is learned, the limit grows only while it is *pressed*: work that wanted this target
  was turned away by the full limit (it went to another target or waits) while the
  answer was out, and the answer came back clean. Nothing pressing,
  nothing grows: a limit above what is used would only be spent by the next burst, in
  rejections. Pressed, it climbs as TCP does after a loss (ARCHITECTURE.md, "The
  limiter"):

  - after a send above the learned capacity was served (the target has more room than
    it had: a recovery in steps), two slots more per clean answer, so the limit triples
    every round trip, as in slow start;
  - at the learned capacity, one slot more per ``hold`` round trips at the limit: one
    request sent above it asks whether the target has more room. Served, the climb
    above starts; refused (one rejection, the climb's whole cost), the limit goes back
    to what the target held and the next ask waits twice as long, up to ``MAX_HOLD`` (4)
    round trips. So a rise in capacity is found within a few round trips, and a steady
    one costs at most one rejection per 4 round trips;
  - below a *ceiling*, the capacity the target held before a rejection below it (a drop:
    a recovery in steps, someone else taking room), one ask every round trip: the room
    it had may come back, and the climb above returns there within a round trip of an
    ask served (as TCP's slow start returns to its threshold). Each refused ask lowers
    the ceiling half-way to what the target holds, and it is forgotten when nothing is
    left between them (or the capacity is back at it), so a drop that lasts costs about
    ``log2(ceiling - capacity) + 2`` asks a round trip apart before the patience doubles
    as above; a steady target never has a ceiling.
* :class:`TokenBucket` is an rpm or tpm bucket that charges up front (tpm charges
  ``max_tokens``; :meth:`TokenBucket.refund` gives back what a request did not use).
* :class:`Budget` bounds transient retries to a share of first attempts, so a flaky
  upstream does not turn into a retry storm.

None of these are thread-safe: use them from the thread that runs the event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from capmon.core.base.clock import Clock
from capmon.core.control.policy import LimiterSignal
from capmon.core.types.config import LimiterConfig

# Slow start and a climb: slots added per clean answer. Two, so the limit triples every
# round trip: growth is paced by answers, a round trip apart, while a rejection comes back
# at once, so a faster start costs about one rejection more at the top, not a round trip.
SLOW_START_STEP = 2.0
# Growth at the learned capacity while pressed: one more slot per HOLD round trips, doubled
# each time the target refutes it, up to MAX_HOLD round trips: a steady target costs one
# refused ask per MAX_HOLD round trips, 1 / (MAX_HOLD * limit) of its requests (1 % at 24
# slots, 3 % at 8). A hold of 0 is a climb: a send above the capacity was served.
_FIRST_HOLD = 1.0
MAX_HOLD = 4.0
_CLIMB = 0.0


def ceiling_after_refusal(ceiling: int, held: int) -> int:
    """A remembered ceiling after an ask below it was refused (the target holds ``held``):
    half-way down to what it holds, and forgotten (0) once that is all that is left."""
    lowered = held + (ceiling - held) // 2
    return lowered if lowered > held else 0


@dataclass(frozen=True, slots=True)
class Slot:
    """Where an admitted request stood when it was sent."""

    position: int  # our requests in flight at the target, itself included
    epoch: int  # the limiter's cut count when it was sent


@dataclass(frozen=True, slots=True)
class Learned:
    """What a limiter has learned, as a shared store keeps it for a fleet (capmon/fleet)."""

    limit: float
    capacity: int | None
    epoch: int
    hold: float = _FIRST_HOLD
    below: int = 0
    ceiling: int = 0  # what the target held before a drop, while still worth asking for (0: none)


@dataclass(frozen=True, slots=True)
class LimiterView:
    limit: float
    in_flight: int
    capacity: int | None  # the learned capacity; None until the first rejection
    min: int
    max: int


class AdaptiveLimiter:
    """``max_limit`` (a model's ``max_concurrency``) lowers ``config.max``; None or 0
    means no extra cap."""

    def __init__(self, config: LimiterConfig, max_limit: int | None = None) -> None:
        hi = config.max if not max_limit else min(config.max, max_limit)
        self.max = max(1, hi)
        self.min = min(config.min, self.max)
        self.decrease = config.decrease
        self.start = float(min(max(config.initial, self.min), self.max))  # the limit before any answer
        self._limit = self.start
        self._in_flight = 0
        self._capacity: int | None = None
        self._epoch = 0
        self._hold = _FIRST_HOLD
        self._below = 0  # rejections in a row below the learned capacity
        self._ceiling = 0  # what the target held before a drop, still worth asking for (0: none)
        self._saved: tuple[float, int | None, float] | None = None
        self.cuts = 0

    # ------------------------------------------------------------ reading

    @property
    def limit(self) -> float:
        return self._limit

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def epoch(self) -> int:
        """Cuts so far (and restores): a slot of an older epoch was sent before the last one."""
        return self._epoch

    def room(self, cap: float | None = None) -> int:
        """Free slots now; ``cap`` (a ramp's share of the limit) may lower the limit."""
        limit = self._limit if cap is None else min(self._limit, cap)
        return max(0, int(limit + 1e-9) - self._in_flight)

    def view(self) -> LimiterView:
        return LimiterView(self._limit, self._in_flight, self._capacity, self.min, self.max)

    # ------------------------------------------------------------ shared with a fleet

    def learned(self) -> Learned:
        return Learned(self._limit, self._capacity, self._epoch, self._hold, self._below, self._ceiling)

    def mirror(self, learned: Learned) -> None:
        """Take what a fleet learned together. A shared store runs this class's learning
        in its own script (capmon/fleet/lua/settle.lua, kept in step with ``release`` and
        ``_cut`` here: change both or neither); this limiter then mirrors the result and
        keeps counting only this process's own requests in flight."""
        self._limit = max(float(self.min), min(float(learned.limit), float(self.max)))
        self._capacity, self._epoch = learned.capacity, learned.epoch
        self._hold, self._below, self._ceiling = learned.hold, learned.below, learned.ceiling
        self._saved = None

    # ------------------------------------------------------------ slots

    def take(self) -> Slot:
        """Take a slot (the caller has checked :meth:`room`; a probe may take one anyway)."""
        self._in_flight += 1
        return Slot(self._in_flight, self._epoch)

    def asks(self, slot: Slot) -> bool:
        """Whether ``slot`` was taken above the learned capacity: an ask for more room."""
        return self._capacity is not None and slot.position > self._capacity

    def release(self, slot: Slot, signal: LimiterSignal, pressed: bool = False) -> bool:
        """Free a slot and learn from how the request ended. ``pressed``: work that wanted
        this target was turned away by the full limit while the request was out (a learned
        limit grows only then). Returns True when an overload was news (the limit was
        cut), False for an echo of an earlier cut: the breaker counts only news, so a
        model that is merely full is not taken for one that is down."""
        if self._in_flight <= 0:
            raise RuntimeError("release() without a matching take()")
        busy = self._in_flight  # including the request that just ended
        self._in_flight -= 1
        if signal is LimiterSignal.OK:
            self._below = 0
            self._grow(slot, busy, pressed)
            return False
        if signal is LimiterSignal.OVERLOAD and slot.epoch == self._epoch:
            self._cut(slot.position)
            return True
        return False

    def _grow(self, slot: Slot, busy: int, pressed: bool) -> None:
        if self._capacity is not None and slot.position > self._capacity and slot.epoch == self._epoch:
            # A request sent above the learned capacity (since the last cut) was served: the
            # target has more room than it had. Climb. One sent before the cut says nothing
            # about the capacity now.
            self._capacity = slot.position
            self._hold = _CLIMB
            if self._capacity >= self._ceiling:
                self._ceiling = 0  # back where it was: the climb goes on until a rejection
        if self._capacity is None:
            # Slow start: only a limit that is being used grows, or it would take several
            # rejections to come back down. Before the first rejection the limit is a guess,
            # not a lesson: it grows while half of it is used, pressed or not, so a burst
            # finds the room before it spills to another model.
            if busy >= self._limit / 2 or pressed:
                self._limit = min(float(self.max), self._limit + SLOW_START_STEP)
        elif pressed:
            # Pressed: the whole limit was in use when work was turned away (the seam's press).
            step = SLOW_START_STEP if self._hold <= _CLIMB else 1.0 / (self._limit * self._hold)
            self._limit = min(float(self.max), self._limit + step)

    def _cut(self, position: int) -> None:
        held = max(self.min, position - 1)
        if self._capacity is not None and held >= self._capacity:
            # A send above the learned capacity was refused: the target holds what was in
            # flight when it was sent.
            if self._ceiling > held:
                # Below what it held before a drop: ask again next round trip, each refusal
                # halving the distance to that ceiling, so a drop that lasts costs about
                # log2(distance) + 2 asks at one per round trip before the patience doubles.
                self._hold = _FIRST_HOLD
                self._ceiling = ceiling_after_refusal(self._ceiling, held)
            else:
                # The next ask waits twice as long.
                self._ceiling = 0
                self._hold = min(MAX_HOLD, max(_FIRST_HOLD, self._hold * 2.0))
            new = float(held)
            self._capacity = held
        else:
            self._below += 1
            # The first rejection below what we knew says exactly what the target holds;
            # more in a row mean someone else is taking room too: cut multiplicatively.
            new = float(held) if self._below == 1 else max(float(self.min), min(held, self._limit * self.decrease))
            if self._capacity is not None:
                # What it held before the drop: room that may come back (a recovery in steps).
                self._ceiling = max(self._ceiling, self._capacity)
            self._capacity = max(self.min, int(new))
            if self._ceiling > self._capacity:
                self._hold = _FIRST_HOLD  # ask for it back every round trip (and a climb is over)
            else:
                self._ceiling = 0
                self._hold = max(_FIRST_HOLD, self._hold)  # a climb is over
        self._limit = max(float(self.min), min(new, float(self.max)))
        self._epoch += 1
        self.cuts += 1

    # ------------------------------------------------------------ an outage is not a capacity signal

    def checkpoint(self) -> None:
        """Remember what was learned before a failure streak began."""
        self._saved = (self._limit, self._capacity, self._hold)

    def restore(self) -> None:
        """The streak was an outage (the breaker tripped), not the target being full:
        forget what it taught, so the ramp after recovery aims at the real capacity."""
        if self._saved is not None:
            self._limit, self._capacity, self._hold = self._saved
            self._saved = None
            self._epoch += 1  # rejections still in flight from the outage are echoes
            self._below = 0


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

    def wait(self, amount: float) -> float:
        """Seconds until ``try_take(amount)`` will succeed (0.0: now)."""
        need = self._need(amount)
        self._refill(self._clock.now())
        if self._enough(need):
            return 0.0
        return (need - self._tokens) / self._per_second

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
