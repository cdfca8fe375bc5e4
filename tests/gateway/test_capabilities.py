"""Routing by capability at the gateway: a request with tools goes past a model whose
provider said it has none (its 400 learned, the skip in ``x-capmon-skipped``), and one that
no model can serve is a 400 ``no_capable_model`` at once, in the caller's format."""

from __future__ import annotations

import anthropic
import openai
import pytest

from capmon.core.types.config import Config, parse_config
from capmon.core.types.serial import snapshot_from_json, snapshot_to_json
from capmon.status import format_snapshot
from tests.gateway.helpers import HELLO, running, scenario, spec
from tests.support.configs import config_toml, sim_models

pytestmark = pytest.mark.looptime

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


async def test_a_request_with_tools_falls_back_past_a_model_that_said_it_has_none() -> None:
    async with running(scenario(spec("flagship", tools="none"), spec("medium"))) as gw, gw.openai() as sdk:
        first = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, tools=TOOLS, tool_choice="required"
        )
        second = await sdk.chat.completions.with_raw_response.create(
            model="auto", messages=HELLO, tools=TOOLS, tool_choice="required"
        )
        snap = gw.client.snapshot()
    assert first.headers["x-capmon-model"] == "medium" and first.headers["x-capmon-attempts"] == "2"
    assert first.parse().choices[0].message.tool_calls
    assert second.headers["x-capmon-model"] == "medium" and second.headers["x-capmon-attempts"] == "1"
    skipped = second.headers["x-capmon-skipped"]
    assert skipped.startswith("flagship@sim/sim-key=incapable (it has no tools (its provider said so)"), skipped
    assert {t.model: set(t.lacks) for t in snap.targets} == {"flagship": {"tools"}, "medium": set(), "small": set()}
    # what was learned, as `capmon status` prints it (a remote one reads the same snapshot)
    printed = format_snapshot(snapshot_from_json(snapshot_to_json(snap)))
    assert "learned: flagship@sim has no tools (Unsupported parameter: 'tools' is not supported" in printed


def _declared(base_url: str) -> Config:
    models = sim_models(["flagship", "medium"], max_tokens=64)
    for m in models.values():
        m["capabilities"] = {"tools": False}
    text = config_toml(base_url, endpoint="sim", keys=[("GW_PROVIDER_KEY", "sim-key")], models=models)
    return parse_config(text, "gateway-test.toml")


async def test_a_request_no_model_can_serve_is_a_400_naming_what_it_needs() -> None:
    async with running(built=_declared) as gw, gw.openai() as sdk, gw.anthropic() as claude:
        with pytest.raises(openai.BadRequestError) as info:
            await sdk.chat.completions.create(model="auto", messages=HELLO, tools=TOOLS)
        with pytest.raises(anthropic.BadRequestError) as messages:
            await claude.messages.create(
                model="auto",
                max_tokens=16,
                messages=[{"role": "user", "content": "weather?"}],
                tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
            )
        served = await sdk.chat.completions.with_raw_response.create(model="auto", messages=HELLO)
    r = info.value.response
    error = r.json()["error"]
    assert r.status_code == 400 and error["code"] == "no_capable_model" and "it needs tools" in error["message"]
    assert r.headers["x-capmon-attempts"] == "0"
    assert "flagship@sim/sim-key=incapable" in r.headers["x-capmon-skipped"]
    m = messages.value.response
    assert m.status_code == 400 and m.json()["type"] == "error" and "it needs tools" in m.json()["error"]["message"]
    assert served.headers["x-capmon-model"] == "flagship"
