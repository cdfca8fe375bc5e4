"""The one queue of requests waiting for a target to admit them.

First come, first served: the request that has waited longest gets the next slot on
a target it can use, and a request that comes back from a retry wait keeps its
place from when it first arrived, so no request starves behind newer ones. Slots
are handed over, not raced for: when something may have made room (an attempt
settled, a probe succeeded, a manual action, a bucket refilled), one dispatch pass
walks the queue in order and admits whoever can go.

Requests that could use exactly the same targets are grouped: when the oldest of a
group cannot be admitted, none of the group can, so a pass costs one admission try
per group, not per request, however long the queue.

Two classes wait apart: interactive requests get free slots before batch ones, and
batch keeps a guaranteed share of the slots handed over while both wait
(``batch_share``), so it never starves.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

from capmon.core.base.clock import Clock
from capmon.core.base.tasks import cancel_and_wait

log = logging.getLogger("capmon.waiting")

G = TypeVar("G")  # what a waiter is granted (the router's target and admission)

# While anyone waits, a pass runs at least this often: a safety net for what no
# event announces (a ramp's share growing with time), not a poll of the targets.
MAX_NAP = 1.0
GATE_SLACK = 0.001  # seconds a timer sleeps past the gate it waits for


INTERACTIVE, BATCH = 0, 1
# Grants counted toward the batch share are forgotten by halves past this many, so the
# share follows the recent past rather than the whole run.
_SHARE_MEMORY = 200


class Waiter(Generic[G]):
    __slots__ = ("seq", "key", "group", "fut", "deadline")

    def __init__(self, seq: int, key: Any, group: Hashable, fut: asyncio.Future[G], deadline: float) -> None:
        self.seq = seq
        self.key = key  # the router's request state
        self.group = group  # (class, what the router groups by)
        self.fut = fut
        self.deadline = deadline  # on the queue's clock


class WaitQueue(Generic[G]):
    """``admit(key)`` tries to admit a waiting request now (a grant or None);
    ``release(grant)`` gives back a grant nobody took; ``ready_at(key)`` is the
    earliest clock time a time-driven gate opens for it (None: only an event);
    ``group_of(key)`` is ``(INTERACTIVE or BATCH, anything hashable)``; ``cannot_wait(key)``,
    asked of every waiter when something changed by hand (a trip, a key disabled), is
    the error it ends with at once when waiting can no longer help it (None: it waits on)."""

    def __init__(
        self,
        clock: Clock,
        admit: Callable[[Any], Awaitable[G | None]],
        release: Callable[[G], Awaitable[None]],
        ready_at: Callable[[Any, float], float | None],
        group_of: Callable[[Any], tuple[int, Hashable]],
        batch_share: float = 0.2,
        cannot_wait: Callable[[Any], BaseException | None] | None = None,
    ) -> None:
        self._clock = clock
        self._cannot_wait = cannot_wait
        self._admit = admit
        self._release = release
        self._ready_at = ready_at
        self._group_of = group_of
        self.batch_share = batch_share
        self._contended = 0  # slots handed over while both classes waited
        self._contended_batch = 0  # ... of which to batch
        self._groups: dict[Hashable, deque[Waiter[G]]] = {}
        self._count = 0
        self._dirty = False
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.Task[None] | None = None
        self._timer_at = float("inf")
        self._closed = False  # aclose() began: no pass or timer starts again
        self._releases: set[asyncio.Future[None]] = set()  # grants passed on after a late cancel

    def __len__(self) -> int:
        return self._count

    # ------------------------------------------------------------ waiting

    async def wait(self, seq: int, key: Any, timeout: float) -> G:
        """Wait in line (by ``seq``, smaller first) until admitted; TimeoutError after
        ``timeout`` seconds. Cancelling the wait never leaks a grant."""
        fut: asyncio.Future[G] = asyncio.get_running_loop().create_future()
        waiter = Waiter(seq, key, self._group_of(key), fut, self._clock.now() + max(0.0, timeout))
        self._insert(waiter)
        self.kick()
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                return await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return fut.result()  # granted in the same instant the wait ran out
            raise
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Cancelled after the hand-over: pass it on. The task is kept until it ends
                # (the loop holds only a weak reference to a task).
                release = asyncio.ensure_future(self._release(fut.result()))
                self._releases.add(release)
                release.add_done_callback(self._releases.discard)
            raise
        finally:
            if not fut.done():
                fut.cancel()
            self._remove(waiter)

    def regroup(self) -> None:
        """Recompute every waiter's group (the pin or the order changed), end those that
        waiting can no longer help, and run a pass."""
        waiters = [w for q in self._groups.values() for w in q]
        self._groups.clear()
        self._count = 0
        for w in sorted(waiters, key=lambda w: w.seq):
            refused = self._cannot_wait(w.key) if self._cannot_wait is not None and not w.fut.done() else None
            if refused is not None:
                w.fut.set_exception(refused)
                continue
            w.group = self._group_of(w.key)
            self._insert(w)
        self.kick()

    def _insert(self, w: Waiter[G]) -> None:
        q = self._groups.get(w.group)
        if q is None:
            q = self._groups[w.group] = deque()
        if not q or q[-1].seq < w.seq:
            q.append(w)
        else:  # back from a retry wait: its place is by arrival, not by return
            items = list(q)
            i = next(i for i, x in enumerate(items) if x.seq > w.seq)
            items.insert(i, w)
            self._groups[w.group] = deque(items)
        self._count += 1

    def _remove(self, w: Waiter[G]) -> None:
        q = self._groups.get(w.group)
        if q is None:
            return
        try:
            q.remove(w)
        except ValueError:
            return
        self._count -= 1
        if not q:
            del self._groups[w.group]

    # ------------------------------------------------------------ dispatching

    def kick(self) -> None:
        """Something may have made room: run a dispatch pass soon (once, however many kicks)."""
        if not self._count or self._closed:
            return
        self._dirty = True
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            while self._dirty:
                self._dirty = False
                await self._pass()
        except Exception:  # a dispatcher bug must not strand the queue: the timer retries
            log.exception("dispatch pass failed")
        finally:
            self._task = None
            self._arm()

    def _pick(self, heaps: tuple[list[tuple[int, int, Hashable]], list[tuple[int, int, Hashable]]]) -> int:
        """Which class's oldest group goes next: interactive first, unless batch is below
        its share of the slots handed over while both wait."""
        if not heaps[BATCH]:
            return INTERACTIVE
        if not heaps[INTERACTIVE]:
            return BATCH
        return BATCH if self._contended_batch < self.batch_share * (self._contended + 1) else INTERACTIVE

    def _tally(self, cls: int, contended: bool) -> None:
        if not contended:
            return
        self._contended += 1
        self._contended_batch += cls == BATCH
        if self._contended > _SHARE_MEMORY:
            self._contended //= 2
            self._contended_batch //= 2

    async def _pass(self) -> None:
        heaps: tuple[list[tuple[int, int, Hashable]], list[tuple[int, int, Hashable]]] = ([], [])
        tie = 0
        for g, q in self._groups.items():
            if q:
                tie += 1
                heaps[g[0]].append((q[0].seq, tie, g))  # type: ignore[index]
        for h in heaps:
            heapq.heapify(h)
        while heaps[INTERACTIVE] or heaps[BATCH]:
            cls = self._pick(heaps)
            contended = bool(heaps[INTERACTIVE]) and bool(heaps[BATCH])
            _, _, group = heapq.heappop(heaps[cls])
            head = self._groups.get(group)
            if not head:
                continue
            w = head[0]
            if w.fut.done():
                self._remove(w)
            else:
                grant = await self._admit(w.key)
                if grant is None:
                    continue  # the group is blocked for this pass
                if w.fut.done():  # cancelled while we asked: give the slot back
                    await self._release(grant)
                else:
                    w.fut.set_result(grant)
                    self._tally(cls, contended)
                self._remove(w)
            rest = self._groups.get(group)
            if rest:
                tie += 1
                heapq.heappush(heaps[cls], (rest[0].seq, tie, group))

    def _arm(self) -> None:
        """Sleep until the earliest time-driven gate opens for a group's oldest waiter."""
        if not self._count or self._closed:
            return  # closing: a pass cancelled by aclose() arms no timer to outlive the queue
        now = self._clock.now()
        at = now + MAX_NAP
        for q in self._groups.values():
            if q:
                t = self._ready_at(q[0].key, now)
                if t is not None and t > now:
                    at = min(at, t)
        if self._timer is not None and not self._timer.done():
            if self._timer_at <= at + 1e-6:
                return
            self._timer.cancel()
        self._timer_at = at
        # Wake a little after the gate, never before it: asyncio runs a timer up to its
        # clock's resolution early, and a pass a hair before a gate opens finds it shut,
        # sets the same timer again and spins without time moving on (under looptime, for ever).
        self._timer = asyncio.ensure_future(self._fire(max(0.0, at - now) + GATE_SLACK))

    async def _fire(self, delay: float) -> None:
        await self._clock.sleep(delay)
        self._timer = None
        self._timer_at = float("inf")
        self._expire()
        if self._count:
            self.kick()

    def _expire(self) -> None:
        """Time out whoever outlived their deadline: each waiter's own timeout does that,
        and this, at most MAX_NAP late, makes sure of it whatever became of that timer."""
        now = self._clock.now()
        for q in self._groups.values():
            for w in q:
                if now >= w.deadline and not w.fut.done():
                    w.fut.set_exception(TimeoutError())

    async def aclose(self) -> None:
        self._closed = True
        await cancel_and_wait([self._timer, self._task])
        if self._releases:  # grants being given back: let them finish, they free slots
            await asyncio.gather(*self._releases, return_exceptions=True)
