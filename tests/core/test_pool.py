"""One model's deployments used as one pool: the room each has left (``TargetState.room``),
a request sent to the one with the most (``[[models]] spread = "room"``, the default) or
overflowing in the config's order (``spread = "order"``), neither a fallback; pinning,
tripping and resetting one deployment (``model@endpoint``) and the whole model."""

from __future__ import annotations

import asyncio

import pytest

from capmon.core.base.exceptions import CapmonError
from capmon.core.control import decisions
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Spread
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.states import State
from tests.support.configs import two_deployments
from tests.support.simulated import StartSim, deployments_scenario

ENV = {"KEY": SIMULATOR_DEMO_KEY}


@pytest.mark.unit
def test_room_left_is_the_least_free_share_of_the_slots_and_each_bucket() -> None:
    assert decisions.room_left(8, 0) == 1.0
    assert decisions.room_left(8, 6) == 0.25
    assert decisions.room_left(8, 9) == 0.0  # a cut limit under what is in flight: none, never below
    assert decisions.room_left(0, 0) == 0.0  # a ramp or a breaker that admits none
    # 16 slots, 4 in flight (3/4 free), but the rpm bucket has 10 of 60 left after this request
    assert decisions.room_left(16, 4, [(10.0, 60.0)]) == pytest.approx(10 / 60)
    assert decisions.room_left(16, 4, [(-3.0, 60.0), (500.0, 1000.0)]) == 0.0  # a bucket in debt


@pytest.mark.unit
def test_spread_is_room_by_default_and_order_when_asked() -> None:
    cfg = two_deployments("http://127.0.0.1:1/v1")
    assert cfg.models[0].spread is Spread.ROOM
    cfg = two_deployments("http://127.0.0.1:1/v1", spread="order")
    assert cfg.models[0].spread is Spread.ORDER


async def _burst(client: FallbackClient, n: int) -> list[str]:
    results = await asyncio.gather(*(client.chat("hi") for _ in range(n)))
    assert all(r.fallbacks == 0 and r.model == "m" for r in results)
    return [r.endpoint for r in results]


@pytest.mark.integration
@pytest.mark.looptime
async def test_by_room_a_burst_fills_both_deployments_evenly_without_a_rejection(start_sim: StartSim) -> None:
    # Each deployment holds 4; the limiter starts at 8 on each (its guess). By room, 8 at
    # once go 4 and 4: nothing reaches a deployment's edge while the other has room.
    sim = await start_sim(deployments_scenario(east=4, west=4))
    bus = ev.EventBus()
    moved: list[ev.Event] = []
    bus.subscribe(lambda e: moved.append(e) if isinstance(e, ev.DeploymentMoved | ev.FellBack) else None)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        endpoints = await _burst(client, 8)
    assert sorted(endpoints) == ["east"] * 4 + ["west"] * 4
    assert sim.simulator.stats()["totals"]["rejected"]["capacity"] == 0
    assert moved == []  # a choice by room is no move, and none is a fallback


@pytest.mark.integration
@pytest.mark.looptime
async def test_in_order_the_first_deployment_takes_its_limit_and_overflows_into_the_next(start_sim: StartSim) -> None:
    # The same burst in the config's order: east is sent its whole limit (8), refuses 4 of them
    # (what the limiter learns from), and those move to west: still no fallback.
    sim = await start_sim(deployments_scenario(east=4, west=4))
    bus = ev.EventBus()
    moves: list[ev.DeploymentMoved] = []
    bus.subscribe(lambda e: moves.append(e) if isinstance(e, ev.DeploymentMoved) else None)
    cfg = two_deployments(sim.base_url, spread="order")
    async with FallbackClient(cfg, environ=ENV, bus=bus) as client:
        endpoints = await _burst(client, 8)
    assert sorted(endpoints) == ["east"] * 4 + ["west"] * 4
    east = sim.simulator.stats()["models"]["sim-m-east"]
    assert east["requests"] == 8 and east["rejected"]["capacity"] == 4
    assert len(moves) == 4 and {(m.from_endpoint, m.to_endpoint) for m in moves} == {("east", "west")}


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_deployment_with_less_room_gets_less_and_none_while_held_off(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario(east=4, west=4))
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV) as client:
        east, west = client.target("m@east/k"), client.target("m@west/k")
        now = client.clock.now()
        assert east.state.room(now, 1) == west.state.room(now, 1) == 1.0
        # A server's hint on east (a 429 with retry-after): no room there until it passes.
        adm = await east.state.admit(1)
        assert adm is not None
        assert east.state.room(now, 1) == pytest.approx(7 / 8)  # one of its 8 in flight
        await east.state.settle(adm, Failure(Kind.RATE_LIMITED, "slow down", retry_after=5.0))
        assert east.state.room(client.clock.now(), 1) == 0.0
        assert await _burst(client, 3) == ["west"] * 3
        await asyncio.sleep(5.5)  # the hint passes: east has room again, by itself
        assert east.state.room(client.clock.now(), 1) > 0.0
        assert sorted(await _burst(client, 2)) == ["east", "west"]


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_pinned_deployment_is_tried_first_and_a_pin_names_a_model_or_a_deployment(
    start_sim: StartSim,
) -> None:
    sim = await start_sim(deployments_scenario(east=4, west=4))
    bus = ev.EventBus()
    moves: list[ev.DeploymentMoved] = []
    bus.subscribe(lambda e: moves.append(e) if isinstance(e, ev.DeploymentMoved) else None)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        assert set(client.pinnable()) == {"m", "backup", "m@east", "m@west"}
        client.pin("m@west")
        assert client.pinned == "m@west" and client.pinned_at == ("m", "west")
        snap = client.snapshot()
        assert snap.pinned_model == "m"
        assert [t.endpoint for t in snap.targets if t.pinned_by(snap.pinned)] == ["west"]
        for _ in range(3):  # one at a time: west has room each time, so west each time
            r = await client.chat("hi")
            assert (r.endpoint, r.fallbacks) == ("west", 0)
        # Full, it overflows into the model's other deployment: a move, not a fallback.
        endpoints = await _burst(client, 6)
        assert sorted(endpoints) == ["east", "east", "west", "west", "west", "west"]
        assert {(m.from_endpoint, m.to_endpoint) for m in moves} == {("west", "east")}
        # A pin of the model sends the backup's requests to m as well; of a backup's: to it.
        client.pin("backup")
        assert (await client.chat("hi")).model == "backup"
        client.pin(None)
        assert client.pinned_at == (None, None)
        with pytest.raises(CapmonError, match="no model or deployment named 'm@south'"):
            client.pin("m@south")


@pytest.mark.integration
@pytest.mark.looptime
async def test_trip_and_reset_act_on_one_deployment_or_the_whole_model(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario(east=4, west=4))
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV) as client:

        def states() -> dict[str, State]:
            return {t.target: t.state for t in client.snapshot().targets}

        client.trip("m@east")
        assert states() == {"m@east/k": State.FORCED_OPEN, "m@west/k": State.CLOSED, "backup@east/k": State.CLOSED}
        r = await client.chat("hi")
        assert (r.model, r.endpoint, r.fallbacks) == ("m", "west", 0)
        client.trip("m")
        assert states()["m@west/k"] is State.FORCED_OPEN
        assert (await client.chat("hi")).model == "backup"
        client.reset("m@west")
        assert states() == {"m@east/k": State.FORCED_OPEN, "m@west/k": State.CLOSED, "backup@east/k": State.CLOSED}
        client.reset("m")
        assert set(states().values()) == {State.CLOSED}
        with pytest.raises(CapmonError):
            client.trip("m@south")
