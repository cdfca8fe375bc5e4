"""What-if (R4): requests get slots first come, first served, and keep their place.

Today (capmon/core/router.py) a request that finds no room waits in ``_waiters`` (a
deque) and a release wakes as many waiters as the freed target has room for. Two
things make a few items wait for most of the run when there are more workers than
slots (saturated scenario: p50 0.6 s, p99 11-14 s on a 15 s run):

* barging: the task whose request just finished runs on first; its worker picks the
  next item, and that new request takes the freed slot before the woken waiter runs;
* losing the place: a woken waiter that cannot use the freed slot (it sticks to a
  model that answered 429, or avoids one that just rejected it, and the slot is on
  another model) queues again *at the back*. A request stuck to the flagship after a
  429 waited 10 s while newer requests, which also prefer the flagship, took every
  flagship slot ahead of it (seen with ``ChatResult.attempts``: attempt 1 at 0.0 s,
  attempt 2 at 10.6 s).

Proposed change: keep waiters ordered by request id (arrival order) - a waiter that
waits again goes back to its place, not to the back; a release wakes them all in that
order (the first that can use the slot takes it; one pass over the waiters per
release); and a request's first try queues behind the requests already waiting
instead of taking a slot they were woken for.
"""

import asyncio
import bisect

from capmon.core.router import _MAX_NAP, FallbackClient

_choose = FallbackClient._choose


async def _fifo_choose(self, state):
    if not state.attempts and self._queued > 0:
        await self._wait(state, _MAX_NAP)  # behind the requests already waiting
    return await _choose(self, state)


async def _ordered_wait(self, state, timeout):
    if not hasattr(self, "_ordered"):
        self._ordered = []
    fut = asyncio.get_running_loop().create_future()
    entry = (state.id, id(fut), fut)
    bisect.insort(self._ordered, entry, key=lambda e: (e[0], e[1]))
    self._queued += 1
    try:
        await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        pass
    finally:
        self._queued -= 1
        if not fut.done():
            fut.cancel()
        try:
            self._ordered.remove(entry)
        except ValueError:
            pass


def _wake_in_order(self, target=None):
    waiters, self._ordered = getattr(self, "_ordered", []), []
    for _, _, fut in waiters:
        if not fut.done():
            fut.set_result(None)


FallbackClient._choose = _fifo_choose
FallbackClient._wait = _ordered_wait
FallbackClient._wake_one = _wake_in_order
FallbackClient._wake_all = _wake_in_order
