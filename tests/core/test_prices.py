"""Prices in the config (``[[models]] prices``, a deployment's own winning), their errors,
the cost of one answer in each format's usage (the cached part at its own price), and
``ChatResult.cost`` from the simulator over real HTTP: None, never 0, for a model without
a price."""

from __future__ import annotations

import json

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.providers import formats
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.targets import build_targets
from capmon.core.types.config import SIMULATOR_DEMO_KEY, parse_config, resolve_keys
from capmon.core.types.prices import Prices, Tokens, cost_of, price_of
from capmon.core.types.result import Format, Request
from capmon.core.types.serial import snapshot_from_json, snapshot_to_json
from capmon.core.types.snapshot import ModelSpend
from tests.support.configs import config_toml
from tests.support.simulated import StartSim, deployments_scenario

SONNET = Prices(input=3.0, output=15.0, cached_input=0.3)


@pytest.mark.unit
def test_a_deployments_own_prices_win_over_the_models_for_its_targets() -> None:
    text = config_toml(
        "http://sim.test/v1",
        endpoint="east",
        endpoints={"west": "http://sim.test/v1"},
        keys=[("KEY", "k")],
        models={
            "m": {
                "prices": {"input": 3.0, "output": 15.0, "cached_input": 0.3},
                "deployments": [
                    {"endpoint": "east", "model": "sim-m-east"},
                    {"endpoint": "west", "model": "sim-m-west", "prices": {"input": 1.0, "output": 2.0}},
                ],
            },
            "backup": {},
        },
    )
    cfg = parse_config(text, "p.toml")
    targets = build_targets(cfg, resolve_keys(cfg, {"KEY": "sk-x"}))[1]
    prices = {t.id: price_of(t.model) for t in targets}
    assert prices == {"m@east/k": SONNET, "m@west/k": Prices(1.0, 2.0, None), "backup@east/k": None}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("prices", "key", "expected"),
    [
        ("{ input = 3.0 }", "models[0].prices.output", "missing; expected USD per million output tokens"),
        ('{ input = "3", output = 15 }', "models[0].prices.input", "expected a number"),
        ("{ input = -1, output = 15 }", "models[0].prices.input", ">= 0"),
        ("{ input = 3, output = 15, cached = 1 }", "models[0].prices.cached", "did you mean 'cached_input'"),
        ("3.0", "models[0].prices", "expected a table"),
    ],
)
def test_a_wrong_price_names_the_file_the_key_and_what_was_expected(prices: str, key: str, expected: str) -> None:
    text = config_toml(models=["flagship"]).replace('name = "flagship"\n', f'name = "flagship"\nprices = {prices}\n', 1)
    with pytest.raises(ConfigError) as info:
        parse_config(text, "prices.toml")
    assert str(info.value).startswith("prices.toml: ") and info.value.key == key
    assert expected in str(info.value)


@pytest.mark.unit
def test_a_deployments_wrong_price_names_its_key() -> None:
    text = config_toml(models={"m": {"deployments": [{"endpoint": "ep", "prices": {"input": 1.0, "output": "free"}}]}})
    with pytest.raises(ConfigError) as info:
        parse_config(text, "d.toml")
    assert info.value.key == "models[0].deployments[0].prices.output"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("caller", "answer", "tokens"),
    [
        # chat and Responses: the cached tokens are part of the prompt's
        (
            Format.CHAT,
            {
                "usage": {
                    "prompt_tokens": 1000,
                    "completion_tokens": 100,
                    "prompt_tokens_details": {"cached_tokens": 800},
                }
            },
            Tokens(1000, 800, 100),
        ),
        (
            Format.RESPONSES,
            {"usage": {"input_tokens": 1000, "output_tokens": 100, "input_tokens_details": {"cached_tokens": 800}}},
            Tokens(1000, 800, 100),
        ),
        # Messages and Converse: fresh input, cache reads and writes apart (a write is priced as input)
        (
            Format.MESSAGES,
            {
                "usage": {
                    "input_tokens": 150,
                    "cache_read_input_tokens": 800,
                    "cache_creation_input_tokens": 50,
                    "output_tokens": 100,
                }
            },
            Tokens(1000, 800, 100),
        ),  # fmt: skip
        (
            Format.CONVERSE,
            {"usage": {"inputTokens": 200, "cacheReadInputTokens": 800, "outputTokens": 100}},
            Tokens(1000, 800, 100),
        ),
        # Gemini: the thoughts are output
        (
            Format.GEMINI,
            {
                "usageMetadata": {
                    "promptTokenCount": 1000,
                    "cachedContentTokenCount": 800,
                    "candidatesTokenCount": 60,
                    "thoughtsTokenCount": 40,
                }
            },
            Tokens(1000, 800, 100),
        ),  # fmt: skip
        (Format.CHAT, {"choices": []}, None),  # no usage told: no tokens, not zero
    ],
)
def test_each_formats_usage_is_priced_with_its_cached_part_apart(
    caller: Format, answer: dict[str, object], tokens: Tokens | None
) -> None:
    assert formats.tokens_of(caller, answer) == tokens
    if tokens is not None:
        # 200 fresh at $3, 800 cached at $0.30, 100 out at $15, per million
        assert cost_of(SONNET, tokens) == pytest.approx((200 * 3 + 800 * 0.3 + 100 * 15) / 1e6)
        assert cost_of(Prices(3.0, 15.0), tokens) == pytest.approx((1000 * 3 + 100 * 15) / 1e6)
    assert cost_of(None, tokens) is None


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
