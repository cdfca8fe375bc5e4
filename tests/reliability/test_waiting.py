"""Requests that wait because no model admits them (every model down, its breaker open by
itself: a probe could find it back, so waiting can help): they must end at their deadline,
promptly, and leave nothing behind while they wait. (Every model tripped by hand is no reason
to wait: tests/core/test_fail_fast.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from capmon.core.base.exceptions import DeadlineExceeded
from capmon.core.routing.client import FallbackClient
from tests.support.breakers import open_every_breaker
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Script, ok, serve

pytestmark = pytest.mark.looptime

MODELS = ("flagship", "medium", "small")


def outage(script: Script) -> dict[str, bool]:
    """Every model overloaded while ``down["on"]``."""
    down = {"on": True}
    for m in MODELS:
        script.set(m, lambda n, body, m=m: OVERLOADED if down["on"] else ok(m))
    return down


def count_waits(client: FallbackClient, limit: int) -> list[int]:
    """Count the wait queue's dispatch passes so that a spin fails the test instead of
    hanging it (on a fast-forwarded loop a spin never lets time move, so no timeout fires)."""
    calls = [0]
    queue: Any = client._queue
    original = queue._pass

    async def dispatch() -> None:
        calls[0] += 1
        if calls[0] > limit:
            raise AssertionError(f"{calls[0]} dispatch passes: the queue spins (now {client.clock.now()!r})")
        await original()

    queue._pass = dispatch
    return calls


async def test_a_request_nothing_admits_ends_at_its_deadline() -> None:
    script = Script()
    outage(script)
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\ndeadline = 120.0")
        async with FallbackClient(cfg, environ=ENV) as client:
            await open_every_breaker(client)
            before = script.served()
            calls = count_waits(client, 1000)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(DeadlineExceeded):
                await client.chat("hi")
            assert loop.time() - t0 == pytest.approx(120.0, abs=1e-3)
    probes = script.served() - before  # each probe's settle kicks a pass too
    assert calls[0] <= 120 / 1 + 5 + 2 * probes  # else a pass at most every second while nothing admits


async def test_a_deadline_a_hair_ahead_of_the_clock_does_not_spin() -> None:
    script = Script()
    outage(script)
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\ndeadline = 120.0")
        async with FallbackClient(cfg, environ=ENV) as client:
            await open_every_breaker(client)
            count_waits(client, 1000)
            loop = asyncio.get_running_loop()
            # 241.71 + 120.0 == 361.71000000000004 in floats; the loop's clock says 361.71
            await asyncio.sleep(241.71 - loop.time())
            assert loop.time() + 120.0 != round(loop.time() + 120.0, 6)
            with pytest.raises(DeadlineExceeded):
                await client.chat("hi")


async def test_waiting_requests_leave_no_dead_futures_behind() -> None:
    script = Script()
    down = outage(script)
    async with serve(script) as url:
        cfg = three_models(url, extra="[client]\ndeadline = 900.0")
        async with FallbackClient(cfg, environ=ENV) as client:
            await open_every_breaker(client)
            tasks = [asyncio.create_task(client.chat(f"r{i}")) for i in range(50)]
            await asyncio.sleep(600)  # ten minutes of nothing admitting anything
            waiting = client.snapshot().queued
            assert waiting == 50
            held = sum(len(q) for q in client._queue._groups.values())
            assert held == waiting, f"{held} futures kept for {waiting} waiting requests"
            down["on"] = False
            for m in MODELS:
                client.reset(m)
            await asyncio.gather(*tasks)
