"""When the runner may start the next item: how many at once, an off-peak daily window
and a rate.

Windows are in local wall time read from the clock (``clock.wall()``), so a test
that fast-forwards the clock fast-forwards the window too. A window may wrap
midnight (``22:00-06:00``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from dataclasses import dataclass

from capmon.batch.defaults import DEFAULT_CONCURRENCY
from capmon.batch.options import OptionError
from capmon.core.base.clock import Clock
from capmon.core.control.limiter import TokenBucket

_HHMM = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


@dataclass(frozen=True, slots=True)
class Window:
    """A daily window ``start``-``end`` in minutes after local midnight; ``end`` is
    excluded. ``start > end`` wraps midnight."""

    start: int
    end: int

    @staticmethod
    def parse(text: str) -> Window:
        m = _HHMM.match(text)
        if not m:
            raise OptionError("window", f"expected HH:MM-HH:MM such as 22:00-06:00, got {text!r}")
        h1, m1, h2, m2 = (int(g) for g in m.groups())
        for h, mm in ((h1, m1), (h2, m2)):
            if not (0 <= h <= 24 and 0 <= mm < 60) or (h == 24 and mm != 0):
                raise OptionError("window", f"{h:02d}:{mm:02d} is not a time of day (in {text!r})")
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if start % 1440 == end % 1440:
            raise OptionError(
                "window", f"start and end are the same ({text!r}); leave the window out to send at any time"
            )
        return Window(start % 1440, end if end == 1440 else end % 1440)

    def __str__(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"

    def _minute(self, wall: float) -> float:
        t = dt.datetime.fromtimestamp(wall)
        return t.hour * 60 + t.minute + t.second / 60 + t.microsecond / 60e6

    def is_open(self, wall: float) -> bool:
        m = self._minute(wall)
        if self.start < self.end:
            return self.start <= m < self.end
        return m >= self.start or m < self.end

    def opens_at(self, wall: float) -> float:
        """Wall time the window next opens (``wall`` itself when it is open)."""
        if self.is_open(wall):
            return wall
        now = dt.datetime.fromtimestamp(wall)
        start = now.replace(hour=self.start // 60, minute=self.start % 60, second=0, microsecond=0)
        if start <= now:
            start += dt.timedelta(days=1)
        # Naive local datetimes: .timestamp() applies the local offset of that day, so a
        # DST change between now and then is accounted for.
        return start.timestamp()


class RateGate:
    """At most ``rate`` items started per second, evenly spaced: a token bucket that
    holds one start, so a paused or window-delayed job does not burst when it goes on."""

    def __init__(self, rate: float, clock: Clock) -> None:
        check_rate(rate)
        self.rate = rate
        self._clock = clock
        self._bucket = TokenBucket(rate * 60.0, clock, burst=1.0)

    async def wait(self) -> None:
        while not self._bucket.try_take(1):
            # At least a millisecond: float noise must not make a fast-forwarded clock spin.
            await self._clock.sleep(max(1e-3, self._bucket.available_at(1) - self._clock.now()))


def check_rate(rate: float) -> None:
    if not rate > 0:
        raise OptionError("rate", f"expected items per second > 0, got {rate}")


@dataclass(frozen=True, slots=True)
class Pacing:
    """How fast a job sends: ``concurrency`` items in flight at once, at most ``rate``
    started a second, and only inside ``window``."""

    concurrency: int = DEFAULT_CONCURRENCY
    rate: float | None = None
    window: Window | None = None

    @staticmethod
    def of(concurrency: int | None = None, rate: float | None = None, window: Window | str | None = None) -> Pacing:
        """Checked values (None: the default); raises OptionError naming the first one that is wrong."""
        concurrency = DEFAULT_CONCURRENCY if concurrency is None else concurrency
        if concurrency < 1:
            raise OptionError("concurrency", f"expected a whole number >= 1, got {concurrency}")
        if rate is not None:
            check_rate(rate)
        return Pacing(
            concurrency,
            rate,
            Window.parse(window)
            if isinstance(window, str) and window
            else window
            if isinstance(window, Window)
            else None,
        )


async def wait_event(clock: Clock, event: asyncio.Event, timeout: float | None) -> None:
    """Wait for ``event``, at most ``timeout`` seconds on ``clock`` (None: as long as it takes)."""
    changed = asyncio.ensure_future(event.wait())
    if timeout is None:
        try:
            await changed
        finally:
            changed.cancel()
        return
    sleeper = asyncio.ensure_future(clock.sleep(timeout))
    try:
        await asyncio.wait({changed, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        changed.cancel()
        sleeper.cancel()
