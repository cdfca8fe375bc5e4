"""The FallbackClient: choose a target, send, settle, then retry, fall back or return.

One client is shared by every caller in a process. A request walks the preference
order (a model pinned by hand, then the request's own model, then the config's
order) and goes to the first target that admits it. When none does it waits in the
one first-come-first-served queue (capmon/core/waiting.py) for the earliest that
will, instead of failing. Admission and settlement are one call each on the state
seam (capmon/core/state.py); what a failure means comes from one policy table
(capmon/core/policy.py); the bytes on the wire are capmon/core/wire.py's business.
ARCHITECTURE.md, "How a request flows", walks through it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Hashable, Mapping, Sequence

import httpx

from capmon.core import events as ev
from capmon.core import wire
from capmon.core.attempt import Answer, Request, Stream, plain
from capmon.core.backoff import Backoff
from capmon.core.clock import Clock, default_clock
from capmon.core.config import Config, ResolvedKey, resolve_keys
from capmon.core.errors import Failure, Kind
from capmon.core.exceptions import CapmonError, DeadlineExceeded, RequestFailed
from capmon.core.policy import Next, policy_for
from capmon.core.prober import Prober, ProbeResult
from capmon.core.result import Attempt, ChatRequest, ChatResult, Decision, estimate_tokens
from capmon.core.snapshot import EngineSnapshot, WaitingRetry, build_snapshot
from capmon.core.state import Admission, MemoryState, StateStore, TargetSpec
from capmon.core.targets import Target, target_id
from capmon.core.transport import make_transport
from capmon.core.waiting import WaitQueue

log = logging.getLogger("capmon.client")

AttemptObserver = Callable[[ChatRequest, Attempt], None]
Grant = tuple[Target, Admission]
__all__ = ["FallbackClient", "ProbeResult"]


@dataclass
class _Routing:
    """What one request remembers while it is routed."""

    id: int
    request: ChatRequest
    prompt_tokens: int
    deadline: float
    started: float
    attempts: list[Attempt] = field(default_factory=list)
    failures: int = 0
    excluded: set[str] = field(default_factory=set)  # target ids never to use again
    skip: dict[str, float] = field(default_factory=dict)  # target id -> until: others first
    min_window: int = 0  # too_large: only models with a larger window
    stick_to: str | None = None  # rate_limited / transient: retry this model
    last_failure: Failure | None = None
    last_model: str | None = None
    switched: bool = False  # the token parameter was switched once for this request


_PROBE = ChatRequest.of("ping", max_tokens=1)


@dataclass(frozen=True, slots=True)
class _End:
    """The last item a streaming attempt yields: a result, a grant to go on with, or None."""

    out: ChatResult | Grant | None


class FallbackClient:
    """The shared fallback client. Use it as an async context manager or call
    :meth:`aclose` when done."""

    def __init__(self, config: Config, *, clock: Clock | None = None, bus: ev.EventBus | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, environ: Mapping[str, str] | None = None,
                 rng: random.Random | None = None, keys: Mapping[tuple[str, str], ResolvedKey] | None = None,
                 state: Callable[[list[TargetSpec]], StateStore] | None = None) -> None:
        self.config = config
        self.clock = clock or default_clock()
        self.bus = bus or ev.EventBus()
        self._backoff = Backoff(config.backoff, rng or random.Random())
        resolved = dict(keys) if keys is not None else resolve_keys(config, environ)
        specs, self.targets = self._build_targets(resolved)
        self.state: StateStore = state(specs) if state else MemoryState(config, specs, self.clock, self.bus.publish)
        for t in self.targets:
            t.state = self.state.target(t.id)
        self._by_id = {t.id: t for t in self.targets}
        self._token_param = {m.name: wire.TokenParam(m.token_param) for m in config.models}
        self._tpm = any(m.tpm for m in config.models)
        self._ids = itertools.count(1)
        self._queue: WaitQueue[Grant] = WaitQueue(self.clock, self._admit_any, self._give_back, self._ready_at,
                                                  self._group)
        self.state.set_listener(self._queue.regroup)
        self.prober = Prober(self)
        self._waiting: dict[int, WaitingRetry] = {}
        self._observers: list[AttemptObserver] = []
        self.in_flight = self.requests = self.succeeded = self.failed = 0
        cc = config.client
        self._http = httpx.AsyncClient(
            transport=transport or make_transport(cc.transport, max_connections=cc.max_connections,
                                                  connect_timeout=cc.connect_timeout),
            timeout=httpx.Timeout(cc.attempt_timeout, connect=cc.connect_timeout),
            limits=httpx.Limits(max_connections=cc.max_connections, max_keepalive_connections=cc.max_connections))

    def _build_targets(self, keys: Mapping[tuple[str, str], ResolvedKey]) -> tuple[list[TargetSpec], list[Target]]:
        specs, out = [], []
        for rank, model in enumerate(self.config.models):
            for ep in (self.config.endpoint(name) for name in model.endpoints):
                for k in ep.keys:
                    key = keys.get((ep.name, k.alias or k.env))
                    if key is None:
                        continue
                    tid = target_id(model.name, ep.name, key.alias)
                    specs.append(TargetSpec(tid, model, (ep.name, key.alias), key.alias))
                    out.append(Target(tid, rank, model, ep, key, state=None,  # type: ignore[arg-type]
                                      url=ep.base_url.rstrip("/") + "/chat/completions"))
        if not out:
            raise CapmonError(f"{self.config.path}: no usable target: every model's keys are missing")
        return specs, out

    def add_observer(self, fn: AttemptObserver) -> Callable[[], None]:
        """Call ``fn(request, attempt)`` after every attempt (the audit log uses this)."""
        self._observers.append(fn)
        return lambda: self._observers.remove(fn)

    async def aclose(self) -> None:
        await self.prober.aclose()
        await self._queue.aclose()
        await self._http.aclose()
        await self.state.aclose()

    async def __aenter__(self) -> "FallbackClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------ manual control

    @property
    def pinned(self) -> str | None:
        return self.state.pinned

    def model_names(self) -> list[str]:
        return [m.name for m in self.config.models]

    def target(self, name: str) -> Target:
        return self._by_id[name]

    def token_param(self, model: str) -> str:
        """The token parameter the client sends to ``model`` now (learned or configured)."""
        return self._token_param[model].value

    def pin(self, model: str | None) -> None:
        """Send traffic to ``model`` first, whatever the order says; ``None`` goes back to automatic."""
        if model is not None and model not in self.model_names():
            raise CapmonError(f"no model named {model!r}; models: {', '.join(self.model_names())}")
        self.state.pin(model)
        self._queue.regroup()

    def _select(self, name: str) -> list[Target]:
        found = [t for t in self.targets if t.id == name or t.model.name == name]
        if not found:
            raise CapmonError(f"no model or target named {name!r}")
        return found

    def trip(self, name: str, reason: str = "tripped by hand") -> None:
        for t in self._select(name):
            t.state.trip(reason)
        self._queue.regroup()

    def force_close(self, name: str, reason: str = "closed by hand") -> None:
        for t in self._select(name):
            t.state.force_close(reason)
        self._queue.regroup()

    def reset(self, name: str, reason: str = "reset by hand") -> None:
        """Close the breaker and clear a parked or disabled key."""
        for t in self._select(name):
            t.state.reset(reason)
        self._queue.regroup()

    # ------------------------------------------------------------ public API

    async def chat(self, request: ChatRequest | str | Sequence[Mapping[str, Any]], **kw: Any) -> ChatResult:
        """Send one chat-completions request and return the first answer any model gives.

        Raises :class:`RequestFailed` when retrying cannot help (auth, quota on every
        key, bad request, too large for every model) or when the deadline or the
        attempt limit is spent.
        """
        r = self._new(request, kw)
        try:
            grant: Grant | None = None
            while True:
                t, adm = grant or await self._acquire(r)
                out = await self._plain_attempt(r, t, adm)
                if isinstance(out, ChatResult):
                    return out
                grant = out
        except BaseException as e:
            self._failed(r, e)
            raise
        finally:
            self._unwait(r)

    async def stream_chunks(self, request: ChatRequest | str | Sequence[Mapping[str, Any]],
                            **kw: Any) -> AsyncIterator[Mapping[str, Any]]:
        """Stream the provider's chunks as parsed dicts (content and tool-call deltas,
        finish reason, usage). Retries and fallbacks happen before the first chunk
        with output; a stream that breaks after it raises RequestFailed."""
        r = self._new(request, kw)
        try:
            grant: Grant | None = None
            while True:
                t, adm = grant or await self._acquire(r)
                attempt = self._stream_attempt(r, t, adm)
                end: _End | None = None
                try:
                    async for chunk in attempt:
                        if isinstance(chunk, _End):
                            end = chunk
                        else:
                            yield chunk
                finally:
                    await attempt.aclose()
                if end is None or isinstance(end.out, ChatResult):
                    return
                grant = end.out
        except BaseException as e:
            self._failed(r, e)
            raise
        finally:
            self._unwait(r)

    async def stream(self, request: ChatRequest | str | Sequence[Mapping[str, Any]], **kw: Any) -> AsyncIterator[str]:
        """Stream the answer's text as it comes (see :meth:`stream_chunks`)."""
        chunks = self.stream_chunks(request, **kw)
        try:
            async for chunk in chunks:
                text = wire.chunk_text(chunk)
                if text:
                    yield text
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def probe(self, target: str, *, wait: float = 0.0) -> ProbeResult:
        """Probe one target now: the due probe of an open breaker, else a small health
        request that waits its turn for a slot there, at most ``wait`` seconds."""
        return await self.prober.probe_now(self._by_id[target], wait)

    async def _acquire_on(self, t: Target, wait: float) -> Admission | None:
        """A slot on this one target, in line with the requests, within ``wait`` seconds."""
        now = self.clock.now()
        r = _Routing(next(self._ids), _PROBE, 1, now + wait, now, excluded={o.id for o in self.targets if o is not t})
        if wait <= 0:
            adm = await t.state.admit(1)
            return adm
        try:
            return (await self._acquire(r))[1]
        except RequestFailed:
            return None

    def snapshot(self) -> EngineSnapshot:
        return build_snapshot(self, tuple(sorted(self._waiting.values(), key=lambda w: w.deadline)), len(self._queue))

    # ------------------------------------------------------------ routing

    def _new(self, request: ChatRequest | str | Sequence[Mapping[str, Any]], kw: Mapping[str, Any]) -> _Routing:
        req = request if isinstance(request, ChatRequest) else ChatRequest.of(request, **kw)
        now = self.clock.now()
        self.requests += 1
        self.state.on_request()
        return _Routing(next(self._ids), req, estimate_tokens(req.messages), now + self.config.client.deadline, now)

    def _failed(self, r: _Routing, e: BaseException) -> None:
        if isinstance(e, RequestFailed):
            self.failed += 1
            self._publish(ev.RequestDone, request_id=r.id, item_id=r.request.item_id, ok=False, model=None,
                          target=None, attempts=len(r.attempts), latency=self.clock.now() - r.started,
                          kind=e.failure.kind.value)

    def _cost(self, r: _Routing, t: Target) -> int:
        cap = t.model.max_tokens
        return r.prompt_tokens + min(r.request.max_tokens or cap, cap)

    def _usable(self, r: _Routing) -> list[Target]:
        """The targets this request could ever use, in the order it should try them."""
        out = []
        for t in self.targets:
            if t.id in r.excluded or t.model.context_window <= r.min_window or not t.state.usable():
                continue
            if r.prompt_tokens + min(r.request.max_tokens or t.model.max_tokens, t.model.max_tokens, 16) \
                    > t.model.context_window:
                continue
            out.append(t)
        if r.stick_to and any(t.model.name == r.stick_to for t in out):
            out = [t for t in out if t.model.name == r.stick_to]
        else:
            r.stick_to = None
        first = [m for m in (r.stick_to, self.state.pinned, r.request.model) if m]
        if first:
            out.sort(key=lambda t: (first.index(t.model.name) if t.model.name in first else len(first), t.rank))
        return out

    def _candidates(self, r: _Routing, now: float) -> list[Target]:
        """The targets this request may try now: the usable ones it is not backing off from."""
        out = self._usable(r)
        if r.skip:
            out = [t for t in out if r.skip.get(t.id, 0.0) <= now]
        return out

    async def _admit_any(self, r: _Routing, exclude: str | None = None) -> Grant | None:
        for t in self._candidates(r, self.clock.now()):
            if t.id != exclude:
                adm = await t.state.admit(self._cost(r, t))
                if adm is not None:
                    return t, adm
        return None

    async def _give_back(self, grant: Grant) -> None:
        await grant[0].state.settle(grant[1], None, cancelled=True)
        self._queue.kick()

    def _ready_at(self, r: _Routing, now: float) -> float | None:
        times = [t.state.ready_at(now, self._cost(r, t)) for t in self._candidates(r, now)]
        times += [u for u in r.skip.values() if u > now]
        found = [x for x in times if x is not None]
        return min(found) if found else None

    def _group(self, r: _Routing) -> Hashable:
        # Requests that may try exactly the same targets share a fate in the queue.
        return tuple(t.id for t in self._candidates(r, self.clock.now())), r.prompt_tokens if self._tpm else 0

    async def _acquire(self, r: _Routing) -> Grant:
        now = self.clock.now()
        if now >= r.deadline - 1e-6:
            self._give_up(r)
        if not self._usable(r):
            failure = r.last_failure or Failure(Kind.TOO_LARGE, f"no model's context window fits about "
                                                                f"{r.prompt_tokens} prompt tokens")
            raise RequestFailed(failure, r.attempts, f"no model can serve this request; last: "
                                                     f"{failure.kind.value}: {failure.reason}")
        grant = None if len(self._queue) else await self._admit_any(r)
        if grant is None:
            try:
                grant = await self._queue.wait(r.id, r, r.deadline - now)
            except TimeoutError:
                self._give_up(r)
        self._unwait(r)
        return grant

    def _give_up(self, r: _Routing) -> Any:
        failure = r.last_failure or Failure(Kind.CAPACITY, "no model admitted the request in time")
        raise DeadlineExceeded(failure, r.attempts, f"deadline of {self.config.client.deadline:g}s passed; "
                                                    f"last: {failure.kind.value}: {failure.reason}")

    def _unwait(self, r: _Routing) -> None:
        if self._waiting.pop(r.id, None) is not None:
            self._publish(ev.RetryFired, request_id=r.id)

    # ------------------------------------------------------------ attempts

    def _begin(self, r: _Routing, t: Target, stream: bool) -> tuple[int, float, float, Request]:
        number = len(r.attempts) + 1
        if r.last_model is not None and r.last_model != t.model.name:
            self._publish(ev.FellBack, request_id=r.id, item_id=r.request.item_id, from_model=r.last_model,
                          to_model=t.model.name, reason=r.last_failure.reason if r.last_failure else "")
        r.last_model = t.model.name
        self._publish(ev.AttemptStarted, request_id=r.id, item_id=r.request.item_id, model=t.model.name,
                      target=t.id, attempt=number)
        cap = t.model.max_tokens
        body = wire.chat_body(r.request.messages, r.request.extra, model=t.model.wire_name,
                              token_param=self._token_param[t.model.name],
                              max_tokens=min(r.request.max_tokens or cap, cap),
                              temperature=r.request.temperature, stream=stream)
        cc = self.config.client
        req = Request(t.url, body, wire.auth_headers(t.endpoint.headers, t.key.secret.reveal()), cc.attempt_timeout,
                      cc.max_response_bytes)
        self.in_flight += 1
        return number, self.clock.wall(), self.clock.now(), req

    async def _plain_attempt(self, r: _Routing, t: Target, adm: Admission) -> ChatResult | Grant | None:
        number, wall, t0, req = self._begin(r, t, False)
        try:
            answer = await plain(self._http, req, wall=wall)
        except BaseException:
            await self._cancelled(t, adm)
            raise
        finally:
            self.in_flight -= 1
        return await self._settle(r, t, adm, answer, number, wall, t0)

    async def _stream_attempt(self, r: _Routing, t: Target, adm: Admission) -> AsyncIterator[Any]:
        number, wall, t0, req = self._begin(r, t, True)
        stream = Stream(self._http, req, self.clock.now, wall)
        chunks = stream.chunks()
        ended = False
        try:
            async for chunk in chunks:
                yield chunk
            await chunks.aclose()
            self.in_flight -= 1
            ended = True
            yield _End(await self._settle(r, t, adm, stream.answer, number, wall, t0))
        finally:
            if not ended:
                self.in_flight -= 1
                await chunks.aclose()
                await self._cancelled(t, adm)

    async def _cancelled(self, t: Target, adm: Admission) -> None:
        if not adm.settled:
            await t.state.settle(adm, None, cancelled=True)
            self._queue.kick()

    async def _settle(self, r: _Routing, t: Target, adm: Admission, answer: Answer, number: int, wall: float,
                      t0: float) -> ChatResult | Grant | None:
        now = self.clock.now()
        latency = now - t0
        failure = answer.failure
        if failure is None and answer.response is None:
            failure = Failure(Kind.TRANSIENT, "no answer", answer.status)
        t.last_status, t.last_kind = answer.status, failure.kind if failure else None
        t.stats.record(now, _outcome(answer.status, failure.kind if failure else None), latency)
        param = self._token_param[t.model.name]
        if failure is not None and not answer.output_sent and not r.switched \
                and wire.refused_token_param(failure, param):
            await t.state.settle(adm, None, cancelled=True)
            self._queue.kick()
            self._learn_token_param(r, t, param, failure)
            self._record(r, t, number, wall, answer.status, failure.kind, failure.reason, None, 0.0, latency,
                         Decision.RETRY)
            return None
        usage = (answer.response or {}).get("usage") or {}
        used = usage.get("total_tokens") if isinstance(usage, Mapping) else None
        await t.state.settle(adm, failure, used_tokens=used if isinstance(used, int) else None)
        self._queue.kick()
        if t.state.probe_due_at() is not None:
            self.prober.kick()
        if failure is None:
            self.succeeded += 1
            self._record(r, t, number, wall, answer.status, None, "", None, 0.0, latency, Decision.OK)
            total = now - r.started
            self._publish(ev.RequestDone, request_id=r.id, item_id=r.request.item_id, ok=True, model=t.model.name,
                          target=t.id, attempts=number, latency=total, kind=None)
            response = answer.response or {}
            return ChatResult(model=t.model.name, endpoint=t.endpoint.name, target=t.id,
                              content=wire.completion_text(response), response=response,
                              attempts=tuple(r.attempts), latency=total, usage=usage)
        self._publish(ev.AttemptFailed, request_id=r.id, item_id=r.request.item_id, model=t.model.name, target=t.id,
                      attempt=number, kind=failure.kind.value, status=answer.status, reason=failure.reason,
                      hint=failure.retry_after)
        r.failures += 1
        r.last_failure = failure
        if answer.output_sent:  # a stream that broke after output reached the caller: never retried
            self._record(r, t, number, wall, answer.status, failure.kind, failure.reason, None, 0.0, latency,
                         Decision.FAIL)
            raise RequestFailed(failure, r.attempts, f"stream broke after output was sent: {failure.kind.value}: "
                                                     f"{failure.reason}")
        return await self._decide(r, t, failure, number, wall, answer.status, latency)

    def _learn_token_param(self, r: _Routing, t: Target, sent: wire.TokenParam, failure: Failure) -> None:
        """The model refused the token parameter: send the other one from now on, and
        try again at once on the same model (once: a second refusal is a bad request)."""
        r.switched = True
        r.stick_to = t.model.name
        if self._token_param[t.model.name] is sent:
            self._token_param[t.model.name] = sent.other
            self._publish(ev.TokenParamLearned, model=t.model.name, param=sent.other.value, reason=failure.reason)
            log.info("model %s refused %s; sending %s from now on", t.model.name, sent.value, sent.other.value)

    async def _decide(self, r: _Routing, t: Target, failure: Failure, number: int, wall: float, status: int | None,
                      latency: float) -> Grant | None:
        """What the request does after a failed attempt, from the policy table. Waiting
        happens in the queue: the request backs off from the target that failed (and
        only that one) and keeps its place in line for every other."""
        now = self.clock.now()
        kind, hint = failure.kind, failure.retry_after
        nxt = policy_for(failure).next

        def record(decision: Decision, wait: float = 0.0) -> None:
            self._record(r, t, number, wall, status, kind, failure.reason, hint, wait, latency, decision)

        def fail(message: str | None = None) -> None:
            record(Decision.FAIL)
            raise RequestFailed(failure, r.attempts, message)

        if nxt is Next.FAIL:
            fail()
        if nxt in (Next.FALLBACK, Next.LARGER):
            r.excluded.add(t.id)
            if nxt is Next.LARGER:
                r.min_window = max(r.min_window, t.model.context_window)
            what = {Kind.AUTH: f"key {t.key.alias} at {t.endpoint.name} is disabled",
                    Kind.QUOTA: f"key {t.key.alias} parked", Kind.TOO_LARGE: "no model with a larger context window",
                    }.get(kind, "no other model to fall back to")
            if number >= self.config.client.max_attempts or not self._usable(r):
                fail(f"{kind.value}: {failure.reason} ({what})")
            record(Decision.FALLBACK)
            return None
        if number >= self.config.client.max_attempts:
            fail(f"{kind.value}: {failure.reason} (after {number} attempts)")
        if nxt is Next.RETRY and not self.state.spend_retry():
            fail(f"transient: {failure.reason} (retry budget spent)")
        wait = self._backoff.wait(r.failures, Kind.TRANSIENT if nxt is Next.RETRY else kind, hint)
        wait = max(0.0, min(wait, r.deadline - now))
        r.skip[t.id] = now + wait
        if nxt in (Next.RETRY, Next.SAME_MODEL):
            r.stick_to = t.model.name
        grant = None if len(self._queue) else await self._admit_any(r)
        if grant is not None:  # another key or model has room now: go at once
            record(Decision.FALLBACK if grant[0].model.name != t.model.name else Decision.RETRY)
            return grant
        record(Decision.RETRY, wait)
        self._show_wait(r, wait, r.stick_to, failure.reason)
        return None

    def _show_wait(self, r: _Routing, wait: float, model: str | None, reason: str) -> None:
        """A visible retry wait: shown in snapshots and announced on the bus."""
        now = self.clock.now()
        info = WaitingRetry(request_id=r.id, item_id=r.request.item_id, model=model, attempt=len(r.attempts) + 1,
                            max_attempts=self.config.client.max_attempts, reason=reason, deadline=now + wait)
        self._waiting[r.id] = info
        self._publish(ev.RetryScheduled, request_id=r.id, item_id=r.request.item_id, model=model,
                      attempt=info.attempt, max_attempts=info.max_attempts, reason=reason, wait=wait,
                      deadline=info.deadline)

    def _record(self, r: _Routing, t: Target, number: int, wall: float, status: int | None, kind: Kind | None,
                reason: str, hint: float | None, wait: float, latency: float, decision: Decision) -> None:
        attempt = Attempt(number=number, model=t.model.name, target=t.id, endpoint=t.endpoint.name,
                          key_alias=t.key.alias, started=wall, status=status, kind=kind, reason=reason, hint=hint,
                          wait=wait, latency=latency, decision=decision)
        r.attempts.append(attempt)
        for fn in list(self._observers):
            try:
                fn(r.request, attempt)
            except Exception:
                log.exception("attempt observer failed")

    def _publish(self, cls: type[ev.Event], **fields: Any) -> None:
        self.bus.publish(cls(at=self.clock.now(), wall=self.clock.wall(), **fields))


def _outcome(status: int | None, kind: Kind | None) -> str:
    """The stats column an attempt counts in: what the dashboard calls 429s and 503s."""
    if kind is None:
        return "ok"
    if status == 429 or kind is Kind.RATE_LIMITED:
        return "rate_limited"
    if status in (503, 529) or kind is Kind.CAPACITY:
        return "capacity"
    return "other"
