"""A ramp that grows on its requests surviving, not only on their answers
(capmon/core/control/survival.py, CircuitBreaker.survived): the FallbackClient against the
simulator over real HTTP, in fast-forwarded time, and the refusal times it learns from."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from capmon.core.control.policy import BreakerSignal
from capmon.core.control.survival import FLOOR, KEPT, RefusalTimes
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.core.types.failure import FIRST_TOKEN, SILENT, Failure, Kind
from capmon.sim.scenario import ModelSpec, Phase, Scenario
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim

ENV = {"KEY": SIMULATOR_DEMO_KEY}
SERVICE = 2.0  # seconds the flagship takes to answer: what a ramp growing by answers waits
WORKERS = 40
BUSY = Failure(Kind.CAPACITY, "Selected model is at capacity", 503, "server_is_overloaded")


# ------------------------------------------------------------------ the survival time


@pytest.mark.unit
def test_the_survival_time_is_the_slowest_recent_refusal_times_the_factor_and_none_before_one() -> None:
    times = RefusalTimes(3.0)
    assert times.survival() is None  # nothing timed: a ramp grows by its answers alone
    times.record(BreakerSignal.SUCCESS, None, 0.9)  # an answer is no refusal
    times.record(BreakerSignal.CAPACITY, Failure(Kind.CAPACITY, "no headers", None, SILENT), 30.0)  # a timeout
    times.record(BreakerSignal.CAPACITY, Failure(Kind.CAPACITY, "slow", 200, FIRST_TOKEN), 30.0)  # after headers
    times.record(BreakerSignal.NEUTRAL, BUSY, 5.0)  # cancelled: not the model's answer
    assert times.survival() is None
    times.record(BreakerSignal.CAPACITY, BUSY, 0.001)
    assert times.survival() == FLOOR  # a loopback refusal: the floor
    times.record(BreakerSignal.CAPACITY, BUSY, 0.2)
    assert times.survival() == pytest.approx(0.6) and RefusalTimes(0.0).survival() is None  # 0: off
    for _ in range(KEPT - 1):  # a slow refusal counts until KEPT faster ones came after it
        times.record(BreakerSignal.CAPACITY, BUSY, 0.01)
    assert times.survival() == pytest.approx(0.6)
    times.record(BreakerSignal.CAPACITY, BUSY, 0.01)
    assert times.survival() == pytest.approx(0.05)


@pytest.mark.unit
def test_a_failure_later_than_the_survival_time_turns_it_off_until_kept_refusals_came_since() -> None:
    # A route that hangs: a request out past the survival time was not admitted after all.
    times = RefusalTimes(3.0)
    times.record(BreakerSignal.CAPACITY, BUSY, 0.01)
    times.record(BreakerSignal.TRANSIENT, Failure(Kind.TRANSIENT, "502 bad gateway", 502), 0.02)  # sooner: nothing
    times.record(BreakerSignal.SILENT, Failure(Kind.CAPACITY, "no headers", None, SILENT), 0.04)
    assert times.survival() == FLOOR
    times.record(BreakerSignal.SILENT, Failure(Kind.CAPACITY, "no headers", None, SILENT), 30.0)
    assert times.survival() is None
    for _ in range(KEPT - 1):
        times.record(BreakerSignal.CAPACITY, BUSY, 0.01)
    assert times.survival() is None
    times.record(BreakerSignal.CAPACITY, BUSY, 0.01)
    assert times.survival() == FLOOR
    # an error inside a 200 stream after a long silence: the same
    times.record(BreakerSignal.CAPACITY, Failure(Kind.CAPACITY, "overloaded", 200), 2.0)
    assert times.survival() is None


# ------------------------------------------------------------------ against the simulator


@dataclass(frozen=True)
class Recovery:
    probe_at: float  # when the probe that found the model back was sent (since the start)
    ramp_at: float  # when the ramp opened
    closed_at: float  # when the ramp closed
    peak_early: int  # the most flagship requests in flight within half a service time of the ramp opening
    rejected_after: int  # the flagship's rejections of requests sent after the return


async def _recover(start_sim: StartSim, *, survival: float, back_at: int) -> Recovery:
    """The flagship (24 slots, SERVICE s) is out from 6 s to 20 s, then back with
    ``back_at`` slots; WORKERS workers keep it wanted all along (medium takes the rest)."""
    down = (Phase(at=6.0, slots=0), Phase(at=20.0, slots=back_at))
    models = (
        ModelSpec(
            name="sim-flagship",
            slots=24,
            base_latency=SERVICE,
            per_token=0.0,
            noise=0.0,
            answer_tokens=8,
            schedule=down,
        ),
        ModelSpec(name="sim-medium", slots=64, base_latency=0.25, per_token=0.0, noise=0.0, answer_tokens=8),
    )
    sim = await start_sim(Scenario(models=models))
    extra = (
        "[breaker]\nprobe_interval = 0.5\ncooldown = 1.0\nprobe_floor = 0.25\nramp_start = 0.5\n"
        f"ramp_duration = 60.0\nramp_survival = {survival}\nramp_lead = 4\n"
        "[limiter]\ninitial = 8\nmax = 64\n"
    )
    cfg = build_config(
        sim.base_url,
        endpoint="sim",
        keys=[("KEY", "k")],
        models=sim_models(("flagship", "medium"), max_tokens=16),
        extra=extra,
    )
    bus = ev.EventBus()
    events: list[ev.Event] = []
    bus.subscribe(events.append)
    async with FallbackClient(cfg, environ=ENV, bus=bus) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stop = False
        in_flight: list[tuple[float, int]] = []

        async def worker(i: int) -> None:
            await asyncio.sleep(i * SERVICE / WORKERS)  # spread: a request comes every 0.05 s
            while not stop:
                await client.chat("steady work")

        async def sample() -> None:
            while not stop:
                flagship = sim.simulator.stats()["models"]["sim-flagship"]
                in_flight.append((loop.time() - t0, flagship["in_flight"]))
                await asyncio.sleep(0.05)

        tasks = [asyncio.create_task(worker(i)) for i in range(WORKERS)] + [asyncio.create_task(sample())]
        await asyncio.sleep(19.0)
        before = sim.simulator.stats()["models"]["sim-flagship"]["rejected"]["capacity"]
        await asyncio.sleep(11.0)
        stop = True
        await asyncio.gather(*tasks)
        after = sim.simulator.stats()["models"]["sim-flagship"]["rejected"]["capacity"]
    moves = [(e.at - t0, e.new) for e in events if isinstance(e, ev.BreakerChanged) and e.model == "flagship"]
    probes = [e for e in events if isinstance(e, ev.ProbeFinished) and e.model == "flagship" and e.ok]
    probe_at = probes[-1].at - probes[-1].latency - t0
    ramp_at = next(at for at, new in moves if new == "ramp" and at > 20.0)
    closed_at = next(at for at, new in moves if new == "closed" and at > ramp_at)
    early = [n for at, n in in_flight if ramp_at <= at <= ramp_at + SERVICE / 2]
    return Recovery(probe_at, ramp_at, closed_at, max(early), after - before)


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_ramp_reaches_the_whole_learned_concurrency_within_a_service_time(start_sim: StartSim) -> None:
    by_answers = await _recover(start_sim, survival=0.0, back_at=24)
    by_survival = await _recover(start_sim, survival=3.0, back_at=24)
    # By answers, the probe's answer opens the ramp, at 12, and the ramp's answers grow it
    # a service time after that.
    assert by_answers.ramp_at - by_answers.probe_at >= SERVICE - 0.1, by_answers
    assert by_answers.closed_at - by_answers.ramp_at >= SERVICE - 0.1, by_answers
    assert by_answers.peak_early <= 13, by_answers
    # By survivals, the probe opens the ramp once it outlived a refusal's time, and the ramp
    # takes each request that comes as it comes: every slot the model has is in use within
    # half a service time of that.
    # (The first request past the model's 24 is refused, which ends the ramp.)
    assert by_survival.ramp_at - by_survival.probe_at <= 0.2, by_survival
    assert by_survival.peak_early >= 23, by_survival
    # What it costs: the ramp runs ramp_lead (4) requests ahead of what the model showed.
    assert by_survival.rejected_after <= by_answers.rejected_after + 4, (by_answers, by_survival)


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_model_back_with_half_its_slots_sees_about_ramp_lead_requests_too_many(start_sim: StartSim) -> None:
    # The ramp opens at the 12 the model holds now: the requests past it are refused at once,
    # the limiter learns 12 from the first, and the ramp ends there.
    by_answers = await _recover(start_sim, survival=0.0, back_at=12)
    by_survival = await _recover(start_sim, survival=3.0, back_at=12)
    assert by_survival.rejected_after <= by_answers.rejected_after + 4, (by_answers, by_survival)
