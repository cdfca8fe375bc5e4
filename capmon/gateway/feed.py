"""The client's events for the control API's SSE readers: numbered, with recent history
kept, so a dashboard that just attached has a log and one that reconnects asks for what
it missed (``Last-Event-ID``).

The bus calls subscribers synchronously in the publishing thread, so taking an event
must cost nothing and never block the client: each reader has a bounded backlog, and
a reader that lags loses its oldest events (it is told how many), never the client's
time.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable

from capmon.core.types import events as ev

HISTORY = 1000  # events kept for readers that attach later
BACKLOG = 2000  # events one slow reader may lag behind before it loses the oldest

Item = tuple[int, ev.Event]


class Reader:
    def __init__(self, backlog: list[Item], limit: int) -> None:
        self._items: collections.deque[Item] = collections.deque(backlog)
        self._limit = limit
        self._ready = asyncio.Event()
        self.dropped = 0  # events lost since the last take()
        self.closed = False  # the feed closed: the gateway is stopping
        if self._items:
            self._ready.set()

    def put(self, item: Item) -> None:
        if len(self._items) >= self._limit:
            self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    async def take(self, timeout: float) -> tuple[list[Item], int]:
        """Everything waiting (and how many were dropped before it); ([], 0) when
        nothing came within ``timeout`` seconds or the feed closed."""
        if not self._items and not self.closed:
            self._ready.clear()
            try:
                async with asyncio.timeout(timeout):  # not wait_for: it can swallow a cancel (3.11)
                    await self._ready.wait()
            except TimeoutError:
                return [], 0
        items = list(self._items)
        self._items.clear()
        dropped, self.dropped = self.dropped, 0
        return items, dropped


class EventFeed:
    """Create it in the event loop's thread; events published from other threads are
    handed to the loop."""

    def __init__(self, bus: ev.EventBus, history: int = HISTORY, backlog: int = BACKLOG) -> None:
        self._lock = threading.Lock()
        self._ring: collections.deque[Item] = collections.deque(maxlen=history)
        self._seq = 0
        self._backlog = backlog
        self._readers: set[Reader] = set()
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        for e in bus.recent():
            self._add(e)
        self._unsubscribe: Callable[[], None] | None = bus.subscribe(self._on_event)

    @property
    def last(self) -> int:
        return self._seq

    def close(self) -> None:
        """Stop taking events and end every reader's stream."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        with self._lock:
            readers = tuple(self._readers)
        for r in readers:
            r.close()

    def _on_event(self, e: ev.Event) -> None:
        if threading.get_ident() == self._thread:
            self._add(e)
        else:
            self._loop.call_soon_threadsafe(self._add, e)

    def _add(self, e: ev.Event) -> None:
        with self._lock:
            self._seq += 1
            item = (self._seq, e)
            self._ring.append(item)
            readers = tuple(self._readers)
        for r in readers:
            r.put(item)

    def reader(self, since: int | None = None) -> Reader:
        """A reader that gets the history after event ``since`` (all of it when None),
        then every new event. Call :meth:`drop` with it when done."""
        with self._lock:
            if since is not None and since > self._seq:
                since = None  # numbered by another run of the gateway: start from the history
            backlog = [it for it in self._ring if since is None or it[0] > since]
            r = Reader(backlog[-self._backlog :], self._backlog)
            self._readers.add(r)
        return r

    def drop(self, r: Reader) -> None:
        with self._lock:
            self._readers.discard(r)
