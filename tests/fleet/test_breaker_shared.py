"""The shared breaker: generations and compare-and-set, so a stale writer cannot undo
a newer move; one probe for the whole fleet while a model is down."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from capmon.core.control.breaker import State
from tests.fleet.helpers import FAST_BREAKER, FLAGSHIP, client, deafen, fleet_config, is_probe, store, until
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve


def _shared_state(redis_url: str, namespace: str) -> dict[str, str]:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return r.hgetall(f"{namespace}:t:{{{FLAGSHIP}}}")
    finally:
        r.close()


async def test_a_process_that_missed_a_trip_cannot_undo_it_with_its_own_probe(redis_url: str, namespace: str) -> None:
    script = Script()
    # Down for three requests, then the probe: it answers, slowly, that the model is back.
    script.set("flagship", lambda n, body: Reply(200, ok("flagship").body, delay=1.0) if is_probe(body) else OVERLOADED)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a:
            for _ in range(3):
                await a.chat("hi")
            ta = a.target(FLAGSHIP).state
            await until(lambda: ta.view().breaker.state is State.HALF_OPEN)  # A's prober is out
            await deafen(store(a))  # and A hears nothing from here on
            gen_probe = int(_shared_state(redis_url, namespace)["gen"])
            async with client(cfg) as b:
                b.trip("flagship", "a person says no")  # a newer move, while A's probe is out
                await until(lambda: int(_shared_state(redis_url, namespace)["gen"]) > gen_probe)
                # A's probe succeeds: its breaker would start the ramp from the probe's generation,
                # but the shared generation moved on; the compare-and-set fails and A adopts the trip.
                await until(lambda: ta.view().breaker.state is State.FORCED_OPEN, timeout=2.0)
                assert script.served("flagship") == 4  # the probe was answered
                shared = _shared_state(redis_url, namespace)
                assert shared["state"] == "forced-open" and shared["reason"] == "a person says no"
                assert b.target(FLAGSHIP).state.view().breaker.state is State.FORCED_OPEN
                before = script.served("flagship")
                assert (await a.chat("hi")).model == "medium"
                assert script.served("flagship") == before


async def test_a_late_success_from_before_a_trip_does_not_close_it_anywhere(redis_url: str, namespace: str) -> None:
    script = Script()
    slow = {"on": True}
    script.set("flagship", lambda n, body: Reply(200, ok("flagship").body, delay=0.4) if slow["on"] else OVERLOADED)
    async with serve(script) as url:
        # limiter.min 4: the late request's slot does not leave the model "full" for B
        cfg = fleet_config(
            url,
            redis_url,
            namespace,
            breaker="[breaker]\nprobe_interval = 30\ncooldown = 30\n",
            extra="[limiter]\nmin = 4\n",
        )
        async with client(cfg) as a, client(cfg) as b:
            late = asyncio.ensure_future(a.chat("sent before the trip"))
            await until(lambda: script.served("flagship") == 1)
            slow["on"] = False
            for _ in range(3):
                await b.chat("hi")
            ta, tb = a.target(FLAGSHIP).state, b.target(FLAGSHIP).state
            await until(lambda: ta.view().breaker.state is State.OPEN)
            assert (await late).model == "flagship"  # its answer arrives after the trip
            await asyncio.sleep(0.05)
            assert ta.view().breaker.state is State.OPEN and tb.view().breaker.state is State.OPEN
            assert _shared_state(redis_url, namespace)["state"] == "open"


async def test_one_probe_for_the_fleet_while_the_model_is_down(redis_url: str, namespace: str) -> None:
    script = Script()
    back = {"at": float("inf")}
    probes: list[float] = []

    def flagship(n: int, body: dict) -> Reply:
        if is_probe(body):
            probes.append(time.perf_counter())
        return ok("flagship") if time.perf_counter() >= back["at"] else OVERLOADED

    script.set("flagship", flagship)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)  # probe 0.2 s after the trip, then 0.4 s
        async with client(cfg) as a, client(cfg) as b, client(cfg) as c:
            for _ in range(3):
                await a.chat("hi")
            tripped = time.perf_counter()
            back["at"] = tripped + 1.1
            targets = [x.target(FLAGSHIP).state for x in (a, b, c)]
            await until(lambda: all(t.view().breaker.state in (State.RAMP, State.CLOSED) for t in targets), timeout=3)
            # Probes at about +0.2, +0.6 and +1.0 s (failed), then +1.4 s (answered): one each
            # time for the three processes; three probers of their own would send three times as many.
            assert 3 <= len(probes) <= 5, [round(p - tripped, 2) for p in probes]
            gaps = [b2 - b1 for b1, b2 in zip(probes, probes[1:], strict=False)]
            assert min(gaps) > 0.15, gaps
            await asyncio.sleep(0.4)  # the ramp's ceiling (0.3 s) has passed: closed everywhere
            assert all(t.view().breaker.state is State.CLOSED for t in targets)


@pytest.mark.parametrize("hint", [None, 0.6], ids=["no hint", "a 0.6 s hint"])
async def test_work_waiting_for_a_down_model_probes_it_sooner_one_probe_at_a_time_for_the_fleet(
    redis_url: str, namespace: str, hint: float | None
) -> None:
    script = Script()
    probes: list[float] = []
    hinted = Reply(OVERLOADED.status, OVERLOADED.body, {"retry-after": str(hint)} if hint else {})

    def flagship(n: int, body: dict) -> Reply:
        if is_probe(body):
            probes.append(time.perf_counter())
            return hinted  # a server's hint holds the next probe, on demand too, in every process
        return OVERLOADED

    script.set("flagship", flagship)
    script.set("medium", lambda n, body: Reply(200, ok("medium").body, delay=0.02))
    # The slow schedule's first probe is 30 s away: every probe here is one demand bought.
    demand = (
        "[breaker]\nfailure_threshold = 3\nprobe_interval = 30\ncooldown = 60\nprobe_share = 1.0\n"
        "probe_floor = 0.25\nramp_duration = 0.3\n"
    )
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, breaker=demand)
        async with client(cfg) as a, client(cfg) as b, client(cfg) as c:
            for _ in range(3):
                await a.chat("hi")
            await until(lambda: all(x.target(FLAGSHIP).state.view().breaker.state is State.OPEN for x in (b, c)))
            t0 = time.perf_counter()

            async def work(x: object) -> None:
                while time.perf_counter() - t0 < 1.5:
                    # A deadline well past any wait here: a request stuck in line fails with why it
                    # waited (DeadlineExceeded), not the test's 60 s timeout with nothing said.
                    await x.chat("wants the flagship", deadline=20.0)  # type: ignore[attr-defined]

            await asyncio.gather(*(work(x) for x in (a, b, c) for _ in range(2)))
    sent = [p - t0 for p in probes if p >= t0]
    floor = hint or 0.25
    assert 2 <= len(sent) <= 1.5 / floor + 1, sent  # every process wants one each floor: the fleet sends one
    gaps = [b2 - b1 for b1, b2 in zip(sent, sent[1:], strict=False)]
    # As the server saw them arrive: granted by Redis a floor apart, each sent when its process got
    # the CPU (a stall of a loaded machine moves one arrival, and shortens the gap after it; three
    # probers of their own would send gaps near zero).
    assert min(gaps) >= 0.5 * floor, gaps


async def test_a_probe_whose_prober_went_silent_is_taken_over(redis_url: str, namespace: str) -> None:
    script = Script()
    script.set(
        "flagship",
        lambda n, body: Reply(200, ok("flagship").body, delay=1.2)
        if is_probe(body) and n == 4
        else ok("flagship")
        if is_probe(body)
        else OVERLOADED,
    )
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)  # lease_ttl 0.6 s: an unrenewed probe is over after it
        async with client(cfg) as a, client(cfg) as b:
            for c in (a, b, a):  # the fleet's failures in a row trip it
                await c.chat("hi")
            ta, tb = a.target(FLAGSHIP).state, b.target(FLAGSHIP).state
            await until(lambda: ta.view().breaker.state is State.HALF_OPEN is tb.view().breaker.state)
            owner = _shared_state(redis_url, namespace)["probe_owner"]
            prober, other = (a, b) if owner == store(a).id else (b, a)
            await deafen(store(prober))  # its heartbeat stops: the probe is no longer renewed
            t0 = time.perf_counter()
            to = other.target(FLAGSHIP).state
            await until(lambda: to.view().breaker.state in (State.RAMP, State.CLOSED), timeout=2.0)
            took = time.perf_counter() - t0
            assert took < 0.6 + 0.3, took
            await until(lambda: _shared_state(redis_url, namespace)["state"] in ("ramp", "closed"), timeout=0.5)


async def test_sparse_work_in_every_process_probes_a_down_model_every_wanted_interval_for_the_fleet(
    redis_url: str, namespace: str
) -> None:
    """[breaker] probe_interval_wanted in a fleet: each process wants the model for its own
    sparse requests, and the fleet sends one stream of probes about that interval apart (a
    probe any process begins is heard by the others; BEGIN_PROBE keeps one out at a time and
    none closer than the floor), not one stream per process; the share alone buys none."""
    script = Script()
    probes: list[float] = []

    def flagship(n: int, body: dict) -> Reply:
        if is_probe(body):
            probes.append(time.perf_counter())
        return OVERLOADED

    script.set("flagship", flagship)
    script.set("medium", lambda n, body: Reply(200, ok("medium").body, delay=0.02))
    wanted = (
        "[breaker]\nfailure_threshold = 3\nprobe_interval = 30\ncooldown = 60\nprobe_share = 0\n"
        "probe_floor = 0.1\nprobe_interval_wanted = 0.4\nprobe_wanted_for = 5\n"
    )
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace, breaker=wanted)
        async with client(cfg) as a, client(cfg) as b, client(cfg) as c:
            for _ in range(3):
                await a.chat("hi")
            await until(lambda: all(x.target(FLAGSHIP).state.view().breaker.state is State.OPEN for x in (b, c)))
            t0 = time.perf_counter()

            async def sparse(x: object, offset: float) -> None:
                await asyncio.sleep(offset)
                while time.perf_counter() - t0 < 2.4:
                    await x.chat("wants the flagship")  # type: ignore[attr-defined]
                    await asyncio.sleep(1.0)

            await asyncio.gather(sparse(a, 0.0), sparse(b, 0.33), sparse(c, 0.66))
            await asyncio.sleep(max(0.0, 2.4 - (time.perf_counter() - t0)))
    sent = [p - t0 for p in probes if t0 <= p <= t0 + 2.4]
    # From the first want to 2.4 s, one every 0.4 s: about 6 (measured: 0.4, 0.8, 1.2, 1.6,
    # 2.0, 2.4); three streams of their own would send three times as many.
    assert 3 <= len(sent) <= 8, sent
    gaps = [b2 - b1 for b1, b2 in zip(sent, sent[1:], strict=False)]
    assert min(gaps) >= 0.5 * 0.4, gaps  # as the server saw them arrive (a loaded machine's stall moves one)


async def test_a_probe_that_outlives_a_refusals_time_starts_the_ramp_for_the_fleet_before_its_answer(
    redis_url: str, namespace: str
) -> None:
    # Overloaded (refused in milliseconds: each process times the refusals it got), then back,
    # answering in 2 s. Neither process has traffic for the model when a probe goes: the one
    # that probed writes the ramp at once, and the other hears of it, long before the answer.
    script = Script()
    down = {"on": True}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else Reply(200, ok("flagship").body, delay=2.0))
    async with serve(script) as url:
        breaker = FAST_BREAKER.replace("ramp_duration = 0.3", "ramp_duration = 60.0")
        cfg = fleet_config(url, redis_url, namespace, breaker=breaker)
        async with client(cfg) as a, client(cfg) as b:
            for c in (a, b, a):  # the fleet's failures in a row trip it
                await c.chat("hi")
            ta, tb = a.target(FLAGSHIP).state, b.target(FLAGSHIP).state
            await until(lambda: tb.view().breaker.state is State.OPEN)
            down["on"] = False
            seen = len(script.seen)
            await until(lambda: any(is_probe(s.body) for s in script.seen[seen:]), timeout=3.0)
            # (It learned no more than the limiter's initial 8: the ramp is whole at once, closed.)
            took = await until(lambda: ta.view().breaker.state.admits and tb.view().breaker.state.admits, timeout=1.5)
            assert took < 1.0, took  # the probe's answer is 2 s away
            assert _shared_state(redis_url, namespace)["state"] in ("ramp", "closed")


async def test_a_refusals_time_is_the_fleets_so_a_process_that_had_none_can_go_by_it(
    redis_url: str, namespace: str
) -> None:
    # The process that probes next may never have been refused itself: it takes the times of
    # the refusals the others got, as it hears of them (SETTLE keeps the latest in the hash).
    script = Script()
    script.set("flagship", lambda n, body: OVERLOADED)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_url, namespace)
        async with client(cfg) as a, client(cfg) as b:
            ta, tb = a.target(FLAGSHIP).state, b.target(FLAGSHIP).state
            assert ta.survival_after() is None and tb.survival_after() is None
            assert (await a.chat("hi")).model == "medium"  # refused in milliseconds: A times it
            assert ta.survival_after() is not None
            await until(lambda: tb.survival_after() is not None)
            # The hash keeps the time to the microsecond: A's own reading may be finer until it
            # mirrors the hash again.
            assert tb.survival_after() == pytest.approx(ta.survival_after(), abs=1e-5)
            assert int(_shared_state(redis_url, namespace)["refusals"]) == 1
