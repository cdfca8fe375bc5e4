"""One attempt on one target, for a user's request and for the client's own probe alike:
build what is sent (in the target's wire, with the token parameter the model takes now),
send it, classify the answer, relearn a refused token parameter, settle the admission.

The router (capmon/core/routing/client.py) and the prober (capmon/core/routing/prober.py) both go through
this one :class:`Executor`, so an answer means the same to a probe as to a request, and
the token-parameter quirk is learned in one place. What an outcome means for the request
(fall back, wait, fail) is routing's business, not this module's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from capmon.core.base.clock import Clock
from capmon.core.base.tasks import cancel_and_wait
from capmon.core.control.seam import Admission
from capmon.core.providers import formats
from capmon.core.providers.token_param import TokenParams
from capmon.core.routing.attempt import Answer, Sending, Stream, chat_request, plain
from capmon.core.routing.targets import Target
from capmon.core.routing.transport import Sender
from capmon.core.types.config import Config
from capmon.core.types.failure import SILENT, Failure, Kind
from capmon.core.types.result import Format, Request

# A probe's answer is one token: anything near this size is already broken.
PROBE_CAP = 1 << 20


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt came to once its answer was read."""

    answer: Answer
    failure: Failure | None  # None: a usable answer
    latency: float  # seconds from the send to the answer
    # The model refused the token parameter that was sent and now knows the other: the
    # admission is not settled, and the caller sends again on it (once).
    relearned: bool = False


class Executor:
    """``settled(target, admission)`` is told after every settle (the client kicks its
    queue and its prober there: a slot, a ramp or a new probe schedule may follow)."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        http: Sender,
        token_params: TokenParams,
        settled: Callable[[Target, Admission], None],
    ) -> None:
        self._config = config
        self._clock = clock
        self._http = http
        self._params = token_params
        self._settled = settled
        self._watches: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ what is sent

    def request(self, t: Target, request: Request, *, stream: bool, time_left: float) -> Sending:
        """A user's request as one attempt on ``t`` sends it."""
        return chat_request(
            t, request, self._params[t.model.name, t.endpoint.name], self._config, stream, time_left=time_left
        )

    def probe_request(self, t: Target) -> Sending:
        """The smallest request that proves ``t`` answers, in its own wire."""
        api, body = formats.probe_body(t, self._params[t.model.name, t.endpoint.name])
        cc = self._config.client
        # A probe's answer is one token: its whole answer is its first, within the first-token limit.
        timeout = min(cc.attempt_timeout, cc.first_token_timeout) if cc.first_token_timeout else cc.attempt_timeout
        return Sending(t, body, timeout, PROBE_CAP, self._config.backoff.max_hint, api)

    # ------------------------------------------------------------ sending

    async def send(self, t: Target, adm: Admission, req: Sending, *, wall: float | None = None) -> Answer:
        """A plain attempt; a cancelled one settles its admission neutrally. ``wall``: the
        wall clock's reading the caller has just taken for it."""
        try:
            return await plain(self._http, req, wall=self._clock.wall() if wall is None else wall)
        except BaseException:
            await self.cancel(t, adm)
            raise

    def stream(self, req: Sending, *, wall: float | None = None) -> Stream:
        """A streaming attempt: iterate its chunks, then :meth:`finish` with its answer
        (``wall``: as in :meth:`send`)."""
        return Stream(self._http, req, self._clock.now, self._clock.wall() if wall is None else wall)

    def watch(self, t: Target, adm: Admission) -> None:
        """An attempt a ramp admitted, or the probe of an open breaker, is being sent: once it
        has been out for the target's survival time (capmon/core/control/survival.py)
        unanswered, tell the target, whose ramp may grow (or start) on it; a waiting request
        may then go (the ``settled`` callback)."""
        if not (adm.ramp or adm.probe):
            return
        after = t.state.survival_after()
        if after is None:
            return
        task = asyncio.create_task(self._survive(t, adm, after))
        self._watches.add(task)
        task.add_done_callback(self._watches.discard)

    async def _survive(self, t: Target, adm: Admission, after: float) -> None:
        await self._clock.sleep(after)
        if t.state.survived(adm):  # False once it was settled (MemoryTarget.survived)
            self._settled(t, adm)

    async def aclose(self) -> None:
        """Stop the survival timers still out."""
        await cancel_and_wait(list(self._watches))

    # ------------------------------------------------------------ settling

    async def finish(
        self,
        t: Target,
        adm: Admission,
        answer: Answer,
        sent_at: float,
        *,
        relearn: bool,
        api: Format | None = None,
        probe: bool = False,
    ) -> Outcome:
        """Classify ``answer`` and settle ``adm`` with it, unless the model refused the token
        parameter and ``relearn`` allows learning it (then nothing is settled: send again).
        ``api``: the caller's format, whose answer's usage refunds a tpm bucket. ``probe``: the
        client's own probe (of an open breaker, or a health probe on request), shown as the
        target's probe latency rather than counted with its traffic."""
        now = self._clock.now()
        latency = now - sent_at
        failure = answer.failure
        if failure is None and answer.response is None:
            failure = Failure(Kind.TRANSIENT, "no answer", answer.status)
        if failure is not None and failure.kind is Kind.UNREACHABLE:
            failure = t.reach.lost(failure, now)
        elif answer.status is not None:
            t.reach.reached(now)
        if failure is not None and failure.code == SILENT:
            t.silent = failure.reason
        elif answer.status is not None:
            t.silent = None  # it answered (a probe's answer, or anyone's): no longer silent
        t.last_status, t.last_kind = answer.status, failure.kind if failure else None
        if probe:
            t.probe_latency = latency
        else:
            t.stats.record_attempt(now, answer.status, failure.kind if failure else None, latency)
        if relearn and failure is not None and not answer.output_sent:
            param = self._params[t.model.name, t.endpoint.name]
            if formats.refused_token_param(answer.wire, failure, param):
                self._params.learn((t.model.name, t.endpoint.name), param, failure.reason)
                return Outcome(answer, failure, latency, relearned=True)
        used = formats.used_tokens(api, answer.response) if api is not None else None
        # An attempt the deadline cut short is a transient timeout: by policy.py, no news to the breaker.
        await t.state.settle(adm, failure, used_tokens=used)
        self._settled(t, adm)
        return Outcome(answer, failure, latency)

    async def cancel(self, t: Target, adm: Admission) -> None:
        """The attempt was abandoned (cancelled, or its stream closed early): settle neutrally."""
        if not adm.settled:
            await t.state.settle(adm, None, cancelled=True)
            self._settled(t, adm)
