"""Invariants under random sequences: the breaker and the limiter on their own (filling
gaps in tests/core/test_breaker_stateful.py), and the whole router with manual actions
interleaved with requests against a scripted server on a real loopback socket.

The router machine runs its own fast-forwarded event loop (looptime): the scripted
server and the client share it, and waits of minutes cost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import looptime
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from capmon.core import events as ev
from capmon.core.breaker import Admission, CircuitBreaker, State
from capmon.core.clock import ManualClock
from capmon.core.config import BreakerConfig, LimiterConfig
from capmon.core.exceptions import RequestFailed
from capmon.core.limiter import AdaptiveLimiter
from capmon.core.result import ChatResult
from capmon.core.router import FallbackClient
from tests.support.configs import ENV, three_models
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

MODELS = ("flagship", "medium", "small")


# ---------------------------------------------------------------- breaker: counted from outside


class BreakerFromOutside(RuleBasedStateMachine):
    """Counts admissions itself instead of trusting the breaker's own counters."""

    @initialize(probes=st.integers(1, 3), threshold=st.integers(1, 3), cooldown=st.sampled_from([0.0, 5.0, 60.0]),
                ramp=st.sampled_from([0.0, 10.0]), seed=st.integers(0, 2**16))
    def setup(self, probes: int, threshold: int, cooldown: float, ramp: float, seed: int) -> None:
        self.cfg = BreakerConfig(failure_threshold=threshold, half_open_probes=probes, cooldown=cooldown,
                                 cooldown_max=max(cooldown, 60.0), ramp_duration=ramp)
        self.clock = ManualClock()
        self.events: list[ev.BreakerChanged] = []
        self.b = CircuitBreaker("t", "m", self.cfg, self.clock, self.events.append, random.Random(seed))
        self.open: list[Admission] = []  # admitted, no outcome reported yet
        self.forced_open_since: int | None = None  # index into events when trip() took effect

    def _current_probes(self) -> int:
        # probe admissions still open, from the breaker's current half-open spell
        gen = self.b._generation  # the generation counter: the only way to tell spells apart
        return sum(1 for a in self.open if a.probe and a.generation == gen)

    @rule(n=st.integers(1, 5))
    def admit(self, n: int) -> None:
        for _ in range(n):
            state = self.b.state
            adm = self.b.admit()
            if state is State.FORCED_OPEN:
                assert adm is None, "admitted while forced open"
            if adm is not None:
                self.open.append(adm)
            if state is State.HALF_OPEN:
                assert self._current_probes() <= self.cfg.half_open_probes

    @rule(i=st.integers(0, 100), outcome=st.sampled_from(["ok", "capacity", "transient", "release"]))
    def finish(self, i: int, outcome: str) -> None:
        if not self.open:
            return
        adm = self.open.pop(i % len(self.open))
        before = self.b.state
        if outcome == "ok":
            self.b.on_success(adm)
        elif outcome == "release":
            self.b.release(adm)
        else:
            self.b.on_failure(adm, capacity=outcome == "capacity")
        if before.manual:
            assert self.b.state is before

    @rule(dt=st.sampled_from([0.0, 1.0, 5.0, 61.0, 600.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule(action=st.sampled_from(["trip", "force_close", "reset"]))
    def by_hand(self, action: str) -> None:
        getattr(self.b, action)()
        expected = {"trip": State.FORCED_OPEN, "force_close": State.FORCED_CLOSED, "reset": State.CLOSED}[action]
        assert self.b.state is expected
        if action == "reset":
            v = self.b.view()
            assert v.consecutive_failures == 0 and v.trips == 0 and v.cooldown_until is None
            assert self.b.would_admit() and self.b.next_admit_at() is None

    @invariant()
    def probes_bounded(self) -> None:
        if self.b.state is State.HALF_OPEN:
            assert self._current_probes() <= self.cfg.half_open_probes

    @invariant()
    def forced_open_admits_nothing(self) -> None:
        if self.b.state is State.FORCED_OPEN:
            assert not self.b.would_admit() and self.b.next_admit_at() is None

    def teardown(self) -> None:
        # settling everything that is still open never raises and leaves no probe held
        for adm in self.open:
            self.b.release(adm)
        if self.b.state is State.HALF_OPEN:
            assert self.b.view().probes_in_flight == 0


TestBreakerFromOutside = BreakerFromOutside.TestCase
TestBreakerFromOutside.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------- limiter: the async queue


class LimiterQueue(RuleBasedStateMachine):
    """``acquire()`` waiters, cancellation and releases, which the core machine (try_acquire
    only) never reaches: the limit stays in bounds, a slot is granted only below the
    limit, waiters are served first come first served, and no slot leaks."""

    @initialize(lo=st.integers(1, 3), span=st.integers(0, 6), decrease=st.sampled_from([0.3, 0.5, 0.9]))
    def setup(self, lo: int, span: int, decrease: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.lim = AdaptiveLimiter(LimiterConfig(initial=lo, min=lo, max=lo + span, decrease=decrease), ManualClock())
        self.holding = 0  # slots this machine holds
        self.waiters: list[asyncio.Task[None]] = []  # in the order they queued
        self.granted_order: list[int] = []
        self.next_id = 0

    def _spin(self) -> None:
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.run_until_complete(asyncio.sleep(0))
        for task in [t for t in self.waiters if t.done()]:
            self.waiters.remove(task)
            if not task.cancelled():
                self.holding += 1

    @rule(n=st.integers(1, 4))
    def acquire(self, n: int) -> None:
        for _ in range(n):
            before_in_flight, before_limit = self.lim.in_flight, int(self.lim.limit)
            ident = self.next_id
            self.next_id += 1

            async def take(ident: int = ident) -> None:
                await self.lim.acquire()
                self.granted_order.append(ident)

            task = self.loop.create_task(take())
            self.waiters.append(task)
            self._spin()
            if task.done() and not task.cancelled():
                assert before_in_flight < before_limit  # granted at once only below the limit

    @rule(outcome=st.sampled_from(["ok", "overload", "neutral"]), n=st.integers(1, 3))
    def release(self, outcome: str, n: int) -> None:
        for _ in range(min(n, self.holding)):
            self.lim.release(outcome)
            self.holding -= 1
        self._spin()

    @rule(i=st.integers(0, 50))
    def cancel(self, i: int) -> None:
        if self.waiters:
            self.waiters[i % len(self.waiters)].cancel()
            self._spin()

    @invariant()
    def consistent(self) -> None:
        assert self.lim.min <= self.lim.limit <= self.lim.max
        assert self.lim.in_flight == self.holding  # nothing granted that nobody holds
        assert self.lim.waiting == len(self.waiters)
        if self.waiters:  # someone waits only while the limit is reached
            assert self.lim.in_flight >= int(self.lim.limit)
        assert self.granted_order == sorted(self.granted_order)  # first come, first served

    def teardown(self) -> None:
        for task in self.waiters:
            task.cancel()
        self._spin()
        while self.holding:
            self.lim.release("neutral")
            self.holding -= 1
        assert self.lim.in_flight == 0 and self.lim.waiting == 0
        self.loop.close()


TestLimiterQueue = LimiterQueue.TestCase
TestLimiterQueue.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------- the router


class RouterMachine(RuleBasedStateMachine):
    """Pin, trip, reset and force_close interleaved with requests (some of them still in
    flight while the hand actions happen) against a scripted server.

    Checked after every step: a model forced open by hand never gets an attempt that
    started after the trip; a model pinned by hand gets the next request when its
    breaker admits and it has room; a request finishes with an answer or a RequestFailed,
    never anything else, and every one gets exactly one RequestDone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = looptime.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.script = Script()
        self.down: set[str] = set()
        for m in MODELS:
            self.script.set(m, lambda n, body, m=m: OVERLOADED if m in self.down else Reply(200, ok(m).body, delay=0.5))
        self.events: list[ev.Event] = []
        bus = ev.EventBus()
        bus.subscribe(self.events.append)
        url = self.loop.run_until_complete(self.stack.enter_async_context(serve(self.script)))
        cfg = three_models(url, cooldown=30.0, ramp_duration=10.0, extra="[client]\ndeadline = 120.0\nattempt_timeout = 10.0")
        self.client = self.loop.run_until_complete(self.stack.enter_async_context(
            FallbackClient(cfg, environ=ENV, bus=bus, rng=random.Random(0))))
        # Work around the spin at a deadline a few ulps ahead of the quantised fake clock
        # (test_waiting.py::test_a_deadline_a_hair_ahead_of_the_clock_does_not_spin):
        # a nap is never shorter than looptime's resolution.
        original_wait = self.client._wait
        self.client._wait = lambda state, timeout: original_wait(state, max(timeout, 1e-6))  # type: ignore[method-assign]
        self.forced_open: dict[str, int] = {}  # model -> index into events when the trip took effect
        self.pinned: str | None = None
        self.background: list[asyncio.Task[Any]] = []
        self.finished = 0

    def _run(self, aw: Any) -> Any:
        return self.loop.run_until_complete(aw)

    def _collect(self, tasks: list[asyncio.Task[Any]]) -> list[Any]:
        async def gather() -> list[Any]:
            return await asyncio.gather(*tasks, return_exceptions=True)

        results = self._run(gather())
        for r in results:
            # an answer, or a failure retrying cannot fix (here: the deadline, every model forced open)
            assert isinstance(r, (ChatResult, RequestFailed)), repr(r)
            event(f"request: {type(r).__name__}")
        self.finished += len(results)
        return results

    # ------------------------------------------------------------ hand actions

    @rule(model=st.sampled_from(MODELS))
    def trip(self, model: str) -> None:
        event(f"trip with {len(self.background)} in the background")
        self.client.trip(model)
        self.forced_open[model] = len(self.events)

    @rule(model=st.sampled_from(MODELS), how=st.sampled_from(["reset", "force_close"]))
    def close_by_hand(self, model: str, how: str) -> None:
        getattr(self.client, how)(model)
        self.forced_open.pop(model, None)

    @rule(model=st.none() | st.sampled_from(MODELS))
    def pin(self, model: str | None) -> None:
        self.client.pin(model)
        self.pinned = model

    @rule(model=st.sampled_from(MODELS), down=st.booleans())
    def server(self, model: str, down: bool) -> None:
        (self.down.add if down else self.down.discard)(model)

    # ------------------------------------------------------------ traffic

    @rule()
    def one_request(self) -> None:
        if self.background:
            return  # the pin check below needs a quiet client
        pinned = self.pinned
        target = next((t for t in self.client.targets if t.model.name == pinned), None)
        admits = (target is not None and target.breaker.state in (State.CLOSED, State.FORCED_CLOSED)
                  and target.limiter.has_room() and target.key_ref not in self.client._disabled_keys
                  and target.not_before <= self.loop.time())
        start = len(self.events)
        self._collect([self.loop.create_task(self.client.chat("one"))])
        event(f"pinned model admits: {admits}")
        if admits:
            first = next(e for e in self.events[start:] if isinstance(e, ev.AttemptStarted))
            assert first.model == pinned, f"pinned {pinned} admits, but the request went to {first.model}"

    @rule(model=st.sampled_from(MODELS))
    def pin_and_request(self, model: str) -> None:
        self.pin(model)
        self.one_request()

    @rule(model=st.sampled_from(MODELS), n=st.integers(1, 8))
    def trip_while_busy(self, model: str, n: int) -> None:
        self.start_background(n)
        self.trip(model)

    @rule(n=st.integers(1, 6))
    def start_background(self, n: int) -> None:
        self.background += [self.loop.create_task(self.client.chat(f"bg {i}")) for i in range(n)]
        self._run(asyncio.sleep(0.1))  # sent, not answered (answers take 0.5 s)

    @rule(dt=st.sampled_from([0.1, 1.0, 31.0]))
    def advance(self, dt: float) -> None:
        self._run(asyncio.sleep(dt))
        done = [t for t in self.background if t.done()]
        self.background = [t for t in self.background if not t.done()]
        self._collect(done)

    @rule()
    def settle(self) -> None:
        tasks, self.background = self.background, []
        self._collect(tasks)

    # ------------------------------------------------------------ invariants

    @invariant()
    def forced_open_models_get_no_new_attempts(self) -> None:
        for model, since in self.forced_open.items():
            late = [e for e in self.events[since:] if isinstance(e, ev.AttemptStarted) and e.model == model]
            assert not late, f"{model} was tripped by hand, yet got attempt(s) {late[:2]}"

    @invariant()
    def one_request_done_each(self) -> None:
        done = [e for e in self.events if isinstance(e, ev.RequestDone)]
        assert len({e.request_id for e in done}) == len(done)  # never twice
        assert len(done) >= self.finished  # every finished request was announced
        snap = self.client.snapshot()
        assert snap.requests == self.finished + len(self.background)
        ended = self.finished + sum(1 for t in self.background if t.done())
        assert snap.succeeded + snap.failed == ended

    def teardown(self) -> None:
        try:
            tasks, self.background = self.background, []
            self._collect(tasks)
            assert self.client.snapshot().in_flight == 0
        finally:
            self._run(self.stack.aclose())
            self.loop.close()


TestRouterMachine = RouterMachine.TestCase
TestRouterMachine.settings = settings(max_examples=15, stateful_step_count=20, deadline=None)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_router_machine_long() -> None:
    run_state_machine_as_test(RouterMachine, settings=settings(max_examples=300, stateful_step_count=60, deadline=None))
