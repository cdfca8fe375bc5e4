"""Probe workers against a real HTTP server on loopback, in fast-forwarded time."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.probe import ProbeWorker
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = pytest.mark.looptime


def flagship(client: FallbackClient):  # type: ignore[no-untyped-def]
    return next(t for t in client.targets if t.model.name == "flagship")


async def test_a_probe_shows_latency_and_status() -> None:
    script = Script()
    script.set("flagship", lambda n, body: Reply(200, ok("flagship").body, delay=0.25))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        probes = ProbeWorker(client, 5.0)
        result = await probes.probe_once(flagship(client).id)
        assert result.ok and result.status == 200
        snap = client.snapshot().targets[0]
        assert snap.last_status == 200 and snap.probe_latency == pytest.approx(0.25, abs=0.05)
        assert probes.last[flagship(client).id].result is result and probes.sent == 1
        assert client.snapshot().targets[0].in_flight == 0  # its slot was given back


async def test_probes_decide_a_half_open_breaker_without_any_traffic() -> None:
    script = Script()
    down = {"on": True}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else ok("flagship"))
    async with serve(script) as url, FallbackClient(three_models(url, cooldown=30.0), environ=ENV) as client:
        target = flagship(client)
        probes = ProbeWorker(client, 5.0)
        for _ in range(3):
            await probes.probe_once(target.id)
        assert target.state.view().breaker.state == "open"
        # Open: the next probe comes when the cool-down ends, not a whole interval later.
        assert 0 < probes.next_delay(target.id) <= 5.0
        down["on"] = False
        task = asyncio.create_task(probes.run_target(target.id))
        await asyncio.sleep(31)
        assert target.state.view().breaker.state in ("ramp", "closed")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_probe_waits_until_the_cool_down_ends_when_that_is_sooner() -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    async with serve(script) as url, FallbackClient(three_models(url, cooldown=2.0), environ=ENV) as client:
        target = flagship(client)
        probes = ProbeWorker(client, 5.0)
        for _ in range(3):
            await probes.probe_once(target.id)
        assert target.state.view().breaker.state == "open"
        assert probes.next_delay(target.id) == pytest.approx(2.05, abs=0.1)
        skipped = await probes.probe_once(target.id)
        assert skipped.ok is None and "open" in skipped.reason  # the breaker does not admit: nothing sent


async def test_a_target_at_its_concurrency_limit_is_not_probed() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        target = flagship(client)
        while await target.state.admit(1) is not None:
            pass
        result = await ProbeWorker(client, 5.0).probe_once(target.id)
        assert result.ok is None and "concurrency limit" in result.reason
        assert script.served("flagship") == 0


async def test_probes_repeat_at_the_interval_staggered_across_targets() -> None:
    script = Script()
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        probes = ProbeWorker(client, 3.0)
        offsets = probes.offsets()
        assert sorted(offsets.values()) == pytest.approx([0.0, 1.0, 2.0])
        tasks = [asyncio.create_task(probes.run_target(tid, offset=offsets[tid])) for tid in probes.target_ids]
        await asyncio.sleep(9.5)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [script.served(m) for m in ("flagship", "medium", "small")] == [4, 3, 3]


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ProbeWorker(object(), 0)  # type: ignore[arg-type]
