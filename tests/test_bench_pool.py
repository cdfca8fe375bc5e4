"""benchmarks.pool: its scenario, capmon's config and LiteLLM's model list are what the
benchmark says (pure: no processes, no sockets, no LiteLLM)."""

from __future__ import annotations

import pytest

from benchmarks import pool
from benchmarks.ideal import ideal
from capmon.core.routing.targets import build_targets
from capmon.core.types.config import Spread, resolve_keys
from capmon.sim.scenario import load_scenario

URL = "http://127.0.0.1:9/v1"


def test_the_scenario_is_three_regions_of_8_12_and_16_slots_one_out_a_while_then_a_small_model() -> None:
    scn = load_scenario(pool.SCENARIO)
    assert [m.name for m in scn.models] == [*pool.REGIONS.values(), pool.SMALL]
    assert [m.slots for m in scn.models] == [8, 12, 16, 6]
    [out] = [m for m in scn.models if m.schedule]
    assert out.name == "sim-pool-b" and [(p.at, p.slots) for p in out.schedule] == [(4, 0), (9, None)]
    assert pool.WORKERS == 8 + 12 + 16  # the small model is needed only while a region is out
    # The ideal: the small model serves only the outage's spill, and the quotas bind in the rpm run.
    slots = ideal(scn, pool.ITEMS["slots"], pool.WORKERS)
    rpm = ideal(scn, pool.ITEMS["rpm"], pool.WORKERS, rpm=pool.quotas("rpm"))
    assert 0 < slots.served[pool.SMALL] < 0.1 * pool.ITEMS["slots"]
    assert all(rpm.served[sim] > pool.RPM[sim] for sim in pool.RPM)  # a minute's worth, and more
    assert rpm.served[pool.SMALL] > slots.served[pool.SMALL]


@pytest.mark.parametrize("mode", pool.MODES)
@pytest.mark.parametrize("spread", list(Spread))
def test_capmon_s_config_is_one_model_on_the_three_regions_and_the_small_one(mode: str, spread: Spread) -> None:
    cfg = pool.capmon_config(URL, mode, spread)
    model, small = cfg.models
    assert (model.name, model.spread, small.name) == (pool.MODEL, spread, pool.SMALL)
    assert [(d.endpoint, d.model) for d in model.deployed()] == list(pool.REGIONS.items())
    targets = build_targets(cfg, resolve_keys(cfg, {}))[1]  # the simulator's demo key: no environment
    assert [(t.model.name, t.deployment, t.model.rpm) for t in targets] == [
        *((pool.MODEL, sim, pool.quotas(mode).get(sim, 0)) for sim in pool.REGIONS.values()),
        (pool.SMALL, pool.SMALL, 0),
    ]
    assert cfg.breaker.probe_interval == 0.5  # capmon-bench.toml's sections, kept


@pytest.mark.parametrize("mode", pool.MODES)
def test_litellm_s_model_list_is_the_three_regions_under_one_name_and_the_small_one(mode: str) -> None:
    listed = pool.litellm_model_list(URL, mode)
    assert [(d["model_name"], d["litellm_params"]["model"]) for d in listed] == [
        *((pool.MODEL, f"openai/{sim}") for sim in pool.REGIONS.values()),
        (pool.SMALL, f"openai/{pool.SMALL}"),
    ]
    assert [d["litellm_params"].get("rpm") for d in listed] == [
        *(pool.quotas(mode).get(s) for s in pool.REGIONS.values()),
        None,
    ]
    assert all(d["litellm_params"]["max_retries"] == 0 and d["litellm_params"]["api_base"] == URL for d in listed)


def test_room_and_quota_are_read_from_the_simulator_s_counters() -> None:
    full = {sim: (10, slots, slots) for sim, slots in zip(pool.REGIONS.values(), (8, 12, 16), strict=True)}
    assert not pool.had_room(full, 1.0, 0.0, {})
    one_free = {**full, "sim-pool-c": (10, 15, 16)}
    assert not pool.had_room(one_free, 1.0, 0.0, {})  # one slot is the moment between two requests
    two_free = {**full, "sim-pool-c": (10, 14, 16)}
    assert pool.had_room(two_free, 1.0, 0.0, {})
    spent = {**full, "sim-pool-c": (240, 14, 16)}  # 240 sent of a 240 rpm quota at t = 0
    assert not pool.had_room(spent, 0.0, 0.0, pool.quotas("rpm"))
    assert pool.had_room(spent, 1.0, 0.0, pool.quotas("rpm"))  # 4 more came in a second later
    samples = [(0.0, {**full, pool.SMALL: (0, 0, 6)}), (0.1, {**two_free, pool.SMALL: (3, 3, 6)})]
    samples.append((0.2, {**full, pool.SMALL: (4, 4, 6)}))
    assert pool.small_with_room(samples, 0.0, "slots") == (0.0, {})  # no two samples in a row with room
    samples.append((0.3, {**two_free, pool.SMALL: (5, 4, 6)}))
    samples.append((0.4, {**two_free, pool.SMALL: (9, 4, 6)}))
    assert pool.small_with_room(samples, 0.0, "slots") == (pytest.approx(4 / 9), {0: 4})
    # 6 s: a region's minute's worth and 6 s of its rate (120 + 12 for a), no more
    assert pool.over_quota({"sim-pool-a": 130, "sim-pool-c": 100}, 6.0, "rpm") == 0
    assert pool.over_quota({"sim-pool-a": 140, "sim-pool-c": 300}, 6.0, "rpm") == (140 - 132) + (300 - 264)
    assert pool.over_quota({"sim-pool-a": 140}, 6.0, "slots") == 0


def test_the_oracles_are_measured_as_the_peers_are_the_floor_side_by_side() -> None:
    # The same counters, replayed from each oracle's schedule, through the same small_with_room:
    # the ideal knows every region's room and never sends down with one free; the informed oracle
    # learns of region b's return (9 s) a round trip late and sends down until then; held to
    # [limiter] initial for its first round trip, it sends down at the start as well.
    scn = load_scenario(pool.SCENARIO)
    offset = 0.05
    seconds = {}
    best = ideal(scn, pool.ITEMS["slots"], pool.WORKERS, offset)
    for name, how in pool.oracles():
        f = pool.oracle_figures(scn, "slots", pool.ITEMS["slots"], offset, how, best)
        assert f["completed"] == sum(f["served"].values()) == pool.ITEMS["slots"]
        seconds[name] = f["small_room_when"]
    ideal_, informed, floor = (seconds[name] for name, _ in pool.oracles())
    assert ideal_ == {}
    assert set(informed) <= {8, 9} and sum(informed.values()) >= 6  # 9 s less the offset: second 8 and 9
    assert floor[0] >= 6 and {s: n for s, n in floor.items() if s} == informed


def test_a_replay_reads_an_oracle_s_schedule_as_the_simulator_s_counters() -> None:
    scn = load_scenario(pool.SCENARIO)
    o = ideal(scn, 60, pool.WORKERS)
    samples = pool.replay(o, scn, 0.0)
    at, first = samples[0]
    assert at == pytest.approx(-0.05) and all(c[:2] == (0, 0) for c in first.values())
    at, counts = samples[1]  # 0.05 s: the first 36 requests out, on the regions by preference
    assert counts["sim-pool-a"] == (8, 8, 8) and counts["sim-pool-b"] == (12, 12, 12)
    assert counts["sim-pool-c"] == (16, 16, 16) and counts[pool.SMALL] == (0, 0, 6)
    assert samples[-1][1]["sim-pool-c"][0] == o.served["sim-pool-c"]  # every request by the end
    assert all(c[1] == 0 for c in samples[-1][1].values())  # and every answer
