"""Prices in the config (``[[models]] prices``, a deployment's own winning), their errors,
the cost of one answer in each format's usage (the cached part at its own price), and
``ChatResult.cost`` from the simulator over real HTTP: None, never 0, for a model without
a price."""

from __future__ import annotations

import dataclasses

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.providers import formats
from capmon.core.routing.targets import build_targets
from capmon.core.types.config import parse_config, resolve_keys
from capmon.core.types.prices import Prices, Tokens, cost_of, price_of
from capmon.core.types.result import Format
from tests.support.configs import config_toml

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


@pytest.mark.unit
def test_a_model_without_prices_in_its_config_is_priced_by_the_offline_catalogue() -> None:
    from capmon.core.types.config import EndpointApi, ModelConfig

    sonnet = ModelConfig(name="sonnet", api_model="us.anthropic.claude-sonnet-4-5-20250929-v1:0")
    listed = price_of(sonnet, EndpointApi.BEDROCK)
    assert listed is not None and listed.input > 0 and listed.output > listed.input
    assert price_of(sonnet) is None  # no endpoint, no catalogue: nobody says
    assert price_of(ModelConfig(name="sim-flagship"), EndpointApi.OPENAI) is None  # unknown to it
    own = dataclasses.replace(sonnet, prices=Prices(input=1.0, output=2.0))
    assert price_of(own, EndpointApi.BEDROCK) == Prices(input=1.0, output=2.0)  # the config wins
