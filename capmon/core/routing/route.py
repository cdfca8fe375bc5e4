"""One request's route: which targets it may use and in what order, and what it does
after a failed attempt.

:class:`Routing` is what one request remembers while it is routed. It has one writer,
the router (capmon/core/routing/client.py): its queries (``usable``, ``candidates``,
``passed_over``, ``cannot_wait``...) change nothing, and :func:`plan` returns a
:class:`Step`, a value the router applies with :meth:`Routing.apply`. The journal
(capmon/core/routing/journal.py) only reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from capmon.core.base.exceptions import CannotWait, RequestFailed, Unavailable
from capmon.core.control.backoff import Schedule
from capmon.core.control.policy import Next, policy_for
from capmon.core.control.seam import KeyState
from capmon.core.providers.splice import Partial, Splice
from capmon.core.routing.targets import Hold, Target, held, stranded, token_limit
from capmon.core.routing.waiting import BATCH, INTERACTIVE
from capmon.core.types.capability import Feature
from capmon.core.types.config import Spread
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Attempt, Decision, Priority, Request, Skip
from capmon.core.types.states import State

# Retries of one request on the model it sticks to (rate-limited, transient) before it
# may fall back to another model.
STICK_LIMIT = 2
# A deadline this close counts as passed: no attempt or wait is worth starting in it.
DEADLINE_SLACK = 1e-6


@dataclass
class Routing:
    """What one request remembers while it is routed."""

    id: int  # also its place in line: smaller ids waited longer
    request: Request
    prompt_tokens: int
    deadline: float
    started: float
    schedule: Schedule | None = None  # its backoff (tenacity's call state); None: it is never retried
    attempts: list[Attempt] = field(default_factory=list)
    excluded: set[str] = field(default_factory=set)  # target ids never to use again
    skip: dict[str, float] = field(default_factory=dict)  # target id -> until: backing off from it
    min_window: int = 0  # too_large: only models with a larger window
    stick_to: str | None = None  # rate_limited / transient: retry this model
    last_failure: Failure | None = None
    last_model: str | None = None
    # The target of its last attempt; before any, the first of the model it counts on first.
    # The next attempt on another endpoint of the same model is a move between deployments.
    last_target: Target | None = None
    first_choice: str = ""  # the model it counts on first (ChatResult.requested)
    switched: bool = False  # the token parameter was switched once for this request
    stuck: int = 0  # failures in a row on the model it sticks to
    own_deadline: bool = False  # the deadline is the request's own, shorter than [client] deadline
    # target id -> why it cannot carry the request (capmon/core/providers/formats.py): never tried,
    # like a model whose context window is too small; ``noted``: skips already on the record.
    incapable: dict[str, str] = field(default_factory=dict)
    noted: set[str] = field(default_factory=set)
    # What it needs that not every model has (capmon/core/providers/capabilities.py), and the
    # targets in ``incapable`` because their model lacks one of those (or its output cap).
    needs: frozenset[Feature] = frozenset()
    lacking: set[str] = field(default_factory=set)
    sending_dropped: tuple[str, ...] = ()  # the fields the latest attempt left out (a stream's headers say so)
    sending_lowered: int | None = None  # the latest attempt's output cap when cut to the model's
    cap_ceiling: bool = False  # [client] cap_client_tokens: a model's max_tokens bounds the caller's
    # target ids this request was counted as demand for (capmon/core/control/demand.py): once each
    wanted: set[str] = field(default_factory=set)
    # [client.patience] of its priority: a server's hint this short on the model it prefers is
    # waited out there, not taken as a reason to move down (ARCHITECTURE.md, "A hint against another model")
    patience: float = 0.0
    # A stream's continuation (capmon/core/routing/continuation.py): what the caller was sent
    # (a Splice; None: never continued), the request as the caller sent it, and while a
    # continuation is due, the partial answer it goes on from and whether its attempt sent a prefill.
    splice: Splice | None = None
    original: Request | None = None
    resume: Partial | None = None
    prefilled: bool = False

    @property
    def sent(self) -> int:
        """Attempts sent so far (the record also holds the targets skipped as incapable)."""
        return sum(1 for a in self.attempts if a.decision is not Decision.SKIP)

    def _first(self, pinned: str | None) -> list[str]:
        """The models it tries before the config's order: the one it sticks to, the pinned
        one, its own."""
        return [m for m in (self.stick_to, pinned, self.request.model) if m]

    def passed_over(self, targets: Sequence[Target], t: Target, pinned: str | None) -> list[Target]:
        """The targets the route puts before ``t`` that it has neither tried nor put on the
        record yet, whatever kept it from them (the router records each with
        :meth:`skip_reason` and notes it in ``noted``)."""
        first = self._first(pinned)
        if t is targets[0] and (not first or first[0] == t.model.name):
            return []  # the common case, on every request's path: nothing comes before the first

        def place(u: Target) -> tuple[int, int]:
            return (first.index(u.model.name) if u.model.name in first else len(first), u.rank)

        mine = place(t)
        tried = {a.target for a in self.attempts if a.decision is not Decision.SKIP}
        return [u for u in targets if u is not t and place(u) < mine and u.id not in self.noted and u.id not in tried]

    def unnoted(self, targets: Sequence[Target]) -> list[Target]:
        """Every target neither tried nor on the record yet (a request that fails without
        another attempt: why it could use none of them)."""
        tried = {a.target for a in self.attempts if a.decision is not Decision.SKIP}
        return [u for u in targets if u.id not in self.noted and u.id not in tried]

    def skip_reason(self, u: Target, now: float) -> tuple[Skip, str]:
        """Why the route passes ``u`` over now, and the detail: the first of the reasons
        :meth:`usable` and an admission check, most lasting first."""
        if u.id in self.incapable:
            return Skip.INCAPABLE, self.incapable[u.id]
        window = u.model.context_window
        wanted = min(token_limit(self.request.max_tokens, u, self.cap_ceiling), 16)
        if window <= self.min_window or self.prompt_tokens + wanted > window:
            need = max(self.min_window + 1, self.prompt_tokens + wanted)
            return Skip.WINDOW, f"its context window of {window:,} tokens is below the {need:,} the request needs"
        v = u.state.standing(now)
        if v.key_state is KeyState.DISABLED or not u.state.usable():
            # Not the provider's words about the key: they may show part of it.
            return Skip.KEY_DISABLED, f"key {u.key.alias} at {u.endpoint.name} is disabled after an auth failure"
        if v.breaker is State.FORCED_OPEN:
            return Skip.TRIPPED, f"tripped by hand ({v.breaker_reason})"
        if v.key_state is KeyState.PARKED:
            left = f" for {max(0.0, v.key_until - now):.0f}s more" if v.key_until is not None else ""
            return Skip.KEY_PARKED, f"key {u.key.alias} at {u.endpoint.name} is out of quota{left}"
        if u.reach.failure is not None and (not v.breaker.admits or not u.reach.answered):
            return Skip.UNREACHABLE, u.reach.failure.reason
        if u.silent is not None and not v.breaker.admits:
            return Skip.SILENT, f"{u.silent}; passed over until its probe answers"
        if not v.breaker.admits:
            return Skip.OPEN, f"breaker {v.breaker.value} ({v.breaker_reason})" if v.breaker_reason else v.breaker.value
        at = u.state.ready_at(now, self.cost(u))
        if at is not None and at > now:
            return Skip.HELD_OFF, f"held off for {at - now:.1f}s more (a server's hint, or its rpm / tpm bucket)"
        return Skip.FULL, "every slot it has is in use"

    def left(self, now: float) -> float:
        """Seconds until its deadline: what any attempt or wait of it may take at most."""
        return self.deadline - now

    def expired(self, now: float) -> bool:
        return now >= self.deadline - DEADLINE_SLACK

    def deadline_passed(self, now: float) -> str:
        """Which deadline passed and when it was given up, for the error."""
        length = self.deadline - self.started
        which = (
            f"the request's own deadline of {length:g}s" if self.own_deadline else f"[client] deadline = {length:g}s"
        )
        return f"{which} passed; given up {now - self.started:.1f}s after the request started"

    def cannot_wait(
        self, targets: Sequence[Target], pinned: str | None, now: float, *, usable: list[Target] | None = None
    ) -> RequestFailed | None:
        """What the request is answered with at once, before it waits: no model it may use
        can admit it before its deadline, and waiting cannot change that (tripped by hand,
        keys disabled or out of quota past the deadline, no window large enough). None
        while one can: an automatically open breaker, a half-open or a full target admits
        again by itself, so the request waits for it. ``usable``: :meth:`usable` of the same
        arguments, when the caller has it already."""
        if usable is None:
            usable = self.usable(targets, pinned)
        if not usable:
            failure = self.last_failure
            if failure is None:
                return self._nothing(targets)
            return RequestFailed(failure, self.attempts, _none(failure))
        holds = []
        for t in usable:
            h = held(t, now) or self._stranded(t, now)
            if h is None or (h.until is not None and h.until < self.deadline):
                return None
            holds.append(h)
        whys, kinds = {h.why for h in holds}, {h.kind for h in holds}
        why = whys.pop() if len(whys) == 1 else Unavailable.MODELS
        kind = kinds.pop() if len(kinds) == 1 else Kind.CAPACITY
        untils = [h.until for h in holds if h.until is not None]
        retry = max(0.0, min(untils) - now) if untils else None
        reasons = "; ".join(dict.fromkeys(h.reason for h in holds))
        if why is Unavailable.UNREACHABLE:
            message = f"no model can serve this request: {reasons}"
        else:
            message = f"no model can serve this request before its deadline and waiting cannot help: {reasons}"
        code = next((h.code for h in holds if h.code), None)
        failure = Failure(kind, reasons, code=code, retry_after=retry)
        return CannotWait(failure, why, self.attempts, message, retry_after=retry)

    def _stranded(self, t: Target, now: float) -> Hold | None:
        """A target whose endpoint was never reached (targets.stranded) is not waited for
        once the request itself failed to connect to it, or once its breaker admits no one
        (it opened: only its probe tries it now). While its breaker admits, a request that
        has not tried it does: that attempt is how a closed breaker hears it is back (or
        opens, and its probe takes over)."""
        h = stranded(t)
        if h is None:
            return None
        if t.id in self.excluded or t.id in self.skip or not t.state.standing(now).breaker.admits:
            return h
        return None

    def no_capable(self, targets: Sequence[Target]) -> CannotWait | None:
        """``no_capable_model`` when every target is incapable and one of them for what its
        model lacks: naming what the request needs and why each is passed over."""
        if any(t.id not in self.incapable for t in targets) or not any(t.id in self.lacking for t in targets):
            return None
        needed = ", ".join(sorted(self.needs)) or "no more output than its cap"
        listed = "; ".join(f"{t.model.name}@{t.endpoint.name}: {self.incapable[t.id]}" for t in _deployments(targets))
        failure = Failure(Kind.BAD_REQUEST, f"no model can do what it needs ({needed}): {listed}")
        message = f"no model can serve this request: it needs {needed}; {listed}"
        return CannotWait(failure, Unavailable.NO_CAPABLE, self.attempts, message)

    def _nothing(self, targets: Sequence[Target]) -> RequestFailed:
        """Why a request that has not been tried yet has no target at all."""
        capable = [t for t in targets if t.id not in self.incapable]
        if not capable:
            none_can = self.no_capable(targets)
            if none_can is not None:
                return none_can
            why = {f"{t.model.name} ({t.endpoint.api.value})": self.incapable[t.id] for t in targets}
            listed = "; ".join(f"{name}: {reason}" for name, reason in why.items())
            failure = Failure(Kind.BAD_REQUEST, f"no model can carry this request: {listed}")
            return RequestFailed(failure, self.attempts, _none(failure))
        keys = [t for t in capable if not t.state.usable()]
        if len(keys) == len(capable):
            aliases = ", ".join(sorted({f"{t.key.alias} at {t.endpoint.name}" for t in keys}))
            failure = Failure(Kind.AUTH, f"every key is disabled after an auth failure ({aliases}); reset it by hand")
            return CannotWait(failure, Unavailable.KEYS, self.attempts, _none(failure))
        failure = Failure(Kind.TOO_LARGE, f"no model's context window fits about {self.prompt_tokens} prompt tokens")
        return CannotWait(failure, Unavailable.WINDOW, self.attempts, _none(failure))

    def cost(self, t: Target) -> int:
        """Tokens the request may use on ``t``: charged to a tpm bucket up front."""
        return self.prompt_tokens + token_limit(self.request.max_tokens, t, self.cap_ceiling)

    def usable(self, targets: Sequence[Target], pinned: str | None, *, stick: bool = True) -> list[Target]:
        """The targets this request could ever use, in the order it should try them: a
        model it sticks to (only that model's targets; ``stick=False``: every model), then
        the pinned one, then its own, then the config's order."""
        out = []
        for t in targets:
            if t.id in self.excluded or t.model.context_window <= self.min_window or not t.state.usable():
                continue
            if t.id in self.incapable:
                continue
            if not self.request.fallback and self.request.model and t.model.name != self.request.model:
                continue
            wanted = min(token_limit(self.request.max_tokens, t, self.cap_ceiling), 16)
            if self.prompt_tokens + wanted > t.model.context_window:
                continue
            out.append(t)
        # The model it sticks to, while one of its targets is still usable; else none.
        sticks = self.stick_to if self.stick_to and any(t.model.name == self.stick_to for t in out) else None
        if sticks and stick:
            out = [t for t in out if t.model.name == sticks]
        first = [m for m in (sticks, pinned, self.request.model) if m]
        if first:
            out.sort(key=lambda t: (first.index(t.model.name) if t.model.name in first else len(first), t.rank))
        return out

    def candidates(
        self, targets: Sequence[Target], pinned: str | None, now: float, *, usable: list[Target] | None = None
    ) -> list[Target]:
        """The usable targets it may try now: not those it is backing off from (``usable``:
        as in :meth:`refusal`)."""
        out = self.usable(targets, pinned) if usable is None else usable
        if self.skip:
            out = [t for t in out if self.skip.get(t.id, 0.0) <= now]
        return out

    def spread(
        self, targets: Sequence[Target], now: float, pinned: tuple[str | None, str | None] = (None, None)
    ) -> list[Target]:
        """``targets`` (in the route's order) with each model's own, where it spreads by
        room (``[[models]] spread``), put in order of the room they have left for this
        request (``TargetState.room``), most first; ties keep the config's order. A pinned
        deployment (``pinned``: the pin's model and endpoint) goes first of its model's. Every
        model keeps its place: this only chooses among one model's deployments and keys,
        so no move it makes is a fallback. A deployment that rate-limits or is full has
        less room (its limiter, bucket or hint says so) and so gets less, until it has
        room again."""
        out: list[Target] = []
        i = 0
        while i < len(targets):
            j = i + 1
            name = targets[i].model.name
            while j < len(targets) and targets[j].model.name == name:
                j += 1
            run = targets[i:j]
            if len(run) > 1 and run[0].model.spread is Spread.ROOM:
                rooms = {t.id: t.state.room(now, self.cost(t)) for t in run}
                run = sorted(run, key=lambda t: -rooms[t.id])
            if len(run) > 1 and pinned[1] is not None and name == pinned[0]:
                run = sorted(run, key=lambda t: t.endpoint.name != pinned[1])
            out.extend(run)
            i = j
        return out

    def group(self, targets: Sequence[Target], pinned: str | None, now: float, by_cost: bool) -> tuple[int, Hashable]:
        """Requests of one priority that may try exactly the same targets share a fate in
        the queue (capmon/core/routing/waiting.py)."""
        cls = BATCH if self.request.priority is Priority.BATCH else INTERACTIVE
        return cls, (tuple(t.id for t in self.candidates(targets, pinned, now)), self.prompt_tokens if by_cost else 0)

    def earliest_elsewhere(self, targets: Sequence[Target], pinned: str | None, model: str, now: float) -> float | None:
        """The earliest clock time a usable target of another model than ``model`` may admit
        the request (its time-driven gates and the request's own back-off from it; a full
        one counts as now: a release hands it over); None when none may by time alone."""
        found = None
        for u in self.usable(targets, pinned, stick=False):
            if u.model.name == model:
                continue
            at = u.state.ready_at(now, self.cost(u))
            if at is None:
                continue
            at = max(at, now, self.skip.get(u.id, 0.0))
            found = at if found is None else min(found, at)
        return found

    def apply(self, step: Step) -> None:
        """Take what :func:`plan` decided into the request's memory (the router calls it)."""
        if step.exclude is not None:
            self.excluded.add(step.exclude)
        self.min_window = max(self.min_window, step.min_window)
        if step.skip is not None:
            self.skip[step.skip[0]] = step.skip[1]
        if step.decision is Decision.RETRY:
            self.stick_to, self.stuck = step.stick_to, step.stuck

    def ready_at(self, targets: Sequence[Target], pinned: str | None, now: float) -> float | None:
        """The earliest time a time-driven gate opens for it (a hint, a bucket, its own back-off)."""
        times = [t.state.ready_at(now, self.cost(t)) for t in self.candidates(targets, pinned, now)]
        times += [u for u in self.skip.values() if u > now]
        found = [x for x in times if x is not None]
        return min(found) if found else None


def _deployments(targets: Sequence[Target]) -> list[Target]:
    """One target per deployment (its keys share what its model can do), in order."""
    seen: dict[tuple[str, str], Target] = {}
    for t in targets:
        seen.setdefault((t.model.name, t.endpoint.name), t)
    return list(seen.values())


def _none(failure: Failure) -> str:
    return f"no model can serve this request; last: {failure.kind.value}: {failure.reason}"


@dataclass(frozen=True, slots=True)
class Step:
    """What a request does after a failed attempt, and what its route learns from it
    (applied by the router with :meth:`Routing.apply`)."""

    decision: Decision  # FAIL, FALLBACK (another target at once) or RETRY (after ``wait``)
    wait: float = 0.0
    message: str | None = None  # why it fails, for RequestFailed
    expired: bool = False  # FAIL because its deadline passed: DeadlineExceeded
    exclude: str | None = None  # a target id never to use again
    min_window: int = 0  # only models with a larger context window than this
    skip: tuple[str, float] | None = None  # (target id, until): back off from it
    stick_to: str | None = None  # RETRY: the model it retries first (None: any)
    stuck: int = 0  # RETRY: failures in a row on the model it sticks to


def plan(
    r: Routing,
    t: Target,
    failure: Failure,
    *,
    number: int,
    max_attempts: int,
    has_other: Callable[[str, int], bool],
    spend_retry: Callable[[], bool],
    now: float,
    elsewhere: Callable[[], float | None] = lambda: None,
    asked: bool = False,
) -> Step:
    """Decide from the policy table; the request's memory is not touched (the router
    applies the step). Waiting happens in the queue: the request backs off from the
    target that failed (and only that one) and keeps its place in line for every other.
    ``has_other(excluded, window)``: whether a usable target remains but that one, with a
    context window larger than ``window``;
    ``elsewhere()``: the earliest clock time a target of another model may admit it;
    ``asked``: the attempt was sent above the target's learned capacity (the limiter asking
    for more room): refused, it is the limiter's lesson, so the request does not stay with
    that model for its hint, whatever its patience; it takes the next slot anywhere."""
    kind = failure.kind
    nxt = policy_for(failure).next
    if nxt is Next.FAIL:
        return Step(Decision.FAIL)
    if nxt in (Next.FALLBACK, Next.LARGER):
        window = t.model.context_window if nxt is Next.LARGER else 0
        if number >= max_attempts or not has_other(t.id, window):
            what = {
                Kind.AUTH: f"key {t.key.alias} at {t.endpoint.name} is disabled",
                Kind.QUOTA: f"key {t.key.alias} parked",
                Kind.TOO_LARGE: "no model with a larger context window",
            }.get(kind, "no other model to fall back to")
            message = f"{kind.value}: {failure.reason} ({what})"
            return Step(Decision.FAIL, message=message, exclude=t.id, min_window=window)
        return Step(Decision.FALLBACK, exclude=t.id, min_window=window)
    if r.expired(now):  # no retry, and none of the retry budget spent on one
        return Step(Decision.FAIL, expired=True)
    if number >= max_attempts:
        return Step(Decision.FAIL, message=f"{kind.value}: {failure.reason} (after {number} attempts)")
    transient = nxt is Next.RETRY
    if transient and not spend_retry():
        return Step(Decision.FAIL, message=f"transient: {failure.reason} (retry budget spent)")
    assert r.schedule is not None
    wait = r.schedule.next_wait(failure, Kind.TRANSIENT if transient else None)
    wait = max(0.0, min(wait, r.deadline - now))
    stick_to, stuck = None, 0
    if nxt in (Next.RETRY, Next.SAME_MODEL):
        # The same model again (another key of it first), but not for ever: a model that
        # keeps refusing one request lets it go to the others. Nor when a server's hint
        # holds it off longer than another model takes to admit it: it goes there, unless
        # the hint is within the request's patience (and its deadline): then it waits it out.
        stuck = r.stuck + 1 if r.stick_to == t.model.name else 1
        hint = failure.retry_after
        patient = hint is not None and hint <= r.patience and now + wait < r.deadline
        held_off = hint is not None and not patient and _sooner(elsewhere(), now + wait)
        stick_to = t.model.name if stuck <= STICK_LIMIT and not held_off and not asked else None
    return Step(Decision.RETRY, wait, skip=(t.id, now + wait), stick_to=stick_to, stuck=stuck)


def _sooner(at: float | None, than: float) -> bool:
    return at is not None and at < than
