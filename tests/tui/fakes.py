"""A scripted DashboardSource for Pilot tests, SVG snapshots, screenshots and the
load benchmark: snapshots built from plain numbers on a ManualClock, so every
rendering is the same on every machine and every run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from capmon.core.base.exceptions import CapmonError
from capmon.core.control.breaker import State
from capmon.core.control.seam import KeyState
from capmon.core.routing.targets import target_id
from capmon.core.types import events as ev
from capmon.core.types.config import EndpointApi
from capmon.core.types.events import BatchProgress, EventBus
from capmon.core.types.failure import Kind
from capmon.core.types.snapshot import (
    EngineSnapshot,
    FleetProcess,
    LinkState,
    ModelSpend,
    SharedStatus,
    TargetSnapshot,
    WaitingRetry,
)
from capmon.core.types.states import JobState
from capmon.core.types.stats import WindowStats
from capmon.tui.source import WorkerSpec, refuse_if_readonly
from tests.support.clocks import ManualClock

ZERO_SPARK = (0,) * 24


def window(
    seconds: int,
    rps: float,
    r429_min: float = 0,
    r503_min: float = 0,
    other_min: float = 0,
    p50: float | None = None,
    p99: float | None = None,
) -> WindowStats:
    requests = round(rps * seconds)
    per = seconds / 60
    r429, r503, other = round(r429_min * per), round(r503_min * per), round(other_min * per)
    return WindowStats(
        seconds=seconds,
        requests=max(requests, r429 + r503 + other),
        ok=max(0, requests - r429 - r503 - other),
        rate_limited=r429,
        capacity=r503,
        other=other,
        p50=p50,
        p99=p99,
    )


def target(
    model: str,
    rank: int,
    *,
    key: str = "sim-key",
    endpoint: str = "sim",
    state: str = "closed",
    fails: int = 0,
    cooldown_until: float | None = None,
    ramp_share: float | None = None,
    trips: int = 0,
    reason: str = "ready",
    limit: float = 8.0,
    in_flight: int = 0,
    rps: float = 0.0,
    r429_min: float = 0,
    r503_min: float = 0,
    other_min: float = 0,
    p50: float | None = None,
    p99: float | None = None,
    spark: Sequence[int] = ZERO_SPARK,
    key_state: str = "ok",
    key_until: float | None = None,
    key_reason: str = "",
    last_status: int | None = 200,
    probe_latency: float | None = None,
    api: str = "openai",
    deployment: str = "",
) -> TargetSnapshot:
    windows = tuple(window(s, rps, r429_min, r503_min, other_min, p50, p99) for s in (10, 60, 300))
    return TargetSnapshot(
        target=target_id(model, endpoint, key),
        model=model,
        endpoint=endpoint,
        key_alias=key,
        rank=rank,
        state=State(state),
        manual=State(state).manual,
        consecutive_failures=fails,
        cooldown_until=cooldown_until,
        ramp_share=ramp_share,
        trips=trips,
        breaker_reason=reason,
        limit=limit,
        in_flight=in_flight,
        key_state=KeyState(key_state),
        key_until=key_until,
        key_reason=key_reason,
        windows=windows,
        spark=tuple(spark),
        last_status=last_status,
        last_kind=None,
        probe_latency=probe_latency,
        api=EndpointApi(api),
        deployment=deployment,
    )


def progress(
    clock: ManualClock,
    *,
    job: str = "demo",
    total: int = 2000,
    done: int = 0,
    failed: int = 0,
    parked: int = 0,
    in_flight: int = 0,
    per_model: Iterable[tuple[str, int]] = (),
    rate: float = 0.0,
    eta: float | None = None,
    state: JobState | str = JobState.RUNNING,
) -> BatchProgress:
    pending = max(0, total - done - failed - parked - in_flight)
    return BatchProgress(
        at=clock.now(),
        wall=clock.wall(),
        job=job,
        total=total,
        done=done,
        failed=failed,
        parked=parked,
        pending=pending,
        in_flight=in_flight,
        per_model=tuple(per_model),
        rate=rate,
        eta=eta,
        state=JobState(state),
    )


class FakeSource:
    """Implements DashboardSource from scripted data. Manual actions change the
    scripted state and publish the events the real client would."""

    def __init__(
        self,
        targets: Sequence[TargetSnapshot],
        *,
        clock: ManualClock | None = None,
        waiting: Sequence[WaitingRetry] = (),
        batch: BatchProgress | None = None,
        pinned: str | None = None,
        readonly: bool = False,
        queued: int = 0,
        can_pause_batch: bool = True,
        description: str = "simulator demo · demo job",
        workers: Sequence[WorkerSpec] = (),
    ) -> None:
        self.clock = clock or ManualClock()
        self.bus = EventBus()
        self.readonly = readonly
        self.description = description
        self.targets = {t.target: t for t in targets}
        self.models = list(dict.fromkeys(t.model for t in sorted(targets, key=lambda t: t.rank)))
        self.waiting = tuple(waiting)
        self.pinned = pinned
        self.queued = queued
        self._batch = batch
        self._batch_paused = False
        self._can_pause_batch = can_pause_batch
        self._workers = list(workers)
        self.calls: list[tuple[str, Any]] = []
        self.shared = SharedStatus()  # what capmon/fleet reports; a test sets it to show the fleet
        self.spend: tuple[ModelSpend, ...] = ()  # what answers cost so far; a test sets it to show the spend
        self.pending: list[ev.Event] = []  # stamped earlier, published by flush_pending()
        self.started = self.stopped = False
        self.snapshots = 0

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.started = True

    def workers(self) -> list[WorkerSpec]:
        return self._workers

    async def stop(self) -> None:
        self.stopped = True

    # ------------------------------------------------------------ reading

    def snapshot(self) -> EngineSnapshot:
        self.snapshots += 1
        rows = tuple(sorted(self.targets.values(), key=lambda t: t.rank))
        in_flight = sum(t.in_flight for t in rows)
        return EngineSnapshot(
            now=self.clock.now(),
            wall=self.clock.wall(),
            pinned=self.pinned,
            targets=rows,
            waiting=tuple(sorted(self.waiting, key=lambda w: w.deadline)),
            queued=self.queued,
            in_flight=in_flight,
            requests=1234,
            succeeded=1180,
            failed=2,
            events_published=self.bus.published,
            shared=self.shared,
            spend=self.spend,
        )

    def batch(self) -> BatchProgress | None:
        if self._batch is not None and self._batch_paused:
            return dataclasses.replace(self._batch, state=JobState.PAUSED, in_flight=0)
        return self._batch

    @property
    def batch_paused(self) -> bool:
        return self._batch_paused

    @property
    def can_pause_batch(self) -> bool:
        return self._can_pause_batch and self._batch is not None

    # ------------------------------------------------------------ scripting

    def set_target(self, target_or_model: str, **changes: Any) -> None:
        for t in self._select(target_or_model):
            self.targets[t.target] = dataclasses.replace(t, **changes)

    def emit(self, cls: type[ev.Event], **fields: Any) -> ev.Event:
        event = cls(at=self.clock.now(), wall=self.clock.wall(), **fields)
        self.bus.publish(event)
        return event

    def later(self, cls: type[ev.Event], **fields: Any) -> None:
        """An event stamped now and published when the test calls flush_pending()
        (after the app has mounted, so it arrives live: log lines and toasts)."""
        self.pending.append(cls(at=self.clock.now(), wall=self.clock.wall(), **fields))

    def flush_pending(self) -> None:
        events, self.pending = self.pending, []
        for e in events:
            self.bus.publish(e)

    def _select(self, name: str) -> list[TargetSnapshot]:
        found = [t for t in self.targets.values() if name == t.target or t.pinned_by(name)]
        if not found:
            raise CapmonError(f"no model or target named {name!r}")
        return found

    def _move(self, name: str, new: State, reason: str) -> None:
        for t in self._select(name):
            self.targets[t.target] = dataclasses.replace(
                t,
                state=new,
                manual=new.manual,
                cooldown_until=None,
                ramp_share=None,
                breaker_reason=reason,
                consecutive_failures=0,
            )
            # Events carry the state's value, as the breaker publishes them.
            self.emit(
                ev.BreakerChanged,
                target=t.target,
                model=t.model,
                old=t.state.value,
                new=new.value,
                reason=reason,
                manual=True,
                cooldown_until=None,
            )

    # ------------------------------------------------------------ manual actions

    @refuse_if_readonly
    def pin(self, model: str | None) -> None:
        self.calls.append(("pin", model))
        if model is not None and not any(t.pinned_by(model) for t in self.targets.values()):
            raise CapmonError(f"no model or deployment named {model!r}")
        self.pinned = model
        self.emit(ev.ModelPinned, model=model)

    @refuse_if_readonly
    def trip(self, target: str) -> None:
        self.calls.append(("trip", target))
        self._move(target, State.FORCED_OPEN, "tripped by hand")

    @refuse_if_readonly
    def reset(self, target: str) -> None:
        self.calls.append(("reset", target))
        self._move(target, State.CLOSED, "reset by hand")
        for t in self._select(target):
            self.targets[t.target] = dataclasses.replace(
                self.targets[t.target], manual=False, key_state=KeyState.OK, key_until=None, key_reason=""
            )

    @refuse_if_readonly
    def force_close(self, target: str) -> None:
        self.calls.append(("force_close", target))
        self._move(target, State.FORCED_CLOSED, "closed by hand")

    @refuse_if_readonly
    def pause_batch(self) -> None:
        self.calls.append(("pause_batch", None))
        self._batch_paused = True

    @refuse_if_readonly
    def resume_batch(self) -> None:
        self.calls.append(("resume_batch", None))
        self._batch_paused = False


# ---------------------------------------------------------------- scenarios


def steady(*, readonly: bool = False) -> FakeSource:
    """Everything closed, the demo job a third done."""
    clock = ManualClock()
    targets = [
        target(
            "flagship",
            0,
            rps=3.4,
            p50=1.31,
            p99=1.92,
            in_flight=6,
            limit=7,
            probe_latency=1.27,
            spark=(0,) * 20 + (0, 1, 0, 0),
        ),
        target(
            "claude",
            1,
            api="anthropic",
            rps=2.9,
            p50=0.96,
            p99=1.48,
            in_flight=4,
            limit=8,
            probe_latency=0.93,
            spark=(0,) * 22 + (1, 0),
        ),
        target(
            "medium",
            2,
            rps=6.8,
            r429_min=2,
            p50=0.74,
            p99=1.12,
            in_flight=10,
            limit=11,
            probe_latency=0.71,
            spark=(0,) * 14 + (1, 0, 0, 2, 0, 0, 0, 1, 0, 0),
        ),
        target("small", 3, rps=4.1, p50=0.41, p99=0.63, in_flight=8, limit=16, probe_latency=0.40),
    ]
    batch = progress(
        clock,
        done=648,
        failed=1,
        in_flight=24,
        per_model=[("flagship", 301), ("claude", 98), ("medium", 182), ("small", 67)],
        rate=14.3,
        eta=92.0,
    )
    source = FakeSource(targets, clock=clock, batch=batch, readonly=readonly)
    source.emit(ev.Notice, level="info", message="demo job started: 2,000 items through 4 models")
    apis = {t.model: str(t.api) for t in targets}
    history = [
        (1.6, "flagship", "claude", 6, "503 server_is_overloaded: The engine is currently overloaded"),
        (2.3, "medium", "small", 2, "429 rate_limit_exceeded: Rate limit reached for sim-medium"),
        (4.1, "flagship", "claude", 3, "503 server_is_overloaded: The engine is currently overloaded"),
        (9.4, "claude", "medium", 1, "529 overloaded_error: Overloaded"),
    ]
    for at, a, b, n, reason in history:
        clock.advance(at - (clock.now() - 1000.0))
        for i in range(n):
            source.emit(
                ev.FellBack,
                request_id=i,
                item_id=None,
                from_model=a,
                to_model=b,
                reason=reason,
                from_api=apis[a],
                to_api=apis[b],
            )
        if at == 4.1:
            clock.advance(1.0)
            source.emit(ev.ModelPinned, model="small")
            clock.advance(2.0)
            source.emit(ev.ModelPinned, model=None)
    clock.advance(12.0 - (clock.now() - 1000.0))
    return source


def outage() -> FakeSource:
    """Flagship's breaker open and counting down, retries waiting; call
    flush_pending() after mount for the trip, the fallbacks and the toast."""
    clock = ManualClock()
    source = FakeSource([], clock=clock)
    source.emit(ev.Notice, level="info", message="demo job started: 2,000 items through 4 models")
    clock.advance(20.3)
    flagship = target_id("flagship", "sim", "sim-key")
    source.later(
        ev.BreakerChanged,
        target=flagship,
        model="flagship",
        old="closed",
        new="open",
        reason="3 capacity failures in a row",
        manual=False,
        cooldown_until=clock.now() + 20.0,
    )
    apis = {"flagship": "openai", "claude": "anthropic", "medium": "openai"}
    moves = [
        (37, 100, "flagship", "claude", "Selected model is at capacity. Please try a different model.", 0.6),
        (9, 150, "claude", "medium", "529 overloaded_error: Overloaded", 0.4),
        (12, 200, "medium", "small", "Rate limit reached for requests", 0.0),
    ]
    for count, first, a, b, reason, then in moves:
        for n in range(first, first + count):
            source.later(
                ev.FellBack,
                request_id=n,
                item_id=f"item-{n:05d}",
                from_model=a,
                to_model=b,
                reason=reason,
                from_api=apis[a],
                to_api=apis.get(b, "openai"),
            )
        clock.advance(then)
    source.later(
        ev.KeyParked,
        target=target_id("medium", "sim", "backup-key"),
        model="medium",
        key_alias="backup-key",
        kind=Kind.QUOTA,
        until=clock.now() + 3600,
        reason="You exceeded your current quota",
    )
    clock.advance(2.0)
    source.later(
        ev.BreakerChanged,
        target=flagship,
        model="flagship",
        old="open",
        new="half-open",
        reason="probing (interval 2s)",
        manual=False,
        cooldown_until=None,
    )
    source.later(
        ev.ProbeFinished,
        target=flagship,
        model="flagship",
        ok=False,
        status=503,
        kind="capacity",
        latency=0.05,
        reason="Selected model is at capacity. Please try a different model.",
        next_probe_at=clock.now() + 16.7,
    )
    source.later(
        ev.BreakerChanged,
        target=flagship,
        model="flagship",
        old="half-open",
        new="open",
        reason="probe failed (capacity)",
        manual=False,
        cooldown_until=clock.now() + 16.7,
    )
    clock.advance(2.5)
    now = clock.now()
    source.targets = {
        t.target: t
        for t in [
            target(
                "flagship",
                0,
                state="open",
                fails=3,
                trips=1,
                cooldown_until=now + 14.2,
                reason="probe failed (capacity)",
                limit=2,
                in_flight=0,
                rps=1.4,
                r503_min=84,
                p50=1.28,
                p99=1.85,
                last_status=503,
                probe_latency=0.05,
                spark=(0,) * 18 + (0, 0, 4, 19, 31, 12),
            ),
            target(
                "claude",
                1,
                api="anthropic",
                rps=6.1,
                r503_min=9,
                p50=0.98,
                p99=1.71,
                in_flight=8,
                limit=8,
                last_status=200,
                probe_latency=0.91,
                spark=(0,) * 20 + (1, 2, 4, 2),
            ),
            target(
                "medium",
                2,
                rps=9.6,
                r429_min=41,
                p50=0.81,
                p99=1.64,
                in_flight=10,
                limit=10,
                last_status=429,
                probe_latency=0.77,
                spark=(0,) * 19 + (1, 3, 9, 14, 11),
            ),
            target(
                "medium",
                2,
                key="backup-key",
                rps=0.0,
                in_flight=0,
                limit=8,
                last_status=429,
                key_state="parked",
                key_until=now + 3594.5,
                key_reason="You exceeded your current quota",
                probe_latency=None,
            ),
            target(
                "small",
                3,
                rps=7.2,
                r503_min=3,
                p50=0.44,
                p99=0.71,
                in_flight=14,
                limit=18,
                probe_latency=0.42,
                spark=(0,) * 21 + (0, 1, 2),
            ),
        ]
    }
    source.models = ["flagship", "claude", "medium", "small"]
    source.waiting = tuple(
        WaitingRetry(
            request_id=300 + i,
            item_id=f"item-{310 + i * 7:05d}",
            model=model,
            attempt=attempt,
            max_attempts=50,
            reason=reason,
            deadline=now + wait,
        )
        for i, (model, attempt, reason, wait) in enumerate(
            [
                ("medium", 2, "429 rate_limit_exceeded: try again in 1.5s", 1.9),
                (None, 3, "Selected model is at capacity. Please try a different model.", 2.7),
                ("medium", 3, "429 rate_limit_exceeded: try again in 1.5s", 3.4),
                (None, 2, "every model is busy: waiting for a free slot", 4.8),
                ("medium", 4, "429 rate_limit_exceeded: try again in 1.5s", 6.1),
                (None, 4, "Selected model is at capacity. Please try a different model.", 9.6),
            ]
        )
    )
    source.queued = 3
    source._batch = progress(
        clock,
        done=912,
        failed=1,
        parked=4,
        in_flight=24,
        per_model=[("flagship", 388), ("claude", 214), ("medium", 223), ("small", 87)],
        rate=9.8,
        eta=109.0,
    )
    # What the answers cost so far, at the demo config's prices (USD per million tokens)
    source.spend = (
        ModelSpend("flagship", 0.7372, 388, 0),
        ModelSpend("claude", 0.5136, 214, 0),
        ModelSpend("medium", 0.0571, 223, 0),
        ModelSpend("small", 0.0035, 87, 0),
    )
    return source


def trip_event(source: FakeSource, model: str = "flagship", cooldown: float = 20.0) -> None:
    """Publish an automatic trip (as the breaker would): drives the log and a toast."""
    t = source._select(model)[0]
    source.emit(
        ev.BreakerChanged,
        target=t.target,
        model=t.model,
        old="closed",
        new="open",
        reason="3 capacity failures in a row",
        manual=False,
        cooldown_until=source.clock.now() + cooldown,
    )


def fleet(*, degraded: bool = False) -> FakeSource:
    """Steady, on a state shared with two other processes (a gateway, a batch worker);
    ``degraded``: Redis was lost 12 s ago and each runs on its own state."""
    source = steady()
    wall = source.clock.wall()
    procs = (
        FleetProcess("p1", "api-1", 4121, "dashboard", 0, wall - 300, wall, degraded, this=True),
        FleetProcess("p2", "api-1", 4188, "gateway", 23, wall - 3600, wall - 0.4, degraded),
        FleetProcess("p3", "batch-7", 917, "batch", 12, wall - 900, wall - 0.2, degraded),
    )
    state = LinkState.DEGRADED if degraded else LinkState.OK
    message = "shared state: Redis at redis://10.0.0.5:6379/0 lost (Connection refused); running on local state"
    source.shared = SharedStatus(
        "redis",
        state,
        wall - 12 if degraded else wall - 300,
        message if degraded else "",
        "redis://10.0.0.5:6379/0",
        "capmon",
        procs,
    )
    return source
