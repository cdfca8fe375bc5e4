"""The FallbackClient: choose a target, send, classify, retry or fall back.

One client is shared by every caller in a process. For each request it walks the
preference order (a model pinned by hand first, then the request's own model, then
the config's order) and sends to the first target whose breaker admits it, whose
key is usable, whose limiter has room and whose buckets have tokens. When none
does, the request waits for the earliest one that will - a slot freeing, a
cool-down ending, a server hint running out - instead of failing.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import httpx

from capmon.core import events as ev
from capmon.core.backoff import Backoff
from capmon.core.breaker import CircuitBreaker
from capmon.core.clock import Clock, default_clock
from capmon.core.config import Config, ResolvedKey, resolve_keys
from capmon.core.errors import CONNECT_FAILED, Failure, Kind, classify_exception, classify_response, parse_completion
from capmon.core.exceptions import CapmonError, DeadlineExceeded, RequestFailed
from capmon.core.limiter import AdaptiveLimiter, Budget, TokenBucket
from capmon.core.result import Attempt, ChatRequest, ChatResult
from capmon.core.snapshot import EngineSnapshot, TargetSnapshot, WaitingRetry
from capmon.core.stats import RollingStats
from capmon.core.targets import Target, target_id

log = logging.getLogger("capmon.client")

AttemptObserver = Callable[[ChatRequest, Attempt], None]

# A quota failure without a hint parks its key this long: quotas reset by the
# hour or the day, and hammering a spent key only adds noise.
_DEFAULT_QUOTA_PARK = 3600.0
# The longest a waiting request sleeps before it looks again, even when it is
# waiting for a slot that it will be woken for: a safety net, not a poll.
_MAX_NAP = 5.0


def estimate_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """A cheap, provider-independent prompt size estimate (about 4 characters a token)."""
    chars = 0
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    chars += len(part["text"])
        chars += 16  # role and framing
    return chars // 4 + 1


def _outcome(status: int | None, kind: Kind | None) -> str:
    if kind is None:
        return "ok"
    if status == 429:
        return "rate_limited"
    if status in (503, 529):
        return "capacity"
    if kind is Kind.CAPACITY:
        return "capacity"
    if kind is Kind.RATE_LIMITED:
        return "rate_limited"
    return "other"


@dataclass
class _RequestState:
    """What one request remembers while it is routed."""

    id: int
    request: ChatRequest
    prompt_tokens: int
    deadline: float
    started: float
    attempts: list[Attempt] = field(default_factory=list)
    failures: int = 0
    avoid: dict[str, float] = field(default_factory=dict)  # target id -> until
    excluded: set[str] = field(default_factory=set)  # target ids never to use again
    min_window: int = 0  # too_large: only models with a larger window
    stick_to: str | None = None  # rate_limited: retry this model
    last_failure: Failure | None = None
    last_model: str | None = None


@dataclass(frozen=True)
class ProbeResult:
    target: str
    ok: bool | None  # None: skipped (the breaker does not admit now)
    status: int | None
    kind: str | None
    latency: float | None
    reason: str


class FallbackClient:
    """The shared fallback client. Use it as an async context manager or call
    :meth:`aclose` when done."""

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
    ) -> None:
        self.config = config
        self.clock = clock or default_clock()
        self.bus = bus or ev.EventBus()
        self._rng = rng or random.Random()
        self._backoff = Backoff(config.backoff, self._rng)
        self._budget = Budget(config.client.retry_budget)
        resolved = dict(keys) if keys is not None else resolve_keys(config, environ)
        self.targets: list[Target] = self._build_targets(resolved)
        self._by_id = {t.id: t for t in self.targets}
        self._disabled_keys: dict[tuple[str, str], str] = {}
        self._pinned: str | None = None
        self._ids = itertools.count(1)
        # Requests waiting for any target to admit them, first come first served; an
        # ordered dict so that a waiter that times out removes itself in O(1).
        self._waiters: collections.OrderedDict[int, asyncio.Future[None]] = collections.OrderedDict()
        self._waiting: dict[int, WaitingRetry] = {}
        self._queued = 0
        self._in_flight = 0
        self.requests = 0
        self.succeeded = 0
        self.failed = 0
        self._observers: list[AttemptObserver] = []
        cc = config.client
        self._http = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(cc.attempt_timeout, connect=cc.connect_timeout),
            limits=httpx.Limits(max_connections=cc.max_connections, max_keepalive_connections=cc.max_connections),
        )

    # ------------------------------------------------------------ setup

    def _build_targets(self, keys: Mapping[tuple[str, str], ResolvedKey]) -> list[Target]:
        cfg = self.config
        out: list[Target] = []
        for rank, model in enumerate(cfg.models):
            for ep_name in model.endpoints:
                ep = cfg.endpoint(ep_name)
                for k in ep.keys:
                    alias = k.alias or k.env
                    key = keys.get((ep.name, alias))
                    if key is None:
                        continue
                    tid = target_id(model.name, ep.name, alias)
                    cap = model.max_concurrency or None
                    out.append(
                        Target(
                            id=tid,
                            rank=rank,
                            model=model,
                            endpoint=ep,
                            key=key,
                            breaker=CircuitBreaker(tid, model.name, cfg.breaker, self.clock, self.bus.publish, self._rng),
                            limiter=AdaptiveLimiter(cfg.limiter, self.clock, max_limit=cap),
                            stats=RollingStats(),
                            rpm=TokenBucket(model.rpm, self.clock) if model.rpm else None,
                            tpm=TokenBucket(model.tpm, self.clock) if model.tpm else None,
                            url=ep.base_url.rstrip("/") + "/chat/completions",
                        )
                    )
        if not out:
            raise CapmonError(f"{cfg.path}: no usable target: every model's keys are missing")
        return out

    def add_observer(self, fn: AttemptObserver) -> Callable[[], None]:
        """Call ``fn(request, attempt)`` after every attempt (the audit log uses this)."""
        self._observers.append(fn)
        return lambda: self._observers.remove(fn)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "FallbackClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------ manual control

    @property
    def pinned(self) -> str | None:
        return self._pinned

    def model_names(self) -> list[str]:
        return [m.name for m in self.config.models]

    def pin(self, model: str | None) -> None:
        """Send traffic to ``model`` first, whatever the order says; ``None`` goes back to automatic."""
        if model is not None and model not in self.model_names():
            raise CapmonError(f"no model named {model!r}; models: {', '.join(self.model_names())}")
        self._pinned = model
        self._publish(ev.ModelPinned, model=model)
        self._wake_all()

    def _select(self, name: str) -> list[Target]:
        found = [t for t in self.targets if t.id == name or t.model.name == name]
        if not found:
            raise CapmonError(f"no model or target named {name!r}")
        return found

    def trip(self, name: str, reason: str = "tripped by hand") -> None:
        for t in self._select(name):
            t.breaker.trip(reason)

    def force_close(self, name: str, reason: str = "closed by hand") -> None:
        for t in self._select(name):
            t.breaker.force_close(reason)
        self._wake_all()

    def reset(self, name: str, reason: str = "reset by hand") -> None:
        """Close the breaker and clear a parked or disabled key."""
        for t in self._select(name):
            t.breaker.reset(reason)
            t.parked_until = None
            t.parked_reason = ""
            t.not_before = 0.0
            self._disabled_keys.pop(t.key_ref, None)
        self._wake_all()

    # ------------------------------------------------------------ public API

    async def chat(self, request: ChatRequest | str | Sequence[Mapping[str, Any]], **kw: Any) -> ChatResult:
        """Send one chat-completions request and return the first answer any model gives.

        Raises :class:`RequestFailed` when retrying cannot help (auth, quota on every
        key, bad request, too large for every model) or when the deadline or the
        attempt limit is spent.
        """
        req = request if isinstance(request, ChatRequest) else ChatRequest.of(request, **kw)
        state = self._new_state(req)
        try:
            while True:
                target = await self._choose(state)
                result = await self._attempt(state, target, stream_sink=None)
                if result is not None:
                    return result
        except BaseException as e:
            self._finish_failed(state, e)
            raise
        finally:
            self._waiting.pop(state.id, None)

    async def stream(self, request: ChatRequest | str | Sequence[Mapping[str, Any]], **kw: Any) -> AsyncIterator[str]:
        """Stream the answer's text as it comes. Retries and fallbacks happen before the
        first piece of text; a stream that breaks after that raises RequestFailed."""
        req = request if isinstance(request, ChatRequest) else ChatRequest.of(request, **kw)
        state = self._new_state(req)
        queue: asyncio.Queue[str | None] = asyncio.Queue()

        async def run() -> ChatResult:
            while True:
                target = await self._choose(state)
                result = await self._attempt(state, target, stream_sink=queue)
                if result is not None:
                    return result

        task = asyncio.ensure_future(run())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    piece = getter.result()
                    if piece is not None:
                        yield piece
                    continue
                getter.cancel()
                while not queue.empty():
                    piece = queue.get_nowait()
                    if piece is not None:
                        yield piece
                task.result()
                return
        except BaseException as e:
            task.cancel()
            self._finish_failed(state, e)
            raise
        finally:
            self._waiting.pop(state.id, None)

    # ------------------------------------------------------------ routing

    def _new_state(self, req: ChatRequest) -> _RequestState:
        now = self.clock.now()
        self.requests += 1
        self._budget.on_request()
        return _RequestState(
            id=next(self._ids),
            request=req,
            prompt_tokens=estimate_tokens(req.messages),
            deadline=now + self.config.client.deadline,
            started=now,
        )

    def _finish_failed(self, state: _RequestState, e: BaseException) -> None:
        if isinstance(e, RequestFailed):
            self.failed += 1
            self._publish(
                ev.RequestDone, request_id=state.id, item_id=state.request.item_id, ok=False, model=None, target=None,
                attempts=len(state.attempts), latency=self.clock.now() - state.started, kind=e.failure.kind.value,
            )

    def _order(self, state: _RequestState) -> list[Target]:
        """Targets in the order this request should try them."""
        first: list[str] = []
        if state.stick_to:
            first.append(state.stick_to)
        if self._pinned:
            first.append(self._pinned)
        if state.request.model:
            first.append(state.request.model)
        ranked = sorted(self.targets, key=lambda t: (first.index(t.model.name) if t.model.name in first else len(first), t.rank))
        return ranked

    def _usable(self, state: _RequestState, t: Target, now: float) -> bool:
        """Could this target ever serve this request (now or later)?"""
        if t.id in state.excluded or t.key_ref in self._disabled_keys:
            return False
        if t.model.context_window <= state.min_window:
            return False
        wanted = min(state.request.max_tokens or t.model.max_tokens, t.model.max_tokens)
        if state.prompt_tokens + min(wanted, 16) > t.model.context_window:
            return False
        return True

    def _ready_at(self, state: _RequestState, t: Target, now: float) -> float:
        """When this target may admit the request as far as time goes (cool-down, hints,
        buckets): ``now`` or earlier means now; a free slot is checked separately."""
        times = [t.not_before, state.avoid.get(t.id, 0.0)]
        if t.parked_until is not None:
            if t.parked_until > now:
                times.append(t.parked_until)
            else:
                t.parked_until = None
        nxt = t.breaker.next_admit_at()
        if nxt is not None:
            times.append(nxt)
        cost = self._token_cost(state, t)
        if t.rpm is not None:
            times.append(t.rpm.available_at(1))
        if t.tpm is not None:
            times.append(t.tpm.available_at(cost))
        return max(times)

    def _token_cost(self, state: _RequestState, t: Target) -> int:
        return state.prompt_tokens + min(state.request.max_tokens or t.model.max_tokens, t.model.max_tokens)

    def _try_take(self, state: _RequestState, t: Target) -> Any:
        """Take a slot on ``t`` for this request, or return None and take nothing."""
        if not t.limiter.has_room() or not t.breaker.would_admit():
            return None
        cost = self._token_cost(state, t)
        if t.rpm is not None and t.rpm.available_at(1) > self.clock.now():
            return None
        if t.tpm is not None and t.tpm.available_at(cost) > self.clock.now():
            return None
        admission = t.breaker.admit()
        if admission is None:
            return None
        if not t.limiter.try_acquire():
            t.breaker.release(admission)
            return None
        if t.rpm is not None:
            t.rpm.try_take(1)
        if t.tpm is not None:
            t.tpm.try_take(cost)
        return admission

    async def _choose(self, state: _RequestState) -> tuple[Target, Any]:
        while True:
            now = self.clock.now()
            # Within a microsecond counts as passed: float sums like 241.71 + 120.0 land a
            # hair past the mark, and a fast-forwarded clock may never get there.
            if now >= state.deadline - 1e-6:
                failure = state.last_failure or Failure(Kind.CAPACITY, "no model admitted the request in time")
                raise DeadlineExceeded(failure, state.attempts, f"deadline of {self.config.client.deadline:g}s passed; last: {failure.kind.value}: {failure.reason}")
            usable = [t for t in self._order(state) if self._usable(state, t, now)]
            if not usable:
                failure = state.last_failure or Failure(Kind.TOO_LARGE, f"no model's context window fits about {state.prompt_tokens} prompt tokens")
                raise RequestFailed(failure, state.attempts, f"no model can serve this request; last: {failure.kind.value}: {failure.reason}")
            if state.stick_to and not any(t.model.name == state.stick_to for t in usable):
                state.stick_to = None
            candidates = [t for t in usable if not state.stick_to or t.model.name == state.stick_to]
            earliest: float | None = None
            for t in candidates:
                ready = self._ready_at(state, t, now)
                if ready > now:
                    earliest = ready if earliest is None else min(earliest, ready)
                    continue
                admission = self._try_take(state, t)
                if admission is not None:
                    if state.stick_to and t.model.name == state.stick_to:
                        state.stick_to = None
                    return t, admission
            # Nothing admits now: wait for a slot to free or the earliest time one may.
            wake_at = min(earliest if earliest is not None else now + _MAX_NAP, now + _MAX_NAP, state.deadline)
            await self._wait(state, max(1e-3, wake_at - now))

    async def _wait(self, state: _RequestState, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[id(fut)] = fut
        self._queued += 1
        try:
            await asyncio.wait_for(fut, timeout)
        except (asyncio.TimeoutError, TimeoutError):
            pass
        finally:
            self._queued -= 1
            self._waiters.pop(id(fut), None)
            if not fut.done():
                fut.cancel()

    def _wake_one(self, target: Target | None = None) -> None:
        """Wake as many waiting requests as ``target`` has room for (at least one): a
        limit that just grew has more than the one slot that was freed."""
        n = 1 if target is None else max(1, int(target.limiter.limit) - target.limiter.in_flight)
        while self._waiters and n > 0:
            _, fut = self._waiters.popitem(last=False)
            if not fut.done():
                fut.set_result(None)
                n -= 1

    def _wake_all(self) -> None:
        while self._waiters:
            _, fut = self._waiters.popitem(last=False)
            if not fut.done():
                fut.set_result(None)

    async def _sleep_retry(self, state: _RequestState, wait: float, model: str | None, reason: str) -> None:
        """A visible retry wait: shown in snapshots and announced on the bus."""
        now = self.clock.now()
        wait = max(0.0, min(wait, state.deadline - now))
        info = WaitingRetry(
            request_id=state.id, item_id=state.request.item_id, model=model, attempt=len(state.attempts) + 1,
            max_attempts=self.config.client.max_attempts, reason=reason, deadline=now + wait,
        )
        self._waiting[state.id] = info
        self._publish(
            ev.RetryScheduled, request_id=state.id, item_id=state.request.item_id, model=model,
            attempt=info.attempt, max_attempts=info.max_attempts, reason=reason, wait=wait, deadline=info.deadline,
        )
        try:
            await self.clock.sleep(wait)
        finally:
            self._waiting.pop(state.id, None)
            self._publish(ev.RetryFired, request_id=state.id)

    # ------------------------------------------------------------ one attempt

    def _body(self, state: _RequestState, t: Target, stream: bool) -> dict[str, Any]:
        extra = {k: v for k, v in state.request.extra.items() if k not in ("model", "messages", "n", "max_tokens", "stream")}
        body: dict[str, Any] = {
            **extra,
            "model": t.model.wire_name,
            "messages": list(state.request.messages),
            "max_tokens": min(state.request.max_tokens or t.model.max_tokens, t.model.max_tokens),
            "n": 1,
        }
        if state.request.temperature is not None:
            body["temperature"] = state.request.temperature
        if stream:
            body["stream"] = True
        return body

    def _headers(self, t: Target) -> dict[str, str]:
        return {**t.endpoint.headers, "Authorization": f"Bearer {t.key.secret.reveal()}"}

    async def _attempt(self, state: _RequestState, chosen: tuple[Target, Any], stream_sink: asyncio.Queue[str | None] | None) -> ChatResult | None:
        t, admission = chosen
        number = len(state.attempts) + 1
        if state.last_model is not None and state.last_model != t.model.name:
            self._publish(
                ev.FellBack, request_id=state.id, item_id=state.request.item_id, from_model=state.last_model,
                to_model=t.model.name, reason=state.last_failure.reason if state.last_failure else "",
            )
        state.last_model = t.model.name
        self._publish(ev.AttemptStarted, request_id=state.id, item_id=state.request.item_id, model=t.model.name, target=t.id, attempt=number)
        started_wall = self.clock.wall()
        t0 = self.clock.now()
        self._in_flight += 1
        response_json: dict[str, Any] | None = None
        content = ""
        status: int | None = None
        failure: Failure | None = None
        try:
            try:
                async with asyncio.timeout(self.config.client.attempt_timeout):
                    if stream_sink is None:
                        resp = await self._http.post(t.url, json=self._body(state, t, False), headers=self._headers(t))
                        status = resp.status_code
                        answer = parse_completion(status, resp.content)
                        if answer is None:
                            failure = classify_response(status, resp.headers, resp.content, now=self.clock.wall())
                        else:
                            response_json = answer  # type: ignore[assignment]
                            content = _content_of(answer)
                    else:
                        status, failure, response_json, content = await self._stream_attempt(state, t, stream_sink)
            except (asyncio.CancelledError, KeyboardInterrupt):
                t.breaker.release(admission)
                t.limiter.release("neutral")
                self._wake_one()
                raise
            except RequestFailed as e:
                # A stream that broke after text reached the caller: recorded, never retried.
                t.breaker.on_failure(admission, capacity=False, hint=None)
                t.limiter.release("neutral")
                self._wake_one()
                now = self.clock.now()
                t.stats.record(now, "other", now - t0)
                self._publish(ev.AttemptFailed, request_id=state.id, item_id=state.request.item_id, model=t.model.name,
                              target=t.id, attempt=number, kind=e.failure.kind.value, status=e.failure.status,
                              reason=e.failure.reason, hint=None)
                self._record(state, t, number, started_wall, e.failure.status, e.failure.kind, e.failure.reason, None,
                             0.0, now - t0, "fail")
                raise RequestFailed(e.failure, state.attempts, str(e)) from None
            except Exception as e:  # classified, never raised: timeouts, resets, broken bodies
                failure = classify_exception(e)
        finally:
            self._in_flight -= 1
        latency = self.clock.now() - t0
        now = self.clock.now()
        t.last_status = status
        t.last_kind = failure.kind.value if failure else None
        t.stats.record(now, _outcome(status, failure.kind if failure else None), latency)

        if failure is None:
            t.breaker.on_success(admission)
            t.limiter.release("ok")
            self._wake_one(t)
            self._record(state, t, number, started_wall, status, None, "", None, 0.0, latency, "ok")
            self.succeeded += 1
            usage = response_json.get("usage", {}) if isinstance(response_json, dict) else {}
            if t.tpm is not None and isinstance(usage, Mapping) and isinstance(usage.get("total_tokens"), int):
                t.tpm.refund(max(0, self._token_cost(state, t) - usage["total_tokens"]))
            total = now - state.started
            self._publish(ev.RequestDone, request_id=state.id, item_id=state.request.item_id, ok=True, model=t.model.name,
                          target=t.id, attempts=number, latency=total, kind=None)
            return ChatResult(model=t.model.name, endpoint=t.endpoint.name, target=t.id, content=content,
                              response=response_json or {}, attempts=tuple(state.attempts), latency=total, usage=usage or {})

        return await self._on_failure(state, t, admission, failure, number, started_wall, status, latency)

    async def _stream_attempt(self, state: _RequestState, t: Target, sink: asyncio.Queue[str | None]) -> tuple[int | None, Failure | None, dict[str, Any] | None, str]:
        pieces: list[str] = []
        async with self._http.stream("POST", t.url, json=self._body(state, t, True), headers=self._headers(t)) as resp:
            status = resp.status_code
            if status >= 300:
                body = await resp.aread()
                return status, classify_response(status, resp.headers, body, now=self.clock.wall()), None, ""
            done = False
            last: dict[str, Any] = {}
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                    delta = chunk["choices"][0].get("delta", {}).get("content") or ""
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    if pieces:
                        raise RequestFailed(Failure(Kind.TRANSIENT, "stream broke after text was sent", status)) from None
                    return status, Failure(Kind.TRANSIENT, "200 with a broken stream chunk", status), None, ""
                last = chunk
                if delta:
                    pieces.append(delta)
                    await sink.put(delta)
            if not done:
                if pieces:
                    raise RequestFailed(Failure(Kind.TRANSIENT, "stream ended before [DONE] after text was sent", status))
                return status, Failure(Kind.TRANSIENT, "stream ended before [DONE]", status), None, ""
            text = "".join(pieces)
            return status, None, {**last, "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}, text

    async def _on_failure(self, state: _RequestState, t: Target, admission: Any, failure: Failure, number: int,
                          started_wall: float, status: int | None, latency: float) -> None:
        now = self.clock.now()
        kind = failure.kind
        state.failures += 1
        state.last_failure = failure
        self._publish(ev.AttemptFailed, request_id=state.id, item_id=state.request.item_id, model=t.model.name, target=t.id,
                      attempt=number, kind=kind.value, status=status, reason=failure.reason, hint=failure.retry_after)
        hint = failure.retry_after
        if kind is Kind.CAPACITY:
            # Rejections of requests sent before the limiter last backed off are echoes
            # of a model that is full, not news of one that is down.
            news = t.limiter.release("overload")
            if news or getattr(admission, "probe", False):
                t.breaker.on_failure(admission, capacity=True, hint=hint)
            else:
                t.breaker.release(admission)
        elif kind is Kind.RATE_LIMITED:
            t.breaker.release(admission)
            t.limiter.release("overload")
        else:
            if kind is Kind.TRANSIENT and failure.code == CONNECT_FAILED:
                t.breaker.on_failure(admission, capacity=True, hint=None)  # unreachable counts as down
            elif kind is Kind.TRANSIENT:
                t.breaker.on_failure(admission, capacity=False, hint=None)
            else:
                t.breaker.release(admission)
            t.limiter.release("neutral")
        self._wake_one()

        out_of_attempts = number >= self.config.client.max_attempts

        def fail(decision: str, message: str | None = None) -> None:
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, decision)
            raise RequestFailed(failure, state.attempts, message)

        if kind in (Kind.BAD_REQUEST,):
            fail("fail")
        if kind is Kind.AUTH:
            self._disabled_keys[t.key_ref] = failure.reason
            self._publish(ev.KeyParked, target=t.id, key_alias=t.key.alias, kind="auth", until=None, reason=failure.reason)
            state.excluded.add(t.id)
            decision = "fallback" if self._any_usable(state, now) else "fail"
            if decision == "fail" or out_of_attempts:
                fail("fail", f"auth: {failure.reason} (key {t.key.alias} at {t.endpoint.name} is disabled)")
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, decision)
            return None
        if kind is Kind.QUOTA:
            park = hint if hint is not None and hint > 0 else _DEFAULT_QUOTA_PARK
            t.parked_until = now + park
            t.parked_reason = failure.reason
            self._publish(ev.KeyParked, target=t.id, key_alias=t.key.alias, kind="quota", until=t.parked_until, reason=failure.reason)
            state.excluded.add(t.id)
            if out_of_attempts or not self._any_usable(state, now):
                fail("fail", f"quota: {failure.reason} (key {t.key.alias} parked)")
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, "fallback")
            return None
        if kind is Kind.TOO_LARGE:
            state.min_window = max(state.min_window, t.model.context_window)
            state.excluded.add(t.id)
            if out_of_attempts or not self._any_usable(state, now):
                fail("fail", f"too_large: {failure.reason} (no model with a larger context window)")
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, "fallback")
            return None
        if out_of_attempts:
            fail("fail", f"{kind.value}: {failure.reason} (after {number} attempts)")

        if kind is Kind.TRANSIENT and failure.code == CONNECT_FAILED:
            # Nothing reached the server (down, restarting): like capacity, fall back at
            # once if another target admits, else wait; its breaker counts this, so later
            # requests queue until a probe finds it back. No budget: nobody was hammered.
            wait = self._backoff.wait(state.failures, Kind.TRANSIENT, hint)
            state.avoid[t.id] = now + wait
            if self._other_ready(state, t, now):
                self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, "fallback")
                return None
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, wait, latency, "retry")
            await self._sleep_retry(state, wait, None, failure.reason)
            return None

        if kind is Kind.TRANSIENT:
            # One broken answer from a live server: the same model again after a short
            # backoff, bounded by the retry budget so a failing server is not hammered.
            wait = self._backoff.wait(state.failures, Kind.TRANSIENT, hint)
            if not self._budget.try_spend():
                fail("fail", f"transient: {failure.reason} (retry budget spent)")
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, wait, latency, "retry")
            await self._sleep_retry(state, wait, t.model.name, failure.reason)
            return None

        if kind is Kind.RATE_LIMITED:
            wait = self._backoff.wait(state.failures, kind, hint)
            # This request comes back to the same model after the hint; every request avoids
            # the key until then when none of ours is in flight there (a key-level stop).
            if hint is not None and t.limiter.in_flight == 0:
                t.not_before = max(t.not_before, now + hint)
            state.avoid[t.id] = now + wait
            state.stick_to = t.model.name
            other_key = any(o.model.name == t.model.name and o.id != t.id and self._usable(state, o, now)
                            and self._ready_at(state, o, now) <= now for o in self.targets)
            if other_key:
                self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, "retry")
                return None
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, wait, latency, "retry")
            await self._sleep_retry(state, wait, t.model.name, failure.reason)
            return None

        # Capacity: fall back at once if another model admits, else wait with backoff.
        wait = self._backoff.wait(state.failures, kind, hint)
        state.avoid[t.id] = now + wait
        # A hint stops the whole target only when nothing else of ours is being served
        # there: otherwise the model is merely full, the limiter's decrease is the
        # target-wide answer, and idling its other slots for the hint would waste them.
        if hint is not None and t.limiter.in_flight == 0:
            t.not_before = max(t.not_before, now + hint)
        if self._other_ready(state, t, now):
            self._record(state, t, number, started_wall, status, kind, failure.reason, hint, 0.0, latency, "fallback")
            return None
        self._record(state, t, number, started_wall, status, kind, failure.reason, hint, wait, latency, "retry")
        await self._sleep_retry(state, wait, None, failure.reason)
        return None

    def _any_usable(self, state: _RequestState, now: float) -> bool:
        return any(self._usable(state, t, now) for t in self.targets)

    def _other_ready(self, state: _RequestState, failed: Target, now: float) -> bool:
        for o in self.targets:
            if o.id == failed.id or not self._usable(state, o, now):
                continue
            ready = self._ready_at(state, o, now)
            if ready <= now and o.breaker.would_admit():
                return True
        return False

    def _record(self, state: _RequestState, t: Target, number: int, started_wall: float, status: int | None,
                kind: Kind | None, reason: str, hint: float | None, wait: float, latency: float, decision: str) -> Attempt:
        attempt = Attempt(number=number, model=t.model.name, target=t.id, endpoint=t.endpoint.name, key_alias=t.key.alias,
                          started=started_wall, status=status, kind=kind, reason=reason, hint=hint, wait=wait,
                          latency=latency, decision=decision)
        state.attempts.append(attempt)
        for fn in list(self._observers):
            try:
                fn(state.request, attempt)
            except Exception:
                log.exception("attempt observer failed")
        return attempt

    def _publish(self, cls: type[ev.Event], **fields: Any) -> None:
        self.bus.publish(cls(at=self.clock.now(), wall=self.clock.wall(), **fields))

    # ------------------------------------------------------------ probes

    async def probe(self, target: str) -> ProbeResult:
        """Send a minimal request straight to one target, through its breaker: while the
        breaker is half-open this is the probe that decides whether it ramps up."""
        t = self._by_id[target]
        admission = t.breaker.admit()
        if admission is None:
            return ProbeResult(t.id, None, None, None, None, f"breaker {t.breaker.state.value}")
        body = {"model": t.model.wire_name, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1, "n": 1}
        t0 = self.clock.now()
        status: int | None = None
        try:
            async with asyncio.timeout(self.config.client.attempt_timeout):
                resp = await self._http.post(t.url, json=body, headers=self._headers(t))
            status = resp.status_code
            failure = classify_response(status, resp.headers, resp.content, now=self.clock.wall())
        except asyncio.CancelledError:
            t.breaker.release(admission)
            raise
        except Exception as e:
            failure = classify_exception(e)
        latency = self.clock.now() - t0
        t.probe_latency = latency
        t.last_status = status
        t.last_kind = failure.kind.value if failure else None
        if failure is None:
            t.breaker.on_success(admission)
            self._wake_all()
        elif failure.kind is Kind.CAPACITY:
            t.breaker.on_failure(admission, capacity=True, hint=failure.retry_after)
        elif failure.kind is Kind.TRANSIENT:
            t.breaker.on_failure(admission, capacity=False, hint=None)
        else:
            t.breaker.release(admission)
        return ProbeResult(t.id, failure is None, status, failure.kind.value if failure else None, latency,
                           failure.reason if failure else "ok")

    # ------------------------------------------------------------ snapshot

    def snapshot(self) -> EngineSnapshot:
        now = self.clock.now()
        rows = []
        for t in self.targets:
            b = t.breaker.view()
            lim = t.limiter.view()
            if t.key_ref in self._disabled_keys:
                key_state, key_until, key_reason = "disabled", None, self._disabled_keys[t.key_ref]
            elif t.parked_until is not None and t.parked_until > now:
                key_state, key_until, key_reason = "parked", t.parked_until, t.parked_reason
            else:
                key_state, key_until, key_reason = "ok", None, ""
            rows.append(TargetSnapshot(
                target=t.id, model=t.model.name, endpoint=t.endpoint.name, key_alias=t.key.alias, rank=t.rank,
                state=b.state.value, manual=b.manual, consecutive_failures=b.consecutive_failures,
                cooldown_until=b.cooldown_until, ramp_share=b.ramp_share, trips=b.trips, breaker_reason=b.reason,
                limit=lim.limit, in_flight=lim.in_flight, key_state=key_state, key_until=key_until, key_reason=key_reason,
                windows=t.stats.windows(now), spark=t.stats.spark(now), last_status=t.last_status, last_kind=t.last_kind,
                probe_latency=t.probe_latency,
            ))
        return EngineSnapshot(
            now=now, wall=self.clock.wall(), pinned=self._pinned, targets=tuple(rows),
            waiting=tuple(sorted(self._waiting.values(), key=lambda w: w.deadline)), queued=self._queued,
            in_flight=self._in_flight, requests=self.requests, succeeded=self.succeeded, failed=self.failed,
            events_published=self.bus.published,
        )


def _content_of(response: Any) -> str:
    try:
        content = response["choices"][0]["message"]["content"]
        return content if isinstance(content, str) else ""
    except (KeyError, IndexError, TypeError):
        return ""
