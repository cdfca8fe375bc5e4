"""The states the core's events and snapshots name: a breaker's (:class:`State`) and a
batch job's (:class:`JobState`).

A module of their own, below ``events.py`` (whose ``BreakerChanged`` and ``BatchProgress``
carry them, and which ``breaker.py`` imports) and below the batch layer. ``breaker.State``
and ``batch.states.JobState`` are these same classes.

str enums: they are written to JSON, SQLite and Redis as their values and compare equal
to them, so the stored and printed forms are what they always were ("half-open",
"waiting-window"); readers turn them back into members at the edge (core/types/serial.py,
capmon/fleet/codec.py, the job store).
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """A breaker's state (core/control/breaker.py moves it; ARCHITECTURE.md, "The breaker")."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"
    RAMP = "ramp"
    FORCED_OPEN = "forced-open"
    FORCED_CLOSED = "forced-closed"

    @property
    def manual(self) -> bool:
        return self in (State.FORCED_OPEN, State.FORCED_CLOSED)

    @property
    def admits(self) -> bool:
        """Whether user requests may be admitted in this state (RAMP: up to its share)."""
        return self in (State.CLOSED, State.FORCED_CLOSED, State.RAMP)


class KeyState(enum.StrEnum):
    """A key's standing on a target (capmon/core/control/decisions.py moves it)."""

    OK = "ok"
    PARKED = "parked"  # quota: until a time
    DISABLED = "disabled"  # auth: until reset by hand


class JobState(enum.StrEnum):
    """A batch job's state (capmon/batch), as its store keeps it and ``BatchProgress`` reports it."""

    STARTING = "starting"  # a runner made, nothing opened yet
    INGESTING = "ingesting"  # reading the input; an ingest cut short stays here and goes on
    READY = "ready"  # read whole, not run yet
    RUNNING = "running"
    PAUSED = "paused"  # by hand, or while results cannot be saved
    WAITING_WINDOW = "waiting-window"  # outside the daily --window
    STOPPED = "stopped"  # cancelled, or its process is gone
    HALTED = "halted"  # a key or a quota stopped it, or saving failed for too long: the message says what to fix
    FINISHED = "finished"

    @property
    def live(self) -> bool:
        """A runner says it holds the job (whether it still does, its lease tells)."""
        return self in _LIVE


_LIVE = frozenset({JobState.RUNNING, JobState.PAUSED, JobState.WAITING_WINDOW})
