"""Frozen dataclass events and a small thread-safe bus.

Every routing decision publishes an event. Subscribers are called synchronously in
the publishing thread, so they must be cheap (a UI posts a message and returns);
a subscriber that raises is logged and kept, never allowed to break the client.
The bus keeps the most recent events in a ring so a late subscriber (the event log
of a dashboard that just opened) can catch up.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from capmon.core.types.capability import Feature
from capmon.core.types.failure import Kind
from capmon.core.types.result import Skip
from capmon.core.types.states import JobState, State

log = logging.getLogger("capmon.events")


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # clock.now() when it happened
    wall: float  # clock.wall() when it happened


@dataclass(frozen=True, slots=True)
class _OfAttempt(Event):
    """Which attempt of which request an event is about (not an event itself)."""

    request_id: int
    item_id: str | None
    model: str
    target: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptStarted(_OfAttempt):
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)


@dataclass(frozen=True, slots=True)
class AttemptFailed(_OfAttempt):
    kind: Kind
    status: int | None
    reason: str
    hint: float | None
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)


@dataclass(frozen=True, slots=True)
class TargetSkipped(Event):
    """A request passed a target over without sending to it (``skip`` says why, ``reason``
    the detail); the attempt records and the audit have it too."""

    request_id: int
    item_id: str | None
    model: str
    target: str
    skip: Skip
    reason: str
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)


@dataclass(frozen=True, slots=True)
class RetryScheduled(Event):
    request_id: int
    item_id: str | None
    model: str | None  # None: waiting for whichever model admits first
    attempt: int  # the attempt that will run next
    max_attempts: int
    reason: str
    wait: float
    deadline: float  # clock.now() at which the retry fires
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)


@dataclass(frozen=True, slots=True)
class RetryFired(Event):
    request_id: int


@dataclass(frozen=True, slots=True)
class FellBack(Event):
    request_id: int
    item_id: str | None
    from_model: str
    to_model: str
    reason: str
    # The provider API (EndpointApi's value) of the target each side was sent to: a change
    # of provider is what a person watching wants to see. "" from a source older than these.
    from_api: str = ""
    to_api: str = ""
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)

    @property
    def crosses_providers(self) -> bool:
        return bool(self.from_api and self.to_api and self.from_api != self.to_api)


@dataclass(frozen=True, slots=True)
class DeploymentMoved(Event):
    """A request left one deployment of a model for another of the same model (its endpoint
    failed it, or could not take it): the model serving it is the same, so no fallback."""

    request_id: int
    item_id: str | None
    model: str
    from_endpoint: str
    to_endpoint: str
    # The id each endpoint knows the model by (its deployment's ``model``)
    from_deployment: str
    to_deployment: str
    reason: str
    target: str = ""  # the target it moved to
    caller_request_id: str | None = None


@dataclass(frozen=True, slots=True)
class BreakerChanged(Event):
    target: str
    model: str
    old: State
    new: State
    reason: str
    manual: bool
    cooldown_until: float | None


@dataclass(frozen=True, slots=True)
class RampStep(Event):
    """A recovering breaker's ramp grew: clean answers (a slot's worth each) doubled its share
    since the last RampStep."""

    target: str
    model: str
    share: float
    reason: str


@dataclass(frozen=True, slots=True)
class ProbeFinished(Event):
    """The client's own probe of a target came back (``ok`` None: it could not be sent)."""

    target: str
    model: str
    ok: bool | None
    status: int | None
    kind: Kind | None
    latency: float | None
    reason: str
    next_probe_at: float | None  # while the breaker stays open
    breaker: bool = True  # the probe of an open breaker; False: a health check of a closed one


@dataclass(frozen=True, slots=True)
class TokenParamLearned(Event):
    """A model's deployment refused the token parameter it was sent; the client now sends
    the other there (its other deployments keep theirs)."""

    model: str
    param: str
    reason: str
    endpoint: str = ""  # the deployment's endpoint ("" from a source older than it)


@dataclass(frozen=True, slots=True)
class CapabilityLearned(Event):
    """A deployment's provider said its model does not support a feature a request used:
    requests that need it skip that deployment for the rest of the process."""

    model: str
    endpoint: str
    feature: Feature
    reason: str


@dataclass(frozen=True, slots=True)
class KeyParked(Event):
    target: str
    model: str
    key_alias: str
    kind: Kind  # Kind.QUOTA (parked) or Kind.AUTH (disabled)
    until: float | None  # None: disabled until reset by hand
    reason: str


@dataclass(frozen=True, slots=True)
class ModelPinned(Event):
    model: str | None  # None: back to automatic


@dataclass(frozen=True, slots=True)
class RequestDone(Event):
    request_id: int
    item_id: str | None
    ok: bool
    model: str | None
    target: str | None
    attempts: int
    latency: float
    kind: Kind | None  # failure kind when not ok
    caller_request_id: str | None = None  # the caller's id (Request.request_id: the gateway's x-request-id)


@dataclass(frozen=True, slots=True)
class BatchProgress(Event):
    """A batch job's counters and its :class:`JobState` (halted or stopped: ``message``
    says why). ``done`` and ``failed`` count committed results only; ``in_flight`` counts
    items sent whose result is not committed yet.
    """

    job: str
    total: int | None
    done: int
    failed: int
    parked: int
    pending: int
    in_flight: int
    per_model: tuple[tuple[str, int], ...]
    rate: float  # items per second, recent
    eta: float | None  # seconds
    state: JobState
    opens_at: float | None = None  # wall time the --window opens, while state is WAITING_WINDOW
    message: str = ""  # why a job halted or stopped
    workers: tuple[tuple[str, int], ...] = ()  # a shared job's workers (host:pid) and the items each did


@dataclass(frozen=True, slots=True)
class BatchItemDone(Event):
    job: str
    item_id: str
    ok: bool
    model: str | None
    kind: str | None


@dataclass(frozen=True, slots=True)
class Notice(Event):
    """A free-form message for people: a manual action, a worker that stopped."""

    level: str  # info | warning | error
    message: str


E = TypeVar("E", bound=Event)
Subscriber = Callable[[Event], None]


class EventBus:
    def __init__(self, history: int = 500) -> None:
        self._lock = threading.Lock()
        self._subscribers: tuple[Subscriber, ...] = ()
        self._recent: collections.deque[Event] = collections.deque(maxlen=history)
        self.published = 0
        self.delivered = 0
        self.subscriber_errors = 0

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn`` for every event from now on; returns a function that unsubscribes."""
        with self._lock:
            self._subscribers = self._subscribers + (fn,)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not fn)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            self._recent.append(event)
            self.published += 1
            subscribers = self._subscribers
        for fn in subscribers:
            try:
                fn(event)
                self.delivered += 1
            except Exception:  # a broken subscriber must never break the client
                self.subscriber_errors += 1
                log.exception("event subscriber %r failed on %s", fn, type(event).__name__)

    def recent(self, n: int | None = None, types: Iterable[type[Event]] | None = None) -> list[Event]:
        with self._lock:
            items = list(self._recent)
        if types is not None:
            wanted = tuple(types)
            items = [e for e in items if isinstance(e, wanted)]
        return items if n is None else items[-n:]
