"""What-if: a capacity / rate-limit hint blocks the whole target only when nothing else
of ours is in flight there.

Today ``FallbackClient._on_failure`` sets ``t.not_before = now + hint`` on every capacity
or rate-limited rejection that carries a hint, so one "Retry-After: 2" stops *every*
request from using that model for 2 s, although its other slots keep freeing. With the
AIMD limiter probing one request above capacity now and then, every probe costs the
model seconds of idle slots (the retry_after scenario: wall / ideal ~2).

Proposed change (capmon/core/router.py, ``_on_failure``, both the RATE_LIMITED and the
CAPACITY branches)::

    if hint is not None and t.limiter.in_flight == 0:   # was: if hint is not None:
        t.not_before = max(t.not_before, now + hint)

The rejected request itself still honours the hint (``state.avoid[t.id]`` gets the
backoff wait, which is the hint plus spread), the limiter's decrease is the
target-wide reaction, and the breaker still takes the hint as the floor of its
cool-down when it trips. Emulated here by ignoring such writes to ``not_before``.
"""

from capmon.core.targets import Target


def _get(self):
    return self.__dict__.get("_not_before", 0.0)


def _set(self, value):
    current = self.__dict__.get("_not_before", 0.0)
    limiter = self.__dict__.get("limiter")
    if value > current and limiter is not None and limiter.in_flight > 0:
        return  # other requests of ours are still being served there: the limiter handles it
    self.__dict__["_not_before"] = value


Target.not_before = property(_get, _set)
