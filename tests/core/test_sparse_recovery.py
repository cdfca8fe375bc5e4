"""Back to a recovered model quickly when traffic is sparse (issue 29, item 5): while a model's
breaker is open and a request wanted it within [breaker] probe_wanted_for, it is probed every
probe_interval_wanted seconds whatever the request rate (capmon/core/control/demand.py); the
slow doubling schedule only when nobody wants it. Against the simulator over real HTTP, in
fast-forwarded time."""

from __future__ import annotations

import asyncio
import math

import pytest

from capmon.core.control.demand import demand_due
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config
from capmon.sim.scenario import ModelSpec, Phase, Scenario
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

ENV = {"KEY": SIMULATOR_DEMO_KEY}
FLAP = 60.0  # the primary answers 503 for this long from the start, then is healthy


def _config(base_url: str, breaker: str = "") -> Config:
    return build_config(
        base_url,
        endpoint="sim",
        keys=[("KEY", "k")],
        models=sim_models(("flagship", "medium"), max_tokens=16),
        extra=f"[breaker]\n{breaker}" if breaker else "",
    )


def _spec(name: str, **kw: object) -> ModelSpec:
    return ModelSpec(name=f"sim-{name}", slots=8, base_latency=0.2, per_token=0.0, noise=0.0, answer_tokens=8, **kw)  # type: ignore[arg-type]


async def _flap(
    start_sim: StartSim, breaker: str = "", *, every: float = 4.0, until: float = 100.0, linger: float = 0.0
) -> tuple[list[tuple[float, str]], list[float]]:
    """One request every ``every`` s until ``until`` (then none for ``linger`` s) against a
    primary that answers 503 for FLAP s: when each request started and which model served
    it, and when each probe of the primary began."""
    down = (Phase(at=0.0, slots=0, dialect="openai-503"), Phase(at=FLAP))
    sim = await start_sim(Scenario(models=(_spec("flagship", schedule=down), _spec("medium"))))
    bus = ev.EventBus(history=10_000)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    probes: list[float] = []
    bus.subscribe(lambda e: probes.append(e.at - e.latency - t0) if isinstance(e, ev.ProbeFinished) else None)
    served: list[tuple[float, str]] = []
    async with FallbackClient(_config(sim.base_url, breaker), environ=ENV, bus=bus) as client:
        while loop.time() - t0 < until:
            at = loop.time() - t0
            result = await client.chat("sparse traffic")
            served.append((at, result.model))
            await asyncio.sleep(max(0.0, t0 + at + every - loop.time()))
        await asyncio.sleep(linger)
    return served, probes


def _back(served: list[tuple[float, str]]) -> float:
    """Seconds from the primary's recovery to the first request it served after it."""
    return next(at for at, model in served if at >= FLAP and model == "flagship") - FLAP


async def test_a_flapping_primary_is_back_within_five_seconds_with_one_request_every_four(
    start_sim: StartSim,
) -> None:
    served, probes = await _flap(start_sim)
    assert all(m == "medium" for at, m in served if 12 <= at < FLAP)  # down: served by the fallback
    assert _back(served) <= 5.0, served
    assert all(m == "flagship" for at, m in served if at >= FLAP + 5.0), served  # and it stays there
    # While it was wanted, one probe every 2 s (probe_interval_wanted), never closer than the floor.
    during = [p for p in probes if 12 <= p < FLAP]
    gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
    assert gaps and all(1.0 - 1e-3 <= g <= 2.0 + 0.5 for g in gaps), probes


async def test_without_the_wanted_interval_sparse_work_waits_for_the_slow_schedule(start_sim: StartSim) -> None:
    """The figure this replaces: the share alone (0.02 of one request in 4 s) earns no probe,
    so the slow schedule's 2, 4, 8, 16, 32 s intervals decide, and the recovery is found late."""
    served, probes = await _flap(start_sim, "probe_interval_wanted = 0\n")
    during = [p for p in probes if p < FLAP]
    gaps = [round(b - a) for a, b in zip(during, during[1:], strict=False)]
    assert gaps[:3] == [4, 8, 16], probes
    assert _back(served) > 5.0, served


async def test_nobody_wanting_it_leaves_the_slow_schedule_alone(start_sim: StartSim) -> None:
    """Requests that stop: probes every 2 s while the last one's want lasts (probe_wanted_for,
    here 10 s), then the slow doubling schedule again."""
    served, probes = await _flap(start_sim, "probe_wanted_for = 10\n", until=22.0, linger=30.0)
    last = served[-1][0]
    assert served and all(m == "medium" for at, m in served if at >= 12)
    wanted = [p for p in probes if last - 4 < p <= last + 10.0 + 1e-6]
    after = [p for p in probes if p > last + 10.0 + 1e-6 and p < FLAP]
    assert len(wanted) >= 5, probes  # every 2 s while wanted
    gaps = [b - a for a, b in zip(after, after[1:], strict=False)]
    assert all(g >= 8.0 - 1e-3 for g in gaps) and len(after) <= 4, probes  # then doubling


def test_the_wanted_rule_is_pure() -> None:
    inf = math.inf
    # wanted until 20: the next probe 2 s after the last one began (never closer than the floor)
    assert demand_due(0.0, 10.0, 1.0, wanted_until=20.0, every=2.0) == 12.0
    assert demand_due(0.0, 10.0, 3.0, wanted_until=20.0, every=2.0) == 13.0
    # no longer wanted by then: not due by want
    assert demand_due(0.0, 10.0, 1.0, wanted_until=11.0, every=2.0) is None
    # off, or never wanted: the share's rule alone
    assert demand_due(0.0, 10.0, 1.0, wanted_until=20.0, every=0.0) is None
    assert demand_due(1.0, 10.0, 1.0, wanted_until=-inf, every=2.0) == 11.0
    # the sooner of the two rules
    assert demand_due(1.0, 10.0, 0.5, wanted_until=20.0, every=2.0) == 10.5
    # before any probe: the first want starts the interval (the trip itself was news)
    assert demand_due(0.0, -inf, 1.0, wanted_until=40.0, every=2.0, since=30.0) == 32.0
