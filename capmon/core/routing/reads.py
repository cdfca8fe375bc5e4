"""One deadline over many reads: a streaming attempt's send and every read of its body
share a single timer, instead of an ``asyncio.timeout`` per read (each builds a Timeout,
pushes a timer onto the loop's heap and cancels it: 5-7 us a read, against 0.5-2 us here).

The deadline guards the reads only, as a timeout per read does: the caller's own work
between chunks (the attempt is a generator that yields each one) is never cancelled. A
read in flight when the deadline passes is cancelled and raises ``TimeoutError``, as
``asyncio.timeout`` raises it; a read begun after it raises ``TimeoutError`` at once. A
cancellation from anyone else stays a cancellation.

Two shorter bounds ride on the same timer (ARCHITECTURE.md, "Streams"): until the
stream's first output, ``first`` seconds from the send (``[client] first_token_timeout``);
after it, ``idle`` seconds within any one read (``[client] stall_timeout``: no bytes for
that long). Each read costs one reading of the clock; the timer is moved only when it
fires early. ``why`` says which bound cut a read."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class ReadDeadline:
    """Reads bounded by one deadline ``seconds`` from now on ``now`` (the project's clock,
    capmon/core/base/clock.py: the loop's time, which a test fast-forwards), and, when given,
    by ``first`` seconds from now until :meth:`output` is called, and by ``idle`` seconds
    per read after it. Call :meth:`close` when done."""

    __slots__ = ("_now", "_at", "_first_at", "_idle", "_since", "_timer", "_reader", "_expired", "why")

    def __init__(
        self, now: Callable[[], float], seconds: float, *, first: float | None = None, idle: float | None = None
    ) -> None:
        self._now = now
        start = now()
        self._at = start + max(0.0, seconds)
        self._first_at = start + max(0.0, first) if first is not None else None
        self._idle = idle  # seconds a read after the first output may wait (None: the deadline only)
        self._since: float | None = None  # when the read in flight began, after the first output
        self._timer: asyncio.TimerHandle | None = None
        self._reader: asyncio.Task[object] | None = None  # the task in a read now
        self._expired = False  # a bound cancelled a read
        self.why = Cut.DEADLINE  # which bound cut the read, once one did

    def left(self) -> float:
        """Seconds until the deadline (0 once it has passed)."""
        return max(0.0, self._at - self._now())

    def output(self) -> None:
        """The stream's first output came: the first-token bound is done; from now each
        read is bounded by ``idle`` too."""
        if self._first_at is None and self._idle is None:
            return
        self._first_at = None
        if self._timer is not None:  # armed for the first token: the next read arms it afresh
            self._timer.cancel()
            self._timer = None

    def _due(self, now: float) -> tuple[float, Cut]:
        """The earliest bound on the read in flight, and which it is."""
        at, why = self._at, Cut.DEADLINE
        if self._first_at is not None:
            if self._first_at < at:
                at, why = self._first_at, Cut.FIRST
        elif self._idle is not None and self._since is not None and self._since + self._idle < at:
            at, why = self._since + self._idle, Cut.IDLE
        return at, why

    async def read(self, aw: Awaitable[T]) -> T:
        """``await aw`` within the bounds."""
        now = self._now()
        if self._idle is not None and self._first_at is None:
            self._since = now
        at, why = self._due(now)
        if self._expired or at - now <= 0.0:
            if not self._expired:
                self.why = why
            if asyncio.iscoroutine(aw):
                aw.close()  # never awaited: no "was never awaited" warning
            raise TimeoutError()
        task = asyncio.current_task()
        assert task is not None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(at - now, self._expire)
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
            self._since = None
        if self._expired:  # the read swallowed the deadline's cancel: it has passed all the same
            task.uncancel()
            raise TimeoutError()
        return result

    def _expire(self) -> None:
        self._timer = None
        reader = self._reader
        if reader is None or self._expired:
            return  # between reads: the next read checks the bounds itself
        now = self._now()
        at, why = self._due(now)
        if at - now > 1e-6:  # a later bound than the one the timer was set for (a read began since)
            self._timer = asyncio.get_running_loop().call_later(at - now, self._expire)
            return
        self._expired = True
        self.why = why
        reader.cancel()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Cut(enum.Enum):
    """Which bound cut a read: the attempt's deadline, the first output's, or a stall's."""

    DEADLINE = "deadline"
    FIRST = "first"
    IDLE = "idle"
