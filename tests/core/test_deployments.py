"""One model on several deployments (``[[models]] deployments``): the config's long and
short forms and each error, a target per deployment with that deployment's id and limits,
and, on the simulator over real HTTP, a request that leaves a deployment at capacity for
another of the same model (no fallback: its own event) or, with every deployment at
capacity, falls back to the next model."""

from __future__ import annotations

from typing import Any

import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.targets import build_targets
from capmon.core.types import events as ev
from capmon.core.types.config import SIMULATOR_DEMO_KEY, Config, parse_config, resolve_keys
from capmon.core.types.failure import Kind
from capmon.core.types.result import sent
from capmon.core.types.serial import event_from_json, event_to_json
from capmon.sim.scenario import Scenario
from tests.support.configs import two_deployments
from tests.support.simulated import StartSim, deployments_scenario, sim_model

ENDPOINTS = """
[[endpoints]]
name = "anthropic"
base_url = "https://api.anthropic.com"
api = "anthropic"
keys = [{ env = "ANT_KEY" }]

[[endpoints]]
name = "vertex-us"
base_url = "https://vertex.example/v1"
keys = [{ env = "VX_KEY", alias = "vx-1" }, { env = "VX_KEY_2", alias = "vx-2" }]
"""
LONG = (
    ENDPOINTS
    + """
[[models]]
name = "claude-sonnet"
api_model = "claude-sonnet-4-5"
rpm = 100
token_param = "max_completion_tokens"

[[models.deployments]]
endpoint = "anthropic"

[[models.deployments]]  # the same as an inline table in deployments = [...]
endpoint = "vertex-us"
model = "claude-sonnet-4-5@20250929"
max_concurrency = 8
rpm = 0
token_param = "max_tokens"
"""
)
SHORT = (
    ENDPOINTS
    + """
[[models]]
name = "claude-sonnet"
api_model = "claude-sonnet-4-5"
rpm = 100
endpoints = ["anthropic", "vertex-us"]
"""
)
KEYS = {"ANT_KEY": "sk-ant-aaaaaaaaaaaaaaaa", "VX_KEY": "vx-aaaaaaaaaaaaaaaa", "VX_KEY_2": "vx-bbbbbbbbbbbbbbbb"}


def _targets(cfg: Config) -> list[Any]:
    return build_targets(cfg, resolve_keys(cfg, KEYS))[1]


@pytest.mark.unit
def test_the_long_form_gives_each_deployment_its_id_and_limits_and_the_model_the_rest() -> None:
    cfg = parse_config(LONG, "d.toml")
    [model] = cfg.models
    assert [(d.endpoint, d.model) for d in model.deployed()] == [
        ("anthropic", ""),
        ("vertex-us", "claude-sonnet-4-5@20250929"),
    ]
    ts = _targets(cfg)
    seen = [(t.id, t.deployment, t.model.rpm, t.model.max_concurrency, t.model.token_param) for t in ts]
    assert seen == [
        ("claude-sonnet@anthropic/ANT_KEY", "claude-sonnet-4-5", 100, 0, "max_completion_tokens"),
        ("claude-sonnet@vertex-us/vx-1", "claude-sonnet-4-5@20250929", 0, 8, "max_tokens"),
        ("claude-sonnet@vertex-us/vx-2", "claude-sonnet-4-5@20250929", 0, 8, "max_tokens"),
    ]
    # one model: its name, window and rank are the same at every deployment (the window, not
    # in the config, the catalogue's for claude-sonnet-4-5 at its first deployment)
    assert {(t.model.name, t.model.context_window, t.rank) for t in ts} == {("claude-sonnet", 200_000, 0)}
    # the seam's limits are the deployment's: vertex's limiter is capped at 8, anthropic's bucket refills 100/min
    specs = build_targets(cfg, resolve_keys(cfg, KEYS))[0]
    assert [(s.id, s.model.max_concurrency, s.model.rpm) for s in specs][1] == ("claude-sonnet@vertex-us/vx-1", 8, 0)


@pytest.mark.unit
def test_the_short_form_is_one_deployment_per_endpoint_with_the_models_id() -> None:
    ts = _targets(parse_config(SHORT, "s.toml"))
    assert [(t.endpoint.name, t.deployment, t.model.rpm) for t in ts] == [
        ("anthropic", "claude-sonnet-4-5", 100),
        ("vertex-us", "claude-sonnet-4-5", 100),
        ("vertex-us", "claude-sonnet-4-5", 100),
    ]
    # a deployment without its own id falls back to the model's api_model, else its name
    bare = parse_config(ENDPOINTS + '[[models]]\nname = "m"\ndeployments = [{ endpoint = "anthropic" }]\n')
    assert [t.deployment for t in _targets(bare)] == ["m"]


@pytest.mark.unit
async def test_the_state_applies_each_deployments_limits_and_the_snapshot_names_it() -> None:
    cfg = parse_config(LONG.replace("max_concurrency = 8", "max_concurrency = 2"), "d.toml")
    async with FallbackClient(cfg, environ=KEYS) as client:
        rows = [(t.endpoint, t.limit, t.deployment, t.token_param) for t in client.snapshot().targets]
    assert rows == [
        ("anthropic", 8.0, "claude-sonnet-4-5", "max_completion_tokens"),  # the [limiter]'s initial 8
        ("vertex-us", 2.0, "claude-sonnet-4-5@20250929", "max_tokens"),  # its own ceiling of 2
        ("vertex-us", 2.0, "claude-sonnet-4-5@20250929", "max_tokens"),
    ]


def _model(lines: str) -> str:
    return (
        ENDPOINTS
        + '\n[[endpoints]]\nname = "azure-eu"\nbase_url = "https://eu.example/v1"\nkeys = []\n'
        + (
            '[[models]]\nname = "first"\nendpoints = ["anthropic"]\n'
            '[[models]]\nname = "second"\nendpoints = ["anthropic"]\n'
            '[[models]]\nname = "third"\n' + lines
        )
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("lines", "key", "expected"),
    [
        (
            'endpoints = ["anthropic"]\ndeployments = [{ endpoint = "vertex-us" }]',
            "models[2].deployments",
            "expected endpoints or deployments, not both",
        ),
        ('api_model = "x"', "models[2].endpoints", "or deployments = [{ endpoint = ... }]"),
        (
            'deployments = [{ endpoint = "anthropic" }, { endpoint = "vertex-eu" }]',
            "models[2].deployments[1].endpoint",
            "no endpoint named 'vertex-eu'; did you mean 'vertex-us'?",
        ),
        (
            'deployments = [{ endpoint = "vertex-us" }, { endpoint = "vertex-us", model = "other" }]',
            "models[2].deployments[1].endpoint",
            "endpoint 'vertex-us' is listed twice",
        ),
        ('endpoints = ["azure-eu", "azure-eu"]', "models[2].endpoints[1]", "endpoint 'azure-eu' is listed twice"),
        ('deployments = [{ model = "x" }]', "models[2].deployments[0].endpoint", "missing; expected the name of"),
        (
            'deployments = [{ endpoint = "anthropic", modle = "x" }]',
            "models[2].deployments[0].modle",
            "did you mean 'model'?",
        ),
        (
            'deployments = [{ endpoint = "anthropic", max_concurrency = -1 }]',
            "models[2].deployments[0].max_concurrency",
            ">= 0",
        ),
        (
            'deployments = [{ endpoint = "anthropic", token_param = "max_toks" }]',
            "models[2].deployments[0].token_param",
            "expected one of max_tokens, max_completion_tokens",
        ),
        (
            'deployments = [{ endpoint = "anthropic", model = " spaced " }]',
            "models[2].deployments[0].model",
            "without spaces around it",
        ),
        ('deployments = "anthropic"', "models[2].deployments", "expected a list of tables"),
    ],
)
def test_each_deployment_error_names_the_file_the_key_and_what_was_expected(
    lines: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_model(lines), "my.toml")
    assert str(info.value).startswith(f"my.toml: {key}: "), str(info.value)
    assert info.value.key == key and expected in str(info.value)


@pytest.mark.unit
def test_a_deployment_move_event_crosses_the_wire_for_a_remote_dashboard() -> None:
    moved = ev.DeploymentMoved(
        at=1.0,
        wall=2.0,
        request_id=3,
        item_id=None,
        model="m",
        from_endpoint="east",
        to_endpoint="west",
        from_deployment="sim-m-east",
        to_deployment="sim-m-west",
        reason="east: breaker open",
        target="m@west/k",
    )
    data = event_to_json(moved)
    assert data["type"] == "DeploymentMoved" and event_from_json(data) == moved


# ---------------------------------------------------------------- on the simulator


ENV = {"KEY": SIMULATOR_DEMO_KEY}


def _record(bus: ev.EventBus) -> list[ev.Event]:
    seen: list[ev.Event] = []
    bus.subscribe(seen.append)
    return seen


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_deployment_at_capacity_moves_the_work_to_the_other_with_no_fallback(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario(east=0))
    bus = ev.EventBus()
    seen = _record(bus)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        first = await client.chat("hi")
        assert first.model == "m" and first.fallbacks == 0 and not first.fell_back
        assert (first.endpoint, first.deployment, first.response["model"]) == ("west", "sim-m-west", "sim-m-west")
        east, west = first.attempts
        assert (east.endpoint, east.deployment, east.kind, east.decision) == (
            "east",
            "sim-m-east",
            Kind.CAPACITY,
            "retry",
        )
        assert (west.endpoint, west.deployment, west.decision) == ("west", "sim-m-west", "ok")
        for _ in range(2):  # two more refusals trip east's breaker ...
            await client.chat("hi")
        assert client.snapshot().targets[0].state == "open"
        after = await client.chat("hi")  # ... and west serves at once, east passed over
        assert (after.endpoint, after.fallbacks, [a.decision for a in after.attempts]) == ("west", 0, ["ok"])
    assert not [e for e in seen if isinstance(e, ev.FellBack)]
    moves = [e for e in seen if isinstance(e, ev.DeploymentMoved)]
    assert len(moves) == 4  # every request moved: three after a refusal, the last past the open breaker
    m = moves[0]
    assert (m.model, m.from_endpoint, m.to_endpoint, m.from_deployment, m.to_deployment, m.target) == (
        "m",
        "east",
        "west",
        "sim-m-east",
        "sim-m-west",
        "m@west/k",
    )
    assert "503" in m.reason or "capacity" in m.reason.lower()
    assert moves[-1].reason.startswith("east: breaker open")


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_deployment_tripped_by_hand_is_passed_over_for_the_other(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario())
    bus = ev.EventBus()
    seen = _record(bus)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        client.trip("m@east/k")
        result = await client.chat("hi")
        stream = client.stream_chunks("hi")
        _ = [c async for c in stream]
    assert (result.model, result.endpoint, result.deployment, result.fallbacks) == ("m", "west", "sim-m-west", 0)
    assert (stream.model, stream.endpoint, stream.deployment, stream.fallbacks) == ("m", "west", "sim-m-west", 0)
    [moved, _] = [e for e in seen if isinstance(e, ev.DeploymentMoved)]
    assert moved.reason == "east: tripped by hand (tripped by hand)"
    assert not [e for e in seen if isinstance(e, ev.FellBack)]


@pytest.mark.integration
@pytest.mark.looptime
async def test_every_deployment_at_capacity_falls_back_to_the_next_model(start_sim: StartSim) -> None:
    sim = await start_sim(deployments_scenario(east=0, west=0))
    bus = ev.EventBus()
    seen = _record(bus)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        result = await client.chat("hi")
    assert (result.model, result.endpoint, result.deployment, result.fallbacks) == ("backup", "east", "sim-backup", 1)
    assert [(a.endpoint, a.deployment, a.kind) for a in result.attempts] == [
        ("east", "sim-m-east", Kind.CAPACITY),
        ("west", "sim-m-west", Kind.CAPACITY),
        ("east", "sim-backup", None),
    ]
    moves = [(e.from_endpoint, e.to_endpoint) for e in seen if isinstance(e, ev.DeploymentMoved)]
    fallbacks = [(e.from_model, e.to_model) for e in seen if isinstance(e, ev.FellBack)]
    assert moves == [("east", "west")] and fallbacks == [("m", "backup")]


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_token_parameter_refused_at_one_deployment_is_learned_there_only(start_sim: StartSim) -> None:
    # west is a reasoning model's deployment: it refuses max_tokens; east takes it
    sim = await start_sim(deployments_scenario(token_param="max_completion_tokens"))
    bus = ev.EventBus()
    seen = _record(bus)
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV, bus=bus) as client:
        client.trip("m@east/k")
        result = await client.chat("hi")
        assert (result.endpoint, result.fallbacks) == ("west", 0)
        assert client.token_param("m", "west") == "max_completion_tokens"
        assert client.token_param("m", "east") == client.token_param("m") == "max_tokens"
    [learned] = [e for e in seen if isinstance(e, ev.TokenParamLearned)]
    assert (learned.model, learned.endpoint, learned.param) == ("m", "west", "max_completion_tokens")


@pytest.mark.integration
@pytest.mark.looptime
async def test_a_deployment_whose_endpoint_has_no_such_model_is_parked_and_the_work_moves_on(
    start_sim: StartSim,
) -> None:
    # east's id is wrong (the simulator has no sim-m-east): its 404 is no fault of the request
    sim = await start_sim(Scenario(models=(sim_model("m-west", 4), sim_model("backup"))))
    async with FallbackClient(two_deployments(sim.base_url), environ=ENV) as client:
        first = await client.chat("hi")
        second = await client.chat("hi")
        east = client.snapshot().targets[0]
    assert (first.endpoint, first.fallbacks) == ("west", 0)
    (missing, served) = first.attempts
    assert (missing.status, missing.kind, missing.decision) == (404, Kind.BAD_REQUEST, "fallback")
    assert "sim-m-east" in missing.reason
    # parked (for an hour: no hint came), so the next request goes to west at once
    assert [(a.endpoint, a.decision) for a in sent(second.attempts)] == [("west", "ok")]
    assert east.target == "m@east/k" and east.key_state == "parked"
