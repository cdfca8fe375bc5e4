"""Run a request's work while watching its connection: a client that goes away cancels
the work, so its upstream attempt is cancelled and its slot given back at once, for
plain requests as much as for streams (a plain request is otherwise only noticed gone
when its answer is written, minutes later for a long completion)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work was done; the work was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _settle(task: asyncio.Future[Any]) -> None:
    """Wait for a cancelled task to finish its cleanup, whatever it raises."""
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: a failure during cleanup is no news to anyone


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then the work is cancelled,
    its cleanup awaited, and :class:`ClientGone` raised. Call it once the request body
    has been read (the watcher reads what comes after it: only the disconnect)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the gateway itself is stopping: stop the work too
        task.cancel()
        watcher.cancel()
        await _settle(task)
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    await _settle(task)
    raise ClientGone()
