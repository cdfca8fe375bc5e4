"""Frozen snapshots of the client's state, for a UI or `capmon status` to render.

A dashboard renders tables from these on a timer rather than from events, so a
burst of events never turns into a burst of redraws (memray's live view works the
same way).
"""

from __future__ import annotations

from dataclasses import dataclass

from capmon.core.stats import WindowStats


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    target: str
    model: str
    endpoint: str
    key_alias: str
    rank: int  # position in the preference order, 0 first
    state: str  # closed | half-open | ramp | open | forced-open | forced-closed
    manual: bool
    consecutive_failures: int
    cooldown_until: float | None  # clock time
    ramp_share: float | None
    trips: int
    breaker_reason: str
    limit: float
    in_flight: int
    key_state: str  # ok | parked | disabled
    key_until: float | None
    key_reason: str
    windows: tuple[WindowStats, ...]  # 10 s, 60 s, 5 min
    spark: tuple[int, ...]  # 429 + 503 over the last two minutes
    last_status: int | None
    last_kind: str | None
    probe_latency: float | None = None

    def window(self, seconds: int) -> WindowStats:
        for w in self.windows:
            if w.seconds == seconds:
                return w
        raise KeyError(seconds)


@dataclass(frozen=True, slots=True)
class WaitingRetry:
    request_id: int
    item_id: str | None
    model: str | None  # None: whichever model admits first
    attempt: int
    max_attempts: int
    reason: str
    deadline: float  # clock time when it fires


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    now: float
    wall: float
    pinned: str | None
    targets: tuple[TargetSnapshot, ...]
    waiting: tuple[WaitingRetry, ...]
    queued: int  # requests waiting for any model to admit them
    in_flight: int
    requests: int
    succeeded: int
    failed: int
    events_published: int

    def to_dict(self) -> dict[str, object]:
        from dataclasses import asdict

        return asdict(self)
