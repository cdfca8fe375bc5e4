"""What-if (R3): the breaker judges a streak of capacity failures in the order requests
were *sent*, and treats the ramp like the closed state.

Today (capmon/core/breaker.py):

* ``on_success`` in CLOSED resets the streak for any success. When a busy model goes
  out, the requests already running there keep succeeding for one service time, and
  each of those late successes resets the streak, so the breaker trips only once they
  have drained; every request sent into a slot they free meanwhile is doomed (the
  outage scenario: ~30 rejections on the flagship before it trips).
* in RAMP, one capacity failure re-opens the breaker at once. After recovery the
  limiter is looking for the model's capacity again, and a full model rejects the
  request over its slots: that is "full", not "down", and it re-opens a healthy model
  for another (longer) cool-down.

Proposed change:

* remember the admission time of the latest counted capacity failure; in
  ``on_success`` (CLOSED and RAMP) reset the streak only for an admission made after it
  (``adm.at >= self._last_failure_admitted``) - the generations idea, within a state;
* in RAMP, count a capacity failure like in CLOSED (``failure_threshold`` in a row, or
  the ratio) instead of re-opening on the first one.
"""

from capmon.core.breaker import CircuitBreaker, State, _clean_hint

_on_success = CircuitBreaker.on_success
_on_failure = CircuitBreaker.on_failure

_NEVER = float("-inf")


def on_failure(self, adm, capacity=True, hint=None):
    counted = (
        capacity
        and not adm.settled
        and adm.generation == self._generation
        and self._state in (State.CLOSED, State.RAMP)
    )
    if counted:
        self._last_failure_admitted = max(getattr(self, "_last_failure_admitted", _NEVER), adm.at)
    if counted and self._state is State.RAMP:
        now = self._clock.now()
        if self._settle(adm, now):  # False when stale, e.g. the ramp completed meanwhile
            self._closed_failure(now, _clean_hint(hint))
        return
    return _on_failure(self, adm, capacity, hint)


def on_success(self, adm):
    state = self._state
    late = adm.at < getattr(self, "_last_failure_admitted", _NEVER)
    consecutive, streak_hint = self._consecutive, self._streak_hint
    _on_success(self, adm)
    if self._state is state and state in (State.CLOSED, State.RAMP):
        if late:
            self._consecutive, self._streak_hint = consecutive, streak_hint  # a late success says nothing new
        elif state is State.RAMP:
            self._consecutive, self._streak_hint = 0, None


def _move(self, *a, **kw):
    self._last_failure_admitted = _NEVER
    return _orig_move(self, *a, **kw)


_orig_move = CircuitBreaker._move
CircuitBreaker.on_success = on_success
CircuitBreaker.on_failure = on_failure
CircuitBreaker._move = _move
