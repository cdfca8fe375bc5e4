"""A running job's progress: the counters of :class:`~capmon.core.types.events.BatchProgress`,
from what the writer committed and what the scheduler holds, and the recent rate.

Cheap and in memory: the runner asks for it on every tick and every commit (the counters
the job row carries are the ones the commit makes true).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

from capmon.batch.pacing import Window
from capmon.batch.states import JobState
from capmon.core.base.clock import Clock
from capmon.core.types import events as ev

RATE_SPAN = 30.0  # seconds of history behind the rate shown


@dataclass(frozen=True, slots=True)
class Counts:
    """What the meter is told, at one moment."""

    state: JobState
    total: int | None
    done: int
    failed: int
    parked: int
    in_flight: int
    per_model: tuple[tuple[str, int], ...]
    message: str = ""


class ProgressMeter:
    def __init__(self, job: str, clock: Clock, window: Window | None) -> None:
        self.job = job
        self.clock = clock
        self.window = window
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def sample(self, finished: int) -> None:
        """Note how many items are finished now (done or failed, committed)."""
        now = self.clock.now()
        self._samples.append((now, finished))
        while len(self._samples) > 2 and now - self._samples[0][0] > RATE_SPAN:
            self._samples.popleft()

    def rate(self) -> float:
        s = self._samples
        if len(s) < 2 or s[-1][0] - s[0][0] < 1.0:
            return 0.0
        return (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])

    def progress(self, c: Counts) -> ev.BatchProgress:
        now, wall = self.clock.now(), self.clock.wall()
        total = c.total
        pending = max(0, total - c.done - c.failed - c.parked - c.in_flight) if total is not None else 0
        rate = self.rate() if c.state is JobState.RUNNING else 0.0
        remaining = (total - c.done - c.failed) if total is not None else None
        eta = remaining / rate if rate > 0 and remaining is not None else None
        opens = self.window.opens_at(wall) if c.state is JobState.WAITING_WINDOW and self.window else None
        return ev.BatchProgress(
            at=now,
            wall=wall,
            job=self.job,
            total=total,
            done=c.done,
            failed=c.failed,
            parked=c.parked,
            pending=pending,
            in_flight=c.in_flight,
            per_model=c.per_model,
            rate=rate,
            eta=eta,
            state=c.state,
            opens_at=opens,
            message=c.message,
        )


def counters(p: ev.BatchProgress) -> dict[str, Any]:
    """A progress's counters as the job row keeps them (JSON)."""
    return {
        "done": p.done,
        "failed": p.failed,
        "parked": p.parked,
        "pending": p.pending,
        "in_flight": p.in_flight,
        "per_model": dict(p.per_model),
        "rate": round(p.rate, 3),
        "eta": None if p.eta is None else round(p.eta, 1),
        "opens_at": p.opens_at,
    }
