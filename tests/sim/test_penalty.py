"""The penalty's basis: "requests" (the default, hammering after a rejection) and
"rejections" (too many capacity rejections of a key in a window ban it), on a manual
clock and over real HTTP with the benchmark's numbers (40 in 1 s bans for 2 s)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.model import NoCapacity, Penalised, Simulator
from capmon.sim.scenario import ModelSpec, PenaltySpec, Scenario, parse_scenario
from tests.sim.helpers import AUTH, chat_body
from tests.support.clocks import ManualClock
from tests.support.simulated import StartSim

BENCH = PenaltySpec(enabled=True, threshold=40, window=1.0, duration=2.0, basis="rejections")


def make(penalty: PenaltySpec) -> tuple[Simulator, ManualClock, str]:
    clock = ManualClock()
    scn = Scenario(
        models=(ModelSpec(name="full", slots=0), ModelSpec(name="also-full", slots=0)),
        keys=(SIMULATOR_DEMO_KEY, "sk-other"),
        penalty=penalty,
    )
    sim = Simulator(scn, clock)
    sim.start()
    alias = sim.authenticate(SIMULATOR_DEMO_KEY)
    assert alias is not None
    return sim, clock, alias


def test_more_than_threshold_rejections_in_the_window_ban_the_key() -> None:
    sim, clock, alias = make(BENCH)
    for i in range(41):  # across models: rejections of the key, whatever the model
        decision = sim.submit(alias, "full" if i % 2 else "also-full", prompt_tokens=1, max_tokens=None)
        assert isinstance(decision, NoCapacity), i
        clock.advance(0.02)
    banned = sim.submit(alias, "full", prompt_tokens=1, max_tokens=None)
    assert isinstance(banned, Penalised) and banned.remaining == pytest.approx(2.0 - 0.02)
    other = sim.authenticate("sk-other")
    assert other is not None and isinstance(sim.submit(other, "full", prompt_tokens=1, max_tokens=None), NoCapacity)
    clock.advance(2.0)
    assert isinstance(sim.submit(alias, "full", prompt_tokens=1, max_tokens=None), NoCapacity)  # the ban is over
    assert sim.stats()["keys"][alias]["penalised"] == 1


def test_rejections_spread_wider_than_the_window_do_not_ban() -> None:
    sim, clock, alias = make(BENCH)
    for _ in range(200):
        assert isinstance(sim.submit(alias, "full", prompt_tokens=1, max_tokens=None), NoCapacity)
        clock.advance(0.03)  # about 33 rejections a second: under 40 per window
    assert sim.stats()["totals"]["penalised"] == 0


def test_the_requests_basis_is_still_the_default() -> None:
    assert PenaltySpec().basis == "requests"
    sim, clock, alias = make(PenaltySpec(enabled=True, threshold=3, window=10, duration=30))
    decisions = [sim.submit(alias, "full", prompt_tokens=1, max_tokens=None) for _ in range(5)]
    assert isinstance(decisions[-1], Penalised)  # 1 rejection, then more than 3 requests after it


async def test_the_benchmark_penalty_over_http(start_sim: StartSim, http: httpx.AsyncClient) -> None:
    scn = Scenario(name="bench", models=(ModelSpec(name="sim-a", slots=0),), penalty=BENCH)
    sim = await start_sim(scn)
    url = f"{sim.base_url}/chat/completions"
    # at once, so that all 41 fall well inside the 1 s window even on a slow machine
    rs = await asyncio.gather(*(http.post(url, json=chat_body(), headers=AUTH) for _ in range(41)))
    assert [r.status_code for r in rs] == [503] * 41
    r = await http.post(url, json=chat_body(), headers=AUTH)
    assert r.status_code == 429 and r.json()["error"]["message"].startswith("penalised")
    assert r.headers["retry-after"] == "2"
    other = await http.post(url, json=chat_body(), headers={"Authorization": "Bearer sk-capmon-sim-1"})
    assert other.status_code == 503  # per key
    await asyncio.sleep(2.05)
    assert (await http.post(url, json=chat_body(), headers=AUTH)).status_code == 503


def test_basis_is_a_scenario_key() -> None:
    scn = parse_scenario(
        "[penalty]\nenabled = true\nthreshold = 40\nwindow = 1.0\nduration = 2.0\n"
        'basis = "rejections"\n[[models]]\nname = "a"\n'
    )
    assert scn.penalty == BENCH
    with pytest.raises(ConfigError) as info:
        parse_scenario('[penalty]\nbasis = "errors"\n[[models]]\nname = "a"\n', "p.toml")
    assert info.value.key == "penalty.basis" and "expected one of requests, rejections" in str(info.value)
