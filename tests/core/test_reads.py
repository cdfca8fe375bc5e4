"""ReadDeadline: one timer over many reads (capmon/core/routing/reads.py), on fast-forwarded loop
time (looptime): the figures are loop seconds."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from capmon.core.base.clock import LoopClock
from capmon.core.routing.reads import Cut, ReadDeadline

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


# ------------------------------------------------------------ the first output's and a stall's bounds


async def test_the_first_output_bound_cuts_before_the_deadline_and_says_so() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    reads = ReadDeadline(LoopClock().now, 60.0, first=5.0, idle=2.0)
    try:
        assert await reads.read(_later(3.0)) == "piece"  # the headers, say: no output yet
        with pytest.raises(TimeoutError):
            await reads.read(_later(10.0))  # no output by 5 s after the start
    finally:
        reads.close()
    assert loop.time() - start == pytest.approx(5.0)
    assert reads.why is Cut.FIRST


async def test_after_output_each_read_may_wait_the_idle_bound_but_no_longer() -> None:
    loop = asyncio.get_running_loop()
    reads = ReadDeadline(LoopClock().now, 60.0, first=5.0, idle=2.0)
    try:
        assert await reads.read(_later(4.0)) == "piece"
        reads.output()  # the first bound is done: 4 s more per read would pass it, 1.5 s each does not
        for _ in range(5):
            assert await reads.read(_later(1.5)) == "piece"
        await asyncio.sleep(10.0)  # the caller's own work between reads is no stall
        started = loop.time()
        with pytest.raises(TimeoutError):
            await reads.read(_later(3.0))
    finally:
        reads.close()
    assert loop.time() - started == pytest.approx(2.0)
    assert reads.why is Cut.IDLE


async def test_the_deadline_still_bounds_reads_after_output() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    reads = ReadDeadline(LoopClock().now, 5.0, first=30.0, idle=2.0)
    try:
        reads.output()
        for _ in range(3):
            assert await reads.read(_later(1.5)) == "piece"
        with pytest.raises(TimeoutError):
            await reads.read(_later(1.5))  # 6 s > 5 s: the deadline's, though no read waited 2 s
    finally:
        reads.close()
    assert loop.time() - start == pytest.approx(5.0)
    assert reads.why is Cut.DEADLINE
