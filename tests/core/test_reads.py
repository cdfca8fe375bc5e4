"""ReadDeadline: one timer over many reads (capmon/core/routing/reads.py), on fast-forwarded loop
time (looptime): the figures are loop seconds."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from capmon.core.base.clock import LoopClock
from capmon.core.routing.reads import ReadDeadline

pytestmark = [pytest.mark.unit, pytest.mark.looptime]


def _deadline(seconds: float) -> ReadDeadline:
    return ReadDeadline(LoopClock().now, seconds)


async def _later(seconds: float, value: str = "piece") -> str:
    await asyncio.sleep(seconds)
    return value


async def test_reads_within_the_deadline_give_their_values() -> None:
    reads = _deadline(10.0)
    try:
        assert [await reads.read(_later(3.0, str(i))) for i in range(3)] == ["0", "1", "2"]
    finally:
        reads.close()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_read_in_flight_at_the_deadline_times_out() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    reads = _deadline(5.0)
    try:
        assert await reads.read(_later(3.0)) == "piece"
        with pytest.raises(TimeoutError):
            await reads.read(_later(3.0))  # 3 + 3 > 5: cut at 5
    finally:
        reads.close()
    assert loop.time() - start == pytest.approx(5.0)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # nothing left pending on the caller's task
    await asyncio.sleep(1.0)  # and it is not cancelled later either


async def test_work_between_reads_is_never_cancelled_and_a_late_read_fails_at_once() -> None:
    loop = asyncio.get_running_loop()
    reads = _deadline(5.0)
    try:
        assert await reads.read(_later(1.0)) == "piece"
        await asyncio.sleep(10.0)  # the caller's own work between chunks, past the deadline
        started = loop.time()
        read = _later(1.0)
        with pytest.raises(TimeoutError):
            await reads.read(read)
        assert loop.time() == started  # at once, the read never begun (and closed, not leaked)
        assert read.cr_frame is None
    finally:
        reads.close()


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    reads = _deadline(5.0)

    async def reader() -> str:
        return await reads.read(_later(10.0))

    task = asyncio.ensure_future(reader())
    await asyncio.sleep(2.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reads.close()


async def test_a_cancel_from_outside_at_the_deadline_stays_a_cancel() -> None:
    reads = _deadline(5.0)
    loop = asyncio.get_running_loop()

    async def reader() -> str:
        return await reads.read(_later(10.0))

    task = asyncio.ensure_future(reader())
    loop.call_at(loop.time() + 5.0, task.cancel)  # someone else's cancel, at the deadline too
    with pytest.raises(asyncio.CancelledError):
        await task
    reads.close()


async def test_closed_its_timer_is_gone() -> None:
    # A timer left on the loop would hold the deadline (and the stream around it) until
    # it fired, long after the stream ended: a closed one is free to go at once.
    class Watched(ReadDeadline):
        __slots__ = ("__weakref__",)

    reads = Watched(LoopClock().now, 600.0)
    assert await reads.read(_later(1.0)) == "piece"
    reads.close()
    gone = weakref.ref(reads)
    del reads
    gc.collect()
    assert gone() is None


async def test_a_read_that_swallows_the_deadlines_cancel_still_times_out() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(10.0)
        except asyncio.CancelledError:
            return "late"  # a reader that will not be cancelled
        return "piece"

    reads = _deadline(5.0)
    try:
        with pytest.raises(TimeoutError):
            await reads.read(stubborn())
        with pytest.raises(TimeoutError):
            await reads.read(_later(0.0))  # and every read after it
    finally:
        reads.close()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's cancel was taken back
    await asyncio.sleep(1.0)
