"""What-if: a ramp that grows on the evidence that its requests were admitted, not only
when they answer (capmon/core/control/breaker.py, CircuitBreaker.record and _grow).

A model that is full refuses at once (a 429 / 503 / 529 comes back in milliseconds) and
one that admits a request answers it a service time later (0.4-1.0 s in the benchmarks,
seconds to minutes in production). So a request of the ramp still unanswered
``WHATIF_SURVIVE`` seconds (default 0.05) after it was sent was admitted: it counts for the
ramp as a clean answer then (``WHATIF_STEP`` slots of the learned concurrency more: 2, as
decisions.ramp_grown, or 1), and its answer does not count again. A refusal after that
still counts as one. The limiter is unchanged (a ramp's overshoot is cut there, and the
echoes of the cut are not news to the breaker).

The change it stands for, if kept: the breaker hears ``survived`` once per ramp request
(the memory state on a timer, the Redis state by the same settle script's step), the
survival time learned per target from its refusals' latency (never less than a floor, and
well under its time to first byte), none before a refusal was ever timed.
"""

import asyncio
import os

from capmon.core.control import seam
from capmon.core.control.breaker import CircuitBreaker
from capmon.core.types.states import State

SURVIVE = float(os.environ.get("WHATIF_SURVIVE", "0.05"))
STEP = float(os.environ.get("WHATIF_STEP", "2"))

_admit = seam.MemoryTarget.admit
_settle = seam.MemoryTarget.settle
_grow = CircuitBreaker._grow
_survived: set[int] = set()


def grow(self, now):
    if getattr(self, "_whatif_skip", False):
        return  # the answer of a request that already counted when it survived
    _grow(self, now)


def survived(b, now):
    if STEP == 2:
        _grow(b, now)
    else:
        b._share = min(1.0, b._share + STEP / max(1.0, b._basis))
        b._advance(now)


async def admit(self, cost):
    adm = await _admit(self, cost)
    if adm is None:
        return adm
    b = self.breaker
    if b.state_at(self._clock.now()) is State.RAMP:
        generation = adm.generation

        def check() -> None:
            if adm.settled or b.generation != generation:
                return
            now = self._clock.now()
            if b.state_at(now) is State.RAMP:
                _survived.add(id(adm))
                survived(b, now)

        asyncio.get_running_loop().call_later(SURVIVE, check)
    return adm


async def settle(self, adm, failure, **kw):
    if id(adm) not in _survived:
        return await _settle(self, adm, failure, **kw)
    _survived.discard(id(adm))
    self.breaker._whatif_skip = True
    try:
        return await _settle(self, adm, failure, **kw)
    finally:
        self.breaker._whatif_skip = False


CircuitBreaker._grow = grow
seam.MemoryTarget.admit = admit
seam.MemoryTarget.settle = settle
