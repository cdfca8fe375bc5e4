"""The SETTLE script's learning is AdaptiveLimiter's (capmon/core/control/limiter.py): the same
sequences of admissions and outcomes through a MemoryTarget and through a RedisTarget
(one process, so the fleet's in-flight count is this process's) give the same slots,
the same limits, the same learned capacity, the same cuts; trips restore the same
checkpoint. Keeping the Lua and the Python in step is the price of atomicity; this
test is what holds them there."""

from __future__ import annotations

import asyncio
import random

from capmon.core.base.clock import default_clock
from capmon.core.control.breaker import State
from capmon.core.control.seam import Admission, MemoryState, TargetSpec
from capmon.core.types.failure import Cause, Failure, Kind
from tests.fleet.helpers import FLAGSHIP, client, fleet_config, store

CAPACITY = Failure(Kind.CAPACITY, "at capacity", 503)
RATE_LIMITED = Failure(Kind.RATE_LIMITED, "rate limited", 429)
DOWN = Failure(Kind.UNREACHABLE, "connection refused", None, Cause.REFUSED)  # nothing reached the server
OUTCOMES = [
    None,
    None,
    CAPACITY,
    CAPACITY,
    RATE_LIMITED,
    RATE_LIMITED,
    Failure(Kind.BAD_REQUEST, "bad", 400),
    DOWN,
    "cancelled",
]


# A sequence that takes every branch of the learning on purpose (limiter initial 4,
# decrease 0.5): slow start; the first rejection (limit = position - 1 = 4); an echo of
# an older send; a second rejection below the capacity (multiplicative: 2); growth at
# the capacity; a send above it served (capacity up); a rejection above it refuted
# (back to what it held, twice as patient). Steps: ("admit", label), ("settle", label,
# outcome) or ("press",): work was turned away (the router's MemoryTarget.press).
def _scripted() -> list[tuple]:
    steps: list[tuple] = [("admit", f"a{i}") for i in range(1, 5)]
    steps += [
        ("settle", "a4", None),
        ("admit", "a5"),
        ("admit", "a6"),
        ("settle", "a6", RATE_LIMITED),
        ("settle", "a5", CAPACITY),
        ("admit", "a7"),
        ("settle", "a7", RATE_LIMITED),
        ("settle", "a1", None),
        ("settle", "a2", None),
        ("admit", "a8"),
        ("settle", "a3", None),
        ("settle", "a8", None),
    ]
    for n in range(45):  # full use, work waiting: asks above the capacity, served (a climb)
        steps += [("admit", f"g{n}.{i}") for i in range(6)] + [("press",)]
        steps += [("settle", f"g{n}.{i}", None) for i in range(6)]
    for n in range(40):  # full use up to the capacity, nothing waiting: no growth
        steps += [("admit", f"h{n}.{i}") for i in range(5)] + [("settle", f"h{n}.{i}", None) for i in range(5)]
    steps += [("admit", f"p{i}") for i in range(6)] + [("settle", f"p{i}", RATE_LIMITED) for i in range(5, -1, -1)]
    return steps


async def _run(
    redis_url: str, namespace: str, seed: int, steps: int, breaker: str, script: list[tuple] | None = None
) -> int:
    cfg = fleet_config(
        "http://127.0.0.1:9/v1",
        redis_url,
        f"{namespace}:s{seed}",
        breaker=breaker,
        extra="[limiter]\ninitial = 4\nmin = 1\nmax = 24\ndecrease = 0.5\n",
    )
    rng = random.Random(seed)
    memory = MemoryState(
        cfg, [TargetSpec(FLAGSHIP, cfg.model("flagship"), ("ep", "a"), "a")], default_clock(), lambda e: None
    ).target(FLAGSHIP)
    trips = 0
    async with client(cfg) as c:
        shared = c.state.target(FLAGSHIP)
        held: list[tuple[Admission, Admission]] = []
        labels: dict[str, tuple[Admission, Admission]] = {}
        for step in script or [None] * steps:
            if step is not None and step[0] == "press":
                memory.press()
                shared.press()
                continue
            if step is not None and step[0] == "settle" and step[1] not in labels:
                continue  # that admission was refused on both sides
            if (
                step is not None
                and step[0] == "settle"
                or step is None
                and held
                and (rng.random() < 0.5 or len(held) > 30)
            ):
                if step is None:
                    # mostly the latest: rejections of fresh sends, the ones that are news
                    m_adm, r_adm = held.pop(-1 if rng.random() < 0.6 else rng.randrange(len(held)))
                    outcome = rng.choice(OUTCOMES)
                else:
                    m_adm, r_adm = labels.pop(step[1])
                    held.remove((m_adm, r_adm))
                    outcome = step[2]
                cancelled = outcome == "cancelled"
                failure = None if cancelled else outcome
                m_news = await memory.settle(m_adm, failure, cancelled=cancelled)  # type: ignore[arg-type]
                r_news = await shared.settle(r_adm, failure, cancelled=cancelled)  # type: ignore[arg-type]
                assert m_news == r_news
            else:
                m_adm, r_adm = await memory.admit(1), await shared.admit(1)
                assert (m_adm is None) == (r_adm is None)
                if m_adm is None:  # turned away, as the router does: the limiter may grow
                    memory.press()
                    shared.press()
                if m_adm is not None and r_adm is not None:
                    assert (m_adm.slot.position, m_adm.slot.epoch) == (r_adm.slot.position, r_adm.slot.epoch)
                    held.append((m_adm, r_adm))
                    if step is not None:
                        labels[step[1]] = (m_adm, r_adm)
            assert memory.limiter.learned() == shared.local.limiter.learned()
            assert memory.breaker.state is shared.local.breaker.state
            if memory.breaker.state is State.OPEN:
                trips += 1
                # back to closed by hand on both, to go on learning
                memory.reset("again")
                shared.reset("again")
                await asyncio.gather(*store(c)._tasks)
                shared.slot_freed()
    return trips


NO_TRIPS = "[breaker]\nfailure_threshold = 1000\nratio_min_requests = 100000\n"


async def test_every_branch_of_the_learning_is_the_same_in_the_script(redis_url: str, namespace: str) -> None:
    await _run(redis_url, namespace, 0, 0, NO_TRIPS, _scripted())


async def test_slow_start_grows_only_a_limit_in_use_in_the_script_too(redis_url: str, namespace: str) -> None:
    # limit 4 -> 5 (two of four in use), then one or two of five in use: no growth
    steps = [
        ("admit", "s1"),
        ("admit", "s2"),
        ("settle", "s1", None),
        ("settle", "s2", None),
        ("admit", "s3"),
        ("admit", "s4"),
        ("settle", "s3", None),
        ("settle", "s4", None),
    ]
    await _run(redis_url, namespace, 0, 0, NO_TRIPS, steps)


async def test_the_settle_script_learns_as_the_adaptive_limiter_does(redis_url: str, namespace: str) -> None:
    no_trips = NO_TRIPS
    for seed in range(8):
        await _run(redis_url, namespace, seed, 120, no_trips)


async def test_a_trip_restores_what_was_learned_before_the_streak_the_same_way(redis_url: str, namespace: str) -> None:
    trips = 0
    for seed in range(100, 108):
        trips += await _run(
            redis_url,
            namespace,
            seed,
            120,
            "[breaker]\nfailure_threshold = 3\nratio_min_requests = 100000\nprobe_interval = 60\n",
        )
    assert trips >= 5  # the sequences did trip, and restored, on both sides


async def test_a_recovery_in_steps_is_followed_the_same_way_by_the_script(redis_url: str, namespace: str) -> None:
    # A target that holds 24, then 12, then 24 again, always full of waiting work: each round
    # sends what both limiters admit (a refusal presses them) and answers it oldest first,
    # refusing what was sent above what the target holds. Both learn 24, drop to 12 with 24
    # remembered as a ceiling, ask for it back (refused, the ceiling lowered) and climb back
    # once it is there, the same way to the last field.
    cfg = fleet_config(
        "http://127.0.0.1:9/v1",
        redis_url,
        f"{namespace}:steps",
        breaker=NO_TRIPS,
        extra="[limiter]\ninitial = 4\nmin = 1\nmax = 32\ndecrease = 0.5\n",
    )
    memory = MemoryState(
        cfg, [TargetSpec(FLAGSHIP, cfg.model("flagship"), ("ep", "a"), "a")], default_clock(), lambda e: None
    ).target(FLAGSHIP)
    holds = [24] * 6 + [12] * 6 + [24] * 6
    ceilings: list[int] = []
    capacities: list[int | None] = []
    async with client(cfg) as c:
        shared = c.state.target(FLAGSHIP)
        for holds_now in holds:
            held: list[tuple[Admission, Admission]] = []
            while True:
                m_adm, r_adm = await memory.admit(1), await shared.admit(1)
                assert (m_adm is None) == (r_adm is None)
                if m_adm is None or r_adm is None:
                    memory.press()
                    shared.press()
                    break
                assert (m_adm.slot.position, m_adm.slot.epoch) == (r_adm.slot.position, r_adm.slot.epoch)
                held.append((m_adm, r_adm))
            for m_adm, r_adm in held:
                failure = RATE_LIMITED if m_adm.slot.position > holds_now else None
                assert await memory.settle(m_adm, failure) == await shared.settle(r_adm, failure)
                assert memory.limiter.learned() == shared.local.limiter.learned()
            ceilings.append(memory.limiter.learned().ceiling)
            capacities.append(memory.limiter.capacity)
    assert capacities[5] == 24 and ceilings[5] == 0
    assert capacities[6] == 12 and ceilings[6] == 24  # the drop: 24 remembered
    assert 12 < ceilings[11] < 24  # refused asks lowered it
    assert capacities[-1] == 24 and ceilings[-1] == 0  # back: forgotten
