"""A client that goes away cancels its upstream attempt and frees its slot at once:
streams before their first byte and in the middle, and plain requests too."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.gateway.helpers import HELLO, Running, running, scenario, spec, until

pytestmark = pytest.mark.looptime

ONE_SLOT = "[limiter]\ninitial = 1\nmin = 1\nmax = 1"


def flagship_in_flight(gw: Running) -> int:
    return gw.client.snapshot().targets[0].in_flight


async def sim_in_flight(gw: Running) -> int:
    state: Any = await gw.sim_model("sim-flagship")
    return int(state["in_flight"])


async def sim_free(gw: Running) -> bool:
    return await sim_in_flight(gw) == 0


def disconnects(gw: Running, api: str = "chat") -> float:
    metrics = gw.app.state.gateway.metrics
    return float(metrics.registry.get_sample_value("capmon_gateway_disconnects_total", {"api": api}) or 0.0)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_a_client_gone_before_the_first_byte_frees_its_slot(stream: bool) -> None:
    slow = scenario(spec("flagship", base_latency=60.0), spec("medium"), spec("small"))
    async with running(slow, extra=ONE_SLOT) as gw, gw.http() as http:
        body = {"model": "flagship", "messages": HELLO, "stream": stream}
        gone = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await until(lambda: flagship_in_flight(gw) == 1, "the flagship took the request")
        await until(lambda: sim_in_flight(gw), "the simulator took it")
        gone.cancel()  # the client goes away: its connection closes
        await until(lambda: gw.client.snapshot().in_flight == 0, "the gateway cancelled the attempt", 1.0)
        snap = gw.client.snapshot()
        if stream:  # the simulator frees a closed stream's slot, as a provider does
            await until(lambda: sim_free(gw), "the simulator freed the stream's slot", 1.0)
        # the freed slot is free: the next request to the flagship (one slot) is admitted at once
        nxt = asyncio.create_task(http.post("/v1/chat/completions", json=body))
        await until(lambda: flagship_in_flight(gw) == 1, "the next request took the freed slot", 1.0)
        queued = gw.client.snapshot().queued
        nxt.cancel()
        await until(lambda: gw.client.snapshot().in_flight == 0, "the second one cancelled too", 1.0)
    assert snap.targets[0].in_flight == 0 and snap.queued == 0 and queued == 0
    assert snap.succeeded == 0 and snap.failed == 0  # cancelled, not failed: nothing counts against the model
    assert snap.targets[0].consecutive_failures == 0 and str(snap.targets[0].state) == "closed"
    assert disconnects(gw) == 2


async def test_a_client_gone_mid_stream_cancels_the_attempt() -> None:
    dribble = scenario(spec("flagship", base_latency=0.1, per_token=0.5, answer_tokens=400), spec("medium"))
    async with running(dribble, models=("flagship", "medium")) as gw, gw.http() as http:
        lines: list[str] = []

        async def read() -> None:
            async with http.stream(
                "POST", "/v1/chat/completions", json={"model": "flagship", "messages": HELLO, "stream": True}
            ) as r:
                assert r.headers["x-capmon-model"] == "flagship"
                async for line in r.aiter_lines():
                    lines.append(line)

        reader = asyncio.create_task(read())
        await until(lambda: sum(line.startswith("data:") for line in lines) >= 2, "output arrived")
        assert await sim_in_flight(gw) == 1
        reader.cancel()
        await until(lambda: gw.client.snapshot().in_flight == 0, "the gateway cancelled the stream", 1.0)
        await until(lambda: sim_free(gw), "the simulator freed the stream's slot", 1.0)
        snap = gw.client.snapshot()
    assert disconnects(gw) == 1
    assert snap.targets[0].in_flight == 0 and snap.failed == 0
