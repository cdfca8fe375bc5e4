"""The one source of time.

Everything in capmon reads time through a :class:`Clock`. The default clock reads
the running event loop's time, so tests that fast-forward the loop (looptime) also
fast-forward every cool-down, backoff and rolling window. Nothing else in the
package calls ``time.time()``, ``time.monotonic()`` or ``asyncio.sleep()`` directly.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds: for deadlines, windows and cool-downs."""

    def wall(self) -> float:
        """Seconds since the epoch: for records people read and HTTP-date hints."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""


class LoopClock:
    """Time as the running asyncio loop sees it (monotonic outside a loop).

    ``wall()`` is anchored once and then advances with ``now()``, so fast-forwarded
    tests see wall time move with loop time.
    """

    def __init__(self) -> None:
        # (loop or None) -> (monotonic anchor, wall anchor); a fast-forwarded loop
        # starts its own time, so each loop gets its own anchor.
        self._anchors: dict[int, tuple[float, float]] = {}

    def now(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:
            return time.monotonic()

    def wall(self) -> float:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            key, now = 0, time.monotonic()
        else:
            key, now = id(loop), loop.time()  # what now() reads, without looking up the loop again
        anchor = self._anchors.get(key)
        if anchor is None:
            if len(self._anchors) > 64:
                self._anchors.clear()
            anchor = self._anchors[key] = (now, time.time())
        return anchor[1] + (now - anchor[0])

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


_default: Clock = LoopClock()


def default_clock() -> Clock:
    return _default
