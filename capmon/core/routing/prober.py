"""The client's own probes: how an open breaker learns that its model is back.

While a target's breaker is open, no user request goes there. Instead the prober
sends one minimal request (one token of output) when a probe is due, by the breaker's
slow schedule or earlier by the demand for the model (capmon/core/control/demand.py), and
sends it through the one attempt executor (capmon/core/routing/executor.py), settled through
the same state seam and policy table as any request: a success starts the ramp, a
failure makes the next scheduled probe wait longer. One probe per target is out at a
time. Every probe is announced (:class:`~capmon.core.types.events.ProbeFinished`) so the
dashboard shows it.

A person or ``capmon status --probe`` can also probe a target now
(:meth:`Prober.probe_now`): the due probe of an open breaker, or a small health
request that waits its turn for a slot when the breaker is closed.

The prober is given what it uses (the clock, the targets, the executor, the demand, a
way to publish and a way to wait in line for one target) and reaches into nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock
from capmon.core.base.tasks import cancel_and_wait
from capmon.core.control.breaker import State
from capmon.core.control.demand import Demand
from capmon.core.control.seam import Admission
from capmon.core.routing.executor import Executor, Outcome
from capmon.core.routing.targets import Target
from capmon.core.types import events as ev
from capmon.core.types.failure import Kind

log = logging.getLogger("capmon.probe")

_WAITING = (State.OPEN, State.HALF_OPEN)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    target: str
    ok: bool | None  # None: not sent (the breaker or the limiter does not admit now)
    status: int | None
    kind: Kind | None
    latency: float | None
    reason: str


class Prober:
    """``publish(event class, **fields)`` puts an event on the bus; ``acquire_on(target,
    wait)`` is a slot on that one target, in line with the requests, within ``wait``
    seconds (or None); ``fleet_size()`` the processes that share the state (1 alone)."""

    def __init__(
        self,
        clock: Clock,
        targets: Sequence[Target],
        executor: Executor,
        demand: Demand,
        publish: Callable[..., None],
        acquire_on: Callable[[Target, float], Awaitable[Admission | None]],
        fleet_size: Callable[[], int] = lambda: 1,
    ) -> None:
        self._clock = clock
        self._targets = targets
        self._executor = executor
        self._demand = demand
        self._publish = publish
        self._acquire_on = acquire_on
        self._fleet_size = fleet_size
        self._elsewhere: set[str] = set()  # targets whose probe another process of the fleet has out
        self._failed_seen: dict[str, int] = {}  # target -> its failed probes when last looked at
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[ProbeResult | None]] = {}
        self._closed = False
        self.sent = 0

    @property
    def probing(self) -> frozenset[str]:
        """The targets whose probe is out now."""
        return frozenset(self._running)

    @property
    def idle(self) -> bool:
        """Nothing runs: no schedule watched, no probe out."""
        return (self._task is None or self._task.done()) and not self._running

    def kick(self) -> None:
        """A breaker opened or changed, or demand grew: look at the probe schedule again."""
        if self._closed:
            return
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def aclose(self) -> None:
        self._closed = True
        await cancel_and_wait([self._task, *self._running.values()])

    def _due(self, t: Target) -> tuple[float, bool] | None:
        """When ``t``'s next probe is due and whether that is early (by demand, before the
        breaker's own schedule); None while no probe is to be sent."""
        scheduled = t.state.probe_due_at()
        self._heard(t)
        if scheduled is None:
            return None
        if t.id in self._elsewhere:
            return scheduled, False  # another process's probe is out: only taking it over is due
        by_demand = self._demand.due(t.id)
        if by_demand is not None and by_demand < scheduled:
            return by_demand, True
        return scheduled, False

    def _heard(self, t: Target) -> None:
        """Keep demand in step with what the breaker does without this process: forget it
        once the breaker is no longer open; spend it when another process of the fleet
        probes (its probe is out, or one more probe failed since this process last looked)."""
        if t.id not in self._demand or t.id in self._running:
            return
        v = t.state.view().breaker
        if v.state not in _WAITING:
            self._demand.forget(t.id)
            self._elsewhere.discard(t.id)
            self._failed_seen.pop(t.id, None)
            return
        seen = self._failed_seen.get(t.id, v.probes_failed)
        self._failed_seen[t.id] = v.probes_failed
        if v.state is State.HALF_OPEN:
            if t.id not in self._elsewhere:
                self._elsewhere.add(t.id)
                self._demand.heard(t.id)
            return
        if t.id not in self._elsewhere and v.probes_failed > seen:
            self._demand.heard(t.id)  # a probe came and went between two looks
        self._elsewhere.discard(t.id)

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            self._demand.scale = max(1, self._fleet_size())
            now = self._clock.now()
            upcoming: list[float] = []
            for t in self._targets:
                due = None if t.id in self._running else self._due(t)
                if due is None:
                    continue
                at, early = due
                if at <= now + 1e-9:
                    task = asyncio.ensure_future(self._scheduled(t, early))
                    self._running[t.id] = task
                    task.add_done_callback(functools.partial(self._done, t.id))
                else:
                    upcoming.append(at)
            if not upcoming and not self._running:
                return
            timeout = (min(upcoming) - now) if upcoming else None
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands as the
            # wake fires, and the closing client then waits for this task for ever.
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _done(self, tid: str, _task: object = None) -> None:
        self._running.pop(tid, None)
        self.kick()  # the breaker may have re-opened with a new schedule

    async def _scheduled(self, t: Target, early: bool) -> ProbeResult | None:
        adm = await t.state.begin_probe(early=early)
        if adm is None:
            # Another process of the fleet probes it, the key is out, or (early) a
            # server's hint still holds it: demand tries again one floor later.
            if early:
                self._demand.refused(t.id)
            return None
        self._demand.probed(t.id)
        try:
            return await self._send(t, adm)
        finally:
            # this process's own probe: its failure is not news of another's
            self._failed_seen[t.id] = t.state.view().breaker.probes_failed

    async def probe_now(self, t: Target, wait: float = 0.0) -> ProbeResult:
        view = t.state.view().breaker
        s = view.state
        if s is State.OPEN:
            assert view.next_probe_at is not None
            left = view.next_probe_at - self._clock.now()
            if left > 1e-9:
                return ProbeResult(t.id, None, None, None, None, f"breaker open; next probe in {left:.1f}s")
            adm = await t.state.begin_probe()
            if adm is not None:
                self._demand.probed(t.id)
        elif s is State.HALF_OPEN:
            return ProbeResult(t.id, None, None, None, None, "a probe is in flight")
        elif s is State.FORCED_OPEN:
            return ProbeResult(t.id, None, None, None, None, "tripped by hand")
        else:
            # A health probe is a request like any other: it waits its turn for a slot.
            adm = await self._acquire_on(t, wait)
            if adm is None:
                return ProbeResult(t.id, None, None, None, None, "skipped: at its concurrency limit")
        if adm is None:
            return ProbeResult(t.id, None, None, None, None, "not admitted now")
        return await self._send(t, adm)

    async def _send(self, t: Target, adm: Admission) -> ProbeResult:
        ex = self._executor
        out: Outcome | None = None
        ex.watch(t, adm)  # admitted before it answers, it starts the ramp (capmon/core/control/survival.py)
        for relearn in (True, False):  # a refused token parameter is learned, then sent again
            t0 = self._clock.now()
            answer = await ex.send(t, adm, ex.probe_request(t))
            out = await ex.finish(t, adm, answer, t0, relearn=relearn, probe=True)
            if not out.relearned:
                break
        assert out is not None
        self.sent += 1
        failure = out.failure
        result = ProbeResult(
            t.id,
            failure is None,
            out.answer.status,
            failure.kind if failure else None,
            out.latency,
            failure.reason if failure else "ok",
        )
        fields: dict[str, Any] = {
            "target": t.id,
            "model": t.model.name,
            "ok": result.ok,
            "status": result.status,
            "kind": result.kind.value if result.kind else None,
            "latency": out.latency,
            "reason": result.reason,
            "next_probe_at": t.state.probe_due_at(),
            "breaker": adm.probe,
        }
        self._publish(ev.ProbeFinished, **fields)
        return result
