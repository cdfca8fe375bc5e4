"""When a request of a ramp counts as admitted before it answers.

A model that is full refuses at once: its 429 / 503 / 529 comes back in about the time
the request took to get there and back. One that admits a request answers it a service
time later (seconds, or minutes). So a request that has been neither answered nor
refused well past the time its model takes to refuse was admitted: it *survived*, and a
recovering model's ramp may grow on it a service time before its answer comes
(CircuitBreaker.survived). That time is learned per target from its own refusals: the
slowest of the last few, times ``[breaker] ramp_survival``, and never less than
:data:`FLOOR`. Until a refusal was timed there is no such time and a ramp grows by its
answers alone, as before.

A refusal here is a capacity failure the server said with an error status. A request
that timed out (no headers, no first token) took the timeout, not a refusal's time, and
an error inside a 200 stream came after the headers: neither is timed as a refusal. But
any failure that came later than the survival time (a hung route timing out, an error
after a long silence) shows that outliving it did not mean admitted here: survival is
off for the target until :data:`KEPT` refusals have been timed since.
"""

from __future__ import annotations

import math
from collections import deque

from capmon.core.control.policy import BreakerSignal
from capmon.core.types.failure import Failure

# Seconds: a survival time is never shorter, whatever the refusals took (a loopback
# simulator refuses in a millisecond; a timer's own lateness is of that order).
FLOOR = 0.05
# Refusals remembered: one slow refusal keeps the survival time long until this many
# faster ones came after it.
KEPT = 16


# What the target's own failures say to the survival time (the module's docstring).
_FAILED = (BreakerSignal.CAPACITY, BreakerSignal.TRANSIENT, BreakerSignal.DOWN, BreakerSignal.SILENT)


def is_refusal(signal: BreakerSignal, failure: Failure | None) -> bool:
    """A capacity failure the server said with an error status (the module's docstring)."""
    return (
        signal is BreakerSignal.CAPACITY
        and failure is not None
        and failure.status is not None
        and failure.status >= 400
    )


class RefusalTimes:
    """The latencies of a target's last :data:`KEPT` refusals; ``factor``: ``[breaker]
    ramp_survival`` (0: off)."""

    __slots__ = ("_factor", "_times")

    def __init__(self, factor: float) -> None:
        self._factor = factor
        self._times: deque[float] = deque(maxlen=KEPT)

    def record(self, signal: BreakerSignal, failure: Failure | None, latency: float) -> None:
        """One settled attempt (the module's docstring)."""
        if failure is None or signal not in _FAILED:
            return
        if is_refusal(signal, failure):
            self.refused(latency)
            return
        after = self.survival()
        if after is not None and latency > after:
            self._times.append(math.inf)  # out past the survival time, and still not admitted

    def refused(self, latency: float) -> None:
        """A refusal's time: this process's own, or another's of the fleet (capmon/fleet)."""
        self._times.append(max(0.0, latency))

    def survival(self) -> float | None:
        """Seconds after which a ramp's request still out counts as admitted; None when off,
        when no refusal was timed yet, or since a failure came later than that."""
        if self._factor <= 0 or not self._times:
            return None
        slowest = max(self._times)
        return None if math.isinf(slowest) else max(FLOOR, self._factor * slowest)
