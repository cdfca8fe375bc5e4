"""The FallbackClient against a real HTTP server on loopback, in fast-forwarded time."""

from __future__ import annotations

import asyncio
import time

import pytest

from capmon.core import events as ev
from capmon.core.errors import Kind
from capmon.core.exceptions import RequestFailed
from capmon.core.router import FallbackClient
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = pytest.mark.looptime


async def test_three_capacity_503s_trip_the_breaker_and_traffic_moves_on() -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            results = [await client.chat("hi") for _ in range(10)]
            flagship = next(t for t in client.targets if t.model.name == "flagship")
            assert flagship.state.view().breaker.state == "open"
    assert script.served("flagship") == 3  # tripped after three, then never asked again
    assert all(r.model == "medium" for r in results)
    assert results[0].fell_back and results[0].attempts[0].kind is Kind.CAPACITY
    assert [a.decision for a in results[0].attempts] == ["fallback", "ok"]


async def test_after_the_cooldown_a_probe_closes_it_and_the_ramp_restores_traffic_gradually() -> None:
    script = Script()
    down = {"on": True}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else ok("flagship"))
    bus = ev.EventBus()
    transitions: list[tuple[str, str]] = []
    bus.subscribe(lambda e: transitions.append((e.old, e.new)) if isinstance(e, ev.BreakerChanged) and e.model == "flagship" else None)
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV, bus=bus) as client:
            for _ in range(3):
                await client.chat("hi")
            assert transitions[-1] == ("closed", "open")
            down["on"] = False
            t0 = time.perf_counter()
            await asyncio.sleep(301)  # the five-minute cool-down, fast-forwarded
            assert time.perf_counter() - t0 < 2
            shares = []
            for _second in range(70):
                before = script.served("flagship")
                for _ in range(20):
                    await client.chat("hi")
                shares.append((script.served("flagship") - before) / 20)
                await asyncio.sleep(1)
            flagship = next(t for t in client.targets if t.model.name == "flagship")
            assert flagship.state.view().breaker.state == "closed"
    assert ("open", "half-open") in transitions and ("half-open", "ramp") in transitions and ("ramp", "closed") in transitions
    # Gradual: the first seconds of the ramp send a small share to the flagship, the last all of it.
    assert sum(shares[1:6]) / 5 < 0.5
    assert shares[-1] == 1.0


async def test_a_401_is_never_retried() -> None:
    script = Script()
    script.always("flagship", Reply(401, {"error": {"message": "Incorrect API key provided: sk-te****aaaa.", "type": "invalid_request_error", "code": "invalid_api_key"}}))
    script.always("medium", Reply(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}))
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            with pytest.raises(RequestFailed) as info:
                await client.chat("hi")
            # Same key for every model: it is disabled after the first 401 and nothing else is sent.
            assert info.value.failure.kind is Kind.AUTH
            with pytest.raises(RequestFailed):
                await client.chat("again")
            snap = client.snapshot()
    assert script.served() == 1
    assert all(t.key_state == "disabled" for t in snap.targets)
    assert "sk-test-aaaa" not in str(info.value)


async def test_insufficient_quota_is_never_retried_on_that_key() -> None:
    script = Script()
    quota = Reply(429, {"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "code": "insufficient_quota"}})
    script.set("flagship", lambda n, body: quota if body and True else quota)
    keys = '[{ env = "TEST_KEY_A", alias = "a" }, { env = "TEST_KEY_B", alias = "b" }]'
    seen_keys: list[str] = []

    def flagship(n: int, body: dict) -> Reply:
        return quota if script.seen[-1].key == ENV["TEST_KEY_A"] else ok("flagship")

    script.set("flagship", flagship)
    async with serve(script) as url:
        async with FallbackClient(three_models(url, keys=keys), environ=ENV) as client:
            results = [await client.chat("hi") for _ in range(5)]
    seen_keys = [s.key for s in script.seen if s.model == "flagship"]
    assert seen_keys.count(ENV["TEST_KEY_A"]) == 1  # parked after its one quota answer
    assert all(r.model == "flagship" and r.target.endswith("/b") for r in results)


async def test_retry_after_ms_is_honoured() -> None:
    script = Script()
    limited = Reply(429, {"error": {"message": "Rate limit is exceeded.", "code": "429"}}, headers={"retry-after-ms": "800"})
    script.set("flagship", lambda n, body: limited if n == 1 else ok("flagship"))
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            result = await client.chat("hi")
    times = [s.at for s in script.seen]
    assert result.model == "flagship"  # rate limited: the same model again, after the hint
    assert result.attempts[0].hint == pytest.approx(0.8)
    assert 0.8 <= times[1] - times[0] <= 0.8 * 1.5 + 0.05


async def test_a_request_never_fails_merely_because_every_model_is_momentarily_full() -> None:
    script = Script()
    loop = asyncio.get_running_loop()
    full_until = loop.time() + 60.0
    # Every model is at capacity for a minute, then answers.
    for name in ("flagship", "medium", "small"):
        script.set(name, lambda n, body, name=name: OVERLOADED if loop.time() < full_until else ok(name))
    async with serve(script) as url:
        cfg = three_models(url, cooldown=10.0, ramp_duration=5.0)
        async with FallbackClient(cfg, environ=ENV) as client:
            results = await asyncio.gather(*(client.chat(f"item {i}") for i in range(30)))
    assert len(results) == 30 and all(r.content == "hello" for r in results)
    assert loop.time() >= full_until
