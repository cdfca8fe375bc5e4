"""What the client tells the world about its requests: events on the bus, the attempt
records observers (the audit log) receive, the request counters and the retry waits a
snapshot shows. Routing decides; the journal only tells what was decided: it reads a
request's route (capmon/core/routing/route.py) and writes nothing into it (the router puts the
attempts it makes here on the route's record)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from capmon.core.base.clock import Clock
from capmon.core.base.secrets import redact
from capmon.core.routing.route import Routing
from capmon.core.routing.targets import Target
from capmon.core.types import events as ev
from capmon.core.types.failure import Failure
from capmon.core.types.prices import Tokens
from capmon.core.types.result import Attempt, Decision, Request, Skip, sent
from capmon.core.types.snapshot import ModelSpend, WaitingRetry

log = logging.getLogger("capmon.client")

AttemptObserver = Callable[[Request, Attempt], None]


def _last_sent_api(r: Routing) -> str:
    """The API of the endpoint the request's last attempt went to ("" before any)."""
    for a in reversed(r.attempts):
        if a.decision is not Decision.SKIP:
            return a.api.value
    return ""


def _passed(r: Routing, model: str) -> str:
    """Why the request left ``model`` without a failure: its skip record, if it has one."""
    for a in reversed(r.attempts):
        if a.decision is Decision.SKIP and a.model == model:
            return f"{model} skipped: {a.reason}"
    return f"{model} is not usable now"


class Journal:
    def __init__(self, clock: Clock, bus: ev.EventBus, max_attempts: int) -> None:
        self._clock = clock
        self.bus = bus
        self._max_attempts = max_attempts
        self._observers: list[AttemptObserver] = []
        self.waiting: dict[int, WaitingRetry] = {}
        # Every request ends as exactly one of succeeded, failed (RequestFailed) or cancelled
        # (anything else: the caller went away); the rest are still in progress.
        self.in_flight = self.requests = self.succeeded = self.failed = self.cancelled = 0
        self._spend: dict[str, ModelSpend] = {}  # per model: what its answers cost so far

    def publish(self, cls: type[ev.Event], at: float | None = None, wall: float | None = None, **fields: Any) -> None:
        """``at`` and ``wall``: the clock's readings the caller has just taken, else read here."""
        clock = self._clock
        self.bus.publish(
            cls(at=clock.now() if at is None else at, wall=clock.wall() if wall is None else wall, **fields)
        )

    def add_observer(self, fn: AttemptObserver) -> Callable[[], None]:
        self._observers.append(fn)
        return lambda: self._observers.remove(fn)

    def started(self, r: Routing, t: Target, number: int, at: float | None = None, wall: float | None = None) -> None:
        prev = r.last_target
        if r.last_model == t.model.name and prev is not None and prev.model.name == t.model.name:
            if prev.endpoint.name != t.endpoint.name:  # another key at the same endpoint is no move
                self._moved(r, prev, t, at, wall)
        elif r.last_model is not None and r.last_model != t.model.name:
            self.publish(
                ev.FellBack,
                at,
                wall,
                request_id=r.id,
                item_id=r.request.item_id,
                from_model=r.last_model,
                to_model=t.model.name,
                reason=r.last_failure.reason if r.last_failure else _passed(r, r.last_model),
                from_api=_last_sent_api(r),
                to_api=t.endpoint.api.value,
                caller_request_id=r.request.request_id,
            )
        self.publish(
            ev.AttemptStarted,
            at,
            wall,
            request_id=r.id,
            item_id=r.request.item_id,
            model=t.model.name,
            target=t.id,
            attempt=number,
            caller_request_id=r.request.request_id,
        )

    def _moved(self, r: Routing, prev: Target, t: Target, at: float | None, wall: float | None) -> None:
        """``r`` goes from ``prev``'s deployment of its model to ``t``'s: why it left (the
        failure of its attempt there, or what kept it from trying there), not a fallback."""
        if r.sent and r.last_failure is not None:
            reason = r.last_failure.reason
        else:
            reason = f"{prev.endpoint.name}: {r.skip_reason(prev, self._clock.now() if at is None else at)[1]}"
        self.publish(
            ev.DeploymentMoved,
            at,
            wall,
            request_id=r.id,
            item_id=r.request.item_id,
            model=t.model.name,
            from_endpoint=prev.endpoint.name,
            to_endpoint=t.endpoint.name,
            from_deployment=prev.deployment,
            to_deployment=t.deployment,
            reason=redact(reason),
            target=t.id,
            caller_request_id=r.request.request_id,
        )

    def failed_attempt(self, r: Routing, t: Target, number: int, status: int | None, failure: Failure) -> None:
        self.publish(
            ev.AttemptFailed,
            request_id=r.id,
            item_id=r.request.item_id,
            model=t.model.name,
            target=t.id,
            attempt=number,
            kind=failure.kind.value,
            status=status,
            reason=failure.reason,
            hint=failure.retry_after,
            caller_request_id=r.request.request_id,
        )

    def done(self, r: Routing, t: Target | None, ok: bool, kind: str | None = None, now: float | None = None) -> None:
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        if now is None:
            now = self._clock.now()
        self.publish(
            ev.RequestDone,
            now,
            request_id=r.id,
            item_id=r.request.item_id,
            ok=ok,
            model=t.model.name if t else None,
            target=t.id if t else None,
            attempts=len(sent(r.attempts)),
            latency=now - r.started,
            kind=kind,
            caller_request_id=r.request.request_id,
        )

    def attempt(
        self,
        r: Routing,
        t: Target,
        number: int,
        wall: float,
        status: int | None,
        failure: Failure | None,
        wait: float,
        latency: float,
        decision: Decision,
        dropped: tuple[str, ...] = (),
        *,
        tokens: Tokens | None = None,
        cost: float | None = None,
        continues: int | None = None,
    ) -> Attempt:
        """One attempt's record (the router puts it on the route, then :meth:`observe`):
        ``tokens`` and ``cost``, an answer's; ``continues``, the offset a continuation went on from."""
        attempt = Attempt(
            number=number,
            model=t.model.name,
            target=t.id,
            endpoint=t.endpoint.name,
            deployment=t.deployment,
            key_alias=t.key.alias,
            started=wall,
            status=status,
            kind=failure.kind if failure else None,
            reason=failure.reason if failure else "",
            hint=failure.retry_after if failure else None,
            wait=wait,
            latency=latency,
            decision=decision,
            api=t.endpoint.api,
            dropped=dropped,
            continues=continues,
            tokens=tokens,
            cost=cost,
        )
        if log.isEnabledFor(logging.DEBUG):  # the arguments alone cost a request more than the check
            log.debug(
                "request %d attempt %d on %s: %s %s -> %s",
                r.id,
                number,
                t.id,
                status,
                failure.kind.value if failure else "ok",
                decision.value,
            )
        return attempt

    def skipped(self, r: Routing, t: Target, skip: Skip, reason: str, wall: float | None = None) -> Attempt:
        """The record of a target the request passed over, never sent (``skip``: why;
        ``reason``: the detail), and its event."""
        wall = self._clock.wall() if wall is None else wall
        reason = redact(reason)  # a breaker's reason may quote a provider's words
        attempt = Attempt(
            number=0,
            model=t.model.name,
            target=t.id,
            endpoint=t.endpoint.name,
            deployment=t.deployment,
            key_alias=t.key.alias,
            started=wall,
            status=None,
            kind=None,
            reason=f"{skip.value}: {reason}",
            hint=None,
            wait=0.0,
            latency=0.0,
            decision=Decision.SKIP,
            api=t.endpoint.api,
            skip=skip,
        )
        self.publish(
            ev.TargetSkipped,
            wall=wall,
            request_id=r.id,
            item_id=r.request.item_id,
            model=t.model.name,
            target=t.id,
            skip=skip,
            reason=reason,
            caller_request_id=r.request.request_id,
        )
        log.debug("request %d skips %s: %s", r.id, t.id, attempt.reason)
        return attempt

    def observe(self, request: Request, attempt: Attempt) -> None:
        """Tell every observer (the audit log) of an attempt on the record."""
        if attempt.tokens is not None:  # an answer that told its usage
            was = self._spend.get(attempt.model) or ModelSpend(attempt.model, 0.0, 0, 0)
            self._spend[attempt.model] = ModelSpend(
                attempt.model,
                was.cost + (attempt.cost or 0.0),
                was.answers + 1,
                was.unpriced + (attempt.cost is None),
            )
        for fn in list(self._observers):
            try:
                fn(request, attempt)
            except Exception:
                log.exception("attempt observer failed")

    def spend(self) -> tuple[ModelSpend, ...]:
        return tuple(self._spend.values())

    def show_wait(self, r: Routing, wait: float, reason: str) -> None:
        """A visible retry wait: shown in snapshots and announced on the bus."""
        info = WaitingRetry(
            request_id=r.id,
            item_id=r.request.item_id,
            model=r.stick_to,
            attempt=r.sent + 1,
            max_attempts=self._max_attempts,
            reason=reason,
            deadline=self._clock.now() + wait,
        )
        self.waiting[r.id] = info
        self.publish(
            ev.RetryScheduled,
            request_id=r.id,
            item_id=r.request.item_id,
            model=r.stick_to,
            attempt=info.attempt,
            max_attempts=info.max_attempts,
            reason=reason,
            wait=wait,
            deadline=info.deadline,
            caller_request_id=r.request.request_id,
        )

    def unwait(self, r: Routing) -> None:
        if self.waiting.pop(r.id, None) is not None:
            self.publish(ev.RetryFired, request_id=r.id)

    def waits(self) -> tuple[WaitingRetry, ...]:
        return tuple(sorted(self.waiting.values(), key=lambda w: w.deadline))
