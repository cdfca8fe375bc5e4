"""The real openai SDK against the gateway serving one model on two deployments (endpoint
east knows it as sim-m-east, west as sim-m-west): east at capacity moves the work to west
with no fallback, and every reply, the access log, the metrics and the event feed name the
deployment that served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capmon.core.types.config import Config
from tests.gateway.helpers import HELLO, running
from tests.support.configs import two_deployments
from tests.support.simulated import deployments_scenario

pytestmark = pytest.mark.looptime


async def test_a_move_between_deployments_is_no_fallback_and_the_reply_names_the_deployment(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"

    def built(url: str) -> Config:
        return two_deployments(url, key_env="GW_PROVIDER_KEY", gateway={"access_log": str(log)})

    async with running(deployments_scenario(east=0), built=built) as gw, gw.openai() as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=HELLO)
        reply = raw.parse()
        async with sdk.chat.completions.with_streaming_response.create(
            model="m", messages=HELLO, stream=True
        ) as streamed:
            _ = [line async for line in streamed.iter_lines()]
        both = await sdk.chat.completions.with_raw_response.create(model="backup", messages=HELLO)
        metrics = (await gw.http().get("/metrics")).text
    assert reply.model == "sim-m-west"
    for h in (raw.headers, streamed.headers):
        assert (h["x-capmon-model"], h["x-capmon-endpoint"], h["x-capmon-deployment"]) == ("m", "west", "sim-m-west")
        assert (h["x-capmon-fallbacks"], h["x-litellm-attempted-fallbacks"], h["x-capmon-attempts"]) == ("0", "0", "2")
        assert h["x-capmon-target"] == "m@west/k"
    assert (both.headers["x-capmon-deployment"], both.headers["x-capmon-fallbacks"]) == ("sim-backup", "0")
    lines = [ln for ln in map(json.loads, log.read_text().splitlines()) if ln["path"] == "/v1/chat/completions"]
    served = [(ln["model_served"], ln["endpoint"], ln["deployment"], ln["fallbacks"]) for ln in lines]
    assert served == [
        ("m", "west", "sim-m-west", 0),
        ("m", "west", "sim-m-west", 0),
        ("backup", "east", "sim-backup", 0),
    ]
    moves = [ln for ln in metrics.splitlines() if ln.startswith("capmon_deployment_moves_total{")]
    assert moves == ['capmon_deployment_moves_total{from_endpoint="east",model="m",to_endpoint="west"} 2.0']
    assert not [ln for ln in metrics.splitlines() if ln.startswith("capmon_fallbacks_total{")]


async def test_the_control_api_pins_trips_and_resets_one_deployment_or_the_whole_model() -> None:
    admin = "sk-gw-admin-0123456789abcdef"

    def built(url: str) -> Config:
        return two_deployments(url, key_env="GW_PROVIDER_KEY", gateway={"admin_key_env": "GW_ADMIN"})

    async with (
        running(deployments_scenario(), built=built, environ={"GW_ADMIN": admin}) as gw,
        gw.http(admin) as http,
    ):

        async def served() -> str:
            r = await http.post("/v1/chat/completions", json={"model": "m", "messages": HELLO})
            assert r.status_code == 200 and r.headers["x-capmon-fallbacks"] == "0", r.text
            return r.headers["x-capmon-endpoint"]

        pinned = await http.post("/capmon/pin", json={"model": "m@west"})
        on_pin = [await served() for _ in range(3)]
        tripped = await http.post("/capmon/trip", json={"target": "m@west"})
        on_trip = await served()
        whole = await http.post("/capmon/trip", json={"target": "m"})
        reset = await http.post("/capmon/reset", json={"target": "m@west"})
        after_reset = await served()
        unknown = await http.post("/capmon/pin", json={"model": "m@south"})
        info = (await http.get("/capmon/snapshot")).json()
    assert pinned.json() == {"ok": True, "pinned": "m@west"} and on_pin == ["west"] * 3
    assert [(t["target"], t["state"]) for t in tripped.json()["targets"]] == [("m@west/k", "forced-open")]
    assert on_trip == "east"  # the pinned deployment tripped: the model's other one, no fallback
    assert [(t["endpoint"], t["state"]) for t in whole.json()["targets"]] == [
        ("east", "forced-open"),
        ("west", "forced-open"),
    ]
    assert [(t["target"], t["state"]) for t in reset.json()["targets"]] == [("m@west/k", "closed")]
    assert after_reset == "west"
    assert unknown.status_code == 404 and "m@south" in unknown.json()["error"]["message"]
    assert info["pinned"] == "m@west"
