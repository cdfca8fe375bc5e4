"""Frozen snapshots of the client's state, for a UI or `capmon status` to render.

A dashboard renders tables from these on a timer rather than from events, so a
burst of events never turns into a burst of redraws (memray's live view works the
same way).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from capmon.core.types.config import EndpointApi, deployment_id
from capmon.core.types.failure import Kind
from capmon.core.types.states import KeyState, State
from capmon.core.types.stats import WindowStats


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    target: str
    model: str
    endpoint: str
    key_alias: str
    rank: int  # position in the preference order, 0 first
    state: State
    manual: bool
    consecutive_failures: int
    cooldown_until: float | None  # clock time of the next probe while open
    ramp_share: float | None
    trips: int
    breaker_reason: str
    limit: float
    in_flight: int
    key_state: KeyState
    key_until: float | None
    key_reason: str
    windows: tuple[WindowStats, ...]  # 10 s, 60 s, 5 min
    spark: tuple[int, ...]  # 429 + 503 over the last two minutes
    last_status: int | None
    last_kind: Kind | None
    probe_latency: float | None = None
    probe_interval: float | None = None  # while open or probing: the interval that led to the next probe
    probes_failed: int = 0
    ramp_slots: int | None = None  # while ramping: requests admitted at once
    capacity: int | None = None  # the concurrency the limiter learned; None until the first rejection
    token_param: str = "max_tokens"
    # The provider API of the target's endpoint. A snapshot from a gateway older than this
    # field has none: every endpoint then spoke OpenAI's wire.
    api: EndpointApi = EndpointApi.OPENAI
    # Why its endpoint cannot be reached, while its last attempt could not connect (the
    # failure's reason: the endpoint, its host and the cause); None while it is reachable.
    unreachable_reason: str | None = None
    # Its endpoint has never answered since the process started (with ``unreachable``: a
    # request does not wait for it; capmon/core/routing/reach.py).
    never_reached: bool = False
    # The id its endpoint knows the model by (its deployment's); "" from a source older than it
    deployment: str = ""
    # Features its provider said its model lacks at this deployment (capmon/core/providers/
    # capabilities.py, Learned): feature -> the provider's words; requests needing one skip it.
    lacks: Mapping[str, str] = field(default_factory=dict)

    def pinned_by(self, pinned: str | None) -> bool:
        """Whether a pin (``EngineSnapshot.pinned``: a model or one of its deployments) sends
        traffic here first."""
        return pinned is not None and pinned in (self.model, deployment_id(self.model, self.endpoint))

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


class LinkState(enum.StrEnum):
    OFF = "off"  # no shared store: this process is the whole client (backend "memory")
    OK = "ok"  # shared with the fleet
    DEGRADED = "degraded"  # the store is unreachable: running on local state, rejoining


@dataclass(frozen=True, slots=True)
class FleetProcess:
    """One live process of the fleet, as its heartbeat registered it."""

    id: str
    host: str
    pid: int
    role: str  # gateway | batch | dashboard | library
    in_flight: int
    started: float  # wall time
    seen: float  # wall time of its last heartbeat
    degraded: bool
    this: bool = False  # the process that made the snapshot


@dataclass(frozen=True, slots=True)
class SharedStatus:
    """Whether the state is shared with other processes (capmon/fleet), and with whom."""

    backend: str = "memory"  # memory | redis
    state: LinkState = LinkState.OFF
    since: float | None = None  # wall time the state began
    message: str = ""  # e.g. why it is degraded
    url: str = ""  # the store, password hidden: redis://***@host:port/db
    namespace: str = ""
    processes: tuple[FleetProcess, ...] = ()

    @property
    def label(self) -> str:
        """What a dashboard, ``/ready`` or ``status`` shows: ``shared state: degraded``."""
        return f"shared state: {self.state.value}"


@dataclass(frozen=True, slots=True)
class ModelSpend:
    """What one model's answers cost this process so far (capmon/core/types/prices.py)."""

    model: str
    cost: float  # USD over its priced answers
    answers: int  # its answers that told their usage
    unpriced: int  # of them, those without a price (no cost: never counted as free)


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
    shared: SharedStatus = field(default_factory=SharedStatus)
    cancelled: int = 0  # ended otherwise: the caller went away (a gateway's client hung up)
    spend: tuple[ModelSpend, ...] = ()  # per model that answered with usage, in the order they first did

    @property
    def spent(self) -> float | None:
        """USD over every priced answer so far; None while no answer had a price."""
        if not any(s.answers > s.unpriced for s in self.spend):
            return None
        return sum(s.cost for s in self.spend)

    @property
    def pinned_model(self) -> str | None:
        """The model pinned, itself or one of its deployments (``pinned`` names which)."""
        return next((t.model for t in self.targets if t.pinned_by(self.pinned)), None)

    @property
    def in_progress(self) -> int:
        """Requests neither succeeded, failed nor cancelled yet: the counts add up to ``requests``."""
        return max(0, self.requests - self.succeeded - self.failed - self.cancelled)

    def to_dict(self) -> dict[str, object]:
        from dataclasses import asdict

        return asdict(self)
