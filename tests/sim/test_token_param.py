"""The token-parameter quirk over real HTTP: a model with token_param =
"max_completion_tokens" refuses max_tokens with OpenAI's (or Azure's) real 400, and every
model takes max_completion_tokens."""

from __future__ import annotations

import httpx
import openai
import pytest

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.sim.scenario import Scenario, parse_scenario
from capmon.sim.server import SimHandle
from tests.sim.helpers import AUTH, HELLO, chat_body, fast_scenario

MESSAGE = "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead."


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario(token_param="max_completion_tokens")


async def post(sim: SimHandle, http: httpx.AsyncClient, model: str = "sim-a", **extra: object) -> httpx.Response:
    return await http.post(f"{sim.base_url}/chat/completions", json=chat_body(model, **extra), headers=AUTH)


async def test_max_tokens_is_refused_in_openais_words(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await post(sim, http, max_tokens=5)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": MESSAGE,
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    }
    r = await post(sim, http, max_tokens=5, stream=True)  # a stream is refused the same way, before it starts
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
    stats = (await http.get(f"{sim.admin_url}/stats")).json()
    assert stats["models"]["sim-a"]["rejected"]["bad_request"] == 2 and stats["models"]["sim-a"]["accepted"] == 0


async def test_azure_wording(sim: SimHandle, http: httpx.AsyncClient) -> None:
    r = await http.post(f"{sim.admin_url}/models/sim-a", json={"unsupported_dialect": "azure"})
    assert r.json()["unsupported_dialect"] == "azure"
    r = await post(sim, http, max_tokens=5)
    error = r.json()["error"]
    assert r.status_code == 400 and list(error)[0] == "code"  # Azure's key order, and its leaked call stack
    assert (error["code"], error["param"], error["message"]) == ("unsupported_parameter", "max_tokens", MESSAGE)
    assert "gunicorn" in error["callstack"]


async def test_max_completion_tokens_works_on_every_model(sim: SimHandle, http: httpx.AsyncClient) -> None:
    for model in ("sim-a", "sim-b"):
        r = await post(sim, http, model, max_completion_tokens=3)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["message"]["content"].split()) == 3
    assert (await post(sim, http, "sim-b", max_tokens=3)).status_code == 200  # sim-b takes either
    assert (await post(sim, http, "sim-a")).status_code == 200  # neither sent: fine
    r = await post(sim, http, max_completion_tokens=0)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_completion_tokens"


async def test_admin_switches_the_quirk(sim: SimHandle, http: httpx.AsyncClient) -> None:
    await http.post(f"{sim.admin_url}/models/sim-b", json={"token_param": "max_completion_tokens"})
    assert (await post(sim, http, "sim-b", max_tokens=3)).status_code == 400
    await http.post(f"{sim.admin_url}/models/sim-b", json={"reset_schedule": True})
    assert (await post(sim, http, "sim-b", max_tokens=3)).status_code == 200
    r = await http.post(f"{sim.admin_url}/models/sim-b", json={"token_param": "max_output_tokens"})
    assert r.status_code == 400 and "token_param must be one of" in r.json()["error"]["message"]


async def test_the_openai_sdk_raises_its_bad_request_error(sim: SimHandle) -> None:
    async with openai.AsyncOpenAI(base_url=sim.base_url, api_key=SIMULATOR_DEMO_KEY, max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="sim-a", messages=HELLO, max_tokens=5)  # type: ignore[arg-type]
        assert info.value.code == "unsupported_parameter" and info.value.param == "max_tokens"
        reply = await client.chat.completions.create(
            model="sim-a",
            messages=HELLO,  # type: ignore[arg-type]
            max_completion_tokens=5,
        )
        assert reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    "line, key, message",
    [
        (
            'token_param = "max_output_tokens"',
            "models[0].token_param",
            "expected one of max_tokens, max_completion_tokens",
        ),
        ('unsupported_dialect = "bedrock"', "models[0].unsupported_dialect", "expected one of openai, azure"),
    ],
)
def test_scenario_keys_are_validated(line: str, key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(f'[[models]]\nname = "a"\n{line}\n', "q.toml")
    assert (info.value.file, info.value.key) == ("q.toml", key) and message in str(info.value)
    ok = parse_scenario(
        '[[models]]\nname = "a"\ntoken_param = "max_completion_tokens"\nunsupported_dialect = "azure"\n'
    )
    assert (ok.models[0].token_param, ok.models[0].unsupported_dialect) == ("max_completion_tokens", "azure")
