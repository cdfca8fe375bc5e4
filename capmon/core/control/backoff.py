"""How long a request backs off from a target after a failure, composed from tenacity.

Capped full jitter, ``U(0, min(cap, base * 2^n))``, is tenacity's
``wait_random_exponential``; a server hint is a floor with spread (a hint ``h`` waits
``U(h, h * (1 + spread))``, so that clients told the same number do not all come back in
the same instant), a ``wait_base`` of our own that falls back to the jitter when there is
no hint. Each request keeps a :class:`Schedule`: tenacity's own call state for one
retried call, advanced with tenacity's methods as its ``Retrying`` would.
"""

from __future__ import annotations

import random

from tenacity import AsyncRetrying, RetryCallState
from tenacity.wait import wait_base, wait_exponential, wait_random_exponential

from capmon.core.types.config import BackoffConfig
from capmon.core.types.failure import Failure, Kind


class wait_full_jitter(wait_random_exponential):
    """tenacity's full jitter, drawing from an injectable random source."""

    def __init__(self, multiplier: float, max: float, rng: random.Random) -> None:
        super().__init__(multiplier=multiplier, max=max)
        self._rng = rng

    def ceiling(self, retry_state: RetryCallState) -> float:
        return float(wait_exponential.__call__(self, retry_state))

    def __call__(self, retry_state: RetryCallState) -> float:
        return self._rng.uniform(0.0, self.ceiling(retry_state))


class wait_hint_floor(wait_base):
    """The server's hint (the failed attempt's ``retry_after``) with spread; ``otherwise``
    when the server gave none."""

    def __init__(self, spread: float, otherwise: wait_full_jitter, rng: random.Random) -> None:
        self.spread = spread
        self.otherwise = otherwise
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        outcome = retry_state.outcome
        failure = outcome.result() if outcome is not None and not outcome.failed else None
        hint = failure.retry_after if isinstance(failure, Failure) else None
        if hint is not None and hint > 0:
            return hint + self._rng.uniform(0.0, hint * self.spread)
        return self.otherwise(retry_state)


class Backoff:
    def __init__(self, config: BackoffConfig, rng: random.Random | None = None) -> None:
        rng = rng or random.Random()
        self._jitter = {
            False: wait_full_jitter(config.base, config.cap, rng),
            True: wait_full_jitter(config.base, min(config.cap, config.transient_cap), rng),
        }
        self._retrying = {
            transient: AsyncRetrying(wait=wait_hint_floor(config.hint_spread, jitter, rng))
            for transient, jitter in self._jitter.items()
        }

    def schedule(self) -> Schedule:
        return Schedule(self)

    def ceiling(self, attempt: int, kind: Kind = Kind.CAPACITY) -> float:
        """The top of the jitter range for the ``attempt``-th retry (1-based), no hint."""
        s = self.schedule()
        for _ in range(max(1, attempt) - 1):
            s.state.prepare_for_next_attempt()
        return self._jitter[kind is Kind.TRANSIENT].ceiling(s.state)


class Schedule:
    """One request's backoff: tenacity's call state for it, one attempt per failure."""

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self.state = RetryCallState(backoff._retrying[False], fn=None, args=(), kwargs={})
        self._started = False

    def next_wait(self, failure: Failure, kind: Kind | None = None) -> float:
        """Seconds to back off after ``failure``; ``kind`` TRANSIENT uses the short cap."""
        if self._started:
            self.state.prepare_for_next_attempt()
        self._started = True
        self.state.set_result(failure)
        retrying = self._backoff._retrying[(kind or failure.kind) is Kind.TRANSIENT]
        wait = float(retrying.wait(self.state))
        self.state.idle_for += wait
        return wait
