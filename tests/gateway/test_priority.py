"""Under saturation, through the gateway: interactive requests that wait get freed slots
first, and batch keeps its share of them ([client] batch_share), so it never starves."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.helpers import HELLO, running, scenario, spec, until

pytestmark = pytest.mark.looptime

# One model, two slots at the gateway: everything else waits in the gateway's line.
SATURATED = "[limiter]\ninitial = 2\nmin = 2\nmax = 2\n\n[client]\nbatch_share = 0.2"
BATCH, INTERACTIVE = 12, 10


async def test_interactive_requests_go_first_and_batch_keeps_its_share() -> None:
    one = scenario(spec("flagship", slots=8, base_latency=1.0))
    async with running(one, models=("flagship",), extra=SATURATED) as gw, gw.http() as http:
        finished: list[str] = []

        async def send(priority: str) -> None:
            r = await http.post(
                "/v1/chat/completions",
                headers={"x-capmon-priority": priority},
                json={"model": "auto", "messages": HELLO},
            )
            assert r.status_code == 200 and r.headers["x-capmon-priority"] == priority
            finished.append(priority)

        tasks = [asyncio.create_task(send("batch")) for _ in range(BATCH)]
        await until(lambda: gw.client.snapshot().queued == BATCH - 2, "the batch requests wait in line")
        tasks += [asyncio.create_task(send("interactive")) for _ in range(INTERACTIVE)]
        await until(lambda: gw.client.snapshot().queued == BATCH + INTERACTIVE - 2, "everyone waits")
        await asyncio.gather(*tasks)
    # The two batch requests that had the slots finish first. First come, first served would
    # then serve the ten waiting batch requests before any interactive one; instead the
    # interactive ones take the freed slots, and batch gets its fifth of them meanwhile.
    order = finished[2:]
    last_interactive = max(i for i, p in enumerate(order) if p == "interactive")
    batch_meanwhile = order[: last_interactive + 1].count("batch")
    assert order.count("interactive") == INTERACTIVE and order.count("batch") == BATCH - 2
    assert batch_meanwhile >= 1, order  # batch kept a share while interactive requests waited
    assert batch_meanwhile / (last_interactive + 1) <= 0.35, order  # about batch_share of the slots, no more
    assert last_interactive < len(order) - 1 - 4, order  # the interactive ones were done well before batch
    assert order[-1] == "batch"
