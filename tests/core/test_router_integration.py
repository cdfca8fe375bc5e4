"""The FallbackClient against a real HTTP server on loopback, in fast-forwarded time."""

from __future__ import annotations

import asyncio
import time

import pytest

from capmon.core.base.exceptions import RequestFailed
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind
from tests.support.configs import ENV, build_config, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]


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


async def test_the_clients_own_probe_finds_the_model_back_and_the_ramp_restores_traffic_gradually() -> None:
    script = Script()
    down = {"on": False}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else Reply(200, ok("flagship").body, delay=0.5))
    for other in ("medium", "small"):  # time moves with the load
        script.set(other, lambda n, body, other=other: Reply(200, ok(other).body, delay=0.1))
    bus = ev.EventBus()
    events: list[ev.Event] = []
    bus.subscribe(lambda e: events.append(e) if getattr(e, "model", None) == "flagship" else None)
    async with serve(script) as url:
        # The ramp by answers alone: growth by survivals (the overloaded replies taught a
        # refusal time) is tests/core/test_ramp_survival.py's.
        cfg = build_config(
            url,
            keys=(("TEST_KEY_A", "a"),),
            breaker={"cooldown": 300.0, "ramp_duration": 60.0, "ramp_survival": 0.0},
            limiter={"initial": 2, "max": 8},
        )
        async with FallbackClient(cfg, environ=ENV, bus=bus) as client:
            # The limiter learns 8 slots from its initial 2 first: a ramp admits no fewer
            # than the initial limit, so one that learned nothing more has no ramp.
            async def warm() -> None:
                for _ in range(10):
                    await client.chat("warm")

            await asyncio.gather(*(warm() for _ in range(8)))
            assert client.snapshot().targets[0].limit == 8
            down["on"] = True
            for _ in range(3):
                await client.chat("hi")
            assert client.snapshot().targets[0].state == "open"
            down["on"] = False
            t0 = time.perf_counter()
            await asyncio.sleep(2.6)  # the first probe comes probe_interval (2 s) after the trip
            assert time.perf_counter() - t0 < 2.5  # fast-forwarded, not slept
            assert client.snapshot().targets[0].state == "ramp"
            loop = asyncio.get_running_loop()
            ramp_from = loop.time()

            async def worker() -> None:
                while loop.time() < ramp_from + 3.0:
                    await client.chat("load")

            await asyncio.gather(*(worker() for _ in range(16)))
            assert client.snapshot().targets[0].state == "closed"
    changes = [(e.old, e.new) for e in events if isinstance(e, ev.BreakerChanged)]
    assert changes == [("closed", "open"), ("open", "half-open"), ("half-open", "ramp"), ("ramp", "closed")]
    # Gradual: the ramp admits half the limit (8) at first, grows two slots per clean answer,
    # so it triples per round trip (0.5 s here) and closes within one or two, long before its
    # 60 s ceiling.
    starts = [s.at for s in script.seen if s.model == "flagship" and s.at >= ramp_from]
    first_round = [a for a in starts if a < ramp_from + 0.5]
    assert len(first_round) <= 5  # half of 8, and a little more as the time ceiling moves
    # A RampStep is published per doubling: from half, the next doubling is the whole (closed).
    assert [round(e.share, 2) for e in events if isinstance(e, ev.RampStep)] == []
    closed = next(e.at for e in events if isinstance(e, ev.BreakerChanged) and e.new == "closed")
    assert closed - ramp_from < 1.5


async def test_a_401_is_never_retried() -> None:
    script = Script()
    script.always(
        "flagship",
        Reply(
            401,
            {
                "error": {
                    "message": "Incorrect API key provided: sk-te****aaaa.",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        ),
    )
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
    quota = Reply(
        429,
        {
            "error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota",
                "code": "insufficient_quota",
            }
        },
    )
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
    limited = Reply(
        429, {"error": {"message": "Rate limit is exceeded.", "code": "429"}}, headers={"retry-after-ms": "800"}
    )
    script.set("flagship", lambda n, body: limited if n == 1 else ok("flagship"))
    async with serve(script) as url:
        async with FallbackClient(three_models(url), environ=ENV) as client:
            # No other model may admit it sooner than the hint (else it would go there).
            client.trip("medium")
            client.trip("small")
            result = await client.chat("hi")
    times = [s.at for s in script.seen]
    assert result.model == "flagship"  # rate limited: the same model again, after the hint
    assert result.attempts[0].hint == pytest.approx(0.8)
    assert 0.8 <= times[1] - times[0] <= 0.8 * 1.5 + 0.05


async def test_a_request_never_fails_merely_because_every_model_is_momentarily_full() -> None:
    script = Script()
    loop = asyncio.get_running_loop()
    # Every model is at capacity for 20 s (fast-forwarded: a fraction of a second, unless a
    # busy loop makes looptime follow real time), then answers.
    full_until = loop.time() + 20.0
    for name in ("flagship", "medium", "small"):
        script.set(name, lambda n, body, name=name: OVERLOADED if loop.time() < full_until else ok(name))
    async with serve(script) as url:
        cfg = three_models(url, cooldown=4.0, ramp_duration=2.0)
        async with FallbackClient(cfg, environ=ENV) as client:
            results = await asyncio.gather(*(client.chat(f"item {i}") for i in range(30)))
    assert len(results) == 30 and all(r.content == "hello" for r in results)
    assert loop.time() >= full_until


async def test_a_request_after_every_key_is_disabled_fails_as_auth_not_as_too_large() -> None:
    script = Script()
    script.always("flagship", Reply(401, {"error": {"message": "Incorrect API key", "code": "invalid_api_key"}}))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        with pytest.raises(RequestFailed):
            await client.chat("hi")
        with pytest.raises(RequestFailed) as info:
            await client.chat("again")
        admits = client.admits_in()
    assert info.value.failure.kind is Kind.AUTH and "disabled" in info.value.failure.reason
    assert set(admits.values()) == {None}  # only a person can bring these back
