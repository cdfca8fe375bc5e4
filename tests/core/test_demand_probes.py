"""Recovery driven by demand (capmon/core/control/demand.py): while a model's breaker is open, the
more work that prefers it is served elsewhere or waits, the sooner it is probed; never more
than [breaker] probe_share of that work, never two probes closer than probe_floor, one at a
time, never before a server's hint; with no demand the slow schedule alone. And the one
attempt executor: a probe and a request learn the token parameter for each other."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from capmon.core.control.breaker import State
from capmon.core.control.demand import demand_due
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import Config
from tests.support.configs import ENV, build_config, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

pytestmark = [pytest.mark.integration, pytest.mark.looptime]

FLAGSHIP = "flagship@ep/a"


def _is_probe(body: dict) -> bool:
    return body.get("messages") == [{"role": "user", "content": "ping"}]


def _breaker(
    share: float, floor: float, interval: float = 30.0, cooldown: float = 60.0, wanted: float = 0.0
) -> dict[str, float]:
    """The share's rule alone unless ``wanted`` (``probe_interval_wanted``) is given."""
    return {
        "probe_interval": interval,
        "cooldown": cooldown,
        "cooldown_multiplier": 2.0,
        "probe_share": share,
        "probe_floor": floor,
        "probe_interval_wanted": wanted,
        "ramp_duration": 0.0,
    }


def _config(url: str, breaker: dict[str, float]) -> Config:
    return build_config(url, keys=(("TEST_KEY_A", "a"),), breaker=breaker)


def _down(script: Script, reply: Reply = OVERLOADED, probe_delay: float = 0.0) -> None:
    """The flagship refuses everything; the others answer in 0.2 s (so time moves)."""

    def flagship(n: int, body: dict) -> Reply:
        if _is_probe(body) and probe_delay:
            return Reply(reply.status, reply.body, reply.headers, delay=probe_delay)
        return reply

    script.set("flagship", flagship)
    for name in ("medium", "small"):
        script.set(name, lambda n, body, name=name: Reply(200, ok(name).body, delay=0.2))


async def _probes_under(
    workers: int,
    seconds: float,
    breaker: dict[str, float],
    script: Script | None = None,
    fill: Callable[[Script], None] = _down,
) -> tuple[list[float], FallbackClient, int]:
    """Trip the flagship, then ``workers`` keep requests coming for ``seconds``: the probes'
    send times (loop time, from the trip), and how many requests preferred the flagship."""
    script = script or Script()
    fill(script)
    bus = ev.EventBus(history=10_000)
    starts: list[float] = []
    async with serve(script) as url, FallbackClient(_config(url, breaker), environ=ENV, bus=bus) as client:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            await client.chat("trip it")
        assert client.target(FLAGSHIP).state.view().breaker.state is State.OPEN
        t0 = loop.time()
        bus.subscribe(lambda e: starts.append(e.at - e.latency - t0) if isinstance(e, ev.ProbeFinished) else None)
        stop = loop.time() + seconds

        async def worker() -> None:
            while loop.time() < stop:
                await client.chat("work that prefers the flagship")

        await asyncio.gather(*(worker() for _ in range(workers)))
        if workers == 0:
            await asyncio.sleep(seconds)
        wanted = client.demand.wanted(FLAGSHIP)
    return starts, client, wanted


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_demand_is_due_once_a_whole_probe_is_earned_and_the_floor_has_passed() -> None:
    assert demand_due(0.99, 10.0, 0.5) is None
    assert demand_due(1.0, 10.0, 0.5) == 10.5
    assert demand_due(1.0, float("-inf"), 0.5) == float("-inf")


async def test_the_probe_rate_grows_with_the_work_that_wants_the_model_within_its_share() -> None:
    extra = _breaker(share=0.05, floor=0.25)  # the slow schedule's first probe: 30 s away
    few, _, few_wanted = await _probes_under(1, 10.0, extra)
    many, _, many_wanted = await _probes_under(8, 10.0, extra)
    assert many_wanted > 5 * few_wanted > 0
    # one request in 20 buys a probe (the first ones in the three that tripped it, none)
    assert len(few) <= 0.05 * few_wanted + 1 and len(many) <= 0.05 * many_wanted + 1
    assert len(many) >= 4 * max(1, len(few)), (few, many)
    assert all(g >= 0.25 - 1e-3 for g in _gaps(many)), many


async def test_probes_are_never_closer_than_the_floor_however_much_work_wants_the_model() -> None:
    starts, _, wanted = await _probes_under(8, 6.0, _breaker(share=1.0, floor=1.0))
    assert wanted > 100  # every request would buy a probe: the floor is what holds them
    assert 5 <= len(starts) <= 7, starts
    assert all(g >= 1.0 - 1e-3 for g in _gaps(starts)), starts


async def test_with_no_demand_the_slow_schedule_alone() -> None:
    starts, _, wanted = await _probes_under(0, 12.0, _breaker(share=1.0, floor=0.1, interval=1.0, cooldown=4.0))
    assert wanted == 0
    # 1 s after the trip, then 2 and 4 (the cooldown), as if there were no demand rule
    assert [round(g) for g in _gaps(starts)][:3] == [2, 4, 4], starts
    assert 0.7 <= starts[0] <= 1.1, starts  # 1 s after the trip (t0 is the third request's answer, 0.2 s later)


async def test_one_probe_in_flight_however_much_work_wants_the_model() -> None:
    script = Script()
    starts, _, _ = await _probes_under(
        8, 6.0, _breaker(share=1.0, floor=0.1), script, lambda s: _down(s, probe_delay=1.5)
    )
    probes = [s.at for s in script.seen if _is_probe(s.body)]
    assert len(probes) >= 3
    assert all(g >= 1.5 - 1e-3 for g in _gaps(probes)), probes  # each waits for the last one's answer


async def test_demand_never_probes_before_a_servers_hint() -> None:
    hinted = Reply(OVERLOADED.status, OVERLOADED.body, {"retry-after": "3"})

    def fill(s: Script) -> None:
        _down(s)
        s.set("flagship", lambda n, body: OVERLOADED if n <= 3 else hinted)  # the probes are told 3 s

    starts, _, wanted = await _probes_under(8, 10.0, _breaker(share=1.0, floor=0.1, interval=0.5), fill=fill)
    assert wanted > 100
    assert len(starts) >= 3 and all(g >= 3.0 - 1e-3 for g in _gaps(starts)), starts


async def test_a_probe_and_a_request_learn_the_token_parameter_for_each_other() -> None:
    refused = Reply(
        400,
        {
            "error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error",
                "param": "max_tokens",
                "code": "unsupported_parameter",
            }
        },
    )
    script = Script()
    script.set(
        "flagship", lambda n, body: OVERLOADED if n <= 3 else refused if "max_tokens" in body else ok("flagship")
    )
    bus = ev.EventBus(history=1000)
    cfg = _breaker(share=0.0, floor=1.0, interval=1.0)
    async with serve(script) as url, FallbackClient(_config(url, cfg), environ=ENV, bus=bus) as client:
        for _ in range(3):
            assert (await client.chat("trip it")).model == "medium"
        await asyncio.sleep(1.5)  # the probe: refused max_tokens, learned, sent again on the same admission
        probes = bus.recent(types=[ev.ProbeFinished])
        assert [p.ok for p in probes] == [True]
        assert client.target(FLAGSHIP).state.view().breaker.state is State.CLOSED
        result = await client.chat("after the recovery")
    assert result.model == "flagship" and [a.decision for a in result.attempts] == ["ok"]  # nothing refused
    flagship = [s.body for s in script.seen if s.model == "flagship"]
    assert [_is_probe(b) for b in flagship] == [False, False, False, True, True, False]
    assert "max_tokens" in flagship[3] and "max_completion_tokens" in flagship[4]
    assert "max_completion_tokens" in flagship[5] and "max_tokens" not in flagship[5]
    learned = bus.recent(types=[ev.TokenParamLearned])
    assert [(e.model, e.param) for e in learned] == [("flagship", "max_completion_tokens")]
    assert client.token_param("flagship") == "max_completion_tokens"


async def test_a_request_held_by_a_retry_after_goes_to_a_model_that_admits_sooner() -> None:
    limited = Reply(429, {"error": {"message": "Rate limit reached.", "code": "rate_limit_exceeded"}})
    limited.headers["retry-after"] = "5"
    script = Script()
    script.set("flagship", lambda n, body: limited if n == 1 else ok("flagship"))
    async with serve(script) as url, FallbackClient(three_models(url), environ=ENV) as client:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        result = await client.chat("hi")
        took = loop.time() - t0
    assert result.model == "medium" and [a.model for a in result.attempts] == ["flagship", "medium"]
    assert took < 1.0, took  # not the 5 s the flagship asked for
