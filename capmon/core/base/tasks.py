"""Background tasks the core starts (the prober, the wait queue's dispatcher and timer)
and how they stop: cancelled, then awaited, so nothing runs after its owner closed and
no "Task was destroyed but it is pending" is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Future[Any] | None]) -> None:
    live = [t for t in tasks if t is not None and not t.done()]
    for task in live:
        task.cancel()
    for task in live:
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass  # its owner is closing: what it was doing no longer matters
