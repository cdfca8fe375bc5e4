"""What each answer cost, through the gateway: the real openai SDK against the simulator
serving one model on two deployments with different prices. The access log, the traces'
exchange and ``capmon_cost_usd_total`` carry the cost at the serving deployment's prices
(its own winning over the model's), by the client key's alias; a model without prices
has no cost anywhere, never 0."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from capmon.core.types.config import Config
from tests.gateway.helpers import HELLO, running
from tests.support.configs import build_config
from tests.support.simulated import deployments_scenario

pytestmark = pytest.mark.looptime

CLIENT = "sk-gw-client-cost-0c1d2e3f4a5b"
ENVIRON = {"GW_CLIENT": CLIENT}
MODEL_PRICES = {"input": 2.0, "output": 10.0}
WEST_PRICES = {"input": 1.0, "output": 4.0, "cached_input": 0.1}


def priced(log: Path) -> Callable[[str], Config]:
    def built(url: str) -> Config:
        deployments = [
            {"endpoint": "east", "model": "sim-m-east"},
            {"endpoint": "west", "model": "sim-m-west", "prices": WEST_PRICES},
        ]
        return build_config(
            url,
            endpoint="east",
            endpoints={"west": url},
            keys=[("GW_PROVIDER_KEY", "k")],
            models={
                "m": {"max_tokens": 64, "deployments": deployments, "prices": MODEL_PRICES},
                "backup": {"api_model": "sim-backup", "max_tokens": 64},
            },
            gateway={"access_log": str(log), "keys": [{"env": "GW_CLIENT", "alias": "team"}]},
            file="cost.toml",
        )

    return built


def usd(tokens_in: int, tokens_out: int, prices: dict[str, float]) -> float:
    return (tokens_in * prices["input"] + tokens_out * prices["output"]) / 1_000_000


async def test_the_cost_is_at_the_serving_deployments_prices_in_the_log_and_the_metrics(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    # east holds nothing: every request of m moves to west, whose prices are its own
    scn = deployments_scenario(east=0)
    async with running(scn, built=priced(log), environ=ENVIRON) as gw, gw.openai(CLIENT) as sdk:
        plain = await sdk.chat.completions.create(model="m", messages=HELLO)
        chunks = await sdk.chat.completions.create(
            model="m", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        _ = [c async for c in chunks]
        await sdk.chat.completions.create(model="backup", messages=HELLO)
        async with gw.http(CLIENT) as http:
            metrics = (await http.get("/metrics")).text
    assert plain.usage is not None and plain.usage.prompt_tokens > 0
    lines = [ln for ln in map(json.loads, log.read_text().splitlines()) if ln["path"] == "/v1/chat/completions"]
    m_lines = [ln for ln in lines if ln["model_served"] == "m"]
    assert [ln["deployment"] for ln in m_lines] == ["sim-m-west", "sim-m-west"]
    for ln in m_lines:
        assert ln["cost_usd"] == pytest.approx(usd(ln["tokens_in"], ln["tokens_out"], WEST_PRICES))
        assert ln["cost_usd"] != pytest.approx(usd(ln["tokens_in"], ln["tokens_out"], MODEL_PRICES))
        assert ln["tokens_cached"] == 0
    [backup] = [ln for ln in lines if ln["model_served"] == "backup"]
    assert backup["tokens_in"] and backup["cost_usd"] is None  # no price: no cost, not a free answer
    series = [ln for ln in metrics.splitlines() if ln.startswith("capmon_cost_usd_total{")]
    assert len(series) == 1, series
    labels, value = series[0].rsplit(" ", 1)
    assert labels == 'capmon_cost_usd_total{deployment="m@west",key="team",model="m"}'
    assert float(value) == pytest.approx(sum(ln["cost_usd"] for ln in m_lines))
    assert CLIENT not in metrics
