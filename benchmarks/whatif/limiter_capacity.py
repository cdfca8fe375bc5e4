"""What-if (R2): the limiter reads the model's capacity off the rejection itself, tells
an echo from news by *when the request was sent*, probes above what it learned only
rarely, and starts over after an outage.

Today (capmon/core/limiter.py) the limiter slow-starts (+1 per success) until the
first overload, then does AIMD: +1 per round trip, ``limit * decrease`` (0.5) on an
overload that is "news". News is judged by a counter of the requests that were in
flight at the last decrease (``_before_decrease``), which *any* release pays off - also
the fast rejections of requests sent after the decrease. So:

* after each probe above capacity the limit halves and climbs back one request per
  round trip: the saturated scenario keeps only ~83 % of the slots busy, the outage
  scenario's fallbacks ~80 %;
* during an outage the limit collapses (~10 decreases, to 1.0) and, slow start being
  over, climbs back one request per round trip after recovery: the flagship's share
  after an outage stays far below the ideal's.

Proposed change:

* ``release(outcome, sent_at)``: the router passes the attempt's admission time. An
  overload is news when the request was sent at or after the last decrease, an echo
  otherwise (exact, where the counter is a guess);
* an overload reports ``busy`` (in flight, the rejected one included): the server held
  ``busy - 1`` of ours, so ``ceiling = max(min, busy - 1)`` and ``limit = min(limit,
  ceiling)`` - for echoes too, as it is still a true reading; no capacity is given up
  on a guess;
* below the ceiling (or before the first overload) grow +1 per success (slow start);
  at the ceiling probe +1 per ``PROBE_RTTS`` (4) round trips, i.e. one doomed request
  per 4 round trips per model at most; a success with more in flight than the
  ceiling raises it;
* when the breaker has recovered (half-open probe succeeded -> ramp), forget the
  ceiling and slow-start again from ``max(limit, initial)``: an outage says nothing
  about the concurrency the model takes once it is back.

(``[limiter] decrease`` would apply only where no in-flight count is meaningful.)
"""

from capmon.core.breaker import CircuitBreaker, State
from capmon.core.limiter import AdaptiveLimiter, Outcome
from capmon.core.router import FallbackClient

PROBE_RTTS = 4.0
_NEVER = float("-inf")


def release(self, outcome):
    if self._in_flight <= 0:
        raise RuntimeError("release() without a matching acquire()")
    kind = Outcome(outcome)
    sent_at = getattr(self, "_sent_at", None)
    self._sent_at = None
    busy = self._in_flight
    self._in_flight -= 1
    ceiling = getattr(self, "_ceiling", None)
    news = False
    if kind is Outcome.OK:
        if busy >= self._limit / 2:
            if ceiling is None:
                self._limit = min(float(self.max), self._limit + 1.0)
            elif self._limit < ceiling:
                self._limit = min(float(ceiling), self._limit + 1.0)
            else:
                self._limit = min(float(self.max), self._limit + 1.0 / (self._limit * PROBE_RTTS))
        if ceiling is not None and busy > ceiling:
            self._ceiling = busy
    elif kind is Outcome.OVERLOAD:
        observed = max(self.min, busy - 1)
        self._ceiling = observed
        self._slow_start = False
        echo = sent_at is not None and sent_at < getattr(self, "_last_decrease_at", _NEVER)
        if observed < self._limit:
            self._limit = float(observed)
            self.decreases += 1
        if not echo:
            news = True
            self._last_decrease_at = self._clock.now()
    self._wake()
    return news


AdaptiveLimiter.release = release

# The router tells the limiter when the failed attempt was sent (its breaker admission time).
_on_failure = FallbackClient._on_failure


async def _on_failure_with_sent_at(self, state, t, admission, *rest):
    t.limiter._sent_at = getattr(admission, "at", None)
    return await _on_failure(self, state, t, admission, *rest)


FallbackClient._on_failure = _on_failure_with_sent_at

_move = CircuitBreaker._move


def _move_and_restart(self, new, reason, now, **kw):
    old = self._state
    _move(self, new, reason, now, **kw)
    limiter = getattr(self, "_limiter", None)
    if limiter is not None and old is State.HALF_OPEN and new is State.RAMP:
        limiter._ceiling = None
        limiter._limit = max(limiter._limit, float(limiter._initial))


CircuitBreaker._move = _move_and_restart

_build = FallbackClient._build_targets


def _build_targets(self, keys):
    targets = _build(self, keys)
    for t in targets:
        t.breaker._limiter = t.limiter
        t.limiter._initial = min(max(self.config.limiter.initial, t.limiter.min), t.limiter.max)
    return targets


FallbackClient._build_targets = _build_targets
