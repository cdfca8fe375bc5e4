"""Recovery by the client's own probes, the evidence-driven ramp, first-come-first-served
waiting and capacity learning: the FallbackClient against the simulator over real HTTP,
in fast-forwarded time."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config
from capmon.sim.scenario import ModelSpec, Phase, Scenario
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}


def config(base_url: str, models: tuple[str, ...], extra: str = "") -> Config:
    return build_config(
        base_url, endpoint="sim", keys=[("KEY", "k")], models=sim_models(models, max_tokens=16), extra=extra
    )


def spec(name: str, slots: int, latency: float = 1.0, **kw: object) -> ModelSpec:
    return ModelSpec(
        name=f"sim-{name}",
        slots=slots,
        base_latency=latency,
        per_token=0.0,
        noise=0.0,
        answer_tokens=8,
        context_window=128_000,
        **kw,
    )  # type: ignore[arg-type]


class Events:
    def __init__(self, bus: ev.EventBus) -> None:
        self.items: list[ev.Event] = []
        bus.subscribe(self.items.append)

    def of(self, cls: type[ev.Event], model: str | None = None) -> list:
        return [e for e in self.items if isinstance(e, cls) and (model is None or getattr(e, "model", None) == model)]


async def test_waiting_is_first_come_first_served_and_nobody_starves(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", 4),)))
    async with FallbackClient(config(sim.base_url, ("flagship",)), environ=ENV) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        async def one(i: int) -> float:
            await asyncio.sleep(i * 0.001)
            await client.chat(f"request {i}")
            return loop.time() - t0

        done = await asyncio.gather(*(one(i) for i in range(40)))
    # Four at a time, one second each: request i is answered in wave i // 4 (give or take
    # the first wave's rejections, which keep their place in line).
    waves = [round(t) for t in done]
    assert max(waves) <= 11
    assert all(a <= b + 1 for a, b in zip(waves, waves[1:], strict=False)), waves  # in order of arrival
    assert waves[-1] >= 10


async def test_in_saturation_the_limiter_settles_on_the_real_capacity_without_overshooting(start_sim: StartSim) -> None:
    # 256 requests on 6 slots, 0.25 s each: 11 s of loop time (fast-forwarded, but kept short
    # for the moments when looptime follows real time on a loaded machine).
    sim = await start_sim(Scenario(models=(spec("flagship", 6, latency=0.25),)))
    async with FallbackClient(config(sim.base_url, ("flagship",)), environ=ENV) as client:

        async def worker() -> None:
            for _ in range(8):
                await client.chat("work")

        await asyncio.gather(*(worker() for _ in range(32)))
        snap = client.snapshot()
    stats = sim.simulator.stats()["totals"]
    # Learned from the positions of its rejections (7 at most: a slot freed at the server a
    # moment before our side saw the answer looks like room for one more).
    assert snap.targets[0].capacity in (6, 7) and 6 <= snap.targets[0].limit < 8
    assert stats["completed"] == 256
    rejected = stats["rejected"]["capacity"] + stats["rejected"]["rate_limited"]
    assert rejected <= 12, stats  # a handful while learning, then at most a rare probe above capacity


async def test_an_open_breaker_is_probed_by_the_client_and_recovers_as_fast_as_capacity_returns(
    start_sim: StartSim,
) -> None:
    # Up for 5 s, long enough for the limiter to learn its 8 slots from its initial 2 (a
    # ramp admits no fewer than the initial limit: one that learned nothing more has none).
    down = (Phase(at=5.0, slots=0), Phase(at=35.0))
    sim = await start_sim(Scenario(models=(spec("flagship", 8, schedule=down), spec("medium", 64))))
    extra = (
        "[breaker]\nprobe_interval = 1.0\ncooldown = 8.0\ncooldown_multiplier = 2.0\nramp_start = 0.25\n"
        "ramp_duration = 60.0\nprobe_share = 0\nprobe_interval_wanted = 0\n"  # the slow schedule alone
        "[limiter]\ninitial = 2\nmax = 8\n"
    )
    bus = ev.EventBus()
    seen = Events(bus)
    async with FallbackClient(config(sim.base_url, ("flagship", "medium"), extra), environ=ENV, bus=bus) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stop = False

        async def worker() -> None:
            while not stop:
                await client.chat("steady traffic")

        tasks = [asyncio.create_task(worker()) for _ in range(16)]
        await asyncio.sleep(5)
        assert client.snapshot().targets[0].limit == 8  # learned before the outage
        await asyncio.sleep(45)
        stop = True
        await asyncio.gather(*tasks)
        closed_at = [e.at - t0 for e in seen.of(ev.BreakerChanged, "flagship") if e.new == "closed"]
        probes = [e for e in seen.of(ev.ProbeFinished, "flagship")]
        steps = seen.of(ev.RampStep, "flagship")
    sent = [p.at - p.latency - t0 for p in probes]
    gaps = [round(b - a) for a, b in zip(sent, sent[1:], strict=False)]
    # Intervals 1, 2, 4, then capped at the cool-down (8), while the probes fail...
    assert gaps[:4] == [2, 4, 8, 8] and all(g <= 8 for g in gaps), gaps
    assert all(not p.ok for p in probes[:-1]) and probes[-1].ok
    # ... the first probe after capacity returns finds it, within one interval ...
    assert 35.0 <= sent[-1] <= 35.0 + 8.0 + 1.0
    # ... and the ramp, from a quarter of the 8 learned (2, the initial limit too), grows a
    # slot per clean answer, so it doubles per round trip (about one service time): the
    # model is closed again in a few seconds, long before the 60 s ceiling.
    # One RampStep per doubling, and the second doubling is the close. (The outage's first
    # rejection may teach 7: capmon/core/control/decisions.py, checkpoint_keeps_lesson; 2 of 7 is 0.29.)
    assert len(steps) == 1 and 0.5 <= steps[0].share < 0.6, [s.share for s in steps]
    assert closed_at and closed_at[-1] - sent[-1] < 5.0


async def test_no_probe_comes_before_the_servers_hint(start_sim: StartSim) -> None:
    down = (Phase(at=0.0, slots=0),)
    sim = await start_sim(
        Scenario(models=(spec("flagship", 8, schedule=down, hint=20.0, dialect="openai-503"), spec("medium", 64)))
    )
    extra = "[breaker]\nprobe_interval = 1.0\ncooldown = 60.0\n"
    bus = ev.EventBus()
    seen = Events(bus)
    async with FallbackClient(config(sim.base_url, ("flagship", "medium"), extra), environ=ENV, bus=bus) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for _ in range(150):
            await client.chat("hi")
            await asyncio.sleep(1.0)
        elapsed = loop.time() - t0
        trips = [e.at for e in seen.of(ev.BreakerChanged, "flagship") if e.old == "closed" and e.new == "open"]
        probes = [e.at - e.latency for e in seen.of(ev.ProbeFinished, "flagship")]
        rejected = sim.simulator.stats()["models"]["sim-flagship"]["rejected"]["capacity"]
    # Each rejection says "retry after 20 s", and the client takes it for the whole model:
    # no request and no probe goes there sooner.
    assert trips and probes and probes[0] - trips[0] >= 20.0 - 1e-6
    assert all(b - a >= 20.0 - 1e-6 for a, b in zip(probes, probes[1:], strict=False)), " ".join(
        str(round(p)) for p in probes
    )
    assert rejected <= elapsed / 20 + 1


async def test_interactive_requests_wait_less_and_batch_keeps_its_share(start_sim: StartSim) -> None:
    sim = await start_sim(Scenario(models=(spec("flagship", 4),)))
    cfg = config(sim.base_url, ("flagship",), "[client]\nbatch_share = 0.25\n[limiter]\ninitial = 4\nmax = 4\n")
    async with FallbackClient(cfg, environ=ENV) as client:
        loop = asyncio.get_running_loop()
        served: list[tuple[float, str]] = []

        async def one(priority: str, delay: float) -> None:
            await asyncio.sleep(delay)
            await client.chat("work", priority=priority)
            served.append((loop.time(), priority))

        t0 = loop.time()
        await asyncio.gather(*[one("batch", 0.0) for _ in range(40)], *[one("interactive", 0.5) for _ in range(40)])
    # While both waited (from the second wave on, until the interactive ones ran out),
    # three of four slots went to interactive requests and one in four to batch.
    both = [p for at, p in served if 1.5 <= at - t0 <= 10.5]
    share = both.count("batch") / len(both)
    assert 0.15 <= share <= 0.35, (share, both)
    last_interactive = max(at for at, p in served if p == "interactive") - t0
    last_batch = max(at for at, p in served if p == "batch") - t0
    assert last_interactive <= 16 and last_batch >= last_interactive + 3  # interactive done well before batch
