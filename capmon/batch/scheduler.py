"""Which item a batch worker sends next, and when it may.

* Pending items are read from the store a page at a time, in input order (from a
  shared store: claimed a few at a time; while other workers hold every item left, the
  page is None and the scheduler asks again every ``poll`` seconds: a worker that dies
  gives its items back when its leases expire).
* Parked items (capacity ran out) wait in a heap ordered by when they are due, and go
  before pending ones once due; the delay grows with every park, with jitter, and a
  server's hint longer than it wins.
* Gates hold workers back: paused by hand, results that cannot be saved (``block``),
  outside the daily window, and the start rate. A halted job opens every gate so its
  workers can end.

Everything is on the job's clock: a test that fast-forwards it fast-forwards parks,
windows and the rate.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import random
from collections.abc import Callable

from capmon.batch.pacing import Pacing, RateGate, wait_event
from capmon.batch.sqlite import StoredItem
from capmon.core.base.clock import Clock

# Within this much of now counts as due: float noise must not leave a parked item a
# hair in the future of a (fast-forwarded) clock that never gets there.
_DUE_SLACK = 1e-6
WINDOW_STEP = 60.0  # the longest sleep waiting for a window, so a clock that jumps (a laptop waking up) is noticed


class _Gate:
    """Open or shut, and a wait for it to open. ``release`` lets waiters through without
    opening it (a halting job's workers must end, paused or not)."""

    def __init__(self) -> None:
        self.shut = False
        self._opened = asyncio.Event()
        self._opened.set()

    def close(self) -> None:
        self.shut = True
        self._opened.clear()

    def open(self) -> None:
        self.shut = False
        self._opened.set()

    def release(self) -> None:
        self._opened.set()

    async def wait(self) -> None:
        await self._opened.wait()


class Scheduler:
    """``page(after_key, limit)`` reads the next pending items from the store (None: none now,
    ask again after ``poll`` seconds)."""

    def __init__(
        self,
        clock: Clock,
        pacing: Pacing,
        page: Callable[[int, int], list[StoredItem] | None],
        *,
        page_size: int | None = None,
        poll: float = 1.0,
        park_base: float = 5.0,
        park_cap: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        self.clock = clock
        self.pacing = pacing
        self.window = pacing.window
        self._rate_gate = RateGate(pacing.rate, clock) if pacing.rate else None
        self._page = page
        self._page_size = page_size or max(256, 4 * pacing.concurrency)
        self.poll = poll
        self._ask_at: float | None = None  # when to ask for a page again, after a None
        self.park_base = park_base
        self.park_cap = park_cap
        self._rng = rng or random.Random()
        self._queue: collections.deque[StoredItem] = collections.deque()
        self._after_key = 0
        self._exhausted = False
        self._parked: list[tuple[float, int, StoredItem]] = []  # heap of (due on the clock, key, item)
        self._pause = _Gate()
        self._saving = _Gate()  # shut while results cannot be saved
        self.halted = False
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ gates

    @property
    def paused(self) -> bool:
        return self._pause.shut

    def pause(self) -> None:
        """Start nothing new; items in flight finish."""
        self._pause.close()

    def resume(self) -> None:
        self._pause.open()
        self.notify()

    def block(self) -> None:
        """Start nothing new until :meth:`unblock` (results cannot be saved)."""
        self._saving.close()

    def unblock(self) -> None:
        self._saving.open()
        self._ask_at = None  # a claim that failed while saving did is asked again at once
        self.notify()

    def halt(self) -> None:
        """The job is halting: every worker waiting at a gate goes on, to see it and end."""
        self.halted = True
        self._pause.release()
        self.notify()

    def window_open(self) -> bool:
        return self.window is None or self.window.is_open(self.clock.wall())

    def may_start(self) -> bool:
        """Whether an item may start right now (after the rate gate let it)."""
        return not (self.halted or self._pause.shut or self._saving.shut) and self.window_open()

    async def gates(self) -> bool:
        """Wait while paused, while results cannot be saved, or outside the window; False
        when the job is halting."""
        while not self.halted:
            if self._pause.shut:
                await self._pause.wait()
                continue
            if self._saving.shut:
                await self._saving.wait()
                continue
            if not self.window_open():
                assert self.window is not None
                wall = self.clock.wall()
                await self.wait_changed(min(max(0.01, self.window.opens_at(wall) - wall), WINDOW_STEP))
                continue
            return True
        return False

    @property
    def rated(self) -> bool:
        """Starts are spaced by a rate: :meth:`pace` before each."""
        return self._rate_gate is not None

    async def pace(self) -> None:
        """Wait for the start rate to allow one more start."""
        if self._rate_gate is not None:
            await self._rate_gate.wait()

    # ------------------------------------------------------------ items

    @property
    def parked(self) -> int:
        return len(self._parked)

    @property
    def drained(self) -> bool:
        """Nothing left to send: every page read, nothing queued, nothing parked."""
        return self._exhausted and not self._queue and not self._parked

    def take(self) -> StoredItem | None:
        """The next item to send: a parked one that is due, else the next pending one."""
        if self._parked and self._parked[0][0] <= self.clock.now() + _DUE_SLACK:
            return heapq.heappop(self._parked)[2]
        if not self._queue and not self._exhausted and (self._ask_at is None or self.clock.now() >= self._ask_at):
            page = self._page(self._after_key, self._page_size)
            self._ask_at = None
            if page is None:
                self._ask_at = self.clock.now() + self.poll
            elif page:
                self._after_key = page[-1].key
                self._queue.extend(page)
            else:
                self._exhausted = True
        return self._queue.popleft() if self._queue else None

    def held(self) -> list[int]:
        """Keys of the items taken and not sent yet (queued or parked)."""
        return [i.key for i in self._queue] + [k for _, k, _ in self._parked]

    def put_back(self, item: StoredItem) -> None:
        """An item taken and not sent goes first again (a parked one: due now)."""
        if item.not_before is not None and item.parks:
            heapq.heappush(self._parked, (self.clock.now(), item.key, item))
        else:
            self._queue.appendleft(item)

    def park_delay(self, parks: int, hint: float | None) -> float:
        """How long an item parked for the ``parks``-th time waits: doubling from
        ``park_base`` up to ``park_cap``, spread by up to half again so parked items do
        not all come back together; a longer server hint wins."""
        delay = min(self.park_cap, self.park_base * 2 ** (parks - 1)) * self._rng.uniform(1.0, 1.5)
        return hint if hint is not None and hint > delay else delay

    def park(self, item: StoredItem, delay: float) -> None:
        heapq.heappush(self._parked, (self.clock.now() + delay, item.key, item))
        self.notify()

    def load_parked(self, items: list[StoredItem], wall: float) -> None:
        """Items a previous run parked, due when their stored wall time says."""
        now = self.clock.now()
        for item in items:
            due = now + max(0.0, (item.not_before or wall) - wall)
            heapq.heappush(self._parked, (due, item.key, item))

    # ------------------------------------------------------------ waiting

    def notify(self) -> None:
        """Something changed (a park, a finish, a resume): idle workers look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, timeout: float | None) -> None:
        await wait_event(self.clock, self._changed, timeout)

    async def idle(self) -> None:
        """Nothing to send now: wait for a parked item to fall due or for anything to change."""
        now = self.clock.now()
        due = [t for t in (self._parked[0][0] if self._parked else None, self._ask_at) if t is not None]
        await self.wait_changed(max(1e-3, min(due) - now) if due else None)
