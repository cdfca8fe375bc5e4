"""The cost of an answer served over real HTTP by the simulator: its usage at the prices of
the deployment that served it; none for a model without prices; the spend on the snapshot
and in the remote dashboard's JSON."""

from __future__ import annotations

import json

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY, parse_config
from capmon.core.types.prices import Tokens
from capmon.core.types.result import Request
from capmon.core.types.serial import snapshot_from_json, snapshot_to_json
from capmon.core.types.snapshot import ModelSpend
from tests.support.configs import config_toml
from tests.support.simulated import StartSim, deployments_scenario


@pytest.mark.integration
@pytest.mark.looptime
async def test_the_results_cost_is_its_usage_at_the_serving_deployments_prices(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario(east=0))  # east refuses everything: m is served at west
    text = config_toml(
        sim.base_url,
        endpoint="east",
        endpoints={"west": sim.base_url},
        keys=[("KEY", "k")],
        models={
            "m": {
                "max_tokens": 64,
                "prices": {"input": 3.0, "output": 15.0},
                "deployments": [
                    {"endpoint": "east", "model": "sim-m-east"},
                    {"endpoint": "west", "model": "sim-m-west", "prices": {"input": 1.0, "output": 2.0}},
                ],
            },
            "backup": {"api_model": "sim-backup", "max_tokens": 64},
        },
    )
    async with FallbackClient(parse_config(text, "c.toml"), environ={"KEY": SIMULATOR_DEMO_KEY}) as client:
        served = await client.chat(Request.of("hello", model="m"))
        unpriced = await client.chat(Request.of("hello", model="backup"))
        snap = client.snapshot()
    assert served.endpoint == "west"
    usage = served.usage
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    expected = (usage["prompt_tokens"] * 1.0 + usage["completion_tokens"] * 2.0) / 1e6
    assert served.cost == pytest.approx(expected)
    assert served.attempts[-1].cost == served.cost
    assert served.attempts[-1].tokens == Tokens(usage["prompt_tokens"], 0, usage["completion_tokens"])
    assert unpriced.usage["prompt_tokens"] > 0 and unpriced.cost is None
    # the dashboard's spend so far, per model, as the remote dashboard's JSON carries it too
    assert snap.spend == (ModelSpend("m", served.cost, 1, 0), ModelSpend("backup", 0.0, 1, 1))
    assert snap.spent == served.cost
    assert snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap)))).spend == snap.spend
