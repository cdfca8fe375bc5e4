"""Clocks for tests: one that moves only when told to, and loop time (so looptime
fast-forwards it) with a chosen wall time."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import time
from collections.abc import Iterator


class ManualClock:
    """A clock that moves only when told to: for synchronous unit tests and snapshots."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_767_225_600.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        self._now += seconds

    async def sleep(self, seconds: float) -> None:
        self._now += max(0.0, seconds)
        await asyncio.sleep(0)


class WallClock:
    """Loop time, with a wall clock that starts at a chosen local time."""

    def __init__(self, start_wall: float) -> None:
        self.start_wall = start_wall
        self.t0: float | None = None

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def wall(self) -> float:
        if self.t0 is None:
            self.t0 = self.now()
        return self.start_wall + self.now() - self.t0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def local(y: int, mo: int, d: int, h: int, mi: int, s: int = 0) -> float:
    """A local wall time."""
    return dt.datetime(y, mo, d, h, mi, s).timestamp()


@contextlib.contextmanager
def utc_zone() -> Iterator[None]:
    """Local time is UTC inside: what prints clock times (logs, status bars) matches everywhere."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()
