"""Rolling per-target windows: requests, ok, 429, 503, other, latency.

Counts live in one-second buckets (a ring of five minutes), so recording is O(1)
and any window up to five minutes is a sum over its buckets. Latencies are kept
as a bounded sample per bucket, enough for p50 / p99 on a dashboard (nearest rank,
as ``capmon report`` computes them: capmon/core/base/text.py).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from capmon.core.base.text import percentile
from capmon.core.types.failure import Kind

HORIZON = 300  # seconds kept: the longest window
WINDOWS = (10, 60, 300)
_SAMPLES_PER_BUCKET = 64


class Outcome(enum.StrEnum):
    """Where an attempt counts on the dashboard."""

    OK = "ok"
    RATE_LIMITED = "rate_limited"  # 429s
    CAPACITY = "capacity"  # 503 / 529 and other capacity answers
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class WindowStats:
    seconds: int
    requests: int
    ok: int
    rate_limited: int  # 429s
    capacity: int  # 503 / 529 and other capacity answers
    other: int
    p50: float | None
    p99: float | None

    @property
    def errors(self) -> int:
        return self.rate_limited + self.capacity + self.other

    @property
    def error_share(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def per_minute(self, count: int) -> float:
        return count * 60.0 / self.seconds

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds


class _Bucket:
    __slots__ = ("second", "requests", "ok", "rate_limited", "capacity", "other", "latencies", "seen")

    def __init__(self, second: int) -> None:
        self.second = second
        self.requests = self.ok = self.rate_limited = self.capacity = self.other = 0
        self.latencies: list[float] = []
        self.seen = 0


class RollingStats:
    def __init__(self, rng: random.Random | None = None) -> None:
        self._buckets: list[_Bucket | None] = [None] * HORIZON
        self._rng = rng or random.Random(0)

    def _bucket(self, now: float) -> _Bucket:
        second = int(now)
        i = second % HORIZON
        b = self._buckets[i]
        if b is None or b.second != second:
            b = self._buckets[i] = _Bucket(second)
        return b

    def record_attempt(self, now: float, status: int | None, kind: Kind | None, latency: float) -> None:
        """One attempt, counted where the dashboard shows it: ok, 429s, 503s or other."""
        if kind is None:
            outcome = Outcome.OK
        elif status == 429 or kind is Kind.RATE_LIMITED:
            outcome = Outcome.RATE_LIMITED
        elif status in (503, 529) or kind is Kind.CAPACITY:
            outcome = Outcome.CAPACITY
        else:
            outcome = Outcome.OTHER
        self.record(now, outcome, latency)

    def record(self, now: float, outcome: Outcome, latency: float | None = None) -> None:
        b = self._bucket(now)
        b.requests += 1
        if outcome is Outcome.OK:
            b.ok += 1
        elif outcome is Outcome.RATE_LIMITED:
            b.rate_limited += 1
        elif outcome is Outcome.CAPACITY:
            b.capacity += 1
        else:
            b.other += 1
        if latency is not None and outcome is Outcome.OK:
            # Reservoir sampling keeps the per-bucket cost bounded under heavy load.
            b.seen += 1
            if len(b.latencies) < _SAMPLES_PER_BUCKET:
                b.latencies.append(latency)
            else:
                j = self._rng.randrange(b.seen)
                if j < _SAMPLES_PER_BUCKET:
                    b.latencies[j] = latency

    def _live(self, now: float, seconds: int) -> list[_Bucket]:
        # Walk only the slots in range: a snapshot reads several windows per target.
        top = int(now)
        out = []
        for second in range(top - min(seconds, HORIZON) + 1, top + 1):
            b = self._buckets[second % HORIZON]
            if b is not None and b.second == second:
                out.append(b)
        return out

    def window(self, now: float, seconds: int) -> WindowStats:
        live = self._live(now, seconds)
        lat = sorted(x for b in live for x in b.latencies)
        return WindowStats(
            seconds=seconds,
            requests=sum(b.requests for b in live),
            ok=sum(b.ok for b in live),
            rate_limited=sum(b.rate_limited for b in live),
            capacity=sum(b.capacity for b in live),
            other=sum(b.other for b in live),
            p50=percentile(lat, 0.50),
            p99=percentile(lat, 0.99),
        )

    def windows(self, now: float) -> tuple[WindowStats, ...]:
        return tuple(self.window(now, s) for s in WINDOWS)

    def spark(self, now: float, seconds: int = 120, points: int = 24) -> tuple[int, ...]:
        """429 + 503 counts in ``points`` equal slices of the last ``seconds``, oldest first."""
        width = max(1, seconds // points)
        start = int(now) - width * points + 1
        out = [0] * points
        for b in self._live(now, width * points):
            k = (b.second - start) // width
            if 0 <= k < points:
                out[k] += b.rate_limited + b.capacity
        return tuple(out)
