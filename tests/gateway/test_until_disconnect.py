"""until_disconnect: the work runs in the request's own task and a departure cancels it,
heard from the connection (a Departure in the scope) or, on any other server, by reading
``receive`` for the disconnect."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from capmon.gateway.disconnect import DEPARTURE, ClientGone, Departure, until_disconnect

pytestmark = pytest.mark.looptime


def _scope(departure: Departure | None) -> dict[str, Any]:
    return {"type": "http", "extensions": {DEPARTURE: departure}} if departure else {"type": "http"}


class _Receive:
    """After the body: nothing until ``leave()``, then ``http.disconnect``."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def __call__(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


async def _slow(log: list[str]) -> str:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        log.append("cancelled")
        raise
    return "done"


@pytest.mark.parametrize("heard_by", ["departure", "receive"])
async def test_a_departure_cancels_the_work_and_raises_client_gone(heard_by: str) -> None:
    departure = Departure() if heard_by == "departure" else None
    receive = _Receive()
    log: list[str] = []
    task = asyncio.create_task(until_disconnect(_scope(departure), receive, _slow(log)))
    await asyncio.sleep(1)
    if departure is not None:
        departure.gone()
    else:
        receive.left.set()
    with pytest.raises(ClientGone):
        await task
    assert log == ["cancelled"]
    assert task.cancelling() == 0  # our cancel is taken back: the task is not left cancelling


@pytest.mark.parametrize("heard_by", ["departure", "receive"])
async def test_work_done_first_returns_its_result_and_a_later_departure_is_no_news(heard_by: str) -> None:
    departure = Departure() if heard_by == "departure" else None
    receive = _Receive()

    async def quick() -> str:
        await asyncio.sleep(0.1)
        return "done"

    async def handler() -> str:
        result = await until_disconnect(_scope(departure), receive, quick())
        if departure is not None:
            departure.gone()
        else:
            receive.left.set()
        await asyncio.sleep(1)  # a watcher's late callback must not cancel what the handler does next
        return result

    assert await handler() == "done"


async def test_a_client_gone_before_the_watch_is_heard_at_once() -> None:
    departure = Departure()
    departure.gone()
    with pytest.raises(ClientGone):
        await until_disconnect(_scope(departure), _Receive(), _slow([]))


async def test_work_that_swallows_the_cancel_still_ends_as_client_gone() -> None:
    departure = Departure()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "swallowed"
        return "done"

    task = asyncio.create_task(until_disconnect(_scope(departure), _Receive(), stubborn()))
    await asyncio.sleep(1)
    departure.gone()
    with pytest.raises(ClientGone):
        await task


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    """The gateway stopping cancels the request's task: the work is cancelled with it."""
    log: list[str] = []
    task = asyncio.create_task(until_disconnect(_scope(Departure()), _Receive(), _slow(log)))
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log == ["cancelled"]
