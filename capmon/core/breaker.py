"""A circuit breaker per target (one model at one endpoint with one key).

States and how they move (see DESIGN.md, "Breaker")::

    CLOSED --N capacity failures in a row, or a failure ratio over a window--> OPEN
    OPEN --cool-down over (checked lazily on the next call)--> HALF_OPEN
    HALF_OPEN --half_open_probes probes succeeded--> RAMP
    HALF_OPEN --a probe failed (capacity or transient)--> OPEN (longer cool-down)
    RAMP --the admitted share reached 1.0--> CLOSED (cool-down growth forgotten)
    RAMP --a capacity failure--> OPEN (longer cool-down)
    any --trip()--> FORCED_OPEN;  any --force_close()--> FORCED_CLOSED;  any --reset()--> CLOSED

There are no timers: time-driven moves (cool-down over, ramp complete) are applied
lazily from ``clock.now()`` whenever the breaker is asked anything, so a
fast-forwarded clock (looptime) moves the breaker with it.

Every attempt holds an :class:`Admission` and reports exactly one outcome:

* ``on_success(adm)``: the model answered.
* ``on_failure(adm, capacity=True, hint=...)``: a capacity error (503 / 529, "at
  capacity"). Counts toward tripping; ``hint`` (seconds, from retry-after and the
  like) is a floor for the cool-down.
* ``on_failure(adm, capacity=False)``: a transient error (timeout, connection error,
  500 / 502 / 504). It says nothing about capacity, so it never trips a CLOSED
  breaker and is ignored during the RAMP; but in HALF_OPEN the probe did not show
  that the model recovered, so it re-opens the breaker.
* ``release(adm)``: an outcome that says nothing about the model at all (auth, quota,
  bad_request, too_large, rate_limited, or the caller gave up). It only frees a
  half-open probe slot.

Each state change starts a new *generation*. Outcomes of admissions taken in an
earlier generation are stale and ignored, so a late success from before a trip can
never close an open breaker, and a late failure from before a reset cannot trip it.

The breaker is not thread-safe: use it from the thread that runs the event loop
(``LoopClock`` reads that loop's time anyway).
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from capmon.core.clock import Clock
from capmon.core.config import BreakerConfig
from capmon.core.events import BreakerChanged, Event

log = logging.getLogger("capmon.breaker")


class State(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"
    RAMP = "ramp"
    FORCED_OPEN = "forced-open"
    FORCED_CLOSED = "forced-closed"

    @property
    def manual(self) -> bool:
        return self in (State.FORCED_OPEN, State.FORCED_CLOSED)


@dataclass(frozen=True, slots=True)
class BreakerView:
    """What a snapshot or the dashboard shows about one breaker."""

    state: State
    manual: bool
    consecutive_failures: int
    cooldown_until: float | None  # clock time; set only while OPEN
    ramp_share: float | None  # share of traffic admitted; set only while RAMP
    trips: int  # trips in a row since the last full recovery (drives the cool-down growth)
    reason: str  # why it is in this state
    probes_in_flight: int
    total_trips: int = 0  # every automatic trip since the breaker was made


@dataclass(eq=False, slots=True)
class Admission:
    """The right to make one attempt. Report exactly one outcome for it; a second
    report for the same admission is ignored."""

    generation: int
    state: State  # the state that admitted it
    probe: bool  # a half-open probe: holds one of the half_open_probes slots
    at: float
    settled: bool = False


def _clean_hint(hint: float | None) -> float | None:
    # A garbage hint (negative, NaN, infinite) is ignored rather than trusted: an
    # infinite cool-down would disable the model until someone resets it by hand.
    if hint is None or not math.isfinite(hint) or hint < 0:
        return None
    return float(hint)


def _max_hint(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


class _Window:
    """Successes and capacity failures over the last ``span`` seconds.

    Counted in ``slices`` time slices rather than one entry per outcome, so memory
    stays small at any request rate; the window's far edge is therefore exact to
    one slice (1 s with the default 60 s window).
    """

    def __init__(self, span: float, slices: int = 60) -> None:
        self.span = span
        self.width = span / slices
        # [slice index, successes, failures, max hint among the failures]
        self._slices: deque[list] = deque()

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
            self._slices.append([current, 0, 0, None])
        s = self._slices[-1]
        if failed:
            s[2] += 1
            s[3] = _max_hint(s[3], hint)
        else:
            s[1] += 1

    def totals(self, now: float) -> tuple[int, int, float | None]:
        """(outcomes, failures, max hint) over the window."""
        self._prune(now)
        ok = failed = 0
        hint: float | None = None
        for _, s_ok, s_failed, s_hint in self._slices:
            ok += s_ok
            failed += s_failed
            hint = _max_hint(hint, s_hint)
        return ok + failed, failed, hint


class CircuitBreaker:
    def __init__(
        self,
        target: str,
        model: str,
        config: BreakerConfig,
        clock: Clock,
        publish: Callable[[Event], None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.target = target
        self.model = model
        self.config = config
        self._clock = clock
        self._publish = publish
        # Injectable so tests can check the ramp's admitted share deterministically.
        self._rng = rng or random.Random()

        self._state = State.CLOSED
        self._reason = "ready"
        self._generation = 0
        # Survive generations: they make each re-trip's cool-down longer.
        self._trips_in_a_row = 0
        self._total_trips = 0
        # Per generation: cleared on every state change.
        self._consecutive = 0
        self._streak_hint: float | None = None
        self._window = _Window(config.ratio_window)
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._cooldown_until: float | None = None
        self._ramp_from = 0.0

    # ------------------------------------------------------------ reading

    @property
    def state(self) -> State:
        self._advance(self._clock.now())
        return self._state

    def view(self) -> BreakerView:
        now = self._clock.now()
        self._advance(now)
        return BreakerView(
            state=self._state,
            manual=self._state.manual,
            consecutive_failures=self._consecutive,
            cooldown_until=self._cooldown_until if self._state is State.OPEN else None,
            ramp_share=self._ramp_share(now) if self._state is State.RAMP else None,
            trips=self._trips_in_a_row,
            reason=self._reason,
            probes_in_flight=self._probes_in_flight if self._state is State.HALF_OPEN else 0,
            total_trips=self._total_trips,
        )

    def would_admit(self) -> bool:
        """Whether ``admit()`` could admit now, without taking a probe slot or a
        random draw. In RAMP this is "maybe" (True while the share is above 0).
        Due time-driven moves (cool-down over, ramp complete) are applied first."""
        now = self._clock.now()
        self._advance(now)
        s = self._state
        if s in (State.CLOSED, State.FORCED_CLOSED):
            return True
        if s is State.HALF_OPEN:
            return self._probes_in_flight < self.config.half_open_probes
        if s is State.RAMP:
            return self._ramp_share(now) > 0.0
        return False

    def next_admit_at(self) -> float | None:
        """Clock time when an OPEN breaker's cool-down ends; None otherwise (it admits
        now, or it is waiting on something that has no time: a probe, a person)."""
        self._advance(self._clock.now())
        return self._cooldown_until if self._state is State.OPEN else None

    # ------------------------------------------------------------ attempts

    def admit(self) -> Admission | None:
        """An admission for one attempt, or None if this target takes nothing now."""
        now = self._clock.now()
        self._advance(now)
        s = self._state
        if s in (State.CLOSED, State.FORCED_CLOSED):
            return Admission(self._generation, s, probe=False, at=now)
        if s is State.HALF_OPEN:
            if self._probes_in_flight >= self.config.half_open_probes:
                return None
            self._probes_in_flight += 1
            return Admission(self._generation, s, probe=True, at=now)
        if s is State.RAMP:
            if self._rng.random() < self._ramp_share(now):
                return Admission(self._generation, s, probe=False, at=now)
            return None
        return None  # OPEN, FORCED_OPEN

    def on_success(self, adm: Admission) -> None:
        now = self._clock.now()
        if not self._settle(adm, now):
            return
        if self._state is State.CLOSED:
            self._consecutive = 0
            self._streak_hint = None
            self._window.add(now, failed=False)
        elif self._state is State.HALF_OPEN:
            self._probes_in_flight -= 1
            self._probe_successes += 1
            if self._probe_successes >= self.config.half_open_probes:
                self._ramp_from = now
                self._move(State.RAMP, f"{self._probe_successes} probe(s) succeeded", now)
                self._advance(now)  # a zero-length ramp closes at once
        elif self._state is State.RAMP:
            # The ramp's progress depends on time only; a success ends a failure streak.
            self._consecutive = 0
            self._streak_hint = None
        # FORCED_CLOSED: ignores outcomes.

    def on_failure(self, adm: Admission, capacity: bool = True, hint: float | None = None) -> None:
        """``capacity=True`` for a capacity error, False for a transient one (see the
        module docstring). ``hint`` is the server's retry-after in seconds."""
        now = self._clock.now()
        if not self._settle(adm, now):
            return
        hint = _clean_hint(hint)
        s = self._state
        if s is State.CLOSED:
            if capacity:
                self._closed_failure(now, hint)
        elif s is State.HALF_OPEN:
            self._probes_in_flight -= 1
            what = "capacity" if capacity else "transient error"
            self._trip(now, f"probe failed ({what})", hint)
        elif s is State.RAMP:
            # The ramp counts failures as the closed state does: a recovering model
            # that is merely full for a moment (a limit probing one above its slots)
            # must not be sent back for a doubled cool-down; one that is still down
            # fails again at once and trips.
            if capacity:
                self._consecutive += 1
                self._streak_hint = _max_hint(self._streak_hint, hint)
                if self._consecutive >= self.config.failure_threshold:
                    self._trip(now, f"{self._consecutive} capacity failures in a row during ramp", self._streak_hint)

    def release(self, adm: Admission) -> None:
        """End an attempt whose outcome says nothing about the model's capacity."""
        now = self._clock.now()
        if not self._settle(adm, now):
            return
        if self._state is State.HALF_OPEN:
            self._probes_in_flight -= 1

    # ------------------------------------------------------------ by hand

    def trip(self, reason: str = "tripped by hand") -> None:
        self._move(State.FORCED_OPEN, reason, self._clock.now(), manual=True)

    def force_close(self, reason: str = "closed by hand") -> None:
        self._move(State.FORCED_CLOSED, reason, self._clock.now(), manual=True)

    def reset(self, reason: str = "reset by hand") -> None:
        # A person judged the model healthy: forget the cool-down growth too.
        self._trips_in_a_row = 0
        self._move(State.CLOSED, reason, self._clock.now(), manual=True)

    # ------------------------------------------------------------ internals

    def _settle(self, adm: Admission, now: float) -> bool:
        """Mark ``adm`` as reported; True if its outcome should count."""
        if adm.settled:
            return False
        adm.settled = True
        # Apply due moves first: a failure that arrives after the ramp has run its
        # course belongs to the ramp's generation, which is over, so it is stale.
        self._advance(now)
        return adm.generation == self._generation

    def _closed_failure(self, now: float, hint: float | None) -> None:
        cfg = self.config
        self._consecutive += 1
        self._streak_hint = _max_hint(self._streak_hint, hint)
        self._window.add(now, failed=True, hint=hint)
        if self._consecutive >= cfg.failure_threshold:
            self._trip(now, f"{self._consecutive} capacity failures in a row", self._streak_hint)
            return
        total, failed, window_hint = self._window.totals(now)
        if total >= cfg.ratio_min_requests and failed >= cfg.failure_ratio * total:
            self._trip(
                now,
                f"{failed} of {total} attempts failed for capacity in {cfg.ratio_window:g}s",
                window_hint,
            )

    def _cooldown(self, hint: float | None) -> float:
        cfg = self.config
        try:
            grown = cfg.cooldown * cfg.cooldown_multiplier ** (self._trips_in_a_row - 1)
        except OverflowError:  # many re-trips in a row: the cap applies anyway
            grown = math.inf
        seconds = min(grown, cfg.cooldown_max)
        # The server knows better than our schedule: never probe before its hint.
        return seconds if hint is None else max(seconds, hint)

    def _trip(self, now: float, reason: str, hint: float | None) -> None:
        self._trips_in_a_row += 1
        self._total_trips += 1
        until = now + self._cooldown(hint)
        log.info("breaker %s opened until %.1f: %s", self.target, until, reason)
        self._move(State.OPEN, reason, now, cooldown_until=until)

    def _ramp_share(self, now: float) -> float:
        cfg = self.config
        if cfg.ramp_duration <= 0:
            return 1.0
        progress = (now - self._ramp_from) / cfg.ramp_duration
        return min(1.0, max(0.0, cfg.ramp_start + (1.0 - cfg.ramp_start) * progress))

    def _advance(self, now: float) -> None:
        """Apply the moves that time alone makes due."""
        if self._state is State.OPEN and self._cooldown_until is not None and now >= self._cooldown_until:
            self._move(State.HALF_OPEN, "cool-down over", now)
        if self._state is State.RAMP and self._ramp_share(now) >= 1.0:
            self._trips_in_a_row = 0  # fully recovered: the next trip starts from the base cool-down
            self._move(State.CLOSED, "ramp complete", now)

    def _move(
        self,
        new: State,
        reason: str,
        now: float,
        *,
        manual: bool = False,
        cooldown_until: float | None = None,
    ) -> None:
        old = self._state
        self._state = new
        self._reason = reason
        self._generation += 1  # everything admitted before this is now stale
        self._consecutive = 0
        self._streak_hint = None
        self._window.clear()
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._cooldown_until = cooldown_until
        if self._publish is None:
            return
        event = BreakerChanged(
            at=now,
            wall=self._clock.wall(),
            target=self.target,
            model=self.model,
            old=old.value,
            new=new.value,
            reason=reason,
            manual=manual,
            cooldown_until=cooldown_until,
        )
        try:
            self._publish(event)
        except Exception:  # a broken subscriber must never break the client
            log.exception("publishing %r failed", event)
