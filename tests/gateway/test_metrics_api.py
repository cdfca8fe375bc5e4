"""/metrics names each target's provider API (an info metric) and counts fallbacks by
API pair, against the real simulator serving one model on OpenAI's wire and one on
Anthropic's; the provider key appears nowhere in a scrape."""

from __future__ import annotations

import httpx
import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import parse_config
from capmon.gateway import close_app, create_app, load_settings, start_server
from tests.gateway.helpers import HELLO, scenario, spec
from tests.support.configs import two_providers
from tests.support.simulated import StartSim

pytestmark = pytest.mark.looptime

PROVIDER_KEY = "sk-canary-provider-metrics-7d1e0c9b5a3f2e84"


async def test_a_scrape_names_each_targets_api_and_counts_fallbacks_across_providers_without_a_key(
    start_sim: StartSim,
) -> None:
    # The flagship holds nothing: every request falls back to claude, on Anthropic's wire.
    scn = scenario(spec("flagship", slots=0), spec("claude", api="anthropic"), keys=(PROVIDER_KEY,))
    sim = await start_sim(scn)
    origin = sim.base_url.removesuffix("/v1")
    cfg = parse_config(two_providers(sim.base_url, origin), "metrics-api.toml")
    env = {"PROVIDER_KEY": PROVIDER_KEY}
    async with FallbackClient(cfg, environ=env) as client:
        app = create_app(client, load_settings(cfg, listen="127.0.0.1:0", environ=env))
        server = await start_server(app, "127.0.0.1", 0)
        try:
            async with httpx.AsyncClient(base_url=server.origin, trust_env=False, timeout=60) as http:
                for _ in range(2):
                    r = await http.post("/v1/chat/completions", json={"model": "flagship", "messages": HELLO})
                    assert r.status_code == 200, r.text
                text = (await http.get("/metrics")).text
        finally:
            close_app(app)
            await server.stop()

    def value(line_start: str) -> float:
        found = [ln for ln in text.splitlines() if ln.startswith(line_start)]
        assert len(found) == 1, (line_start, found)
        return float(found[0].rsplit(" ", 1)[1])

    assert (
        value(
            'capmon_target_info{api="openai",deployment="sim-flagship",endpoint="oai",model="flagship",target="flagship@oai/oai-key"}'
        )
        == 1
    )
    assert (
        value(
            'capmon_target_info{api="anthropic",deployment="sim-claude",endpoint="ant",model="claude",target="claude@ant/ant-key"}'
        )
        == 1
    )
    assert value('capmon_fallbacks_total{from_model="flagship",to_model="claude"}') == 2
    assert value('capmon_api_fallbacks_total{from_api="openai",to_api="anthropic"}') == 2
    assert value('capmon_requests_total{model="claude",outcome="ok"}') == 2
    assert PROVIDER_KEY not in text and PROVIDER_KEY[:12] not in text
