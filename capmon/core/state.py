"""The state seam: everything the client knows and changes about its targets.

Per target: the breaker (with its manual states), the key's state (disabled by an
auth failure, parked by a quota), the rpm / tpm buckets, the adaptive limiter and a
server's "not before". For the whole client: the pin and the retry budget. Routing
(capmon/core/router.py) reads and changes them only through two calls per attempt:

* ``await target.admit(cost)``: one decision over breaker, key, limiter and buckets,
  returning an :class:`Admission` or None;
* ``await target.settle(admission, failure)``: one update of all of them from the
  attempt's outcome, through the policy table (capmon/core/policy.py).

:class:`MemoryState` keeps it all in this process. A shared implementation (several
processes acting as one client) provides the same interface; ARCHITECTURE.md, "The
state seam", says what each call must guarantee.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from capmon.core.breaker import BreakerView, CircuitBreaker, State
from capmon.core.clock import Clock
from capmon.core.config import Config, ModelConfig
from capmon.core.errors import Failure
from capmon.core.events import Event, KeyParked, ModelPinned
from capmon.core.limiter import AdaptiveLimiter, Budget, LimiterView, Slot, TokenBucket
from capmon.core.policy import CANCELLED, BreakerSignal, KeyAction, LimiterSignal, policy_for

if TYPE_CHECKING:
    from capmon.core.snapshot import SharedStatus

# A quota failure without a hint parks its key this long: quotas reset by the hour or
# the day, and hammering a spent key only adds noise.
DEFAULT_QUOTA_PARK = 3600.0

KeyRef = tuple[str, str]  # (endpoint name, key alias)


class KeyState(enum.StrEnum):
    OK = "ok"
    PARKED = "parked"  # quota: until a time
    DISABLED = "disabled"  # auth: until reset by hand


@dataclass(eq=False, slots=True)
class Admission:
    """The right to make one attempt on one target. Settle it exactly once; a second
    settle is ignored."""

    target: str
    generation: int  # the breaker's generation when admitted: later outcomes of an older one are stale
    probe: bool  # the client's own probe of an open breaker
    slot: Slot
    cost: int  # tokens charged to the tpm bucket
    at: float
    settled: bool = False
    lease: str | None = None  # a shared store's lease on a fleet-wide slot; None: granted by local state alone


@dataclass(frozen=True, slots=True)
class TargetView:
    breaker: BreakerView
    limiter: LimiterView
    ramp_slots: int | None  # while RAMP: how many requests the ramp admits at once
    key_state: KeyState
    key_until: float | None
    key_reason: str
    not_before: float


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What the state needs to know about a target (capmon/core/targets.py has the rest)."""

    id: str
    model: ModelConfig
    key_ref: KeyRef
    key_alias: str


class TargetState(Protocol):
    """One target's state, behind the seam."""

    id: str

    def ready_at(self, now: float, cost: int) -> float | None: ...
    def probe_due_at(self) -> float | None: ...
    def usable(self) -> bool: ...
    async def admit(self, cost: int) -> Admission | None: ...
    async def begin_probe(self, *, early: bool = False) -> Admission | None: ...
    async def settle(
        self,
        adm: Admission,
        failure: Failure | None,
        *,
        used_tokens: int | None = None,
        cancelled: bool = False,
        unused: bool = False,
    ) -> bool: ...
    def holds(self, adm: Admission) -> bool: ...
    def trip(self, reason: str) -> None: ...
    def force_close(self, reason: str) -> None: ...
    def reset(self, reason: str) -> None: ...
    def view(self) -> TargetView: ...


class StateStore(Protocol):
    """The client-wide state: its targets, the pin and the retry budget."""

    async def start(self) -> None: ...  # connect a shared store; the client calls it once before use
    def shared_status(self) -> SharedStatus: ...
    @property
    def pinned(self) -> str | None: ...
    def pin(self, model: str | None) -> None: ...
    def target(self, target_id: str) -> TargetState: ...
    def spend_retry(self) -> bool: ...
    def on_request(self) -> None: ...
    def set_listener(self, fn: Callable[[], None]) -> None: ...
    async def aclose(self) -> None: ...


class KeyBook:
    """Key state, in one place: auth disables a key for every model it serves; a quota
    parks one model on one key."""

    def __init__(self) -> None:
        self.disabled: dict[KeyRef, str] = {}
        self.parked: dict[str, tuple[float, str]] = {}  # target id -> (until, reason)

    def state(self, key_ref: KeyRef, target: str, now: float) -> tuple[KeyState, float | None, str]:
        reason = self.disabled.get(key_ref)
        if reason is not None:
            return KeyState.DISABLED, None, reason
        parked = self.parked.get(target)
        if parked is not None:
            if parked[0] > now:
                return KeyState.PARKED, parked[0], parked[1]
            del self.parked[target]
        return KeyState.OK, None, ""

    def clear(self, key_ref: KeyRef, target: str) -> None:
        self.disabled.pop(key_ref, None)
        self.parked.pop(target, None)


class MemoryTarget:
    def __init__(
        self, spec: TargetSpec, config: Config, clock: Clock, keys: KeyBook, publish: Callable[[Event], None]
    ) -> None:
        self.id = spec.id
        self.spec = spec
        self._clock = clock
        self._keys = keys
        self._publish = publish
        model = spec.model
        self.breaker = CircuitBreaker(spec.id, model.name, config.breaker, clock, publish)
        self.limiter = AdaptiveLimiter(config.limiter, max_limit=model.max_concurrency or None)
        self.rpm = TokenBucket(model.rpm, clock) if model.rpm else None
        self.tpm = TokenBucket(model.tpm, clock) if model.tpm else None
        self.not_before = 0.0
        self._max_hint = config.breaker.cooldown_max  # a server hint holds a target off no longer

    # ------------------------------------------------------------ reading

    def _ramp_slots(self) -> int | None:
        share = self.breaker.share()
        if share >= 1.0 or share <= 0.0:
            return None
        return max(1, math.ceil(share * max(1.0, self.limiter.limit)))

    def usable(self) -> bool:
        """False while the key is disabled: only a person can bring it back."""
        return self.spec.key_ref not in self._keys.disabled

    def ready_at(self, now: float, cost: int) -> float | None:
        """When the time-driven gates (hint, quota park, buckets) open: ``now`` or
        earlier when they are open. None when only an event can open the target (an
        open breaker waits for its probe, a disabled key for a person). A free slot is
        not a matter of time: a release wakes the waiters."""
        key, until, _ = self._keys.state(self.spec.key_ref, self.id, now)
        if key is KeyState.DISABLED or not self.breaker.state.admits:
            return None
        t = self.not_before
        if until is not None:
            t = max(t, until)
        if self.rpm is not None:
            t = max(t, self.rpm.available_at(1))
        if self.tpm is not None:
            t = max(t, self.tpm.available_at(cost))
        return t

    def probe_due_at(self) -> float | None:
        return self.breaker.probe_due_at()

    def view(self) -> TargetView:
        now = self._clock.now()
        key, until, reason = self._keys.state(self.spec.key_ref, self.id, now)
        return TargetView(
            self.breaker.view(), self.limiter.view(), self._ramp_slots(), key, until, reason, self.not_before
        )

    # ------------------------------------------------------------ attempts

    async def admit(self, cost: int) -> Admission | None:
        now = self._clock.now()
        if now < self.not_before:
            return None
        share = self.breaker.share()
        if share <= 0.0:
            return None
        if self._keys.state(self.spec.key_ref, self.id, now)[0] is not KeyState.OK:
            return None
        cap = None if share >= 1.0 else max(1, math.ceil(share * max(1.0, self.limiter.limit)))
        if self.limiter.room(cap) <= 0:
            return None
        if self.rpm is not None and self.rpm.available_at(1) > now:
            return None
        if self.tpm is not None and self.tpm.available_at(cost) > now:
            return None
        if self.rpm is not None:
            self.rpm.try_take(1)
        if self.tpm is not None:
            self.tpm.try_take(cost)
        return Admission(self.id, self.breaker.generation, False, self.limiter.take(), cost, now)

    async def begin_probe(self, *, early: bool = False) -> Admission | None:
        """The one probe of an open breaker, when it is due (``early``: due by the demand
        for the model, capmon/core/demand.py, before the breaker's own schedule)."""
        now = self._clock.now()
        if self._keys.state(self.spec.key_ref, self.id, now)[0] is not KeyState.OK:
            return None
        generation = self.breaker.begin_probe(early=early)
        if generation is None:
            return None
        return Admission(self.id, generation, True, self.limiter.take(), 0, now)

    def holds(self, adm: Admission) -> bool:
        """Whether an admission handed over a moment ago still stands: nothing (a trip by
        hand, a probe's verdict) moved the breaker since, and it still admits."""
        return adm.generation == self.breaker.generation and self.breaker.share() > 0.0

    async def settle(
        self,
        adm: Admission,
        failure: Failure | None,
        *,
        used_tokens: int | None = None,
        cancelled: bool = False,
        unused: bool = False,
    ) -> bool:
        """Apply one attempt's outcome to breaker, limiter, key and buckets. Returns
        whether a capacity failure was news (see AdaptiveLimiter.release). ``unused``:
        the admission was given back before anything was sent, so its bucket charge is
        refunded too."""
        if adm.settled:
            return False
        adm.settled = True
        now = self._clock.now()
        pol = CANCELLED if cancelled else policy_for(failure)
        hint = failure.retry_after if failure is not None else None
        b, lim = self.breaker, self.limiter
        before = b.state
        if adm.probe:
            lim.release(adm.slot, LimiterSignal.NEUTRAL)  # a probe says nothing about concurrency
            news = False
        else:
            starts_streak = pol.breaker is BreakerSignal.DOWN or (
                pol.limiter is LimiterSignal.OVERLOAD and lim.is_news(adm.slot)
            )
            if starts_streak and before.admits and b.consecutive == 0:
                lim.checkpoint()  # a failure streak may begin: remember what it may undo
            news = lim.release(adm.slot, pol.limiter)
        b.record(adm.generation, pol.breaker, sent_at=adm.at, hint=hint, news=news, probe=adm.probe, basis=lim.limit)
        if b.state is State.OPEN and before in (State.CLOSED, State.RAMP):
            lim.restore()  # an outage, not a full model: keep the capacity learned before it
        if pol.key is KeyAction.DISABLE and failure is not None:
            self._keys.disabled[self.spec.key_ref] = failure.reason
            self._emit_key("auth", None, failure.reason)
        elif pol.key is KeyAction.PARK and failure is not None:
            until = now + (hint if hint is not None and hint > 0 else DEFAULT_QUOTA_PARK)
            self._keys.parked[self.id] = (until, failure.reason)
            self._emit_key("quota", until, failure.reason)
        if pol.hint_blocks and hint is not None and lim.in_flight == 0 and not adm.probe:
            # A hint stops the whole target only when nothing else of ours is being served
            # there: otherwise the model is merely full and the limiter's cut is the answer.
            self.not_before = max(self.not_before, now + min(hint, self._max_hint))
        if failure is None and self.tpm is not None and used_tokens is not None:
            self.tpm.refund(max(0, adm.cost - used_tokens))
        if unused and not adm.probe:
            if self.rpm is not None:
                self.rpm.refund(1)
            if self.tpm is not None:
                self.tpm.refund(adm.cost)
        if pol.breaker is BreakerSignal.DOWN:
            news = True
        return news

    def _emit_key(self, kind: str, until: float | None, reason: str) -> None:
        self._publish(
            KeyParked(
                at=self._clock.now(),
                wall=self._clock.wall(),
                target=self.id,
                model=self.spec.model.name,
                key_alias=self.spec.key_alias,
                kind=kind,
                until=until,
                reason=reason,
            )
        )

    # ------------------------------------------------------------ by hand

    def trip(self, reason: str) -> None:
        self.breaker.trip(reason)

    def force_close(self, reason: str) -> None:
        self.breaker.force_close(reason)

    def reset(self, reason: str) -> None:
        """Close the breaker and clear a parked or disabled key and a server's hint."""
        self.breaker.reset(reason)
        self._keys.clear(self.spec.key_ref, self.id)
        self.not_before = 0.0


class MemoryState:
    """All of a client's state, in this process (the default)."""

    def __init__(
        self, config: Config, specs: Iterable[TargetSpec], clock: Clock, publish: Callable[[Event], None]
    ) -> None:
        self._clock = clock
        self._publish = publish
        self.keys = KeyBook()
        self._budget = Budget(config.client.retry_budget)
        self._pinned: str | None = None
        self._targets = {s.id: MemoryTarget(s, config, clock, self.keys, publish) for s in specs}
        self._listener: Callable[[], None] | None = None

    @property
    def pinned(self) -> str | None:
        return self._pinned

    def pin(self, model: str | None) -> None:
        self._pinned = model
        self._publish(ModelPinned(at=self._clock.now(), wall=self._clock.wall(), model=model))

    def target(self, target_id: str) -> MemoryTarget:
        return self._targets[target_id]

    @property
    def budget(self) -> Budget:
        return self._budget

    def spend_retry(self) -> bool:
        return self._budget.try_spend()

    def on_request(self) -> None:
        self._budget.on_request()

    def set_listener(self, fn: Callable[[], None]) -> None:
        """``fn()`` is called when something outside the router's own calls may let a
        waiting request in (a shared store hears of another process's reset)."""
        self._listener = fn

    async def start(self) -> None:
        return None

    def shared_status(self) -> SharedStatus:
        from capmon.core.snapshot import SharedStatus

        return SharedStatus()

    async def aclose(self) -> None:
        return None
