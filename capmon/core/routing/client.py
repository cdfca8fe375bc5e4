"""The FallbackClient: choose a target, send, settle, then retry, fall back or return.

One client is shared by every caller in a process. A request walks its route
(capmon/core/routing/route.py: a model pinned by hand, then the request's own model, then
the config's order) and goes to the first target that admits it. When none does it
waits in the one first-come-first-served queue (capmon/core/routing/waiting.py) for the
earliest that will, instead of failing. Admission and settlement are one call each on
the state seam (capmon/core/control/seam.py); what a failure means comes from one policy
table (capmon/core/control/policy.py); the bytes on the wire are the format and dialect
modules' (capmon/core/providers/formats.py composes them) and capmon/core/routing/attempt.py's
business. ARCHITECTURE.md, "How a request flows", walks through it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.exceptions import DeadlineExceeded, RequestFailed
from capmon.core.control.backoff import Backoff
from capmon.core.control.demand import Demand
from capmon.core.control.seam import Admission, MemoryState, StateStore, TargetSpec
from capmon.core.providers import capabilities, formats
from capmon.core.providers.splice import add_usage
from capmon.core.providers.token_param import TokenParams
from capmon.core.providers.tokens import estimate_request
from capmon.core.routing.attempt import Answer, Sending, result_of
from capmon.core.routing.calls import FormatCalls
from capmon.core.routing.continuation import continued_request, refuses_prefill
from capmon.core.routing.controls import ManualControls
from capmon.core.routing.executor import Executor
from capmon.core.routing.journal import AttemptObserver, Journal
from capmon.core.routing.prober import Prober, ProbeResult
from capmon.core.routing.route import Routing, Step, plan
from capmon.core.routing.streaming import ChatStream
from capmon.core.routing.targets import Target, admits_in, build_targets
from capmon.core.routing.transport import Sender, make_transport
from capmon.core.routing.waiting import WaitQueue
from capmon.core.types import events as ev
from capmon.core.types.config import Config, ResolvedKey, Spread, resolve_keys
from capmon.core.types.failure import UNSUPPORTED_FEATURE, Failure, Kind
from capmon.core.types.prices import Tokens, cost_of, price_of
from capmon.core.types.result import Attempt, ChatResult, Decision, Format, Request
from capmon.core.types.snapshot import EngineSnapshot, TargetSnapshot

log = logging.getLogger("capmon.client")

Grant = tuple[Target, Admission]
_HEALTH = Request.of("ping", max_tokens=1)  # what a health probe waits in line as
Messages = Request | str | Sequence[Mapping[str, Any]]
__all__ = ["FallbackClient", "ProbeResult"]


# Breaks that no continuation mends: the answer is past its size cap, or the request is refused.
_NOT_CONTINUED = frozenset({Kind.OVERSIZED, Kind.BAD_REQUEST, Kind.TOO_LARGE})


@dataclass(frozen=True, slots=True)
class _End:
    """The last item a streaming attempt yields: a result, a grant to go on with, or None."""

    out: ChatResult | Grant | None


class FallbackClient(FormatCalls, ManualControls):
    """The shared fallback client. Use it as an async context manager or call
    :meth:`aclose` when done. ``state`` builds the state seam's implementation from the
    targets (default: :class:`~capmon.core.control.seam.MemoryState`, this process only)."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        bus: ev.EventBus | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        keys: Mapping[tuple[str, str], ResolvedKey] | None = None,
        state: Callable[[list[TargetSpec]], StateStore] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or default_clock()
        self.bus = bus or ev.EventBus()
        self._backoff = Backoff(config.backoff, rng or random.Random())
        specs, self.targets = build_targets(config, dict(keys) if keys is not None else resolve_keys(config, environ))
        self.state: StateStore = state(specs) if state else MemoryState(config, specs, self.clock, self.bus.publish)
        for t in self.targets:
            t.state = self.state.target(t.id)
        self._by_id = {t.id: t for t in self.targets}
        self._first_model = min(self.targets, key=lambda t: t.rank).model.name if self.targets else ""
        self._pins = self.pinnable()
        self._home: dict[str, Target] = {}  # each model's first target: the deployment it is tried at first
        for t in self.targets:
            self._home.setdefault(t.model.name, t)
        self._token_param = TokenParams(
            {(t.model.name, t.endpoint.name): t.model.token_param for t in self.targets},
            lambda where, param, reason: self.journal.publish(
                ev.TokenParamLearned, model=where[0], param=param, reason=reason, endpoint=where[1]
            ),
        )
        self._by_cost = any(t.model.tpm for t in self.targets)  # a deployment may set its own
        self._no_prefill: set[str] = set()  # models whose 400 said they take no assistant prefill
        self._takes_untouched: dict[Format, bool] = {}  # per caller format: see _untouched
        self._ids = itertools.count(1)
        self._queue: WaitQueue[Grant] = WaitQueue(
            self.clock,
            self._admit_any,
            self._give_back,
            lambda r, now: r.ready_at(self.targets, self.pinned_at[0], now),
            lambda r: r.group(self.targets, self.pinned_at[0], self.clock.now(), self._by_cost),
            batch_share=config.client.batch_share,
            cannot_wait=lambda r: r.cannot_wait(self.targets, self.pinned_at[0], self.clock.now()),
        )
        self.state.set_listener(self._news)
        self.journal = Journal(self.clock, self.bus, config.client.max_attempts)
        cc = config.client
        self._http = Sender(
            transport
            or make_transport(
                cc.transport, max_connections=cc.max_connections, connect_timeout=cc.connect_timeout, where=config.path
            ),
            attempt_timeout=cc.attempt_timeout,
            connect_timeout=cc.connect_timeout,
        )
        # One executor for every attempt, a user's or a probe (capmon/core/routing/executor.py).
        self.executor = Executor(config, self.clock, self._http, self._token_param, self._after_settle)
        bc = config.breaker
        self.demand = Demand(
            self.clock,
            share=bc.probe_share,
            floor=bc.probe_floor,
            every=bc.probe_interval_wanted,
            wanted_for=bc.probe_wanted_for,
            on_due=lambda: self.prober.kick(),
        )
        self.prober = Prober(
            self.clock,
            self.targets,
            self.executor,
            self.demand,
            self.journal.publish,
            self._acquire_on,
            fleet_size=lambda: len(self.state.shared_status().processes) or 1,
        )

    def add_observer(self, fn: AttemptObserver) -> Callable[[], None]:
        """Call ``fn(request, attempt)`` after every attempt (the audit log uses this)."""
        return self.journal.add_observer(fn)

    async def aclose(self) -> None:
        await self.prober.aclose()
        await self._queue.aclose()
        await self.executor.aclose()
        await self._http.aclose()
        await self.state.aclose()

    async def start(self) -> None:
        await self.state.start()  # connect a shared store ([shared]); a no-op in memory

    def _after_settle(self, t: Target, adm: Admission) -> None:
        if adm.probe:
            self._queue.regroup()  # a ramp may have started: waiting requests can go there now
        else:
            self._queue.kick()
        if t.state.probe_due_at() is not None:
            self.prober.kick()

    def _news(self) -> None:
        # A shared store heard of a change elsewhere (a trip, a reset, a free slot): look again.
        self._queue.regroup()
        self.prober.kick()

    async def __aenter__(self) -> FallbackClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------ public API

    async def chat(self, request: Messages, **kw: Any) -> ChatResult:
        """Send one chat-completions request and return the first answer any model gives.

        Raises :class:`RequestFailed` when retrying cannot help (auth, quota on every
        key, bad request, too large for every model) or when the deadline or the
        attempt limit is spent.
        """
        r = self._new(request, kw)
        try:
            grant: Grant | None = None
            now: float | None = r.started  # nothing awaited since it was read
            while True:
                t, adm = await self._next(r, grant, now)
                now = None
                number, wall, t0, req = self._begin(r, t, adm, False)
                try:
                    answer = await self.executor.send(t, adm, req, wall=wall)
                finally:
                    self.journal.in_flight -= 1
                out = await self._settle(r, t, adm, answer, number, wall, t0)
                if isinstance(out, ChatResult):
                    return out
                grant = out
        except BaseException as e:
            self._failed(r, e)
            raise
        finally:
            self.journal.unwait(r)

    def stream_chunks(self, request: Messages, **kw: Any) -> ChatStream:
        """Stream the provider's chunks as parsed dicts (content and tool-call deltas,
        finish reason, usage; for a Responses API request, its events). Retries and
        fallbacks happen before the first chunk with output; a stream that breaks after
        it raises RequestFailed. The returned stream says which model serves it."""
        r = self._new(request, kw)
        return ChatStream(lambda s: self._stream(r, s), r.request.format)

    async def _stream(self, r: Routing, s: ChatStream) -> AsyncIterator[Mapping[str, Any]]:
        s.request_id, s.requested = r.id, r.first_choice
        if r.request.continuation is not False and self.config.client.continuations > 0:
            r.splice, r.original = formats.splicer(r.request.format, r.prompt_tokens), r.request
            s.continuations = r.splice.records  # the stream's record of its continuations, as they come
        splice = r.splice
        try:
            grant: Grant | None = None
            while True:
                t, adm = await self._next(r, grant)
                attempt = self._stream_attempt(r, t, adm)
                end: _End | None = None
                try:
                    async for chunk in attempt:
                        if isinstance(chunk, _End):
                            end = chunk
                            continue
                        if s.model is None:
                            s.serving(
                                t.model.name,
                                t.endpoint.name,
                                t.id,
                                tuple(r.attempts),
                                api=t.endpoint.api,
                                dropped=r.sending_dropped,
                                lowered=r.sending_lowered,
                                deployment=t.deployment,
                            )
                        if splice is None:
                            yield chunk
                            continue
                        for out in splice.fit(chunk) if splice.records else (chunk,):
                            splice.out(out)
                            yield out
                finally:
                    await attempt.aclose()  # type: ignore[attr-defined]
                if end is None:
                    return
                if isinstance(end.out, ChatResult):
                    s.result = self._whole(r, end.out)
                    return
                grant = end.out
        except BaseException as e:
            self._failed(r, e)
            raise
        finally:
            self.journal.unwait(r)

    def stream(self, request: Messages, **kw: Any) -> AsyncIterator[str]:
        """Stream the answer's text as it comes (see :meth:`stream_chunks`)."""
        return self.stream_chunks(request, **kw).texts()

    async def probe(self, target: str, *, wait: float = 0.0) -> ProbeResult:
        """Probe one target now: the due probe of an open breaker, else a small health
        request that waits its turn for a slot there, at most ``wait`` seconds."""
        return await self.prober.probe_now(self._by_id[target], wait)

    def snapshot(self) -> EngineSnapshot:
        return build_snapshot(self, self.journal, len(self._queue))

    # ------------------------------------------------------------ routing

    def _new(self, request: Messages, kw: Mapping[str, Any]) -> Routing:
        req = request if isinstance(request, Request) else Request.of(request, **kw)
        now = self.clock.now()
        self.journal.requests += 1
        self.state.on_request()
        # A caller may ask for less time than the config allows, never more.
        cap = self.config.client.deadline
        asked = req.deadline if req.deadline is not None and req.deadline > 0 else cap
        deadline, own = min(asked, cap), asked < cap
        r = Routing(next(self._ids), req, estimate_request(req), now + deadline, now, self._backoff.schedule())
        r.own_deadline, r.cap_ceiling = own, self.config.client.cap_client_tokens
        r.patience = self.config.client.patience.of(req.priority.value)
        # The model it counts on first: serving any other is a fallback, tried or not (a
        # breaker open or tripped by hand skips it without an attempt).
        model, endpoint = self.pinned_at
        r.first_choice = req.model or model or self._first_model
        r.last_model = r.first_choice or None
        r.last_target = self._home.get(r.first_choice)
        if endpoint is not None and r.first_choice == model:  # a pinned deployment is where it starts
            r.last_target = next(
                (t for t in self.targets if t.model.name == model and t.endpoint.name == endpoint), None
            )
        r.incapable = (
            {} if self._untouched(req.format) else formats.incapable_targets(req, self.targets, self.config.client)
        )
        r.needs = capabilities.needs(req)
        for tid, (_, why) in capabilities.lacking(req, self.targets, self.state.lessons, r.needs).items():
            r.incapable.setdefault(tid, why)
            r.lacking.add(tid)
        return r

    def _untouched(self, caller: Format) -> bool:
        """Whether every target takes a ``caller`` request as it comes (formats.takes_untouched):
        then none is incapable of one, whatever its body."""
        known = self._takes_untouched.get(caller)
        if known is None:
            known = self._takes_untouched[caller] = all(formats.takes_untouched(caller, t) for t in self.targets)
        return known

    def _learn(self, r: Routing, t: Target, failure: Failure) -> None:
        """A provider said ``t``'s model does not support a feature: its deployment lacks it
        for the process (every later request that needs it skips it), and this request passes
        over its other keys there."""
        feature = failure.feature
        if feature is None:
            return
        deployment = t.deployment_id
        if self.state.learn(deployment, feature, failure.message or failure.reason):
            log.info("%s does not support %s: skipped for requests that need it (%s)", deployment, feature, failure)
            model, endpoint, reason = t.model.name, t.endpoint.name, failure.reason
            self.journal.publish(ev.CapabilityLearned, model=model, endpoint=endpoint, feature=feature, reason=reason)
        why = f"it has no {feature.value} (its provider said so), which the request needs"
        r.needs |= {feature}
        for u in self.targets:
            if u.deployment_id == deployment:
                r.incapable.setdefault(u.id, why)
                r.lacking.add(u.id)

    def _skips(self, r: Routing, t: Target | None, now: float, wall: float | None = None) -> None:
        """Put every target ``r`` passed over on its way to ``t`` on its record, with why
        (``t`` None: every one it had, when it fails without an attempt)."""
        passed = r.passed_over(self.targets, t, self.pinned_at[0]) if t is not None else r.unnoted(self.targets)
        for u in passed:
            r.noted.add(u.id)
            skip, reason = r.skip_reason(u, now)
            self._note(r, self.journal.skipped(r, u, skip, reason, wall=wall))

    def _note(self, r: Routing, attempt: Attempt) -> None:
        """An attempt (or a skip) on the request's record, then to the observers."""
        r.attempts.append(attempt)
        self.journal.observe(r.request, attempt)

    def _wanted(self, r: Routing, passed: Sequence[Target]) -> None:
        """``r`` is served by another target than these (in its order of preference), or
        waits. Each of them whose breaker is open (its probe schedule runs) has one more
        request that prefers it (capmon/core/control/demand.py), counted once per request.
        The first, the one it prefers, is pressed when its breaker admits: its limiter may
        grow (capmon/core/control/limiter.py). The others are not: more room there would
        only move work between fallbacks, and each ask for it costs a rejection."""
        self._press_first(passed)
        for u in passed:
            if u.state.probe_due_at() is None:
                continue
            if u.id not in r.wanted:
                r.wanted.add(u.id)
                self.demand.want(u.id)

    def _failed(self, r: Routing, e: BaseException) -> None:
        if isinstance(e, RequestFailed):
            self.journal.done(r, None, ok=False, kind=e.failure.kind.value)
        else:  # the caller went away (cancelled, a stream closed early) or a bug raised
            self.journal.cancelled += 1

    async def _admit_any(
        self, r: Routing, exclude: str | None = None, *, now: float | None = None, usable: list[Target] | None = None
    ) -> Grant | None:
        """The first candidate that admits ``r`` (of one model's deployments and keys, the one
        with the most room first where the model spreads by room: ``Routing.spread``). ``now``
        and ``usable``: the clock's reading and ``r.usable()`` the caller has just taken,
        nothing having changed since."""
        passed: list[Target] = []
        if now is None:
            now = self.clock.now()
        pinned = self.pinned_at
        for t in r.spread(r.candidates(self.targets, pinned[0], now, usable=usable), now, pinned):
            if t.id != exclude:
                adm = await t.state.admit(r.cost(t))
                if adm is not None:
                    if passed:
                        self._wanted(r, passed)
                    return t, adm
                passed.append(t)
        self._press_first(passed)  # it waits (again); demand is counted once, in _acquire
        return None

    @staticmethod
    def _chose(r: Routing, t: Target, now: float) -> None:
        """Before its first attempt, a request for a model that spreads by room and goes to
        another of its deployments than the first while the first has room too chose by room:
        no move (journal.started publishes none). One the first could not take is a move."""
        home = r.last_target
        if r.sent or home is None or home is t or home.model.name != t.model.name:
            return
        if t.model.spread is Spread.ROOM and home.state.room(now, r.cost(home)) > 0.0:
            r.last_target = t

    @staticmethod
    def _press_first(passed: Sequence[Target]) -> None:
        """Press the target a request preferred of those that turned it away, when its breaker
        admits (an open one counts demand instead: FallbackClient._wanted)."""
        if passed and passed[0].state.probe_due_at() is None:
            passed[0].state.press()

    async def _acquire_on(self, t: Target, wait: float) -> Admission | None:
        """A slot on this one target, in line with the requests, within ``wait`` seconds
        (a health probe's; see capmon/core/routing/prober.py)."""
        if wait <= 0:
            return await t.state.admit(1)
        now = self.clock.now()
        r = Routing(-1, _HEALTH, 1, now + wait, now, excluded={o.id for o in self.targets if o is not t})
        r.own_deadline = True
        try:
            return (await self._acquire(r))[1]
        except RequestFailed:
            return None

    async def _give_back(self, grant: Grant) -> None:
        await grant[0].state.settle(grant[1], None, cancelled=True, unused=True)
        self._queue.kick()

    async def _next(self, r: Routing, grant: Grant | None, now: float | None = None) -> Grant:
        """The grant for the next attempt; the deadline is checked before each, waited for or not.
        ``now``: the clock's reading the caller has just taken, for :meth:`_acquire`."""
        grant = grant or await self._acquire(r, now)
        if r.expired(self.clock.now()):
            await self._give_back(grant)
            self._give_up(r)
        return grant

    async def _acquire(self, r: Routing, now: float | None = None) -> Grant:
        if now is None:
            now = self.clock.now()  # one reading for the checks up to the first await
        if r.expired(now):
            self._give_up(r)
        usable = r.usable(self.targets, self.pinned_at[0])
        refused = r.cannot_wait(self.targets, self.pinned_at[0], now, usable=usable)
        if refused is not None:
            self._skips(r, None, now)
            refused.attempts = tuple(r.attempts)
            raise refused
        # Nobody waiting: go now if a target admits. Otherwise take a place in line.
        grant = None if len(self._queue) else await self._admit_any(r, now=now, usable=usable)
        if grant is None:
            self._wanted(r, r.usable(self.targets, self.pinned_at[0]))
        while grant is None:
            try:
                waited = await self._queue.wait(r.id, r, r.left(self.clock.now()))
            except TimeoutError:
                self._give_up(r)
            if waited[0].state.holds(waited[1]):
                grant = waited
            else:  # tripped by hand since the hand-over
                await self._give_back(waited)
        self.journal.unwait(r)
        return grant

    def admits_in(self) -> dict[str, float | None]:
        """Per target, seconds until it may admit a request (see targets.admits_in)."""
        return admits_in(self.targets, self.clock.now())

    def _give_up(self, r: Routing, before: str = "") -> NoReturn:
        failure = r.last_failure or Failure(Kind.CAPACITY, "no model admitted the request in time")
        now = self.clock.now()
        self._skips(r, None, now)  # why it could use none of the others in time
        passed = r.deadline_passed(now)
        last = f"last: {failure.kind.value}: {failure.reason}"
        raise DeadlineExceeded(failure, r.attempts, f"{before}{passed}; {last}", passed=passed)

    # ------------------------------------------------------------ attempts

    def _begin(self, r: Routing, t: Target, adm: Admission, stream: bool) -> tuple[int, float, float, Sending]:
        number = r.sent + 1
        now, wall = self.clock.now(), self.clock.wall()  # the attempt's start, its events' too
        self._skips(r, t, now, wall)
        self._chose(r, t, now)
        self.journal.started(r, t, number, at=now, wall=wall)
        r.last_model, r.last_target = t.model.name, t
        if r.resume is not None:
            self._resume(r, t)
        req = self.executor.request(t, r.request, stream=stream, time_left=r.left(now))
        r.sending_dropped, r.sending_lowered = req.dropped, req.lowered
        self.journal.in_flight += 1
        self.executor.watch(t, adm)
        return number, wall, now, req

    async def _stream_attempt(self, r: Routing, t: Target, adm: Admission) -> AsyncIterator[Any]:
        number, wall, t0, req = self._begin(r, t, adm, True)
        stream = self.executor.stream(req, wall=wall)
        chunks = stream.chunks()
        ended = False
        try:
            async for chunk in chunks:
                yield chunk
            await chunks.aclose()  # type: ignore[attr-defined]
            self.journal.in_flight -= 1
            ended = True
            yield _End(await self._settle(r, t, adm, stream.answer, number, wall, t0))
        finally:
            if not ended:
                self.journal.in_flight -= 1
                await chunks.aclose()  # type: ignore[attr-defined]
                await self.executor.cancel(t, adm)

    def _continue(self, r: Routing, t: Target, failure: Failure, number: int, now: float) -> Step | None:
        """How a stream that broke after output goes on (capmon/core/routing/continuation.py):
        the routing step of its continuation, or None when it is not continued (the caller
        opted out, ``[client] continuations`` are spent, the answer holds more than text, it
        broke past its size cap, its deadline passed, or no model may take it)."""
        splice = r.splice
        if splice is None or len(splice.records) >= self.config.client.continuations or r.expired(now):
            return None
        if failure.kind in _NOT_CONTINUED:
            return None
        if splice.partial().why_not is not None:
            return None
        # bounded by [client] continuations, not the retry budget
        step = self._plan(r, t, failure, number, now, spend_retry=lambda: True)
        return None if step.decision is Decision.FAIL else step

    def _plan(
        self,
        r: Routing,
        t: Target,
        failure: Failure,
        number: int,
        now: float,
        *,
        spend_retry: Callable[[], bool],
        asked: bool = False,
    ) -> Step:
        """What the route does after ``failure`` on ``t`` (:func:`plan` with this client's targets)."""
        pinned = self.pinned_at[0]
        return plan(
            r,
            t,
            failure,
            number=number,
            max_attempts=self.config.client.max_attempts,
            has_other=lambda tid, window: any(
                u.id != tid and u.model.context_window > window for u in r.usable(self.targets, pinned, stick=False)
            ),
            spend_retry=spend_retry,
            now=now,
            elsewhere=lambda: r.earliest_elsewhere(self.targets, pinned, t.model.name, now),
            asked=asked,
        )

    def _resume(self, r: Routing, t: Target) -> None:
        """The continuation's request for ``t``: the caller's with the partial answer, as a
        prefill where ``t`` takes one (Anthropic's Messages wire, unless the model says or
        showed it takes none), else followed by the instruction."""
        assert r.original is not None and r.splice is not None and r.resume is not None
        prefill = formats.takes_prefill(r.original, t) and t.model.prefill and t.model.name not in self._no_prefill
        r.request, trailing = continued_request(r.original, r.resume.text, prefill=prefill)
        r.prefilled = prefill
        r.splice.begin(t.model.name, trailing)

    def _whole(self, r: Routing, result: ChatResult) -> ChatResult:
        """A continued stream's result: the whole answer's text and every request's usage."""
        splice = r.splice
        if splice is None or not splice.records:
            return result
        usage = add_usage(
            result.usage,
            (
                ("prompt_tokens", splice.earlier_in),
                ("input_tokens", splice.earlier_in),
                ("completion_tokens", splice.earlier_out),
                ("output_tokens", splice.earlier_out),
                ("total_tokens", splice.earlier_in + splice.earlier_out),
            ),
        )
        # The earlier parts' tokens are estimates, by models whose prices may differ: no cost.
        return dataclasses.replace(result, content="".join(splice.text), usage=usage, cost=None)

    async def _settle(
        self, r: Routing, t: Target, adm: Admission, answer: Answer, number: int, wall: float, t0: float
    ) -> ChatResult | Grant | None:
        """What one attempt's answer means: the result, a grant to go on with at once, or
        None (wait in line, or go on with the next target)."""
        # Only the first refusal of the token parameter is learned: a second is a bad request.
        out = await self.executor.finish(t, adm, answer, t0, relearn=not r.switched, api=r.request.format)
        now = self.clock.now()
        failure, latency = out.failure, out.latency

        # An attempt that went on with a broken answer (and got as far as output): from where.
        went_on = r.splice.records[-1].offset if r.resume is not None and r.splice is not None else None
        if r.resume is not None and (failure is None or answer.output_sent):
            r.resume = None

        def record(decision: Decision, wait: float = 0.0, tokens: Tokens | None = None) -> None:
            status, dropped = answer.status, answer.dropped
            cost = cost_of(price_of(t.model, t.endpoint.api), tokens) if tokens is not None else None
            on = went_on if went_on is not None and (failure is None or answer.output_sent) else None
            a = self.journal.attempt(
                r,
                t,
                number,
                wall,
                status,
                failure,
                wait,
                latency,
                decision,
                dropped,
                tokens=tokens,
                cost=cost,
                continues=on,
            )
            self._note(r, a)

        if out.relearned:
            # The other token parameter from now on, and at once on the same admission.
            r.switched = True
            record(Decision.RETRY)
            return t, adm
        if failure is None:
            record(Decision.OK, tokens=formats.tokens_of(r.request.format, answer.response))
            self.journal.done(r, t, ok=True, now=now)
            return result_of(
                answer,
                t,
                r.request.format,
                tuple(r.attempts),
                now - r.started,
                r.id,
                r.first_choice,
                r.sending_lowered,
                cost=r.attempts[-1].cost,
            )
        self.journal.failed_attempt(r, t, number, answer.status, failure)
        if r.resume is not None and r.prefilled and refuses_prefill(failure):
            # The model takes no prefill: learned, and the continuation goes again at once
            # with the instruction (that 400 is never the caller's error).
            self._no_prefill.add(t.model.name)
            log.info("model %s takes no assistant prefill: continuing with an instruction (%s)", t.model.name, failure)
            record(Decision.RETRY)
            return None
        r.last_failure = failure
        if failure.code == UNSUPPORTED_FEATURE:
            self._learn(r, t, failure)
        if answer.output_sent:  # a stream that broke after output reached the caller
            step = self._continue(r, t, failure, number, now)
            if step is None:
                record(Decision.FAIL)
                if r.expired(now):
                    self._give_up(r, "stream broke after output was sent: ")
                if r.splice is not None and r.splice.partial().half_call:  # never half a tool call as whole
                    failure = dataclasses.replace(
                        failure, reason=f"{failure.reason}, inside a tool call's arguments (not continued)"
                    )
                reason = f"{failure.kind.value}: {failure.reason}"
                raise RequestFailed(failure, r.attempts, f"stream broke after output was sent: {reason}")
            r.apply(step)
            assert r.splice is not None  # a step comes only for a stream that has one (_continue)
            r.resume = r.splice.partial()
            record(Decision.CONTINUE)
            grant = None if len(self._queue) else await self._admit_any(r)
            if grant is None and step.wait:
                self.journal.show_wait(r, step.wait, failure.reason)
            return grant
        step = self._plan(r, t, failure, number, now, spend_retry=self.state.spend_retry, asked=adm.ask)
        r.apply(step)
        if step.decision is not Decision.RETRY:
            record(step.decision)
            if step.expired:
                self._give_up(r)
            if step.decision is Decision.FAIL:
                none_can = r.no_capable(self.targets) if failure.code == UNSUPPORTED_FEATURE else None
                if none_can is not None:
                    self._skips(r, None, now)
                    raise none_can
                raise RequestFailed(failure, r.attempts, step.message)
            return None  # FALLBACK: the next target at once
        # Another key or model with room now: go at once (no waiter could use that slot,
        # or it would have been handed over). Else wait in line, backing off from ``t``.
        grant = None if len(self._queue) else await self._admit_any(r)
        if grant is not None:
            record(Decision.FALLBACK if grant[0].model.name != t.model.name else Decision.RETRY)
            return grant
        record(Decision.RETRY, step.wait)
        self.journal.show_wait(r, step.wait, failure.reason)
        return None


def build_snapshot(client: FallbackClient, journal: Journal, queued: int) -> EngineSnapshot:
    now = client.clock.now()
    rows = []
    for t in client.targets:
        v = t.state.view()
        b, lim = v.breaker, v.limiter
        rows.append(
            TargetSnapshot(
                target=t.id,
                model=t.model.name,
                endpoint=t.endpoint.name,
                key_alias=t.key.alias,
                rank=t.rank,
                state=b.state,
                manual=b.manual,
                consecutive_failures=b.consecutive_failures,
                cooldown_until=b.next_probe_at,
                ramp_share=b.ramp_share,
                trips=b.trips,
                breaker_reason=b.reason,
                limit=lim.limit,
                in_flight=lim.in_flight,
                key_state=v.key_state,
                key_until=v.key_until,
                key_reason=v.key_reason,
                windows=t.stats.windows(now),
                spark=t.stats.spark(now),
                last_status=t.last_status,
                last_kind=t.last_kind,
                probe_latency=t.probe_latency,
                probe_interval=b.probe_interval,
                probes_failed=b.probes_failed,
                ramp_slots=v.ramp_slots,
                capacity=lim.capacity,
                token_param=client.token_param(t.model.name, t.endpoint.name),
                api=t.endpoint.api,
                unreachable_reason=t.reach.cause,
                never_reached=not t.reach.answered,
                deployment=t.deployment,
                lacks={f.value: why for f, why in client.state.lessons.lacks(t.deployment_id).items()},
            )
        )
    return EngineSnapshot(
        now=now,
        wall=client.clock.wall(),
        pinned=client.pinned,
        targets=tuple(rows),
        waiting=journal.waits(),
        queued=queued,
        in_flight=journal.in_flight,
        requests=journal.requests,
        succeeded=journal.succeeded,
        failed=journal.failed,
        cancelled=journal.cancelled,
        events_published=client.bus.published,
        shared=client.state.shared_status(),
        spend=journal.spend(),
    )
