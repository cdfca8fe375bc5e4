"""The fleet's background tasks (heartbeat, reconciliation, rejoin, the pub/sub
listener), each watched and started again when it ends for any reason but closing.

A task that raised, or that something cancelled, is logged with what ended it and
started again after a backoff (50 ms, doubling to 2 s; back to 50 ms once it has run
for 10 s), so no bug or unexpected value can leave a process without heartbeats,
reconciliation or news for the rest of its life. The watching is a done-callback,
not a task of its own: there is nothing to kill.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from capmon.core.base.clock import Clock
from capmon.core.base.tasks import cancel_and_wait
from capmon.fleet.link import describe

FIRST_BACKOFF, MAX_BACKOFF = 0.05, 2.0
HEALTHY_AFTER = 10.0  # seconds a task must run before its backoff starts over

_log = logging.getLogger("capmon.fleet")


class Supervisor:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._started: dict[str, float] = {}
        self._failures: collections.Counter[str] = collections.Counter()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.restarts: collections.Counter[str] = collections.Counter()
        self.closed = False

    def run(self, name: str, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``loop()`` (meant to run for ever) as the task ``name``, and again whenever it ends."""
        self.watch(name, asyncio.ensure_future(loop()), lambda: self.run(name, loop))

    def watch(self, name: str, task: asyncio.Task[Any], restart: Callable[[], None]) -> None:
        """Watch ``task``: when it ends without :meth:`forget` or :meth:`aclose`, ``restart()``."""
        if self.closed:
            task.cancel()
            return
        self._tasks[name] = task
        self._started[name] = self._clock.now()
        task.add_done_callback(lambda t: self._ended(name, t, restart))

    def task(self, name: str) -> asyncio.Task[Any] | None:
        return self._tasks.get(name)

    def forget(self, name: str) -> asyncio.Task[Any] | None:
        """Stop watching ``name`` (its owner ends it on purpose); returns the task."""
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        return self._tasks.pop(name, None)

    def _ended(self, name: str, task: asyncio.Task[Any], restart: Callable[[], None]) -> None:
        if self.closed or self._tasks.get(name) is not task:
            return  # closing, or ended on purpose
        del self._tasks[name]
        if task.cancelled():
            why = "was cancelled"
        elif task.exception() is not None:
            exc = task.exception()
            assert exc is not None
            why = f"failed ({type(exc).__name__}: {describe(exc)})"
        else:
            why = "ended"
        if self._clock.now() - self._started.get(name, 0.0) > HEALTHY_AFTER:
            self._failures[name] = 0
        self._failures[name] += 1
        delay = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (self._failures[name] - 1))
        _log.warning("shared state: the %s task %s; starting it again in %.2f s", name, why, delay)
        self._timers[name] = asyncio.get_running_loop().call_later(delay, self._restart, name, restart)

    def _restart(self, name: str, restart: Callable[[], None]) -> None:
        self._timers.pop(name, None)
        if self.closed:
            return
        self.restarts[name] += 1
        restart()

    async def aclose(self) -> None:
        self.closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks, self._tasks = list(self._tasks.values()), {}
        await cancel_and_wait(tasks)
