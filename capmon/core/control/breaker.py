"""A circuit breaker per target (one model at one endpoint with one key).

States and how they move (ARCHITECTURE.md, "The breaker")::

    CLOSED --N capacity failures in a row, or a failure ratio over a window--> OPEN
    OPEN --a probe is due: the client sends one minimal request of its own--> HALF_OPEN
    HALF_OPEN --probes_needed probes succeeded--> RAMP
    HALF_OPEN --the probe failed--> OPEN (the next probe waits longer)
    RAMP --the share reached 1.0--> CLOSED (probe interval growth forgotten)
    RAMP --full (a capacity failure) after it served in the ramp--> CLOSED
    RAMP --N capacity failures in a row--> OPEN
    any --trip()--> FORCED_OPEN;  any --force_close()--> FORCED_CLOSED;  any --reset()--> CLOSED

While OPEN no user request is admitted. The client probes the model itself: the
first probe comes ``probe_interval`` after the trip, each failed probe multiplies
the interval by ``cooldown_multiplier`` up to ``cooldown``, and no probe is sent
sooner than a server hint (itself capped at ``cooldown_max``). So a model that has
capacity again is found within one interval, at the cost of one tiny request per
interval while it has none. That is the slow schedule; work waiting for the model can
make a probe due sooner (``begin_probe(early=True)``, capmon/core/control/demand.py), still
never before the hint.

RAMP admits a growing share of the target's learned concurrency, from ``ramp_start``
of it (half by default, as TCP's slow-start threshold after a loss is half the
window) but never fewer slots than the limiter's initial limit. The share grows by
evidence, like TCP slow start: each success sent in the ramp adds two slots' worth,
so a round of answers as large as the share triples it, and the ramp triples per
round trip while its slots are in use. A request of the ramp still out well past the
time the model takes to refuse was admitted (capmon/core/control/survival.py): it adds a
slot before its answer, but only while fewer than ``ramp_lead`` of the ramp's requests
are out unproven (neither survived nor answered) and fewer than ``ramp_lead`` of its
slots are unused, so the ramp runs that far ahead of what the model showed, a survival
time behind it rather than a service time, and a model that came back with less than
before sees about that many requests too many. A capacity failure once the model has
served in the ramp (an answer, or a survival) ends the ramp: the limiter's cut to what
was in flight is what the model holds now, and a share of that cut would hold back room
it just showed. Before it served, failures add nothing and stop the growth by survivals;
``failure_threshold`` of them in a row trip it again. Time is only a ceiling: after
``ramp_duration`` the share is 1.0 however little traffic came.

There are no timers: time-driven moves are applied lazily from ``clock.now()``
whenever the breaker is asked anything, so a fast-forwarded clock moves it too.

Every state change starts a new *generation*. An outcome of an attempt admitted in
an earlier generation is stale and ignored, so a late success from before a trip
cannot close an open breaker and a late failure from before a reset cannot trip it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from capmon.core.base.clock import Clock
from capmon.core.control.decisions import OUTAGE as _OUTAGE
from capmon.core.control.decisions import clean_hint as clean_hint  # its home is decisions.py, which the stores share
from capmon.core.control.decisions import ramp_grown, ramp_opening
from capmon.core.control.policy import BreakerSignal
from capmon.core.types.config import BreakerConfig
from capmon.core.types.events import BreakerChanged, Event, RampStep
from capmon.core.types.states import State as State  # its home is below events.py, which names it

log = logging.getLogger("capmon.breaker")


@dataclass(frozen=True, slots=True)
class BreakerView:
    """What a snapshot or the dashboard shows about one breaker."""

    state: State
    manual: bool
    consecutive_failures: int
    next_probe_at: float | None  # clock time; set only while OPEN
    probe_interval: float | None  # the interval that led to it
    probes_failed: int  # failed probes since the trip
    ramp_share: float | None  # share of the learned concurrency admitted; set only while RAMP
    trips: int  # trips in a row since the last full recovery (drives the interval growth)
    reason: str
    total_trips: int


@dataclass(frozen=True, slots=True)
class BreakerRecord:
    """What a fleet of processes shares of one breaker (capmon/fleet): its state and
    schedule, not the evidence each process counts itself. Times are on this process's
    clock."""

    state: State
    generation: int
    reason: str
    next_probe: float | None  # while OPEN
    interval: float
    probes_failed: int
    probe_successes: int
    trips: int  # trips in a row
    total_trips: int
    ramp_from: float  # while RAMP
    ramp_share: float  # while RAMP: the share clean rounds earned (time is only a ceiling)
    basis: float  # while RAMP: the learned concurrency the share is of


def ramp_share(now: float, ramp_from: float, earned: float, ramp_start: float, ramp_duration: float) -> float:
    """A ramp's share now: what clean rounds ``earned``, or the time ceiling if higher
    (capmon/fleet/lua/lib.lua, ``ramp_share_now``, is the same)."""
    if ramp_duration <= 0:
        return 1.0
    by_time = ramp_start + (1.0 - ramp_start) * (now - ramp_from) / ramp_duration
    return min(1.0, max(earned, by_time))


def _max_hint(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class _Window:
    """Successes and capacity failures over the last ``span`` seconds, in time slices
    (memory stays small at any request rate; the far edge is exact to one slice)."""

    def __init__(self, span: float, slices: int = 60) -> None:
        self.span = span
        self.width = span / slices
        self._slices: deque[list[float]] = deque()  # [slice index, successes, failures, max hint or -1]

    def clear(self) -> None:
        self._slices.clear()

    def _prune(self, now: float) -> int:
        current = math.floor(now / self.width)
        oldest = current - math.ceil(self.span / self.width) + 1
        while self._slices and self._slices[0][0] < oldest:
            self._slices.popleft()
        return current

    def add(self, now: float, failed: bool, hint: float | None = None) -> None:
        current = self._prune(now)
        if not self._slices or self._slices[-1][0] != current:
            self._slices.append([current, 0, 0, -1.0])
        s = self._slices[-1]
        if failed:
            s[2] += 1
            if hint is not None:
                s[3] = max(s[3], hint)
        else:
            s[1] += 1

    def totals(self, now: float) -> tuple[int, int, float | None]:
        """(outcomes, failures, max hint) over the window."""
        self._prune(now)
        ok = failed = 0
        hint = -1.0
        for _, s_ok, s_failed, s_hint in self._slices:
            ok += int(s_ok)
            failed += int(s_failed)
            hint = max(hint, s_hint)
        return ok + failed, failed, (hint if hint >= 0 else None)


class CircuitBreaker:
    def __init__(
        self,
        target: str,
        model: str,
        config: BreakerConfig,
        clock: Clock,
        publish: Callable[[Event], None] | None = None,
    ) -> None:
        self.target = target
        self.model = model
        self.config = config
        self._clock = clock
        self._publish = publish

        self._state = State.CLOSED
        self._reason = "ready"
        self.generation = 0
        # Survive state changes: they lengthen the first probe interval of a re-trip.
        self._trips_in_a_row = 0
        self._total_trips = 0
        # Per generation: cleared on every state change.
        self._consecutive = 0
        self._streak_from = 0.0  # when the first failure of the current streak was sent
        self._streak_hint: float | None = None
        self._window = _Window(config.ratio_window)
        # OPEN / HALF_OPEN
        self._interval = config.probe_interval
        self._next_probe: float | None = None
        # While OPEN: no probe before this, a demand-driven one included (a server's hint).
        self._hint_until = 0.0
        self._probes_failed = 0
        self._probe_successes = 0
        # RAMP
        self._ramp_from = 0.0
        self._share = 1.0
        self._reported = 1.0  # the share the last RampStep named: one is published per doubling
        self._basis = 1.0
        # The ramp's requests out that have neither survived nor been settled: what the
        # model has not yet shown it admits. This process's own: a fleet shares the share
        # survivals raised, not this.
        self._young = 0
        self._shown = False  # a request of this ramp survived or answered: the model serves again
        self._refused = False  # a capacity failure came in this ramp: it is at the model's room
        self._changes = 0  # state moves and ramp steps this breaker decided itself

    # ------------------------------------------------------------ reading

    @property
    def state(self) -> State:
        return self.state_at(self._clock.now())

    def state_at(self, now: float) -> State:
        """The state now, ``now`` being the clock's reading the caller just took: one read
        of the clock per step, not one per question (so with every ``now=`` below)."""
        self._advance(now)
        return self._state

    @property
    def consecutive(self) -> int:
        return self._consecutive

    @property
    def reason(self) -> str:
        """Why it is in its state (read after ``state_at``: time may have moved it)."""
        return self._reason

    def view(self, now: float | None = None) -> BreakerView:
        if now is None:
            now = self._clock.now()
        self._advance(now)
        s = self._state
        return BreakerView(
            state=s,
            manual=s.manual,
            consecutive_failures=self._consecutive,
            next_probe_at=self._next_probe if s is State.OPEN else None,
            probe_interval=self._interval if s in (State.OPEN, State.HALF_OPEN) else None,
            probes_failed=self._probes_failed,
            ramp_share=self._ramp_share(now) if s is State.RAMP else None,
            trips=self._trips_in_a_row,
            reason=self._reason,
            total_trips=self._total_trips,
        )

    def share(self, now: float | None = None) -> float:
        """The share of the learned concurrency user requests may use now: 1.0 closed,
        the ramp's share in RAMP, 0.0 while open or probing."""
        if now is None:
            now = self._clock.now()
        self._advance(now)
        s = self._state
        if s is State.RAMP:
            return self._ramp_share(now)
        return 1.0 if s.admits else 0.0

    def probe_due_at(self) -> float | None:
        """Clock time the next probe is due while OPEN; None in every other state."""
        self._advance(self._clock.now())
        return self._next_probe if self._state is State.OPEN else None

    # ------------------------------------------------------------ shared with a fleet

    @property
    def changes(self) -> int:
        """How many moves and ramp steps this breaker has decided itself: read it before
        and after :meth:`record` (or any read, which applies time-driven moves) to tell
        whether that call made a transition, then :meth:`export` it."""
        return self._changes

    def export(self) -> BreakerRecord:
        self._advance(self._clock.now())
        return BreakerRecord(
            self._state,
            self.generation,
            self._reason,
            self._next_probe,
            self._interval,
            self._probes_failed,
            self._probe_successes,
            self._trips_in_a_row,
            self._total_trips,
            self._ramp_from,
            self._share,
            self._basis,
        )

    def adopt(self, rec: BreakerRecord, origin: str | None = None) -> None:
        """Take a state decided elsewhere (another process of the fleet, or the shared
        store's answer to a move this one lost) without treating it as this breaker's
        own decision: :attr:`changes` does not move. Its BreakerChanged names ``origin``
        in the reason (None: this process's own request to the store, e.g. the probe it
        won). The same state and generation only refreshes the schedule."""
        now = self._clock.now()
        old = self._state
        same = rec.generation == self.generation and rec.state is old
        share = max(self._share, rec.ramp_share) if same else rec.ramp_share
        stepped = same and old is State.RAMP and share > self._share + 1e-9
        self._state, self.generation, self._reason = rec.state, rec.generation, rec.reason
        self._next_probe = rec.next_probe if rec.state is State.OPEN else None
        if not same:  # decided elsewhere, whose hint this process does not know: none early
            self._hint_until = rec.next_probe or 0.0
        self._interval, self._probes_failed = rec.interval, rec.probes_failed
        self._probe_successes = rec.probe_successes
        self._trips_in_a_row, self._total_trips = rec.trips, rec.total_trips
        self._ramp_from, self._share, self._basis = rec.ramp_from, share, max(1.0, rec.basis)
        if not same:
            self._reported = share
            self._young = 0
            self._shown = self._refused = False
        if stepped:
            self._report(now, f"share raised to {self._share:.0%}" + (f" [{origin}]" if origin else ""))
        if same:
            return
        self._consecutive = 0
        self._streak_hint = None
        self._window.clear()
        reason = rec.reason if origin is None else f"{rec.reason} [{origin}]"
        self._emit(
            BreakerChanged(
                at=now,
                wall=self._clock.wall(),
                target=self.target,
                model=self.model,
                old=old,
                new=rec.state,
                reason=reason,
                manual=rec.state.manual,
                cooldown_until=self._next_probe,
            )
        )

    # ------------------------------------------------------------ probes

    def begin_probe(self, *, early: bool = False) -> int | None:
        """Start the due probe: OPEN -> HALF_OPEN. Returns the probe's generation, or
        None when no probe may go (not open, already probing, too early). ``early``: the
        work waiting for the model makes a probe worth sending before the schedule's time
        (capmon/core/control/demand.py); it still waits out a server's hint."""
        now = self._clock.now()
        self._advance(now)
        if self._state is not State.OPEN or self._next_probe is None:
            return None
        if now < (self._hint_until if early else self._next_probe) - 1e-9:
            return None
        why = "on demand" if now < self._next_probe - 1e-9 else f"interval {self._interval:g}s"
        self._move(State.HALF_OPEN, f"probing ({why})", now, keep_probe_state=True)
        return self.generation

    # ------------------------------------------------------------ outcomes

    def record(
        self,
        generation: int,
        signal: BreakerSignal,
        *,
        sent_at: float,
        hint: float | None = None,
        news: bool = True,
        probe: bool = False,
        basis: float = 1.0,
        floor: float = 1.0,
        young: bool = False,
        now: float | None = None,
    ) -> None:
        """One attempt's outcome. ``sent_at`` is when the attempt was admitted: failures
        in a row are counted in send order, so the successes of requests sent before a
        streak began (still finishing when a model goes down) do not break it. ``news``
        is False for a capacity failure the limiter took as an echo of requests sent
        before it backed off: a model that is merely full is not one that is down.
        ``basis`` is the learned concurrency a ramp starting now is a share of, ``floor``
        the fewest slots it admits (the limiter's initial limit); ``young``: the attempt
        was counted by :meth:`ramp_admitted` and had not survived; ``now``: the reading
        the caller just took, if it did."""
        if now is None:
            now = self._clock.now()
        self._advance(now)
        if generation != self.generation:
            return  # stale: admitted before the last state change
        if young and self._young:
            self._young -= 1  # answered or refused before it survived
        hint = clean_hint(hint)
        s = self._state
        failed = signal in _OUTAGE or (signal is BreakerSignal.CAPACITY and news)
        if s is State.HALF_OPEN and probe:
            self._probe_outcome(now, signal, hint, basis, floor)
        elif signal is BreakerSignal.SILENT and s in (State.CLOSED, State.RAMP):
            # A silent route is not tried again until its probe answers (policy.py).
            self._streak(sent_at, hint)
            self._trip(now, "silent: no response headers in time", self._streak_hint)
        elif s is State.CLOSED:
            if signal is BreakerSignal.SUCCESS:
                self._window.add(now, failed=False)
                self._success(sent_at)
            elif failed:
                self._streak(sent_at, hint)
                self._closed_failure(now, hint)
        elif s is State.RAMP:
            if signal is BreakerSignal.SUCCESS:
                self._shown |= self._success(sent_at)
                self._grow(now)
            elif failed:
                if signal is BreakerSignal.CAPACITY and self._shown:
                    # It serves again and refused one more: the limiter's cut (to what was in
                    # flight) is what it holds now, and a share of that cut would hold back
                    # room the model just showed. The ramp's work is done.
                    self._move(State.CLOSED, "full in the ramp: the limiter holds what it showed", now)
                    return
                # One that has shown nothing is not sent back at once either (the limiter's
                # cut answers a full one, and the share stops growing by survivals); one still
                # down fails again and trips.
                self._refused = True
                self._streak(sent_at, hint)
                if self._consecutive >= self.config.failure_threshold:
                    self._trip(now, f"{self._consecutive} capacity failures in a row during ramp", self._streak_hint)

    def ramp_admitted(self, generation: int) -> bool:
        """An attempt was admitted by the ramp (the caller's admission of ``generation``):
        young until it survives or is settled. Returns whether it counts (the ramp is on)."""
        if generation != self.generation or self._state is not State.RAMP:
            return False
        self._young += 1
        return True

    def survived(self, generation: int, *, free: int, now: float | None = None) -> bool:
        """An attempt :meth:`ramp_admitted` counted survived (capmon/core/control/survival.py):
        a slot more, unless ``ramp_lead`` of the ramp's requests are still young or ``free``
        (the ramp's slots not in use) is ``ramp_lead`` or more, or a capacity failure came in
        this ramp. Returns whether the share grew (a waiting request may go now). Like an
        answer's growth, a change a fleet's store hears by the step this process writes with
        its next call."""
        if now is None:
            now = self._clock.now()
        self._advance(now)
        if generation != self.generation or self._state is not State.RAMP:
            return False
        self._shown |= self._consecutive == 0  # admitted, and nothing refused since
        if self._young:
            self._young -= 1
        lead = self.config.ramp_lead
        if self._refused or self._young >= lead or free >= lead:
            return False  # refused: the model has no more room than the ramp found; answers grow it on
        self._share = ramp_grown(self._share, self._basis, slots=1.0)
        self._changes += 1
        self._report(now, f"requests survived: share grown to {self._share:.0%}")
        self._advance(now)
        return True

    def probe_survived(self, generation: int, *, basis: float, floor: float, now: float | None = None) -> bool:
        """The probe of ``generation`` survived (capmon/core/control/survival.py): the model
        admits again, a service time before the probe's answer can say so. It counts as the
        probe's success (its answer, when it comes, is stale); ``basis`` and ``floor`` as in
        :meth:`record`. Returns whether the breaker moved (to RAMP, or open for the next of
        ``half_open_probes``)."""
        if now is None:
            now = self._clock.now()
        self._advance(now)
        if generation != self.generation or self._state is not State.HALF_OPEN:
            return False
        self._probe_outcome(now, BreakerSignal.SUCCESS, None, basis, floor, admitted=True)
        return True

    def _streak(self, sent_at: float, hint: float | None) -> None:
        if self._consecutive == 0:
            self._streak_from = sent_at
        self._consecutive += 1
        self._streak_hint = _max_hint(self._streak_hint, hint)

    def _success(self, sent_at: float) -> bool:
        """Whether it says something about the model now (it ends a failure streak). OPEN:
        nothing is admitted, so nothing current arrives; FORCED_*: outcomes ignored."""
        if self._consecutive and sent_at < self._streak_from:
            return False  # sent before the streak began: it says nothing about the model now
        self._consecutive = 0
        self._streak_hint = None
        return True

    def _probe_outcome(
        self, now: float, signal: BreakerSignal, hint: float | None, basis: float, floor: float, admitted: bool = False
    ) -> None:
        if signal is BreakerSignal.SUCCESS:
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                how = "admitted (still out past the time a refusal takes)" if admitted else "succeeded"
                self._start_ramp(now, basis, floor, f"{self._probe_successes} probe(s) {how}")
            else:
                self._reopen(now, "probe succeeded; another is needed", hint, grow=False)
        elif signal is BreakerSignal.NEUTRAL:
            # The probe proved nothing either way (its key was refused, a bad request):
            # probe again after the same interval.
            self._reopen(now, "probe inconclusive", hint, grow=False)
        else:
            self._probes_failed += 1
            self._probe_successes = 0  # probes must succeed in a row
            self._reopen(now, f"probe failed ({signal.value})", hint, grow=True)

    # ------------------------------------------------------------ by hand

    def trip(self, reason: str = "tripped by hand") -> None:
        now = self._clock.now()
        self._advance(now)  # what time already decided comes first: the event names the right old state
        self._move(State.FORCED_OPEN, reason, now, manual=True)

    def force_close(self, reason: str = "closed by hand") -> None:
        now = self._clock.now()
        self._advance(now)
        self._move(State.FORCED_CLOSED, reason, now, manual=True)

    def reset(self, reason: str = "reset by hand") -> None:
        now = self._clock.now()
        self._advance(now)
        # A person judged the model healthy: forget the interval growth too.
        self._trips_in_a_row = 0
        self._move(State.CLOSED, reason, now, manual=True)

    # ------------------------------------------------------------ internals

    def _closed_failure(self, now: float, hint: float | None) -> None:
        cfg = self.config
        self._window.add(now, failed=True, hint=hint)
        if self._consecutive >= cfg.failure_threshold:
            self._trip(now, f"{self._consecutive} capacity failures in a row", self._streak_hint)
            return
        total, failed, window_hint = self._window.totals(now)
        if total >= cfg.ratio_min_requests and failed >= cfg.failure_ratio * total:
            self._trip(now, f"{failed} of {total} attempts failed for capacity in {cfg.ratio_window:g}s", window_hint)

    def _wait(self, now: float, interval: float, hint: float | None) -> float:
        # The server knows better than our schedule: never probe before its hint, on
        # demand neither.
        hint = min(hint, self.config.cooldown_max) if hint is not None else None
        self._hint_until = now + (hint or 0.0)
        return interval if hint is None else max(interval, hint)

    def _trip(self, now: float, reason: str, hint: float | None) -> None:
        cfg = self.config
        self._trips_in_a_row += 1
        self._total_trips += 1
        try:
            first = cfg.probe_interval * cfg.cooldown_multiplier ** (self._trips_in_a_row - 1)
        except OverflowError:  # many re-trips in a row: the cap applies anyway
            first = math.inf
        self._interval = max(0.0, min(first, cfg.cooldown))
        self._probes_failed = 0
        self._probe_successes = 0
        until = now + self._wait(now, self._interval, hint)
        log.info("breaker %s opened, first probe at %.1f: %s", self.target, until, reason)
        self._move(State.OPEN, reason, now, next_probe=until, keep_probe_state=True)

    def _reopen(self, now: float, reason: str, hint: float | None, *, grow: bool) -> None:
        cfg = self.config
        if grow:
            self._interval = min(cfg.cooldown, max(self._interval, 1e-3) * cfg.cooldown_multiplier)
        until = now + self._wait(now, self._interval, hint)
        self._move(State.OPEN, reason, now, next_probe=until, keep_probe_state=True)

    def _start_ramp(self, now: float, basis: float, floor: float, reason: str) -> None:
        self._ramp_from = now
        self._basis = max(1.0, basis)
        self._share = self._reported = ramp_opening(self.config.ramp_start, self._basis, floor)
        self._move(State.RAMP, reason, now)
        self._advance(now)  # a ramp that starts at 1.0 (or lasts 0 s) closes at once

    def _grow(self, now: float) -> None:
        """A clean answer: two slots' worth more (decisions.ramp_grown). Each is a change
        a fleet's store hears (the step rides on the settle that brought the answer); a
        RampStep is published per doubling, not per answer."""
        self._share = ramp_grown(self._share, self._basis)
        self._changes += 1
        self._report(now, f"clean round: share doubled to {self._share:.0%}")
        self._advance(now)

    def _report(self, now: float, reason: str) -> None:
        if self._share < 1.0 and self._share >= 2.0 * self._reported - 1e-9:
            self._reported = self._share
            self._emit_step(now, reason)

    def _ramp_share(self, now: float) -> float:
        cfg = self.config
        return ramp_share(now, self._ramp_from, self._share, cfg.ramp_start, cfg.ramp_duration)

    def _advance(self, now: float) -> None:
        """Apply the moves that time alone makes due."""
        if self._state is State.RAMP and self._ramp_share(now) >= 1.0:
            self._trips_in_a_row = 0  # fully recovered: the next trip starts from the first interval
            self._move(State.CLOSED, "ramp complete", now)

    def _emit_step(self, now: float, reason: str) -> None:
        self._emit(
            RampStep(
                at=now, wall=self._clock.wall(), target=self.target, model=self.model, share=self._share, reason=reason
            )
        )

    def _emit(self, event: Event) -> None:
        if self._publish is None:
            return
        try:
            self._publish(event)
        except Exception:  # a broken subscriber must never break the client
            log.exception("publishing %r failed", event)

    def _move(
        self,
        new: State,
        reason: str,
        now: float,
        *,
        manual: bool = False,
        next_probe: float | None = None,
        keep_probe_state: bool = False,
    ) -> None:
        old = self._state
        self._state = new
        self._reason = reason
        self.generation += 1  # everything admitted before this is now stale
        self._changes += 1
        self._consecutive = 0
        self._streak_hint = None
        self._window.clear()
        self._next_probe = next_probe
        self._young = 0
        self._shown = self._refused = False
        if not keep_probe_state:
            self._probes_failed = 0
            self._probe_successes = 0
            self._interval = self.config.probe_interval
        self._emit(
            BreakerChanged(
                at=now,
                wall=self._clock.wall(),
                target=self.target,
                model=self.model,
                old=old,
                new=new,
                reason=reason,
                manual=manual,
                cooldown_until=next_probe,
            )
        )
