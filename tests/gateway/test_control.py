"""The control API a dashboard attaches to (snapshot, events, pin, trip, reset,
force-close, info), /metrics, /health and /ready, over HTTP against the gateway."""

from __future__ import annotations

import json

import httpx
import pytest

from capmon.core.types import events as ev
from capmon.core.types.serial import event_from_json, snapshot_from_json
from tests.gateway.helpers import HELLO, running, sse_frames

pytestmark = pytest.mark.looptime

ADMIN = "sk-gw-admin-0123456789abcdef"
WITH_ADMIN = 'admin_key_env = "GW_ADMIN"'


async def _chat(http: httpx.AsyncClient, model: str = "auto") -> str:
    r = await http.post("/v1/chat/completions", json={"model": model, "messages": HELLO})
    assert r.status_code == 200, r.text
    return r.headers["x-capmon-model"]


async def _events(http: httpx.AsyncClient, stop_at: str, headers: dict[str, str] | None = None) -> list[dict]:
    frames: list[str] = []
    async with http.stream("GET", "/capmon/events", headers=headers or {}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        async for line in r.aiter_lines():
            frames.append(line)
            if line.startswith("data:") and stop_at in line:
                break
    return [f for f in sse_frames("\n".join(frames) + "\n\n") if "data" in f]


async def test_pin_trip_reset_and_force_close_steer_the_gateway() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        before = await _chat(http)
        tripped = await http.post("/capmon/trip", json={"target": "flagship", "reason": "maintenance"})
        after_trip = await _chat(http, "flagship")  # asked for by name, but tripped: falls back
        pinned = await http.post("/capmon/pin", json={"model": "small"})
        after_pin = await _chat(http)
        unpinned = await http.post("/capmon/pin", json={"model": None})
        reset = await http.post("/capmon/reset", json={"target": "flagship@sim/sim-key"})  # a target id works too
        after_reset = await _chat(http)
        closed = await http.post("/capmon/force-close", json={"target": "medium"})
        unknown = await http.post("/capmon/trip", json={"target": "gpt-9"})
        bad = await http.post("/capmon/trip", json={"model": "flagship"})
        bad_pin = await http.post("/capmon/pin", json={"model": "gpt-9"})
    assert (before, after_trip, after_pin, after_reset) == ("flagship", "medium", "small", "flagship")
    # Each action answers with what it moved, not the whole snapshot.
    assert tripped.status_code == 200 and tripped.json() == {
        "ok": True,
        "targets": [
            {
                "target": "flagship@sim/sim-key",
                "model": "flagship",
                "endpoint": "sim",
                "state": "forced-open",
                "manual": True,
                "reason": "maintenance",
            }
        ],
    }
    assert len(tripped.content) < 300
    assert pinned.json() == {"ok": True, "pinned": "small"} and unpinned.json() == {"ok": True, "pinned": None}
    assert [(t["target"], t["state"], t["manual"]) for t in reset.json()["targets"]] == [
        ("flagship@sim/sim-key", "closed", False)
    ]
    assert [(t["model"], t["state"]) for t in closed.json()["targets"]] == [("medium", "forced-closed")]
    assert unknown.status_code == 404 and "gpt-9" in unknown.json()["error"]["message"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model"
    assert bad_pin.status_code == 404


async def test_the_snapshot_reads_back_as_the_clients_own() -> None:
    async with running() as gw, gw.http() as http:
        await _chat(http)
        served = (await http.get("/capmon/snapshot")).json()
        local = gw.client.snapshot()
        info = (await http.get("/capmon/info")).json()
    snap = snapshot_from_json(served)
    assert [t.target for t in snap.targets] == [t.target for t in local.targets]
    assert snap.succeeded == local.succeeded == 1 and snap.targets[0].state == local.targets[0].state
    assert snap.targets[0].windows[0].requests == 1
    assert info["models"] == ["flagship", "medium", "small"] and info["aliases"] == {"auto": None}
    assert info["api_version"] == 1 and info["readonly"] is True and info["simulator"] is None
    assert info["service"] == "capmon-gateway" and info["events"] >= 2  # the last event's number
    assert [t["target"] for t in info["targets"]] == [t.target for t in local.targets]


async def test_events_come_with_their_history_first_and_resume_after_the_last_seen() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        await _chat(http)  # before anyone listens: kept as history
        history = await _events(http, "RequestDone")
        last = max(int(f["id"]) for f in history)
        await http.post("/capmon/trip", json={"target": "small"})
        resumed = await _events(http, "BreakerChanged", {"last-event-id": str(last)})
        by_query = await _events(http, "BreakerChanged", None)
    parsed = [event_from_json(json.loads(f["data"])) for f in history]
    assert [type(e).__name__ for e in parsed][:2] == ["AttemptStarted", "RequestDone"]
    assert all(f["event"] == json.loads(f["data"])["type"] for f in history)
    done = parsed[1]
    assert isinstance(done, ev.RequestDone) and done.ok and done.model == "flagship"
    assert [int(f["id"]) for f in resumed] == [last + 1] and "BreakerChanged" in resumed[0]["data"]
    changed = event_from_json(json.loads(resumed[0]["data"]))
    assert isinstance(changed, ev.BreakerChanged) and changed.model == "small" and changed.manual
    assert [f["event"] for f in by_query][:2] == ["AttemptStarted", "RequestDone"]  # no id: the whole history


async def test_ready_says_whether_some_model_admits_within_the_deadline() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        ready = await http.get("/ready")
        for m in ("flagship", "medium", "small"):
            await http.post("/capmon/trip", json={"target": m})
        down = await http.get("/ready")
        refused = await http.post(
            "/v1/chat/completions", headers={"x-capmon-deadline": "1"}, json={"model": "auto", "messages": HELLO}
        )
        await http.post("/capmon/reset", json={"target": "small"})
        back = await http.get("/ready")
        health = await http.get("/health")
    assert ready.status_code == 200 and ready.json()["ready"] is True and "admits now" in ready.json()["reason"]
    assert down.status_code == 503 and down.json()["ready"] is False
    assert "tripped by hand" in down.json()["reason"]
    assert [t["state"] for t in down.json()["targets"]] == ["forced-open"] * 3
    # Waiting cannot help (only a person resets a trip): answered at once, no time to name.
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "models_unavailable"
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"
    assert back.status_code == 200 and back.json()["reason"] == "small admits now"
    assert health.status_code == 200 and health.json() == {"status": "ok"}


async def test_metrics_per_model_and_target() -> None:
    async with running(gateway=WITH_ADMIN, environ={"GW_ADMIN": ADMIN}) as gw, gw.http(ADMIN) as http:
        await gw.sim_admin("outage/sim-flagship", {"duration": 60})
        for _ in range(4):
            await _chat(http)
        text = (await http.get("/metrics")).text
        scraped = (await http.get("/metrics")).headers["content-type"]
    assert scraped.startswith("text/plain; version=0.0.4")

    def value(line_start: str) -> float:
        found = [ln for ln in text.splitlines() if ln.startswith(line_start)]
        assert len(found) == 1, (line_start, found)
        return float(found[0].rsplit(" ", 1)[1])

    fl, md = 'model="flagship",target="flagship@sim/sim-key"', 'model="medium",target="medium@sim/sim-key"'
    assert value(f"capmon_deployment_state{{{fl}}}") == 2  # its breaker opened: down
    assert value(f"capmon_deployment_state{{{md}}}") == 0
    assert value('capmon_breaker_state{model="flagship",state="open",target="flagship@sim/sim-key"}') == 1
    assert value(f"capmon_breaker_trips_total{{{fl}}}") == 1
    assert value('capmon_attempts_total{model="flagship",outcome="capacity",target="flagship@sim/sim-key"}') == 3
    assert value('capmon_attempts_total{model="medium",outcome="ok",target="medium@sim/sim-key"}') == 4
    assert value('capmon_requests_total{model="medium",outcome="ok"}') == 4
    # The fourth, served by medium while flagship's breaker was open, fell back too (never tried).
    assert value('capmon_fallbacks_total{from_model="flagship",to_model="medium"}') == 4
    assert value(f"capmon_limiter_limit{{{md}}}") >= 1 and value(f"capmon_in_flight{{{md}}}") == 0
    assert value('capmon_request_latency_seconds_count{model="medium"}') == 4
    assert value(f"capmon_attempt_latency_seconds_count{{{fl}}}") == 3
    assert value("capmon_waiting_requests") == 0 and value("capmon_retry_waiting") == 0
    assert value('capmon_gateway_responses_total{api="chat",status="200"}') == 4
    assert value('capmon_pinned{model="flagship"}') == 0
