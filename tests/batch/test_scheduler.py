"""The scheduler alone: which item goes next, parks, and the gates, over a real job store
in fast-forwarded time."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path

import pytest

from capmon.batch.pacing import Pacing, Window
from capmon.batch.scheduler import Scheduler
from capmon.batch.sqlite import JobStore
from capmon.batch.states import ItemState
from capmon.core.base.clock import LoopClock
from tests.support.clocks import WallClock, local

pytestmark = pytest.mark.looptime


def _store(tmp_path: Path, n: int) -> tuple[JobStore, int]:
    store = JobStore(tmp_path / "jobs.db")
    info = store.create_job("j", input_path="in.jsonl", input_size=1, fingerprint="f", settings={}, now=1.0)
    store.ingest_chunk(
        info.id,
        [(i, f"it-{i}", ItemState.PENDING, "[]", None, None, None, None, None, None) for i in range(1, n + 1)],
        offset=0,
        line=n,
        now=1.0,
    )
    return store, info.id


def _scheduler(tmp_path: Path, n: int, pacing: Pacing | None = None, **kw: object) -> Scheduler:
    store, job_id = _store(tmp_path, n)
    return Scheduler(
        kw.pop("clock", LoopClock()),
        pacing or Pacing(concurrency=1),  # type: ignore[arg-type]
        lambda after, limit: store.pending_page(job_id, after, limit),
        **kw,
    )  # type: ignore[arg-type]


async def test_pending_items_come_in_input_order_page_after_page(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 600)  # pages of 256
    taken = []
    while (item := sched.take()) is not None:
        taken.append(item.line)
    assert taken == list(range(1, 601)) and sched.drained


async def test_a_parked_item_waits_its_delay_then_goes_before_pending_ones(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 10)
    first = sched.take()
    assert first is not None
    sched.park(dataclasses.replace(first, parks=1, not_before=0.0), 5.0)
    assert sched.parked == 1 and [sched.take().line for _ in range(3)] == [2, 3, 4]  # type: ignore[union-attr]
    await asyncio.sleep(5.0)
    assert sched.take().line == 1  # type: ignore[union-attr]
    while sched.take() is not None:
        pass
    assert sched.drained


async def test_an_item_put_back_goes_first_again_a_parked_one_due_now(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 3)
    a = sched.take()
    assert a is not None
    sched.put_back(a)
    assert sched.take() == a and sched.parked == 0
    sched.put_back(dataclasses.replace(a, parks=2, not_before=123.0))
    assert sched.parked == 1 and sched.take().line == 1 and sched.parked == 0  # type: ignore[union-attr]


def test_park_delays_double_up_to_the_cap_with_spread_and_a_longer_hint_wins(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 1, park_base=5.0, park_cap=300.0, rng=random.Random(1))
    for parks, base in [(1, 5.0), (2, 10.0), (3, 20.0), (7, 300.0), (30, 300.0)]:
        delays = [sched.park_delay(parks, None) for _ in range(200)]
        assert all(base <= d <= 1.5 * base for d in delays) and max(delays) - min(delays) > 0.3 * base
    assert sched.park_delay(1, 60.0) == 60.0 and sched.park_delay(1, 1.0) >= 5.0


async def test_pause_holds_the_gate_until_resume_and_a_halt_lets_waiters_end(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 1)
    assert await sched.gates()
    sched.pause()
    waiting = asyncio.create_task(sched.gates())
    await asyncio.sleep(100)
    assert not waiting.done() and not sched.may_start()
    sched.resume()
    assert await waiting is True and sched.may_start()
    sched.pause()
    waiting = asyncio.create_task(sched.gates())
    await asyncio.sleep(1)
    sched.halt()
    assert await waiting is False and sched.paused  # released, not resumed


async def test_results_that_cannot_be_saved_block_the_gate_until_unblocked(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 1)
    sched.block()
    waiting = asyncio.create_task(sched.gates())
    await asyncio.sleep(30)
    assert not waiting.done() and not sched.may_start() and not sched.paused
    sched.unblock()
    assert await waiting is True


async def test_outside_the_window_the_gate_opens_when_the_window_does(tmp_path: Path) -> None:
    clock = WallClock(local(2026, 3, 2, 21, 50))
    sched = _scheduler(tmp_path, 1, Pacing(1, None, Window.parse("22:00-06:00")), clock=clock)
    assert not sched.window_open()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await sched.gates()
    assert 600 - 1 <= loop.time() - t0 <= 600 + 1 and sched.window_open()


async def test_idle_wakes_when_a_parked_item_falls_due_or_anything_changes(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 1)
    item = sched.take()
    assert item is not None and sched.take() is None
    sched.park(item, 7.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await sched.idle()
    assert loop.time() - t0 == pytest.approx(7.0, abs=0.01) and sched.take() == item
    idle = asyncio.create_task(sched.idle())  # nothing parked: waits for a change, however long
    await asyncio.sleep(3600)
    assert not idle.done()
    sched.notify()
    await idle


async def test_the_rate_spaces_starts(tmp_path: Path) -> None:
    sched = _scheduler(tmp_path, 10, Pacing(4, 2.0))
    assert sched.rated
    loop = asyncio.get_running_loop()
    starts = []
    for _ in range(5):
        await sched.pace()
        starts.append(loop.time())
    assert starts[-1] - starts[0] == pytest.approx(2.0, abs=0.01)
    assert not _scheduler(tmp_path / "b", 1).rated
