"""How long to wait before the next attempt.

Capped full jitter (``U(0, min(cap, base * 2^n))``) with tenacity computing the
exponential schedule, and server hints as a floor with spread: a hint ``h`` waits
``U(h, h * (1 + spread))`` so that clients told the same number do not all come
back in the same instant.
"""

from __future__ import annotations

import random

from tenacity import RetryCallState, wait_exponential

from capmon.core.config import BackoffConfig
from capmon.core.errors import Kind


def _state(attempt: int) -> RetryCallState:
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, attempt)
    return state


class Backoff:
    def __init__(self, config: BackoffConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()
        self._capacity = wait_exponential(multiplier=config.base, max=config.cap)
        self._transient = wait_exponential(multiplier=config.base, max=min(config.cap, config.transient_cap))

    def ceiling(self, attempt: int, kind: Kind = Kind.CAPACITY) -> float:
        """The top of the jitter range for the ``attempt``-th retry (1-based)."""
        schedule = self._transient if kind is Kind.TRANSIENT else self._capacity
        return float(schedule(_state(attempt)))

    def wait(self, attempt: int, kind: Kind = Kind.CAPACITY, hint: float | None = None) -> float:
        """Seconds to wait before the ``attempt``-th retry (1-based)."""
        if hint is not None and hint > 0:
            spread = hint * self.config.hint_spread
            return hint + self._rng.uniform(0.0, spread)
        return self._rng.uniform(0.0, self.ceiling(attempt, kind))
