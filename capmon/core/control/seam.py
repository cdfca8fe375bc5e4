"""The state seam: everything the client knows and changes about its targets.

Per target: the breaker (with its manual states), the key's state (disabled by an
auth failure, parked by a quota), the rpm / tpm buckets, the adaptive limiter and a
server's "not before". For the whole client: the pin and the retry budget. Routing
(capmon/core/routing/client.py) reads and changes them only through two calls per attempt:

* ``await target.admit(cost)``: one decision over breaker, key, limiter and buckets,
  returning an :class:`Admission` or None;
* ``await target.settle(admission, failure)``: one update of all of them from the
  attempt's outcome, through the policy table (capmon/core/control/policy.py).

What each call decides is capmon/core/control/decisions.py (pure functions): this module
applies those decisions to objects in this process, and the fleet's store applies the
very same ones to Redis.

:class:`MemoryState` keeps it all in this process. A shared implementation (several
processes acting as one client) provides the same interface; ARCHITECTURE.md, "The
state seam", says what each call must guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from capmon.core.base.clock import Clock
from capmon.core.control import decisions
from capmon.core.control.breaker import BreakerView, CircuitBreaker, State
from capmon.core.control.decisions import KeyMove, Outcome
from capmon.core.control.decisions import KeyState as KeyState  # re-exported: the seam's views carry it
from capmon.core.control.limiter import AdaptiveLimiter, Budget, LimiterView, Slot, TokenBucket
from capmon.core.control.survival import RefusalTimes
from capmon.core.types.capability import Feature, Lessons
from capmon.core.types.config import Config, ModelConfig
from capmon.core.types.events import Event, KeyParked, ModelPinned
from capmon.core.types.failure import Failure, Kind

if TYPE_CHECKING:
    from capmon.core.types.snapshot import SharedStatus

KeyRef = tuple[str, str]  # (endpoint name, key alias)


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
    # Sent above the learned capacity: the limiter asking for more room (capmon/core/control/limiter.py).
    # A refusal is its own lesson, not the model telling this request to wait for it.
    ask: bool = False
    # Counted by a ramp (CircuitBreaker.ramp_admitted): still out past the target's survival
    # time, it may grow the ramp (TargetState.survived).
    ramp: bool = False
    survived: bool = False


@dataclass(frozen=True, slots=True)
class TargetView:
    breaker: BreakerView
    limiter: LimiterView
    ramp_slots: int | None  # while RAMP: how many requests the ramp admits at once
    key_state: KeyState
    key_until: float | None
    key_reason: str
    not_before: float


class Standing(NamedTuple):
    """A view's key and breaker fields, what ``targets.held`` decides from, read without
    building the whole view (a request asks before it waits: ``Routing.cannot_wait``)."""

    key_state: KeyState
    key_until: float | None
    key_reason: str
    breaker: State
    breaker_reason: str


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """What the state needs to know about a target (capmon/core/routing/targets.py has the rest)."""

    id: str
    model: ModelConfig
    key_ref: KeyRef
    key_alias: str


class TargetState(Protocol):
    """One target's state, behind the seam."""

    id: str

    def ready_at(self, now: float, cost: int) -> float | None: ...
    def room(self, now: float, cost: int) -> float:
        """The share of its room still free for a request of ``cost`` tokens, 0 to 1
        (decisions.room_left): what one model's deployments are chosen by. A reading, not a
        promise: ``admit`` decides."""

    def probe_due_at(self) -> float | None: ...
    def usable(self) -> bool: ...
    def press(self) -> None:
        """Work that wanted this target was turned away (it went to another or waits):
        what lets the limiter grow (capmon/core/control/limiter.py)."""

    async def admit(self, cost: int) -> Admission | None: ...
    def survival_after(self) -> float | None:
        """Seconds after which an attempt a ramp admitted that is still out counts as admitted
        by the model (capmon/core/control/survival.py); None: not known, or off."""

    def survived(self, adm: Admission) -> bool:
        """``adm``, admitted by a ramp or the probe of an open breaker, is still out past
        :meth:`survival_after`: the ramp may grow on it (CircuitBreaker.survived), or start
        (CircuitBreaker.probe_survived). Returns whether it did. Once per admission."""

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
    def standing(self, now: float) -> Standing: ...  # ``now``: the clock's reading just taken


class StateStore(Protocol):
    """The client-wide state: its targets, the pin, the retry budget and what providers
    taught about the features each deployment lacks."""

    async def start(self) -> None: ...  # connect a shared store; the client calls it once before use
    def shared_status(self) -> SharedStatus: ...
    @property
    def pinned(self) -> str | None: ...
    def pin(self, model: str | None) -> None: ...
    @property
    def lessons(self) -> Lessons: ...
    def learn(self, deployment: str, feature: Feature, why: str) -> bool: ...  # False: known already
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
        self._pressed_at = -math.inf  # when work that wanted this target last went elsewhere or waited
        self.refusals = RefusalTimes(config.breaker.ramp_survival)

    # ------------------------------------------------------------ reading

    def _ramp_slots(self, now: float | None = None) -> int | None:
        return decisions.ramp_slots(self.breaker.share(now), self.limiter.limit)

    def gates(self, now: float) -> decisions.Gates:
        """What this target's gates say now (the mirror's, for a shared store); ``now``:
        the clock's reading just taken."""
        key, until, _ = self._keys.state(self.spec.key_ref, self.id, now)
        return decisions.Gates(now, self.breaker.share(now), key, until, self.not_before)

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

    def room(self, now: float, cost: int, pending: int = 0) -> float:
        """``pending``: admissions asked for and not answered yet (a shared store's round
        trip), counted as in flight."""
        if decisions.gate(self.gates(now)) is not None:
            return 0.0
        lim = self.limiter
        buckets = []
        if self.rpm is not None:
            buckets.append((self.rpm.available - 1, self.rpm.capacity))
        if self.tpm is not None:
            buckets.append((self.tpm.available - cost, self.tpm.capacity))
        slots = decisions.slots(self.breaker.share(now), lim.limit)
        return decisions.room_left(slots, lim.in_flight + pending, buckets)

    def probe_due_at(self) -> float | None:
        return self.breaker.probe_due_at()

    def press(self, full: bool = False) -> None:
        """Work that wanted this target was turned away. It presses the limiter only when
        the limit is what turned it away (all of it in use; ``full``: a shared store's
        fleet-wide count says so), not a ramp's share, a bucket or a hint."""
        lim = self.limiter
        if full or lim.in_flight >= int(lim.limit + 1e-9):
            self._pressed_at = self._clock.now()

    def pressed_since(self, at: float) -> bool:
        """Whether work that wanted this target was turned away at ``at`` or later."""
        return self._pressed_at >= at

    def view(self) -> TargetView:
        now = self._clock.now()
        key, until, reason = self._keys.state(self.spec.key_ref, self.id, now)
        return TargetView(
            self.breaker.view(now), self.limiter.view(), self._ramp_slots(now), key, until, reason, self.not_before
        )

    def standing(self, now: float) -> Standing:
        key, until, reason = self._keys.state(self.spec.key_ref, self.id, now)
        b = self.breaker
        return Standing(key, until, reason, b.state_at(now), b.reason)

    # ------------------------------------------------------------ attempts

    async def admit(self, cost: int) -> Admission | None:
        now = self._clock.now()
        gates = self.gates(now)
        if decisions.gate(gates) is not None:
            return None
        lim = self.limiter
        room = decisions.Room(
            lim.limit,
            lim.in_flight,
            None if self.rpm is None else self.rpm.wait(1),
            None if self.tpm is None else self.tpm.wait(cost),
        )
        if not decisions.counted(gates, room).admitted:
            return None
        if self.rpm is not None:
            self.rpm.try_take(1)
        if self.tpm is not None:
            self.tpm.try_take(cost)
        slot = lim.take()
        gen = self.breaker.generation
        ramp = gates.share < 1.0 and self.breaker.ramp_admitted(gen)
        return Admission(self.id, gen, False, slot, cost, now, ask=lim.asks(slot), ramp=ramp)

    def survival_after(self) -> float | None:
        return self.refusals.survival()

    def survived(self, adm: Admission, *, full: bool = False) -> bool:
        """``full``: a shared store knows the ramp's slots are all in use (the fleet's
        requests fill it); otherwise this process's own requests in flight say how many are free."""
        if adm.settled or adm.survived or not (adm.ramp or adm.probe):
            return False
        adm.survived = True
        lim = self.limiter
        if adm.probe:
            return self.breaker.probe_survived(adm.generation, basis=lim.limit, floor=lim.start)
        now = self._clock.now()
        free = 0 if full else max(0, decisions.slots(self.breaker.share(now), lim.limit) - lim.in_flight)
        return self.breaker.survived(adm.generation, free=free, now=now)

    async def begin_probe(self, *, early: bool = False) -> Admission | None:
        """The one probe of an open breaker, when it is due (``early``: due by the demand
        for the model, capmon/core/control/demand.py, before the breaker's own schedule)."""
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
        """Apply one attempt's outcome to breaker, limiter, key and buckets, as
        capmon/core/control/decisions.py decides. Returns whether a capacity failure was news
        (see AdaptiveLimiter.release). ``unused``: the admission was given back before
        anything was sent, so its bucket charges are refunded too."""
        if adm.settled:
            return False
        adm.settled = True
        now = self._clock.now()
        plan = decisions.plan_settle(
            Outcome(failure, cancelled, unused, used_tokens), probe=adm.probe, cost=adm.cost, max_hint=self._max_hint
        )
        b, lim = self.breaker, self.limiter
        self.refusals.record(plan.breaker, failure, now - adm.at)
        before = b.state_at(now)
        news = decisions.overload_is_news(plan.limiter, adm.slot.epoch, lim.epoch)
        checkpoint = decisions.starts_streak(plan, news=news, admits=before.admits, streak=b.consecutive)
        after = checkpoint and decisions.checkpoint_keeps_lesson(
            news, lim.capacity, adm.slot.position, lim.min, lim.start
        )
        if checkpoint and not after:
            lim.checkpoint()
        lim.release(adm.slot, plan.limiter, self.pressed_since(adm.at))
        if after:
            lim.checkpoint()
        b.record(
            adm.generation,
            plan.breaker,
            sent_at=adm.at,
            hint=plan.hint,
            news=news,
            probe=adm.probe,
            basis=lim.limit,
            floor=lim.start,
            young=adm.ramp and not adm.survived,
            now=now,
        )
        if decisions.trip_restores(before, b.state_at(now)):
            lim.restore()
        if plan.key is not None:
            self.move_key(plan.key, now)
        self.not_before = decisions.not_before_after(self.not_before, now, plan.block_for, lim.in_flight)
        if plan.refund_tokens and self.tpm is not None:
            self.tpm.refund(plan.refund_tokens)
        if plan.refund_request and self.rpm is not None:
            self.rpm.refund(1)
        return decisions.reports_news(plan, news)

    def move_key(self, move: KeyMove, now: float) -> None:
        """Disable or park the key as a settle decided, and say so."""
        if move.state is KeyState.DISABLED:
            self._keys.disabled[self.spec.key_ref] = move.reason
            until = None
        else:
            until = now + move.park_for
            self._keys.parked[self.id] = (until, move.reason)
        self.emit_key(move.kind, until, move.reason)

    def emit_key(self, kind: Kind, until: float | None, reason: str) -> None:
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
        self._lessons = Lessons()
        self._targets = {s.id: MemoryTarget(s, config, clock, self.keys, publish) for s in specs}
        self._listener: Callable[[], None] | None = None

    @property
    def pinned(self) -> str | None:
        return self._pinned

    def pin(self, model: str | None) -> None:
        self._pinned = model
        self._publish(ModelPinned(at=self._clock.now(), wall=self._clock.wall(), model=model))

    @property
    def lessons(self) -> Lessons:
        return self._lessons

    def learn(self, deployment: str, feature: Feature, why: str) -> bool:
        """A provider said ``deployment``'s model lacks ``feature``: every later request
        that needs it skips that deployment."""
        return self._lessons.add(deployment, feature, why)

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
        from capmon.core.types.snapshot import SharedStatus

        return SharedStatus()

    async def aclose(self) -> None:
        return None
