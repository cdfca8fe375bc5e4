"""The limiter climbs (capmon/core/control/limiter.py): a limit learned at a model's capacity
grows again as fast as round trips allow once the provider admits more and work waits for
it, at the cost of a few rejected asks; with nothing waiting it stays where it is. The
FallbackClient against the simulator over real HTTP, in fast-forwarded time."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import ModelSpec, Phase, Scenario
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}
ROUND_TRIP = 0.5
RISE = 6.0  # the provider admits 16 instead of 8 from here on (seconds since the simulator started)


def _scenario(slots: int = 8, schedule: tuple[Phase, ...] = (Phase(at=RISE, slots=16),)) -> Scenario:
    flagship = ModelSpec(
        name="sim-flagship",
        slots=slots,
        base_latency=ROUND_TRIP,
        per_token=0.0,
        noise=0.2,  # answers spread over the round trip, as real ones are (not in lockstep)
        answer_tokens=8,
        context_window=128_000,
        schedule=schedule,
    )
    return Scenario(models=(flagship,), seed=7)


async def _run(
    start_sim: StartSim,
    workers: int,
    until: float,
    *,
    early_workers: int = 0,
    scenario: Scenario | None = None,
    rise: float = RISE,
    top: int = 16,
    breaker: dict | None = None,
) -> dict:
    """``workers`` send requests back to back until ``until`` seconds; ``early_workers`` more
    do so for the first 3 s only (so that the limiter learns the 8 slots from a rejection).
    Returns the limiter's readings every 0.1 s, the first time it reached ``top`` (16) after
    ``rise``, and the simulator's counts."""
    sim = await start_sim(scenario or _scenario())
    models = sim_models(("flagship",), max_tokens=8)
    cfg = build_config(sim.base_url, endpoint="sim", keys=[("KEY", "k")], models=models, breaker=breaker or {})
    async with FallbackClient(cfg, environ=ENV) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time() - sim.simulator.elapsed()  # the simulator's clock: its schedule's zero

        async def worker(stop: float) -> None:
            while loop.time() - t0 < stop:
                await client.chat("work")

        readings: list[tuple[float, float, int | None]] = []

        async def watch() -> None:
            while loop.time() - t0 < until:
                t = client.snapshot().targets[0]
                readings.append((loop.time() - t0, t.limit, t.capacity))
                await asyncio.sleep(0.1)

        await asyncio.gather(
            watch(), *(worker(until) for _ in range(workers)), *(worker(3.0) for _ in range(early_workers))
        )
    stats = sim.simulator.stats()["models"]["sim-flagship"]
    reached = next((t for t, limit, _ in readings if t > rise and limit >= top), None)
    return {"readings": readings, "reached": reached, "stats": stats}


async def test_a_limit_learned_at_8_climbs_to_16_within_a_few_round_trips_once_the_provider_admits_16(
    start_sim: StartSim,
) -> None:
    got = await _run(start_sim, workers=24, until=12.0)
    readings, stats = got["readings"], got["stats"]
    before = [(limit, capacity) for t, limit, capacity in readings if 4.0 <= t < RISE]
    assert before and all(capacity is not None and 8 <= capacity <= 9 for _, capacity in before), before
    assert all(limit < 10 for limit, _ in before), before  # at the capacity, asking for one more now and then
    # Work waits all the time (24 workers): the limit is at 16 within four round trips of the
    # rise (an ask, its answer, a climb that triples per round trip), not the many seconds
    # of a limit that only creeps.
    assert got["reached"] is not None and got["reached"] - RISE <= 4 * ROUND_TRIP, (got["reached"], readings)
    after = [capacity for t, _, capacity in readings if t >= RISE + 4 * ROUND_TRIP]
    assert after and all(capacity is not None and 16 <= capacity <= 17 for capacity in after), after
    # The asks and the climb's top cost a few rejections, not a share of the work.
    rejected = stats["rejected"]["capacity"] + stats["rejected"]["rate_limited"]
    assert stats["completed"] > 250
    assert rejected <= 0.04 * stats["requests"], stats


async def test_with_nothing_waiting_a_learned_limit_stays_where_it_is(start_sim: StartSim) -> None:
    # 12 workers for 3 s teach the limiter the 8 slots; then 8 send back to back: the 8 slots
    # are all in use, but nothing is turned away, so more room would not be used.
    got = await _run(start_sim, workers=8, until=12.0, early_workers=4)
    later = [(limit, capacity) for t, limit, capacity in got["readings"] if t >= 5.0]
    # What the 12 pressed it to before they stopped stays (at most an ask's slot more, which
    # 8 workers never use); from then on nothing moves it, not the rise to 16 at 6 s.
    assert later and all(capacity == 8 and limit == later[0][0] < 10.0 for limit, capacity in later), later
    assert got["reached"] is None
    stats = got["stats"]
    assert stats["rejected"]["capacity"] + stats["rejected"]["rate_limited"] <= 4, stats  # learning only


DROP, BACK = 4.0, 6.5  # the provider admits 12 of its 24 slots from DROP, all 24 again from BACK


async def test_a_limit_learned_at_12_below_a_remembered_24_climbs_back_within_two_round_trips(
    start_sim: StartSim,
) -> None:
    # A recovery in steps: the limiter learns 24, the provider drops to 12, and comes back to
    # 24 five round trips later. Remembering the 24 it held, the limiter asks for one more slot
    # every round trip (not at its doubling patience, which had reached 4 round trips at 24),
    # so the next ask after the return is served and the climb's tripling finds 24 within
    # about two round trips (without the ceiling: five).
    # The drop's rejections in a row would trip the breaker (whose restore and ramp are
    # tested elsewhere): a threshold no drop reaches leaves the limiter alone here.
    scenario = _scenario(24, (Phase(at=DROP, slots=12), Phase(at=BACK)))
    breaker = {"failure_threshold": 1000, "ratio_min_requests": 100000}
    got = await _run(start_sim, workers=40, until=12.0, scenario=scenario, rise=BACK, top=24, breaker=breaker)
    readings, stats = got["readings"], got["stats"]
    before = [(limit, capacity) for t, limit, capacity in readings if 3.0 <= t < DROP]
    assert before and all(capacity is not None and 24 <= capacity <= 25 for _, capacity in before), before
    dropped = [capacity for t, _, capacity in readings if DROP + 3 * ROUND_TRIP <= t < BACK]
    assert dropped and all(capacity is not None and capacity <= 13 for capacity in dropped), readings
    assert got["reached"] is not None and got["reached"] - BACK <= 2.5 * ROUND_TRIP, (got["reached"], readings)
    after = [capacity for t, _, capacity in readings if t >= BACK + 4 * ROUND_TRIP]
    assert after and all(capacity is not None and 24 <= capacity <= 25 for capacity in after), after
    # The drop's own rejections (what was sent into the 24 before a rejection came back:
    # about 15) and a refused ask per round trip while 12: about 5 % of the requests.
    rejected = stats["rejected"]["capacity"] + stats["rejected"]["rate_limited"]
    assert rejected <= 0.05 * stats["requests"], stats
