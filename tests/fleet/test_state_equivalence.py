"""One decision, two stores: a MemoryState and a RedisState (one process, a fresh
namespace on a real redis-server) driven by the same random sequence of admissions,
settles of every kind, probes, manual actions and clock moves must decide the same
thing at every step and show the same views after it. Both follow
capmon/core/control/decisions.py; the Lua in capmon/fleet/lua/ is its atomic copy, and this
machine is what holds the two in step (ARCHITECTURE.md, "Where a change goes").

Time. Shared times live on Redis's clock, which no test can move. Both stores here
read one clock, :class:`JumpClock`: real time plus the jumps the machine makes. A
jump of ``dt`` also moves every time stored in the namespace (a target's probe
schedule, ramp start, not-before, quota parking, streak start; the buckets' last
refill) back by ``dt``, which is what ``dt`` of Redis's time passing would do.
Liveness times (leases, a probe's lease) are not moved: ``lease_ttl`` is an hour.
Every step starts TICK seconds after the last, and no move lands within MARGIN of a
time a decision turns on (as the memory store knows it exactly): Redis's times reach
the mirror through an offset measured over a round trip, and the two stores' calls
are a moment apart, so no decision may hang on less than a second. Views holding a
time are compared to TOLERANCE.

The default run is derandomized (the same sequences every run) and long enough to
take every failure kind and manual action (the test checks it did); ``pytest -m
slow`` runs long random variants.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
import tomllib
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, ClassVar, TypeVar

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from capmon.core.control.seam import Admission, MemoryState, MemoryTarget, TargetSpec, TargetView
from capmon.core.types.config import parse_config
from capmon.core.types.failure import FIRST_TOKEN, SILENT, Cause, Failure, Kind
from capmon.fleet import RedisState
from capmon.fleet.settings import resolve
from capmon.fleet.target import RedisTarget
from tests.support.configs import ENV, config_toml

T = TypeVar("T")

FAST = settings(max_examples=16, stateful_step_count=120, deadline=None, derandomize=True)
SLOW = settings(max_examples=300, stateful_step_count=120, deadline=None, derandomize=False)

FLAGSHIP, MEDIUM = "flagship@ep/a", "medium@ep/a"  # two models on one key: auth disables both
TARGETS = (FLAGSHIP, MEDIUM)
# Seconds. Every step starts TICK later than the one before, and no step lands within
# MARGIN of a time a decision turns on (a probe due, a hint or a parking over, a bucket
# refilled): Redis's times reach the mirror converted by an offset measured over a
# round trip, so they are off by that trip (more under load), and the two stores'
# calls are a moment apart. Views holding a time are compared to TOLERANCE.
TICK = 2.0
MARGIN = 1.0
TOLERANCE = 0.9

OUTCOMES: dict[str, Failure | None] = {
    "ok": None,
    "capacity": Failure(Kind.CAPACITY, "Selected model is at capacity", 503, "server_is_overloaded"),
    "rate_limited": Failure(Kind.RATE_LIMITED, "Rate limit reached", 429, "rate_limit_exceeded"),
    "quota": Failure(Kind.QUOTA, "You exceeded your current quota", 429, "insufficient_quota"),
    "auth": Failure(Kind.AUTH, "Incorrect API key provided", 401, "invalid_api_key"),
    "too_large": Failure(Kind.TOO_LARGE, "context length exceeded", 400, "context_length_exceeded"),
    "bad_request": Failure(Kind.BAD_REQUEST, "bad role", 422),
    "transient": Failure(Kind.TRANSIENT, "502 bad gateway", 502),
    "down": Failure(Kind.UNREACHABLE, "connection refused", None, Cause.REFUSED),
    "oversized": Failure(Kind.OVERSIZED, "answer larger than max_response_bytes", 200),
    "silent": Failure(Kind.CAPACITY, "no response headers within 30s: the route is silent", None, SILENT),
    "first_token": Failure(Kind.CAPACITY, "no first token within 30s (first_token_timeout)", 200, FIRST_TOKEN),
    "cancelled": None,
    "unused": None,
}
outcomes = st.sampled_from(
    ["ok"] * 6
    + ["capacity"] * 6
    + ["rate_limited"] * 2
    + ["down"] * 3
    + ["quota", "auth", "too_large", "bad_request", "transient", "oversized", "silent", "first_token"]
    + ["cancelled", "unused"] * 2
)
# whole seconds only (see the module's docstring); garbage is dropped by both stores
hints = st.none() | st.sampled_from([1.0, 5.0, 30.0, 120.0, math.inf, -1.0, math.nan])
jumps = st.sampled_from([1.0, 2.0, 5.0, 10.0, 30.0, 61.0, 300.0, 4000.0])
picks = st.integers(0, 3) | st.integers(0, 10**6)
MANUAL = ("trip", "force_close", "reset")

seen: collections.Counter[str] = collections.Counter()  # what the runs covered


class JumpClock:
    """Real monotonic time plus the jumps made so far (the shared store's calls take
    real time, and Redis's clock moves with it)."""

    def __init__(self) -> None:
        self.jumped = 1000.0

    def now(self) -> float:
        return time.monotonic() + self.jumped

    def wall(self) -> float:
        return time.time() + self.jumped

    def jump(self, seconds: float) -> None:
        self.jumped += seconds

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def with_hint(failure: Failure | None, hint: float | None) -> Failure | None:
    if failure is None or hint is None:
        return failure
    return Failure(failure.kind, failure.reason, failure.status, failure.code, hint)


def config_text(redis_url: str, namespace: str, breaker: str, flagship: str) -> str:
    return config_toml(
        "http://127.0.0.1:9/v1",
        models={"flagship": tomllib.loads(flagship), "medium": {}},
        shared={
            "backend": "redis",
            "url": redis_url,
            "namespace": namespace,
            "lease_ttl": 3600,
            "heartbeat": 60,
            "reconcile": 60,
        },
        limiter={"initial": 1, "min": 1, "max": 8, "decrease": 0.5},
        extra=breaker,
    )


# Times stored in a target's hash that Redis's clock passing would age (not liveness).
_AGED = ("next_probe", "ramp_from", "not_before", "park_until", "streak_from")
_SHIFT = """
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 and redis.call('TYPE', key).ok == 'hash' then
    local fields = {'at'}  -- a bucket's last refill
    if redis.call('HEXISTS', key, 'gen') == 1 then fields = cjson.decode(ARGV[2]) end
    for _, f in ipairs(fields) do
      local v = tonumber(redis.call('HGET', key, f) or '')
      if v ~= nil and v > 0 then redis.call('HSET', key, f, string.format('%.6f', v - tonumber(ARGV[1]))) end
    end
    -- a message published before the jump carries times from before it: a newer version
    -- keeps the mirror from taking it once the next answer came with the new offset
    if fields[1] ~= 'at' then redis.call('HINCRBY', key, 'ver', 1) end
  end
end
return 0
"""


class Equivalence(RuleBasedStateMachine):
    redis_url: ClassVar[str] = ""

    @initialize(
        threshold=st.integers(1, 2),
        probes=st.integers(1, 2),
        interval=st.sampled_from([2.0, 10.0]),
        ratio=st.sampled_from([False, False, True]),
        rpm=st.sampled_from([0, 6]),
        tpm=st.sampled_from([0, 600]),
    )
    def setup(self, threshold: int, probes: int, interval: float, ratio: bool, rpm: int, tpm: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = JumpClock()
        self.ns = f"capmon-eq-{uuid.uuid4().hex[:12]}"
        # A ramp grows by clean answers only (its time ceiling a million seconds away), from
        # 0.35 of a limit of at most 8 or its floor, the initial limit (1: low, so that the
        # limiter often learns more and a trip has a ramp to go to); the time ceiling stays
        # below what evidence earned, so a moment of real time never tips a ramp's slots.
        breaker = (
            f"[breaker]\nfailure_threshold = {threshold}\nhalf_open_probes = {probes}\n"
            f"probe_interval = {interval}\ncooldown = 30\ncooldown_multiplier = 2.0\ncooldown_max = 60\n"
            "ramp_start = 0.35\nramp_duration = 1000000\nratio_window = 1000000\n"
            + ("failure_ratio = 0.5\nratio_min_requests = 4\n" if ratio else "ratio_min_requests = 100000\n")
        )
        flagship = (f"rpm = {rpm}\n" if rpm else "") + (f"tpm = {tpm}\n" if tpm else "")
        cfg = parse_config(config_text(self.redis_url, self.ns, breaker, flagship), "equivalence.toml")
        specs = [TargetSpec(tid, cfg.model(tid.split("@")[0]), ("ep", "a"), "a") for tid in TARGETS]
        self.memory = MemoryState(cfg, specs, self.clock, lambda e: None)
        self.shared = RedisState(cfg, specs, self.clock, lambda e: None, resolve(cfg, ENV))
        self.sync = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.shift = self.sync.register_script(_SHIFT)
        self._run(self.shared.start())
        assert self.shared.link.ok

        async def first_rounds() -> None:  # the background loops' first rounds (a heartbeat and a
            calls = self.shared.link.calls  # reconciliation each, besides the join's), then quiet
            while calls["heartbeat"] < 2 or calls["reconcile"] < 2:
                await asyncio.sleep(0.001)

        self._run(asyncio.wait_for(first_rounds(), 5.0))
        self.open: list[tuple[Admission, Admission]] = []  # (memory's, Redis's), admitted, not settled
        self._ceilings: dict[str, int] = {}  # the limiter's ceiling at the last compare
        self.compare()
        # The flagship's limiter learns a few slots above its initial one first (slow start,
        # in both stores): a ramp admits no fewer than the initial limit, so a trip of a
        # limiter that learned nothing more has no ramp to go to.
        while self._m(FLAGSHIP).limiter.limit < 8:
            while self._admit(FLAGSHIP, 0):
                pass
            if not self.open:
                self._jump(61.0)  # the rpm bucket is empty: full again a minute later
            while self.open:
                self._settle(len(self.open) - 1, "ok", None, None)
            self.compare()

    def teardown(self) -> None:
        try:
            if hasattr(self, "shared"):
                assert self.shared.link.ok, self.shared.link.message  # nothing here may degrade it
                self._run(self.shared.aclose())
        finally:
            if hasattr(self, "loop"):
                self.loop.close()
            if hasattr(self, "sync"):
                keys = list(self.sync.scan_iter(match=f"{self.ns}:*", count=500))
                if keys:
                    self.sync.delete(*keys)
                self.sync.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _m(self, tid: str) -> MemoryTarget:
        return self.memory.target(tid)

    def _r(self, tid: str) -> RedisTarget:
        return self.shared.target(tid)

    # ------------------------------------------------------------ steps

    # One rule with an ``action``, weighted, for the reason given in
    # tests/core/test_breaker_stateful.py: rules are drawn evenly, and recovery needs
    # more attempts and probes than manual actions and jumps.
    @rule(
        action=st.sampled_from(
            ["attempt"] * 5 + ["admit"] * 3 + ["settle"] * 3 + ["probe"] * 5 + ["by_hand", "jump", "jump"]
        ),
        tid=st.sampled_from([FLAGSHIP, FLAGSHIP, MEDIUM]),
        cost=st.sampled_from([0, 100, 300]),
        i=picks,
        outcome=outcomes,
        hint=hints,
        used=st.none() | st.sampled_from([0, 50, 100, 400]),
        dt=jumps,
        manual=st.sampled_from(MANUAL),
    )
    def step(
        self,
        action: str,
        tid: str,
        cost: int,
        i: int,
        outcome: str,
        hint: float | None,
        used: int | None,
        dt: float,
        manual: str,
    ) -> None:
        self._advance(TICK)
        if action == "admit":
            self._admit(tid, cost)
        elif action == "attempt":
            if self._admit(tid, cost):
                self._press(tid)  # while it was out, work was turned away (the limiter may grow)
                if i % 5 == 1:
                    self._survive(len(self.open) - 1)  # and it was out past its survival time
                self._settle(len(self.open) - 1, outcome, hint, used)
        elif action == "settle":
            if i % 3 == 0:  # work was turned away since the attempts went out (another target full, say)
                self._press(tid)
            if self.open:
                self._settle(len(self.open) - 1 - i % len(self.open), outcome, hint, used)
        elif action == "probe":  # mostly successful (recovery needs them); sometimes held in flight
            self._probe(tid, outcome if i % 3 == 0 else "ok", hint, hold=i % 5 == 1)
        elif action == "by_hand":
            self._by_hand(tid, manual)
        else:
            self._advance(dt)
        self.compare()

    def _admit(self, tid: str, cost: int) -> bool:
        m, r = self._run(self._m(tid).admit(cost)), self._run(self._r(tid).admit(cost))
        assert (m is None) == (r is None), f"memory admitted: {m is not None}, Redis: {r is not None}"
        if m is None or r is None:
            self._press(tid)  # turned away, as the router does: the work goes elsewhere or waits
            return False
        seen["admitted"] += 1
        assert (m.slot.position, m.slot.epoch, m.generation) == (r.slot.position, r.slot.epoch, r.generation)
        assert m.ramp == r.ramp, f"counted by a ramp: memory {m}, Redis {r}"
        self.open.append((m, r))
        return True

    # ------------------------------------------------------------ walks (the tests below)

    def trip_by_outage(self, tid: str, threshold: int) -> None:
        """Connection failures in a row trip ``tid`` and teach its limiter nothing."""
        for _ in range(threshold):
            assert self._admit(tid, 0)
            self._settle(len(self.open) - 1, "down", None, None)
        self.compare()

    def answer_all(self) -> None:
        """Every attempt still out answers, oldest first."""
        while self.open:
            self._settle(0, "ok", None, None)
            self.compare()

    def _survive(self, index: int) -> None:
        """An attempt still out past its survival time (the executor's timer, here a step)."""
        m, r = self.open[index]

        async def both() -> tuple[bool, bool]:  # in the loop, as the executor's timer calls it;
            grew = self._m(m.target).survived(m), self._r(r.target).survived(r)
            while self.shared._tasks:  # then what it writes in the background (a probe's ramp)
                await asyncio.gather(*list(self.shared._tasks))
            return grew

        grew_m, grew_r = self._run(both())
        assert grew_m == grew_r, f"survived: memory grew {grew_m}, Redis {grew_r}"
        if m.ramp:
            seen["survived in a ramp"] += 1
        if grew_m:
            seen["survived: the ramp grew"] += 1

    def _press(self, tid: str) -> None:
        self._m(tid).press()
        self._r(tid).press()

    def _settle(self, index: int, outcome: str, hint: float | None, used: int | None) -> None:
        m, r = self.open.pop(index)
        seen["probe " + outcome if m.probe else outcome] += 1
        failure = with_hint(OUTCOMES[outcome], hint)
        kw: dict[str, Any] = {"cancelled": outcome == "cancelled", "unused": outcome == "unused"}
        if outcome == "ok":
            kw["used_tokens"] = used
        news_m = self._run(self._m(m.target).settle(m, failure, **kw))
        news_r = self._run(self._r(r.target).settle(r, failure, **kw))
        assert news_m == news_r, f"news: memory {news_m}, Redis {news_r}"
        assert self._run(self._r(r.target).settle(r, failure, **kw)) is False  # a second settle is ignored

    def _probe(self, tid: str, outcome: str, hint: float | None, hold: bool) -> None:
        due = self._m(tid).probe_due_at()
        if due is not None and due > self.clock.now():
            self._advance(due - self.clock.now())  # MARGIN past it
            self.compare()
        m, r = self._run(self._m(tid).begin_probe()), self._run(self._r(tid).begin_probe())
        assert (m is None) == (r is None), f"memory probed: {m is not None}, Redis: {r is not None}"
        if m is None or r is None:
            return
        seen["probe"] += 1
        assert m.probe and r.probe and m.generation == r.generation
        self.open.append((m, r))
        if not hold:
            self.compare()
            self._settle(len(self.open) - 1, outcome, hint, None)

    def _by_hand(self, tid: str, action: str) -> None:
        seen[action] += 1
        getattr(self._m(tid), action)("by hand")

        async def by_hand() -> None:  # in the loop, as the router calls it; then what it writes in the background
            getattr(self._r(tid), action)("by hand")
            while self.shared._tasks:
                await asyncio.gather(*list(self.shared._tasks))

        self._run(by_hand())

    def _deadlines(self) -> list[float]:
        """The times a decision turns on, as the memory store (exact) knows them."""
        out: list[float] = []
        for tid in TARGETS:
            t = self._m(tid)
            v = t.view()
            out += [x for x in (v.breaker.next_probe_at, v.key_until, v.not_before) if x]
            if t.rpm is not None:
                out.append(t.rpm.available_at(1))
            if t.tpm is not None:
                out += [t.tpm.available_at(c) for c in (100, 300)]
        return out

    def _advance(self, dt: float) -> None:
        """Move time ``dt`` on, or a little more: never within MARGIN of a deadline."""
        now = self.clock.now()
        land = now + dt
        deadlines = self._deadlines()
        for _ in range(len(deadlines) + 1):
            near = [d for d in deadlines if abs(land - d) < MARGIN]
            if not near:
                break
            land = max(near) + MARGIN
        self._jump(land - now)

    def _jump(self, dt: float) -> None:
        seen["jump"] += 1
        self.clock.jump(dt)
        k = self.shared.keys
        keys = [key for tid in TARGETS for key in (k.target(tid), k.rpm(tid), k.tpm(tid))]
        self.shift(keys=keys, args=[dt, '["' + '","'.join(_AGED) + '"]'])

    # ------------------------------------------------------------ the same after every step

    def compare(self) -> None:
        for tid in TARGETS:
            mv, rv = self._m(tid).view(), self._r(tid).view()
            same_view(mv, rv, tid)
            mp, rp = self._m(tid).probe_due_at(), self._r(tid).probe_due_at()
            assert (mp is None) == (rp is None), f"{tid}: probe due: memory {mp}, Redis {rp}"
            assert self._m(tid).usable() == self._r(tid).usable()
            # what the limiter learned, beyond its view: the patience, the rejections in a row
            # below the capacity, the ceiling remembered from before a drop
            ml, rl = self._m(tid).limiter.learned(), self._r(tid).local.limiter.learned()
            assert ml == rl, f"{tid}: learned: memory {ml}, Redis {rl}"
            if ml.ceiling:
                seen["limiter ceiling"] += 1
                if ml.ceiling < self._ceilings.get(tid, 0):
                    seen["limiter ceiling lowered"] += 1
            self._ceilings[tid] = ml.ceiling
            seen[f"state {mv.breaker.state.value}"] += 1
            seen[f"key {mv.key_state.value}"] += 1


def close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= TOLERANCE


def same_view(m: TargetView, r: TargetView, tid: str) -> None:
    mb, rb = m.breaker, r.breaker
    exact = ("state", "manual", "consecutive_failures", "probes_failed", "trips", "reason", "total_trips")
    for name in exact:
        assert getattr(mb, name) == getattr(rb, name), f"{tid}: breaker {name}: memory {mb}, Redis {rb}"
    assert mb.probe_interval == rb.probe_interval, f"{tid}: probe interval: memory {mb}, Redis {rb}"
    assert close(mb.next_probe_at, rb.next_probe_at), f"{tid}: next probe: memory {mb}, Redis {rb}"
    assert (mb.ramp_share is None) == (rb.ramp_share is None), f"{tid}: ramp: memory {mb}, Redis {rb}"
    if mb.ramp_share is not None and rb.ramp_share is not None:
        assert abs(mb.ramp_share - rb.ramp_share) < 1e-3, f"{tid}: ramp share: memory {mb}, Redis {rb}"
    assert m.limiter == r.limiter, f"{tid}: limiter: memory {m.limiter}, Redis {r.limiter}"
    assert m.ramp_slots == r.ramp_slots, f"{tid}: ramp slots: memory {m.ramp_slots}, Redis {r.ramp_slots}"
    assert (m.key_state, m.key_reason) == (r.key_state, r.key_reason), f"{tid}: key: memory {m}, Redis {r}"
    assert close(m.key_until, r.key_until), f"{tid}: key until: memory {m.key_until}, Redis {r.key_until}"
    assert close(m.not_before, r.not_before), f"{tid}: not before: memory {m.not_before}, Redis {r.not_before}"


COVERED = {
    *(k for k in OUTCOMES),
    *MANUAL,
    "probe",
    "probe ok",
    "jump",
    "state open",
    "state half-open",
    "state ramp",
    "state forced-open",
    "state forced-closed",
    "key parked",
    "key disabled",
    "limiter ceiling",
    "survived in a ramp",
    "survived: the ramp grew",
}


@contextlib.contextmanager
def walk(redis_url: str, *, threshold: int, tripped: bool = False) -> Iterator[Equivalence]:
    """A machine walked by hand, step by step (the random runs reach these paths only now and
    then): its flagship learned 8 slots first, ``threshold`` failures in a row trip it
    (``tripped``: they did, by connection failures, in both stores)."""
    Equivalence.redis_url = redis_url
    m = Equivalence()
    m.setup(threshold=threshold, probes=1, interval=2.0, ratio=False, rpm=0, tpm=0)
    try:
        if tripped:
            m.trip_by_outage(FLAGSHIP, threshold)
        yield m
    finally:
        m.teardown()


def test_memory_and_redis_decide_the_same(redis_url: str) -> None:
    Equivalence.redis_url = redis_url
    seen.clear()
    # The stores' calls take real time (Redis's clock moves with it), so a sequence can take
    # another branch from one run to the next: a run that missed something is followed by a
    # longer one (2 s per 16 examples on a quiet machine), and only four that all missed it fail.
    for examples in (FAST.max_examples, 2 * FAST.max_examples, 4 * FAST.max_examples, 8 * FAST.max_examples):
        run_state_machine_as_test(Equivalence, settings=settings(FAST, max_examples=examples))
        if COVERED <= set(seen):
            break
    missing = COVERED - set(seen)
    assert not missing, f"the derandomized runs never took {sorted(missing)}: give them more steps ({dict(seen)})"


def test_a_ramp_grows_two_slots_per_clean_answer_in_both_stores(redis_url: str) -> None:
    # The random runs reach a ramp now and then; this one walks through one, step by step:
    # a fleet's share grows by the step its process writes with each settle.
    with walk(redis_url, threshold=2, tripped=True) as m:
        flagship = m._m(FLAGSHIP)
        assert flagship.limiter.limit == 8 and flagship.breaker.state.value == "open"
        m._probe(FLAGSHIP, "ok", None, hold=False)
        m.compare()
        grown = []
        for outcome in ["ok", "ok", "capacity", "ok"]:
            while m._admit(FLAGSHIP, 0):  # every slot the ramp has, in both stores
                pass
            grown.append(flagship.view().ramp_slots)
            m._settle(0, outcome, None, None)  # the oldest answers
            m.compare()
        # 0.35 of 8 (3 slots), two slots more per clean answer; the oldest's rejection (position
        # 3: the target holds 2) after it served in the ramp ends the ramp at the limiter's cut.
        assert grown == [3, 5, 7, None] and flagship.limiter.capacity == 2
        assert flagship.breaker.state.value == "closed"
        m.answer_all()


def test_a_ramp_grows_by_survivals_the_same_way_in_both_stores(redis_url: str) -> None:
    # A fleet's share grows by the step the process whose request survived writes with its
    # next call: here the admission the new slot lets in, decided after the step.
    with walk(redis_url, threshold=2, tripped=True) as m:
        flagship = m._m(FLAGSHIP)
        m._probe(FLAGSHIP, "ok", None, hold=False)
        assert flagship.breaker.state.value == "ramp"

        def fill() -> None:
            while m._admit(FLAGSHIP, 0):
                pass
            m.compare()

        fill()
        assert [a.ramp for a, _ in m.open] == [True] * 3
        slots = []
        for index in range(4):  # the opening's three, then the first new one, survive in turn
            m._survive(index)
            m.compare()
            fill()
            slots.append(flagship.view().ramp_slots)
        # 3 of 8, a slot per survival (fewer than ramp_lead young, none free), each taken at once
        assert slots == [4, 5, 6, 7] and len(m.open) == 7
        # The newest refused (at 7: the model holds 6) after the ramp's requests survived: the
        # ramp is done, the limiter's cut is the limit, and a survival now counts for nothing.
        m._settle(len(m.open) - 1, "capacity", None, None)
        m.compare()
        assert flagship.breaker.state.value == "closed" and flagship.limiter.limit == 6
        m._survive(4)
        m.compare()
        m.answer_all()


def test_a_probe_that_survived_starts_the_ramp_the_same_way_in_both_stores(redis_url: str) -> None:
    # The probe still out past its survival time: the ramp starts before its answer, in
    # Redis too (the process writes the move at once), and the probe's answer, stale then,
    # changes nothing.
    with walk(redis_url, threshold=2, tripped=True) as m:
        flagship = m._m(FLAGSHIP)
        m._probe(FLAGSHIP, "ok", None, hold=True)
        assert flagship.breaker.state.value == "half-open" and m.open[-1][0].probe
        m._survive(len(m.open) - 1)
        m.compare()
        assert flagship.breaker.state.value == "ramp"
        assert flagship.view().breaker.reason == "1 probe(s) admitted (still out past the time a refusal takes)"
        assert m.sync.hget(m.shared.keys.target(FLAGSHIP), "state") == "ramp"  # written at once
        assert m._admit(FLAGSHIP, 0)
        m.compare()
        m._settle(0, "capacity", None, None)  # the probe's own answer, late: stale in both
        m.compare()
        assert flagship.breaker.state.value == "ramp"
        m.answer_all()


def test_a_drop_is_remembered_and_asked_back_the_same_way_in_both_stores(redis_url: str) -> None:
    # The random runs reach a remembered ceiling now and then; this one walks through a
    # drop: the capacity learned, a rejection far below it (the ceiling remembered), asks
    # for the room back a round trip apart, refused (the ceiling lowered) and then served.
    # the flagship's limit is 8; a threshold of 5: the walk's rejections never trip the breaker
    with walk(redis_url, threshold=5) as m:
        flagship = m._m(FLAGSHIP)

        def fill() -> None:
            while m._admit(FLAGSHIP, 0):  # every slot, in both stores (a refusal presses both)
                pass

        def answer(index: int, outcome: str) -> None:
            m._settle(index, outcome, None, None)
            m.compare()

        def ask(outcome: str) -> None:
            """Work waits: clean answers, a slot at a time, until a send above the capacity."""
            fill()
            while not flagship.limiter.asks(m.open[-1][0].slot):
                answer(0, "ok")
                fill()
            answer(len(m.open) - 1, outcome)
            while m.open:
                answer(0, "ok")

        fill()
        answer(len(m.open) - 1, "capacity")  # at 8: the target holds 7
        while m.open:
            answer(0, "ok")
        fill()
        answer(3, "capacity")  # at 4: it holds 3 now
        while m.open:
            answer(0, "ok")
        assert (flagship.limiter.capacity, flagship.limiter.learned().ceiling) == (3, 7)
        ask("capacity")  # refused: half-way down to what it holds
        assert (flagship.limiter.capacity, flagship.limiter.learned().ceiling) == (3, 5)
        ask("ok")  # served: a climb, and 4 is still below the ceiling
        assert (flagship.limiter.capacity, flagship.limiter.learned().ceiling) == (4, 5)
        ask("ok")  # back at the ceiling: forgotten
        assert flagship.limiter.capacity >= 5 and flagship.limiter.learned().ceiling == 0


@pytest.mark.slow
@pytest.mark.timeout(900)  # about 100 s
def test_memory_and_redis_decide_the_same_in_long_random_runs(redis_url: str) -> None:
    Equivalence.redis_url = redis_url
    run_state_machine_as_test(Equivalence, settings=SLOW)
