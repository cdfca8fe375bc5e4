"""What an admission and a settle decide, as pure functions: the one specification
every store of the state seam follows (ARCHITECTURE.md, "The state seam").

:class:`~capmon.core.control.seam.MemoryTarget` applies these decisions to its own breaker,
limiter, key book and buckets. ``RedisTarget`` (capmon/fleet/target.py) applies them
to its mirror and sends them to its scripts, which take only what needs the whole
fleet's counts at one moment (how many requests are in flight, the buckets' tokens,
the fleet's failure streak) and decide that part atomically in Lua; each block of
capmon/fleet/lua/ names the function here that it mirrors.
tests/fleet/test_state_equivalence.py drives both stores through the same random
sequences and holds them to the same decisions and views.

Change a decision here and in the Lua block that names it; the per-kind consequences
themselves are the table in capmon/core/control/policy.py.

The facts an admission or a settle is decided from are immutable records; those built
on every attempt are NamedTuples, which cost half what a frozen dataclass does to build
(this is the hot path of every request).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from capmon.core.control.limiter import SLOW_START_STEP
from capmon.core.control.policy import CANCELLED, BreakerSignal, KeyAction, LimiterSignal, Policy, policy_for
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.states import KeyState as KeyState  # re-exported: what a settle moves a key to
from capmon.core.types.states import State

# A quota failure without a hint parks its key this long: quotas reset by the hour or
# the day, and hammering a spent key only adds noise.
DEFAULT_QUOTA_PARK = 3600.0


class Verdict(enum.StrEnum):
    """An admission's answer; the values are the ADMIT script's (capmon/fleet/lua/admit.lua)."""

    OK = "ok"
    STATE = "state"  # the breaker admits no user request (open, probing, tripped)
    DISABLED = "disabled"
    PARKED = "parked"
    HINT = "hint"  # a server's "not before"
    FULL = "full"  # no free slot under the limit (a ramp's share of it)
    RPM = "rpm"
    TPM = "tpm"


# ------------------------------------------------------------ admit


class Gates(NamedTuple):
    """What decides an admission before anything is counted."""

    now: float
    share: float  # the breaker's share of the limit now: 0 while it admits no user request
    key: KeyState
    key_until: float | None  # while PARKED
    not_before: float  # a server's hint, 0 for none


class Room(NamedTuple):
    """What is counted: the limit and what holds it, the buckets."""

    limit: float
    in_flight: int  # requests in flight at the target (a shared store: every process's)
    rpm_wait: float | None  # seconds until one request's rpm token is there (0: now); None: no rpm bucket
    tpm_wait: float | None  # seconds until the request's tokens are there; None: no tpm bucket


class AdmitDecision(NamedTuple):
    verdict: Verdict
    retry_at: float = 0.0  # when a time-driven refusal (parked, hint, rpm, tpm) lifts; 0 otherwise

    @property
    def admitted(self) -> bool:
        return self.verdict is Verdict.OK


_OK = AdmitDecision(Verdict.OK)
_STATE = AdmitDecision(Verdict.STATE)
_DISABLED = AdmitDecision(Verdict.DISABLED)
_FULL = AdmitDecision(Verdict.FULL)


def clean_hint(hint: float | None) -> float | None:
    """A server's hint, or None for garbage (negative, NaN, infinite): ignored rather
    than trusted, since an infinite wait would disable the model until someone resets it
    by hand. Every store of the state seam reads hints through this."""
    if hint is None or not math.isfinite(hint) or hint < 0:
        return None
    return float(hint)


# ------------------------------------------------------------ the ramp

# A share is a sum of slots' worths (1 / basis each): the rounding of those sums must
# not cost a whole slot (ceil(7.000000000000001) is 8) nor keep a full ramp from closing.
_SLOT_EPS = 1e-9


def ramp_opening(ramp_start: float, basis: float, floor: float) -> float:
    """The share a ramp starts at (the probe answered): ``ramp_start`` of the concurrency
    learned before the trip, ``basis``, but never fewer slots than ``floor``, the limiter's
    initial limit: what it would admit to a target it knew nothing about, so a recovering
    one it knows held ``basis`` earns no less. 1.0 (no ramp) when the floor is the basis
    or more (capmon/core/control/breaker.py, CircuitBreaker._start_ramp; a fleet's ramp starts
    by the transition that process writes)."""
    b = max(1.0, basis)
    return min(1.0, max(ramp_start, floor / b))


def ramp_grown(share: float, basis: float, slots: float = SLOW_START_STEP) -> float:
    """A ramp's share ``slots`` of the ``basis`` more. After one clean answer (a success sent
    in the ramp) that is two (the limiter's SLOW_START_STEP), as TCP's slow start grows its
    window per ack: a round of clean answers as large as the share triples it, so the ramp
    triples per round trip while its slots are in use, and every answer counts at once: a
    slow answer holds back its own slot, not its round's (capmon/core/control/breaker.py,
    CircuitBreaker.record). After one of its requests survived (capmon/core/control/survival.py:
    neither answered nor refused well past the time its model takes to refuse, so it was
    admitted) it is one, granted only while the ramp is fewer than ``[breaker] ramp_lead``
    requests and slots ahead of what the model showed (CircuitBreaker.survived). A fleet's
    share is raised by the step that process writes."""
    grown = share + slots / max(1.0, basis)
    return 1.0 if grown >= 1.0 - _SLOT_EPS else grown


def slots(share: float, limit: float) -> int:
    """How many requests the target admits at once: the limit, or while a ramp admits
    a share of it, ``ceil(share * limit)`` (at least one)."""
    cap = limit
    if 0.0 < share < 1.0:
        cap = min(limit, max(1, math.ceil(share * max(1.0, limit) - _SLOT_EPS)))
    return max(0, math.floor(cap + 1e-9))


def room_left(slots_now: int, in_flight: int, buckets: Iterable[tuple[float, float]] = ()) -> float:
    """The share of a target's room still free, from 0 (none) to 1 (all of it): the least
    of its slots' (those it admits now less those in flight, over them) and each bucket's
    (``(tokens left after the request, bucket size)``). What one model's deployments are
    ordered by with ``spread = "room"`` (capmon/core/routing/route.py): a share, not a
    count, so a small deployment and a large one reach their edge together."""
    share = max(0, slots_now - in_flight) / slots_now if slots_now > 0 else 0.0
    for left, size in buckets:
        if size > 0:
            share = min(share, max(0.0, left) / size)
    return share


def ramp_slots(share: float, limit: float) -> int | None:
    """What a view shows while a ramp admits part of the limit; None otherwise."""
    if share >= 1.0 or share <= 0.0:
        return None
    return slots(share, limit)


def gate(g: Gates) -> AdmitDecision | None:
    """The refusals decided before counting, in the order ADMIT checks them; None when
    every gate is open. A shared store's mirror asks this alone to save a round trip."""
    if g.share <= 0.0:
        return _STATE
    if g.key is KeyState.DISABLED:
        return _DISABLED
    if g.key is KeyState.PARKED and g.key_until is not None and g.key_until > g.now:
        return AdmitDecision(Verdict.PARKED, g.key_until)
    if g.not_before > g.now:
        return AdmitDecision(Verdict.HINT, g.not_before)
    return None


def admit(g: Gates, room: Room) -> AdmitDecision:
    """One admission: the gates, then a free slot, then the buckets (rpm first)."""
    refused = gate(g)
    return refused if refused is not None else counted(g, room)


def counted(g: Gates, room: Room) -> AdmitDecision:
    """The part of :func:`admit` after the gates: a free slot, then the buckets."""
    if room.in_flight >= slots(g.share, room.limit):
        return _FULL
    if room.rpm_wait:
        return AdmitDecision(Verdict.RPM, g.now + room.rpm_wait)
    if room.tpm_wait:
        return AdmitDecision(Verdict.TPM, g.now + room.tpm_wait)
    return _OK


# ------------------------------------------------------------ settle


class Outcome(NamedTuple):
    """How one attempt ended, as the seam hears it."""

    failure: Failure | None
    cancelled: bool = False  # cut short by the caller: says nothing about the target
    unused: bool = False  # given back before anything was sent: its charges come back
    used_tokens: int | None = None  # a success's real token count (the rest of the charge comes back)


@dataclass(frozen=True, slots=True)
class KeyMove:
    """What a failure does to the key: disable it (auth, for every model it serves) or
    park this model on it (quota) for ``park_for`` seconds."""

    state: KeyState
    reason: str
    park_for: float = 0.0

    @property
    def kind(self) -> Kind:
        """The KeyParked event's kind."""
        return Kind.AUTH if self.state is KeyState.DISABLED else Kind.QUOTA


class SettlePlan(NamedTuple):
    """Everything a settle decides from the outcome alone, before any count."""

    policy: Policy
    probe: bool
    hint: float | None  # the server's hint, garbage dropped
    limiter: LimiterSignal  # what the limiter hears (nothing from a probe)
    key: KeyMove | None
    block_for: float | None  # seconds the hint holds the whole target off, if none of ours is left in flight
    refund_tokens: int  # tpm tokens charged up front that come back
    refund_request: bool  # the rpm token comes back too

    @property
    def breaker(self) -> BreakerSignal:
        return self.policy.breaker


def plan_settle(outcome: Outcome, *, probe: bool, cost: int, max_hint: float) -> SettlePlan:
    """The decisions of a settle that need no count (lua/settle.lua takes them as its
    arguments): the policy row, the hint, the key's move, how long a hint may block,
    the refunds. ``max_hint`` (``breaker.cooldown_max``): a hint holds a target off
    no longer."""
    failure = outcome.failure
    pol = CANCELLED if outcome.cancelled else policy_for(failure)
    hint = clean_hint(failure.retry_after) if failure is not None else None
    key: KeyMove | None = None
    if failure is not None and pol.key is KeyAction.DISABLE:
        key = KeyMove(KeyState.DISABLED, failure.reason)
    elif failure is not None and pol.key is KeyAction.PARK:
        key = KeyMove(KeyState.PARKED, failure.reason, hint if hint is not None and hint > 0 else DEFAULT_QUOTA_PARK)
    block = min(hint, max_hint) if pol.hint_blocks and hint is not None and not probe else None
    if outcome.unused and not probe:
        refund = cost
    elif failure is None and outcome.used_tokens is not None:
        refund = max(0, cost - outcome.used_tokens)
    else:
        refund = 0
    return SettlePlan(
        policy=pol,
        probe=probe,
        hint=hint,
        limiter=LimiterSignal.NEUTRAL if probe else pol.limiter,  # a probe says nothing about concurrency
        key=key,
        block_for=block,
        refund_tokens=refund,
        refund_request=outcome.unused and not probe,
    )


def overload_is_news(signal: LimiterSignal, slot_epoch: int, epoch: int) -> bool:
    """Whether a rejection is news: sent since the limiter's last cut (an echo of the
    cut otherwise). The breaker counts only news (capmon/core/control/limiter.py)."""
    return signal is LimiterSignal.OVERLOAD and slot_epoch == epoch


def starts_streak(plan: SettlePlan, *, news: bool, admits: bool, streak: int) -> bool:
    """Whether a failure streak may begin here, so the limiter remembers what it learned
    before it (a trip then restores that: an outage is not a capacity signal)."""
    if plan.probe or not admits or streak != 0:
        return False
    return plan.breaker in OUTAGE or news


def checkpoint_keeps_lesson(news: bool, capacity: int | None, position: int, floor: int, start: float) -> bool:
    """Whether the checkpoint a streak's first failure takes comes after what that failure
    teaches the limiter rather than before it. A rejection that is news and says the
    target holds at least what the limiter knew (its learned capacity, or before any, the
    limit it started from) is the limiter's own learning: growth refuted, a full target's
    answer, which a trip later in the same streak (an outage) must not undo: restored to
    slow start, the limiter would grow past that capacity again and the ramp after the
    recovery would aim above it. A rejection below what was known may be the outage's
    first: the checkpoint is then what was known before it. ``floor`` is the limiter's min
    (a rejection at ``position`` says it holds ``max(floor, position - 1)``,
    capmon/core/control/limiter.py), ``start`` its initial limit."""
    if not news:
        return False
    return max(floor, position - 1) >= (start if capacity is None else capacity)


def trip_restores(before: State, after: State) -> bool:
    """A settle that tripped the breaker from closed or ramp restores the limiter's checkpoint."""
    return after is State.OPEN and before in (State.CLOSED, State.RAMP)


def not_before_after(current: float, now: float, block_for: float | None, left_in_flight: int) -> float:
    """A server's "not before" after a settle. A hint stops the whole target only when
    nothing else of ours is being served there (``left_in_flight``: a shared store
    counts the fleet's); otherwise the model is merely full and the limiter's cut is the
    answer."""
    if block_for is None or left_in_flight > 0:
        return current
    return max(current, now + block_for)


def reports_news(plan: SettlePlan, limiter_news: bool) -> bool:
    """What settle returns: the capacity failure was news, or nothing reached the server."""
    return limiter_news or plan.breaker in OUTAGE


# What the breaker hears of an outage rather than of a full model: nothing reached the
# server, or it kept silent (the limiter keeps what it learned before).
OUTAGE = (BreakerSignal.DOWN, BreakerSignal.SILENT)
