"""Run a request's work while watching its connection: a client that goes away cancels
the work, so its upstream attempt is cancelled and its slot given back at once, for
plain requests as much as for streams (a plain request is otherwise only noticed gone
when its answer is written, minutes later for a long completion).

The work runs in the request's own task, and the departure cancels that task, the way
``asyncio.timeout`` does: no task per request for the work, none for a watcher, no
``asyncio.wait``. How the departure is heard:

- from the connection itself, when the scope carries a :class:`Departure` under
  ``scope["extensions"][DEPARTURE]``: the gateway's own HTTP protocols
  (capmon/gateway/connections.py) and the in-process transport (capmon/inprocess/transport.py)
  put one there and call :meth:`Departure.gone` when the client goes;
- else (any other ASGI server) by a watcher task reading ``receive`` for ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.types import Receive, Scope

T = TypeVar("T")

DEPARTURE = "capmon.departure"  # the scope extension's name


class ClientGone(Exception):
    """The client disconnected before the work was done; the work was cancelled."""


class Departure:
    """One request's connection going away: told once by whoever owns the connection,
    heard by the work that watches it."""

    __slots__ = ("_hear", "left")

    def __init__(self) -> None:
        self.left = False
        self._hear: Callable[[], object] | None = None

    def gone(self) -> None:
        if self.left:
            return
        self.left = True
        hear, self._hear = self._hear, None
        if hear is not None:
            hear()

    def watch(self, hear: Callable[[], object] | None) -> None:
        """``hear()`` is called when the client goes (at once if it has); None: stop watching."""
        self._hear = hear
        if hear is not None and self.left:
            self._hear = None
            hear()


def departure_of(scope: Scope) -> Departure | None:
    d = scope.get("extensions", {}).get(DEPARTURE)
    return d if isinstance(d, Departure) else None


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(scope: Scope, receive: Receive, work: Awaitable[T]) -> T:
    """``await work``, unless the client disconnects first: then the work is cancelled
    (its cleanup runs as it unwinds) and :class:`ClientGone` raised. Call it once the
    request body has been read (a watcher reads what comes after it: only the disconnect)."""
    task = asyncio.current_task()
    assert task is not None
    gone = False
    listening = True

    def hear(*_: Any) -> None:
        nonlocal gone
        if listening and not gone:  # a watcher's callback may run after the work is done
            gone = True
            task.cancel()

    departure = departure_of(scope)
    watcher: asyncio.Task[None] | None = None
    if departure is not None:
        departure.watch(hear)
    else:
        watcher = asyncio.ensure_future(_disconnected(receive))
        watcher.add_done_callback(lambda w: None if w.cancelled() or w.exception() else hear())
    try:
        result = await work
    except BaseException as e:
        if not gone:
            raise
        # Ours was the cancel. Another pending one (the gateway itself is stopping) goes on;
        # anything the work raised while unwinding is no news: the client is gone.
        if task.uncancel() > 0 and isinstance(e, asyncio.CancelledError):
            raise
        raise ClientGone() from None
    finally:
        listening = False
        if departure is not None:
            departure.watch(None)
        elif watcher is not None:
            watcher.cancel()
    if gone:  # the work swallowed our cancel and returned: the client is gone all the same
        task.uncancel()
        raise ClientGone()
    return result
