"""The client's own probes: how an open breaker learns that its model is back.

While a target's breaker is open, no user request goes there. Instead the prober
sends one minimal request (one token of output) when the breaker says a probe is
due, and settles it through the same state seam and policy table as any request:
a success starts the ramp, a failure makes the next probe wait longer. Every probe
is announced (:class:`~capmon.core.events.ProbeFinished`) so the dashboard shows it.

A person or ``capmon status --probe`` can also probe a target now
(:meth:`Prober.probe_now`): the due probe of an open breaker, or a small health
request through normal admission when the breaker is closed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capmon.core import events as ev
from capmon.core import formats, wire
from capmon.core.attempt import Answer, Request, plain
from capmon.core.breaker import State
from capmon.core.errors import Kind
from capmon.core.exceptions import RequestFailed
from capmon.core.result import Api, ChatRequest
from capmon.core.routing import Routing
from capmon.core.state import Admission
from capmon.core.tasks import cancel_and_wait

if TYPE_CHECKING:
    from capmon.core.router import FallbackClient
    from capmon.core.targets import Target

log = logging.getLogger("capmon.probe")

# A probe's answer is one token: anything near this size is already broken.
_PROBE_CAP = 1 << 20
_HEALTH = ChatRequest.of("ping", max_tokens=1)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    target: str
    ok: bool | None  # None: not sent (the breaker or the limiter does not admit now)
    status: int | None
    kind: Kind | None
    latency: float | None
    reason: str


class Prober:
    def __init__(self, client: FallbackClient) -> None:
        self._client = client
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[ProbeResult | None]] = {}
        self._closed = False
        self.sent = 0

    def kick(self) -> None:
        """A breaker opened or changed: look at the probe schedule again."""
        if self._closed:
            return
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    async def aclose(self) -> None:
        self._closed = True
        await cancel_and_wait([self._task, *self._running.values()])

    async def _run(self) -> None:
        clock = self._client.clock
        while True:
            self._wake.clear()
            now = clock.now()
            upcoming: list[float] = []
            for t in self._client.targets:
                due = t.state.probe_due_at()
                if due is None or t.id in self._running:
                    continue
                if due <= now + 1e-9:
                    task = asyncio.ensure_future(self._due(t))
                    self._running[t.id] = task
                    task.add_done_callback(functools.partial(self._done, t.id))
                else:
                    upcoming.append(due)
            if not upcoming and not self._running:
                return
            timeout = (min(upcoming) - now) if upcoming else None
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def _done(self, tid: str, _task: object = None) -> None:
        self._running.pop(tid, None)
        self.kick()  # the breaker may have re-opened with a new schedule

    async def _due(self, t: Target) -> ProbeResult | None:
        adm = await t.state.begin_probe()
        if adm is None:
            return None  # another process of the fleet probes it, or the key is out
        return await self._send(t, adm)

    async def probe_now(self, t: Target, wait: float = 0.0) -> ProbeResult:
        view = t.state.view().breaker
        s = view.state
        if s is State.OPEN:
            assert view.next_probe_at is not None
            wait = view.next_probe_at - self._client.clock.now()
            if wait > 1e-9:
                return ProbeResult(t.id, None, None, None, None, f"breaker open; next probe in {wait:.1f}s")
            adm = await t.state.begin_probe()
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

    async def _acquire_on(self, t: Target, wait: float) -> Admission | None:
        """A slot on this one target, in line with the requests, within ``wait`` seconds."""
        if wait <= 0:
            return await t.state.admit(1)
        client = self._client
        now = client.clock.now()
        r = Routing(-1, _HEALTH, 1, now + wait, now, excluded={o.id for o in client.targets if o is not t})
        try:
            return (await client._acquire(r))[1]
        except RequestFailed:
            return None

    async def _send(self, t: Target, adm: Admission) -> ProbeResult:
        client = self._client
        clock = client.clock
        t0 = clock.now()
        answer: Answer | None = None
        try:
            for _ in range(2):  # a refused token parameter is learned, then sent again
                param = client._token_param[t.model.name]
                api, body = formats.probe_body(t, param)
                req = Request(
                    t, body, client.config.client.attempt_timeout, _PROBE_CAP, client.config.backoff.max_hint, api
                )
                answer = await plain(client._http, req, wall=clock.wall())
                if answer.failure is None or api is not Api.CHAT or not wire.refused_token_param(answer.failure, param):
                    break
                client._token_param.learn(t.model.name, param, answer.failure.reason)
        except BaseException:
            await t.state.settle(adm, None, cancelled=True)
            raise
        assert answer is not None
        failure = answer.failure
        if failure is None and answer.response is None:
            failure = answer.failure
        await t.state.settle(adm, failure)
        self.sent += 1
        latency = clock.now() - t0
        t.probe_latency, t.last_status, t.last_kind = latency, answer.status, failure.kind if failure else None
        result = ProbeResult(
            t.id,
            failure is None,
            answer.status,
            failure.kind if failure else None,
            latency,
            failure.reason if failure else "ok",
        )
        client.journal.publish(
            ev.ProbeFinished,
            target=t.id,
            model=t.model.name,
            ok=result.ok,
            status=result.status,
            kind=result.kind.value if result.kind else None,
            latency=latency,
            reason=result.reason,
            next_probe_at=t.state.probe_due_at(),
            breaker=adm.probe,
        )
        client._queue.regroup()  # a ramp may have started: waiting requests can go there now
        return result
