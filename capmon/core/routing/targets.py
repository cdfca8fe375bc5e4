"""A target: one model at one endpoint (one of its deployments) with one key. What is fixed about it (config,
URL, key) and what the client observes of it (rolling stats, last answer) live here;
what decides admission lives behind the state seam (capmon/core/control/seam.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from capmon.core.base.exceptions import CapmonError, Unavailable
from capmon.core.control.breaker import State
from capmon.core.control.seam import KeyRef, KeyState, TargetSpec, TargetState
from capmon.core.providers.dialect import Auth, Dialect, dialect_of
from capmon.core.routing.reach import Reach, host_of
from capmon.core.routing.transport import Head, Sender
from capmon.core.types.config import (
    NO_KEY,
    Config,
    EndpointConfig,
    KeyConfig,
    ModelConfig,
    ResolvedKey,
    deployment_id,
)
from capmon.core.types.failure import Kind
from capmon.core.types.result import Format
from capmon.core.types.stats import RollingStats


def target_id(model: str, endpoint: str, key_alias: str) -> str:
    """The one place a target id is made; nothing else parses one."""
    return f"{deployment_id(model, endpoint)}/{key_alias}"


@dataclass(eq=False)
class Target:
    id: str
    rank: int
    model: ModelConfig
    endpoint: EndpointConfig
    key: ResolvedKey
    state: TargetState
    # What this process has seen of the endpoint's reachability, shared by its targets.
    reach: Reach
    stats: RollingStats = field(default_factory=RollingStats)
    last_status: int | None = None
    last_kind: Kind | None = None
    probe_latency: float | None = None
    # Why its last attempt was silent (no response headers in time), until an answer with
    # headers comes (its probe's): routing passes it over as Skip.SILENT meanwhile.
    silent: str | None = None
    # What every attempt sends, parsed and encoded once (a static key is in the headers):
    # the URL of each wire the endpoint's API serves (and a streamed attempt's, where its API
    # streams elsewhere), and what the key puts on each request (its dialect's,
    # capmon/core/providers/dialect.py).
    urls: dict[Format, httpx.URL] = field(default_factory=dict, repr=False)
    stream_urls: dict[Format, httpx.URL] = field(default_factory=dict, repr=False)
    http_headers: list[tuple[bytes, bytes]] = field(default_factory=list, repr=False)
    auth: Auth = field(default_factory=Auth, repr=False)
    _heads: dict[tuple[Format, bool], Head] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )  # head(), once per wire, plain and streamed

    def __post_init__(self) -> None:
        if not self.urls:
            dialect = self.dialect
            self.urls = {w: httpx.URL(u) for w, u in dialect.urls(self.endpoint, self.model).items()}
            self.stream_urls = {w: httpx.URL(u) for w, u in dialect.stream_urls(self.endpoint, self.model).items()}
            self.auth = dialect.auth(self.endpoint, self.key.secret.reveal())
            self.http_headers = Sender.headers(dict(self.endpoint.headers), self.auth.headers)

    @property
    def dialect(self) -> Dialect:
        """Its endpoint's dialect (capmon/core/providers/dialect.py)."""
        return dialect_of(self.endpoint)

    def url(self, wire: Format, streamed: bool = False) -> httpx.URL:
        """Where an attempt in ``wire`` goes (``streamed``: a streaming attempt, which goes
        to its own URL where the endpoint's API has one)."""
        url = self.stream_urls.get(wire) if streamed else None
        return self.urls[wire] if url is None else url

    def head(self, wire: Format, streamed: bool = False) -> Head:
        """The headers every attempt in ``wire`` sends, but its length (``Sender.head``)."""
        streamed = streamed and wire in self.stream_urls  # one head where both go to one URL
        head = self._heads.get((wire, streamed))
        if head is None:
            head = self._heads[(wire, streamed)] = Sender.head(self.url(wire, streamed), self.http_headers)
        return head

    @property
    def deployment(self) -> str:
        """The id its endpoint knows the model by (its deployment's ``model``; else the
        model's ``api_model`` or name)."""
        return self.model.wire_name

    @property
    def deployment_id(self) -> str:
        """Its model at its endpoint: what a pin, trip or reset of the deployment names."""
        return deployment_id(self.model.name, self.endpoint.name)

    @property
    def key_ref(self) -> KeyRef:
        return (self.endpoint.name, self.key.alias)


def build_targets(config: Config, keys: Mapping[tuple[str, str], ResolvedKey]) -> tuple[list[TargetSpec], list[Target]]:
    """Every (model, deployment, key) the config names and the environment holds a key for,
    in preference order, each carrying the model as its deployment sees it (``ModelConfig.at``).
    The targets' state is attached by the client (the seam decides)."""
    specs, out = [], []
    reach = {ep.name: Reach(ep.name, host_of(ep.base_url)) for ep in config.endpoints}
    for rank, model in enumerate(config.models):
        for deployment in model.deployed():
            ep = config.endpoint(deployment.endpoint)
            seen = model.at(deployment)  # its id and limits there: what every attempt and the seam read
            for k in ep.keys or (KeyConfig(env="", alias=NO_KEY),):
                key = keys.get((ep.name, k.alias or k.env))
                if key is None:
                    continue
                tid = target_id(model.name, ep.name, key.alias)
                specs.append(TargetSpec(tid, seen, (ep.name, key.alias), key.alias))
                out.append(
                    Target(
                        tid,
                        rank,
                        seen,
                        ep,
                        key,
                        state=None,  # type: ignore[arg-type]
                        reach=reach[ep.name],
                    )
                )
    if not out:
        raise CapmonError(f"{config.path}: no usable target: every model's keys are missing")
    return specs, out


def token_limit(asked: int | None, t: Target, ceiling: bool) -> int:
    """The output cap an attempt on ``t`` sends: the caller's own, the model's
    ``max_tokens`` when it gives none, and never more than the model's with ``ceiling``
    (``[client] cap_client_tokens``)."""
    cap = t.model.max_tokens
    if asked is None:
        return cap
    return min(asked, cap) if ceiling else asked


def admits_in(targets: list[Target], now: float) -> dict[str, float | None]:
    """Per target, seconds until it may admit a request (0: now; a full one counts as now,
    it frees a slot by itself, and so does a half-open one, whose probe is out), or None
    when only a person can bring it back (:func:`held`: a disabled key, tripped by hand) or
    its endpoint was never reached (:func:`stranded`): what a gateway's /ready and
    Retry-After are made of, by the rule a request's wait is."""
    out: dict[str, float | None] = {}
    for t in targets:
        hold = held(t, now) or stranded(t)
        if hold is not None:
            out[t.id] = None if hold.until is None else max(0.0, hold.until - now)
            continue
        at = t.state.ready_at(now, 1)
        if at is None:
            at = t.state.probe_due_at()  # an open breaker admits again once its probe answers
        out[t.id] = 0.0 if at is None else max(0.0, at - now)
    return out


@dataclass(frozen=True, slots=True)
class Hold:
    """What keeps a target from admitting that no release, probe or bucket lifts."""

    why: Unavailable
    kind: Kind  # what a request refused for it failed of
    reason: str
    until: float | None  # clock time it lifts by itself (a quota's reset); None: only a person lifts it
    code: str | None = None  # an unreachable endpoint's errors.Cause


def held(t: Target, now: float) -> Hold | None:
    """Why ``t`` cannot admit until a person acts or a known time passes: a key disabled
    after an auth failure, a breaker tripped by hand, a key out of quota. None for every
    other state, an automatically open breaker (its probe is due), a half-open one and a
    full target included: those admit again by themselves."""
    v = t.state.standing(now)
    if v.key_state is KeyState.DISABLED:
        where = f"key {t.key.alias} at {t.endpoint.name}"
        return Hold(Unavailable.KEYS, Kind.AUTH, f"{where} is disabled ({v.key_reason}); reset it by hand", None)
    if v.breaker is State.FORCED_OPEN:
        return Hold(Unavailable.MODELS, Kind.CAPACITY, f"{t.model.name} is tripped by hand ({v.breaker_reason})", None)
    if v.key_state is KeyState.PARKED and v.key_until is not None:
        left = max(0.0, v.key_until - now)
        where = f"key {t.key.alias} at {t.endpoint.name}"
        # parked by a quota, or by a model its endpoint does not have (failure.MODEL_NOT_FOUND)
        why = f"{where} is parked for {left:.0f}s more ({v.key_reason})"
        return Hold(Unavailable.KEYS, Kind.QUOTA, why, v.key_until)
    return None


def stranded(t: Target) -> Hold | None:
    """Why ``t`` is not worth waiting for: its endpoint could not be connected to at its
    last attempt and has never answered since the process started (capmon/core/routing/reach.py).
    Its breaker's probe brings it back if it ever answers; nothing says it will."""
    reach = t.reach
    if reach.failure is None or reach.answered:
        return None
    return Hold(Unavailable.UNREACHABLE, Kind.UNREACHABLE, reach.failure.reason, None, reach.failure.code)
