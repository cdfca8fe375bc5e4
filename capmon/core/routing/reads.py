"""One deadline over many reads: a streaming attempt's send and every read of its body
share a single timer, instead of an ``asyncio.timeout`` per read (each builds a Timeout,
pushes a timer onto the loop's heap and cancels it: 5-7 us a read, against 0.5-2 us here).

The deadline guards the reads only, as a timeout per read does: the caller's own work
between chunks (the attempt is a generator that yields each one) is never cancelled. A
read in flight when the deadline passes is cancelled and raises ``TimeoutError``, as
``asyncio.timeout`` raises it; a read begun after it raises ``TimeoutError`` at once. A
cancellation from anyone else stays a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ReadDeadline:
    """Reads bounded by one deadline ``seconds`` from now on ``now`` (the project's clock,
    capmon/core/base/clock.py: the loop's time, which a test fast-forwards). Call
    :meth:`close` when done."""

    __slots__ = ("_now", "_at", "_timer", "_reader", "_expired")

    def __init__(self, now: Callable[[], float], seconds: float) -> None:
        self._now = now
        self._at = now() + max(0.0, seconds)
        self._timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[object] | None = None  # the task in a read now
        self._expired = False  # the deadline cancelled a read

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(0.0, self._at - self._now())

    async def read(self, aw: Awaitable[T]) -> T:
        """``await aw`` within the deadline."""
        left = self.left()
        if self._expired or left <= 0.0:
            if asyncio.iscoroutine(aw):
                aw.close()  # never awaited: no "was never awaited" warning
            raise TimeoutError()
        task = asyncio.current_task()
        assert task is not None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(left, self._expire)
        self._reader = task
        try:
            result = await aw
        except asyncio.CancelledError:
            # Ours, and nobody else's with it: the read timed out. (uncancel() takes back
            # only our own request; another one pending stays a cancellation.)
            if self._expired and task.uncancel() == 0:
                raise TimeoutError() from None
            raise
        finally:
            self._reader = None
        if self._expired:  # the read swallowed the deadline's cancel: it has passed all the same
            task.uncancel()
            raise TimeoutError()
        return result

    def _expire(self) -> None:
        self._timer = None
        reader = self._reader
        if reader is not None and not self._expired:
            self._expired = True
            reader.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
