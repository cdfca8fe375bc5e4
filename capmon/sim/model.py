"""The simulator's state: slots, schedules, penalties, faults and counters. Pure: no web
framework, time only from the injected :class:`~capmon.core.base.clock.Clock`.

A request that finds no free slot on its model is rejected at once (it is never queued):
that is what a provider at capacity does, and what the client must cope with.

Precedence of what a model looks like right now: an admin outage, then admin overrides,
then the scenario's schedule phase in force, then the model's own values.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.hints import MAX_HINT
from capmon.sim.dialects import CAPACITY_DIALECTS, UNSUPPORTED_DIALECTS, Api, Wire, serves
from capmon.sim.faults import FaultInjector, FaultMode, FaultRule
from capmon.sim.scenario import (
    ANY_KEY,
    MAX_LATENCY_FACTOR,
    NO_TOOLS,
    STREAM_STYLES,
    TOKEN_PARAMS,
    TOOL_MODES,
    ModelSpec,
    Phase,
    Scenario,
)
from capmon.sim.usage import HONEST, USAGE_MODES

# Per-key counters are kept for at most this many keys; beyond it (only possible with
# keys = ["*"]) new keys share one bucket so a key-spraying client cannot grow memory.
MAX_KEY_BUCKETS = 256
OTHER_KEYS = "key-other"
INVALID_KEY = "key-invalid"


def key_alias(key: str) -> str:
    """How a key is shown in stats: a short hash, never the key itself."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class ModelState:
    """What a model looks like right now."""

    name: str
    slots: int
    in_flight: int
    latency_factor: float
    dialect: str
    hint: float | None
    phase: int | None  # index of the schedule phase in force; None before the first
    outage_for: float  # seconds left of an admin outage, 0 when none
    overrides: tuple[str, ...]  # admin overrides in force
    stream_style: str = "openai"
    tools: str = "auto"
    token_param: str = "max_tokens"
    unsupported_dialect: str = "openai"
    api: str = "openai"  # the wire(s) it is served on
    context_window: int = 0
    usage: str = HONEST  # how its answers report the tokens used (capmon/sim/usage.py)
    prefill: bool = True  # takes an assistant prefill (false: Anthropic's 400 for one)
    labels: tuple[str, ...] = ()  # its classify labels (capmon/sim/labels.py)
    disagree: float = 0.0

    @property
    def free(self) -> int:
        return max(0, self.slots - self.in_flight)


@dataclass(frozen=True)
class Ticket:
    """An admitted request: what to answer and how long to take. Holds a slot until released."""

    id: int
    model: str
    key: str  # alias
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop", or "length" when max_tokens cut the answer short
    first_token: float  # seconds to the first token
    per_token: float  # seconds per completion token after that
    usage: str = HONEST  # how the answer reports the tokens used (capmon/sim/usage.py)
    resume: str | None = None  # the partial answer it goes on with (capmon/sim/resume.py)
    structured: str | None = None  # the JSON document it answers, not prose (capmon/sim/structured.py)

    @property
    def service_time(self) -> float:
        return self.first_token + self.per_token * self.completion_tokens


@dataclass(frozen=True)
class Admitted:
    ticket: Ticket


@dataclass(frozen=True)
class NoCapacity:
    state: ModelState


@dataclass(frozen=True)
class Penalised:
    remaining: float


@dataclass(frozen=True)
class UnknownModel:
    model: str


@dataclass(frozen=True)
class TooLong:
    context_window: int
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Unsupported:
    """The request sent a parameter this model refuses (``param``; ``instead`` is the one it
    takes, "" for a feature it has not at all: tools to a model with ``tools = "none"``)."""

    param: str
    instead: str
    dialect: str


@dataclass(frozen=True)
class Faulted:
    rule: FaultRule
    ticket: Ticket  # timing and content for the broken answer; holds no slot
    state: ModelState  # the model as it was, for the stream's shape

    @property
    def mode(self) -> FaultMode:
        return self.rule.mode


Decision = Admitted | NoCapacity | Penalised | UnknownModel | TooLong | Unsupported | Faulted


class _Counters:
    __slots__ = (
        "requests",
        "accepted",
        "completed",
        "cancelled",
        "capacity",
        "rate_limited",
        "auth",
        "bad_request",
        "penalised",
        "faults",
        "in_flight",
    )
    requests: int
    accepted: int
    completed: int
    cancelled: int
    capacity: int
    rate_limited: int
    auth: int
    bad_request: int
    penalised: int
    faults: int
    in_flight: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def reset(self) -> None:
        in_flight = self.in_flight  # live requests are a fact, not a counter
        self.__init__()  # type: ignore[misc]
        self.in_flight = in_flight

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "accepted": self.accepted,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "rejected": {
                "capacity": self.capacity,
                "rate_limited": self.rate_limited,
                "auth": self.auth,
                "bad_request": self.bad_request,
            },
            "penalised": self.penalised,  # a subset of rejected.rate_limited
            "faults": self.faults,
            "in_flight": self.in_flight,
        }


class _ModelRuntime:
    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.counters = _Counters()
        self.overrides: dict[str, Any] = {}
        self.outage_until = 0.0
        self.outage_dialect: str | None = None


class _KeyRuntime:
    def __init__(self) -> None:
        self.counters = _Counters()
        self.penalised_until = 0.0
        self.last_rejected: dict[str, float] = {}  # model -> when it last rejected this key
        self.hammer: dict[str, deque[float]] = {}  # model -> requests since that rejection
        self.rejections: deque[float] = deque()  # when this key's capacity rejections happened


class Simulator:
    """One simulated provider. Not thread-safe: it lives in one event loop."""

    def __init__(self, scenario: Scenario, clock: Clock | None = None, *, rng: random.Random | None = None) -> None:
        self.scenario = scenario
        self.clock = clock or default_clock()
        self.rng = rng or random.Random(scenario.seed)
        self.faults = FaultInjector()
        self._models = {m.name: _ModelRuntime(m) for m in scenario.models}
        self._accepted = {k: key_alias(k) for k in scenario.keys if k != ANY_KEY}
        self._any_key = ANY_KEY in scenario.keys
        self._keys: dict[str, _KeyRuntime] = {}
        self._totals = _Counters()
        self._live: dict[int, Ticket] = {}
        self._ids = itertools.count(1)
        self._origin: float | None = None

    # ------------------------------------------------------------ time

    def start(self, now: float | None = None) -> None:
        """Start the schedules' clock (t = 0). Called when the server starts listening;
        otherwise on first use, so the origin is read inside the serving event loop."""
        self._origin = self.clock.now() if now is None else now

    def elapsed(self) -> float:
        if self._origin is None:
            self.start()
        assert self._origin is not None
        return self.clock.now() - self._origin

    def _phase(self, spec: ModelSpec, elapsed: float) -> tuple[int | None, Phase | None]:
        if not spec.schedule:
            return None, None
        t = elapsed % self.scenario.repeat if self.scenario.repeat > 0 else elapsed
        found: tuple[int | None, Phase | None] = (None, None)
        for i, phase in enumerate(spec.schedule):
            if phase.at > t:
                break
            found = (i, phase)
        return found

    # ------------------------------------------------------------ models

    def model_names(self, wire: Wire | None = None) -> list[str]:
        """Every model, or those served on ``wire``."""
        return [n for n, rt in self._models.items() if wire is None or serves(rt.spec.api, wire)]

    def has_model(self, name: str, wire: Wire | None = None) -> bool:
        rt = self._models.get(name)
        return rt is not None and (wire is None or serves(rt.spec.api, wire))

    def state(self, name: str) -> ModelState:
        rt = self._models[name]
        spec = rt.spec
        now = self.clock.now()
        index, phase = self._phase(spec, self.elapsed())
        slots = spec.slots if phase is None or phase.slots is None else phase.slots
        factor = 1.0 if phase is None or phase.latency_factor is None else phase.latency_factor
        dialect = spec.dialect if phase is None or phase.dialect is None else phase.dialect
        hint = spec.hint if phase is None or phase.hint is None else phase.hint
        o = rt.overrides
        slots = o.get("slots", slots)
        factor = o.get("latency_factor", factor)
        dialect = o.get("dialect", dialect)
        hint = o.get("hint", hint)
        outage_for = max(0.0, rt.outage_until - now)
        if outage_for > 0:
            slots = 0
            dialect = rt.outage_dialect or dialect
        return ModelState(
            name=name,
            slots=slots,
            in_flight=rt.counters.in_flight,
            latency_factor=factor,
            dialect=dialect,
            hint=hint,
            phase=index,
            outage_for=outage_for,
            overrides=tuple(sorted(o)),
            stream_style=o.get("stream_style", spec.stream_style),
            tools=o.get("tools", spec.tools),
            token_param=o.get("token_param", spec.token_param),
            unsupported_dialect=o.get("unsupported_dialect", spec.unsupported_dialect),
            api=spec.api,
            labels=spec.labels,
            disagree=spec.disagree,
            context_window=spec.context_window,
            usage=o.get("usage", spec.usage),
            prefill=spec.prefill,
        )

    def configure(
        self,
        name: str,
        *,
        slots: Any = UNSET,
        latency_factor: Any = UNSET,
        hint: Any = UNSET,
        dialect: Any = UNSET,
        reset_schedule: bool = False,
        stream_style: Any = UNSET,
        tools: Any = UNSET,
        token_param: Any = UNSET,
        unsupported_dialect: Any = UNSET,
        usage: Any = UNSET,
    ) -> ModelState:
        """Override a model while running. ``reset_schedule`` drops earlier overrides and any
        outage first, so the schedule applies again. Raises KeyError / ValueError."""
        rt = self._models[name]
        changes: dict[str, Any] = {}
        if slots is not UNSET:
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
                raise ValueError(f"slots must be a whole number >= 0, got {slots!r}")
            changes["slots"] = slots
        if latency_factor is not UNSET:
            if (
                isinstance(latency_factor, bool)
                or not isinstance(latency_factor, (int, float))
                or not 0 < latency_factor <= MAX_LATENCY_FACTOR
            ):
                raise ValueError(
                    f"latency_factor must be a number > 0 and <= {MAX_LATENCY_FACTOR:g}, got {latency_factor!r}"
                )
            changes["latency_factor"] = float(latency_factor)
        if hint is not UNSET:
            if hint is not None and (
                isinstance(hint, bool) or not isinstance(hint, (int, float)) or not 0 <= hint <= MAX_HINT
            ):
                raise ValueError(f"hint must be a number from 0 to {MAX_HINT:g} or null (no hint), got {hint!r}")
            changes["hint"] = None if hint is None else float(hint)
        if dialect is not UNSET:
            if not isinstance(dialect, str) or dialect not in CAPACITY_DIALECTS:
                raise ValueError(f"dialect must be one of {', '.join(CAPACITY_DIALECTS)}, got {dialect!r}")
            changes["dialect"] = dialect
        for field, value, choices in (
            ("stream_style", stream_style, STREAM_STYLES),
            ("tools", tools, TOOL_MODES),
            ("token_param", token_param, TOKEN_PARAMS),
            ("unsupported_dialect", unsupported_dialect, UNSUPPORTED_DIALECTS),
            ("usage", usage, USAGE_MODES),
        ):
            if value is not UNSET:
                if not isinstance(value, str) or value not in choices:
                    raise ValueError(f"{field} must be one of {', '.join(choices)}, got {value!r}")
                changes[field] = value
        if reset_schedule:
            rt.overrides.clear()
            rt.outage_until = 0.0
            rt.outage_dialect = None
        rt.overrides.update(changes)
        return self.state(name)

    def outage(self, name: str, duration: float, dialect: str | None = None) -> ModelState:
        """No slots on ``name`` for ``duration`` seconds, whatever the schedule says."""
        rt = self._models[name]
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 <= duration < math.inf:
            raise ValueError(f"duration must be a finite number of seconds >= 0, got {duration!r}")
        if dialect is not None and (not isinstance(dialect, str) or dialect not in CAPACITY_DIALECTS):
            raise ValueError(f"dialect must be one of {', '.join(CAPACITY_DIALECTS)}, got {dialect!r}")
        rt.outage_until = self.clock.now() + float(duration)
        rt.outage_dialect = dialect
        return self.state(name)

    # ------------------------------------------------------------ requests

    def is_accepted(self, token: str | None) -> bool:
        """Whether ``token`` is a key of this scenario (nothing is counted)."""
        return bool(token) and (token in self._accepted or self._any_key)

    def authenticate(self, token: str | None) -> str | None:
        """The key's alias, or None (counted as an auth rejection)."""
        alias = self._accepted.get(token) if token else None
        if alias is None and token and self._any_key:
            alias = key_alias(token)
        if alias is None:
            bucket = self._key(INVALID_KEY)
            for c in (self._totals, self._keys[bucket].counters):
                c.requests += 1
                c.auth += 1
            return None
        return alias

    def _key(self, alias: str) -> str:
        if alias not in self._keys:
            if len(self._keys) >= MAX_KEY_BUCKETS:
                alias = OTHER_KEYS
            self._keys.setdefault(alias, _KeyRuntime())
        return alias

    def _counters(self, alias: str, model: str | None) -> list[_Counters]:
        out = [self._totals, self._keys[alias].counters]
        if model is not None and model in self._models:
            out.append(self._models[model].counters)
        return out

    def bad_request(self, alias: str, model: str | None = None) -> None:
        """Count a request refused before it named a usable model (bad JSON, bad fields)."""
        alias = self._key(alias)
        for c in self._counters(alias, model):
            c.requests += 1
            c.bad_request += 1

    def submit(
        self,
        alias: str,
        model: str,
        *,
        prompt_tokens: int,
        max_tokens: int | None,
        stream: bool = False,
        api: Api = Api.CHAT,
        sent_max_tokens: bool = False,
        wire: Wire = Wire.OPENAI,
        tools: bool = False,
    ) -> Decision:
        """Decide one authenticated, well-formed request (chat, Responses or Messages).
        ``sent_max_tokens``: the request used the legacy ``max_tokens`` parameter. A model
        not served on ``wire`` is unknown there, as another provider's model would be.
        ``tools``: the request may call one of its tools (a fault may answer with a call)."""
        alias = self._key(alias)
        key = self._keys[alias]
        counters = self._counters(alias, model)
        now = self.clock.now()
        for c in counters:
            c.requests += 1

        if key.penalised_until > now:
            return self._penalise(counters, key.penalised_until - now)
        rt = self._models.get(model)
        if rt is None or not serves(rt.spec.api, wire):
            for c in counters:
                c.bad_request += 1
            return UnknownModel(model)
        if self._hammering(key, model, now):
            key.penalised_until = now + self.scenario.penalty.duration
            key.last_rejected.clear()
            key.hammer.clear()
            return self._penalise(counters, self.scenario.penalty.duration)

        spec = rt.spec
        state = self.state(model)
        if sent_max_tokens and state.token_param == "max_completion_tokens":
            for c in counters:
                c.bad_request += 1
            return Unsupported("max_tokens", "max_completion_tokens", state.unsupported_dialect)
        if tools and state.tools == NO_TOOLS:
            for c in counters:
                c.bad_request += 1
            return Unsupported("tools", "", state.unsupported_dialect)
        asked = max_tokens or 0
        if prompt_tokens + asked > spec.context_window:
            for c in counters:
                c.bad_request += 1
            return TooLong(spec.context_window, prompt_tokens, asked)

        rule = self.faults.take_rule(model, stream, self.rng, api, tools)
        if rule is not None:
            for c in counters:
                c.faults += 1
            return Faulted(rule, self._ticket(spec, state, alias, prompt_tokens, max_tokens), state)

        if state.in_flight >= state.slots:
            for c in counters:
                c.capacity += 1
            key.last_rejected[model] = now
            self._count_rejection(key, now)
            return NoCapacity(state)

        ticket = self._ticket(spec, state, alias, prompt_tokens, max_tokens)
        self._live[ticket.id] = ticket
        for c in counters:
            c.accepted += 1
            c.in_flight += 1
        return Admitted(ticket)

    def _penalise(self, counters: list[_Counters], remaining: float) -> Penalised:
        for c in counters:
            c.rate_limited += 1
            c.penalised += 1
        return Penalised(remaining)

    def _count_rejection(self, key: _KeyRuntime, now: float) -> None:
        """Under ``basis = "rejections"``, more than ``threshold`` capacity rejections within
        ``window`` seconds ban the key (this rejection is still answered as one)."""
        p = self.scenario.penalty
        if not p.enabled or p.basis != "rejections":
            return
        times = key.rejections
        times.append(now)
        while times and times[0] <= now - p.window:
            times.popleft()
        if len(times) > p.threshold:
            key.penalised_until = now + p.duration
            times.clear()

    def _hammering(self, key: _KeyRuntime, model: str, now: float) -> bool:
        """Record a request made soon after ``model`` rejected this key; True when there
        have been more than ``threshold`` of them within ``window`` seconds."""
        p = self.scenario.penalty
        rejected = key.last_rejected.get(model)
        if not p.enabled or p.basis != "requests" or rejected is None or now - rejected > p.window:
            return False
        times = key.hammer.setdefault(model, deque())
        times.append(now)
        while times and times[0] < now - p.window:
            times.popleft()
        return len(times) > p.threshold

    def _ticket(
        self, spec: ModelSpec, state: ModelState, alias: str, prompt_tokens: int, max_tokens: int | None
    ) -> Ticket:
        limit = max_tokens if max_tokens else spec.answer_tokens
        completion = max(1, min(limit, spec.answer_tokens))
        factor = max(0.0, 1.0 + spec.noise * self.rng.uniform(-1.0, 1.0)) * state.latency_factor
        return Ticket(
            id=next(self._ids),
            model=spec.name,
            key=alias,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            finish_reason="length" if limit < spec.answer_tokens else "stop",
            first_token=spec.base_latency * factor,
            per_token=spec.per_token * factor,
            usage=state.usage,
        )

    def release(self, ticket: Ticket, *, completed: bool = True) -> None:
        """Free the ticket's slot. Idempotent; a no-op for tickets that held none."""
        if self._live.pop(ticket.id, None) is None:
            return
        for c in self._counters(ticket.key, ticket.model):
            c.in_flight -= 1
            if completed:
                c.completed += 1
            else:
                c.cancelled += 1

    # ------------------------------------------------------------ stats

    def stats(self) -> dict[str, Any]:
        now = self.clock.now()
        models: dict[str, Any] = {}
        for name, rt in self._models.items():
            s = self.state(name)
            models[name] = {
                **rt.counters.as_dict(),
                "api": rt.spec.api,
                "slots": s.slots,
                "free": s.free,
                "latency_factor": s.latency_factor,
                "dialect": s.dialect,
                "hint": s.hint,
                "phase": s.phase,
                "outage_for": round(s.outage_for, 3),
                "overrides": list(s.overrides),
                "stream_style": s.stream_style,
                "tools": s.tools,
                "token_param": s.token_param,
                "usage": s.usage,
            }
        keys = {
            alias: {**k.counters.as_dict(), "penalised_for": round(max(0.0, k.penalised_until - now), 3)}
            for alias, k in self._keys.items()
        }
        return {
            "scenario": self.scenario.name,
            "elapsed": round(self.elapsed(), 3),
            "totals": self._totals.as_dict(),
            "models": models,
            "keys": keys,
            "faults": self.faults.snapshot(),
        }

    def reset_counters(self) -> None:
        self._totals.reset()
        for rt in self._models.values():
            rt.counters.reset()
        for k in self._keys.values():
            k.counters.reset()
