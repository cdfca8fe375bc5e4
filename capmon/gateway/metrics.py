"""``GET /metrics``: the shared client in the Prometheus exposition format, on a registry
of the app's own (so two gateways in one process, as in tests, never share counters).

Two sources. Counters and histograms are fed as things happen: every attempt (the
client's attempt observer), every finished request, fallback and retry wait (the
event bus), and every HTTP answer. Gauges are read from the client's snapshot when
Prometheus scrapes, so they are never stale.

Per target (a model at an endpoint with a key) and per model:

| metric | LiteLLM's nearest |
|---|---|
| capmon_target_info{model,target,endpoint,api,deployment} 1: its provider API, the id it has for the model | |
| capmon_deployment_state{model,target}: 0 healthy, 1 ramp or half-open, 2 open | litellm_deployment_state |
| capmon_breaker_state{model,target,state} 1 for the state it is in | |
| capmon_breaker_trips_total{model,target} | litellm_deployment_cooled_down |
| capmon_limiter_limit, capmon_limiter_capacity, capmon_in_flight{model,target} | litellm_remaining_requests |
| capmon_key_usable{model,target} 0 while its key is parked (quota) or disabled (auth) | |
| capmon_attempts_total{model,target,outcome}: ok or the kind | litellm_deployment_success/failure_responses |
| capmon_attempt_latency_seconds{model,target} | litellm_request_total_latency_metric |
| capmon_skips_total{model,target,why}: requests that passed a target over, never sent, and why | |
| capmon_requests_total{model,outcome} (model "" when none served) | litellm_deployment_total_requests |
| capmon_request_latency_seconds{model}, waits included | litellm_llm_api_latency_metric |
| capmon_fallbacks_total{from_model,to_model} | litellm_deployment_successful_fallbacks |
| capmon_api_fallbacks_total{from_api,to_api}: the same by provider API (openai -> anthropic...) | |
| capmon_deployment_moves_total{model,from_endpoint,to_endpoint}: moves between a model's deployments | |
| capmon_retry_waits_total{model}, capmon_retry_wait_seconds | |
| capmon_waiting_requests (queued for any model), capmon_retry_waiting, capmon_in_flight_requests | |
| capmon_pinned{model} | |
| capmon_gateway_responses_total{api,status}, _disconnects_total{api} | litellm_proxy_total_requests_metric |
| capmon_cost_usd_total{model,deployment,key}: answers' cost at the config's prices | litellm_spend_metric |

In ``capmon_cost_usd_total`` ``deployment`` is capmon's name for it (``model@endpoint``, what a pin
or a trip names) and ``key`` the client key's alias ("" on an open gateway); an answer without a
price (none configured, no usage told) is not counted, never counted as free.

The API is an info metric rather than a label on every series: a target's API never
changes while it runs, and PromQL joins it where wanted
(``capmon_attempts_total * on(target) group_left(api) capmon_target_info``). In
``capmon_gateway_responses_total`` ``api`` is the route the caller used (chat,
responses, messages...), not a provider. No metric carries a key: targets are named by
their key's alias.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, assert_never

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from capmon.core.control.seam import KeyState
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import deployment_id
from capmon.core.types.result import Attempt, Request
from capmon.core.types.states import State
from capmon.gateway.access_log import AccessLog
from capmon.gateway.exchange import Exchange

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# LLM calls take from milliseconds (a cached or tiny answer) to minutes (a long one).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def deployment_state(state: State) -> int:
    """litellm_deployment_state's reading of a breaker state: 0 healthy, 1 partial, 2 down
    (a match, so that mypy names a new state this forgets)."""
    match state:
        case State.CLOSED | State.FORCED_CLOSED:
            return 0
        case State.RAMP | State.HALF_OPEN:
            return 1
        case State.OPEN | State.FORCED_OPEN:
            return 2
        case _:
            assert_never(state)


class _SnapshotCollector(Collector):
    def __init__(self, client: FallbackClient) -> None:
        self.client = client

    def collect(self) -> Iterable[Metric]:
        snap = self.client.snapshot()
        labels = ["model", "target"]
        deployment = GaugeMetricFamily(
            "capmon_deployment_state",
            "0 healthy, 1 partial (ramp or half-open), 2 down (open), as litellm_deployment_state",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "capmon_breaker_state", "1 for the breaker state the target is in", labels=[*labels, "state"]
        )
        trips = CounterMetricFamily("capmon_breaker_trips", "times the target's breaker opened", labels=labels)
        limit = GaugeMetricFamily("capmon_limiter_limit", "the target's adaptive concurrency limit", labels=labels)
        capacity = GaugeMetricFamily(
            "capmon_limiter_capacity",
            "the concurrency the limiter learned the target holds (absent until its first rejection)",
            labels=labels,
        )
        in_flight = GaugeMetricFamily("capmon_in_flight", "requests in flight at the target", labels=labels)
        key = GaugeMetricFamily(
            "capmon_key_usable", "1 while the target's key is usable, 0 while parked or disabled", labels=labels
        )
        info = GaugeMetricFamily(
            "capmon_target_info",
            "1 per target, labelled with its endpoint, that endpoint's provider API and the id it knows the model by",
            labels=[*labels, "endpoint", "api", "deployment"],
        )
        for t in snap.targets:
            ids = [t.model, t.target]
            info.add_metric([*ids, t.endpoint, str(t.api), t.deployment or t.model], 1.0)
            deployment.add_metric(ids, deployment_state(t.state))
            for s in State:
                breaker.add_metric([*ids, s.value], 1.0 if s is t.state else 0.0)
            trips.add_metric(ids, t.trips)
            limit.add_metric(ids, t.limit)
            if t.capacity is not None:
                capacity.add_metric(ids, t.capacity)
            in_flight.add_metric(ids, t.in_flight)
            key.add_metric(ids, 1.0 if t.key_state is KeyState.OK else 0.0)
        yield from (info, deployment, breaker, trips, limit, capacity, in_flight, key)
        yield GaugeMetricFamily(
            "capmon_waiting_requests", "requests waiting for any model to admit them", value=snap.queued
        )
        yield GaugeMetricFamily(
            "capmon_retry_waiting", "requests waiting out a backoff before their next attempt", value=len(snap.waiting)
        )
        yield GaugeMetricFamily(
            "capmon_in_flight_requests", "attempts in flight across every target", value=snap.in_flight
        )
        pinned = GaugeMetricFamily(
            "capmon_pinned", "1 for the model pinned by hand (itself or one of its deployments)", labels=["model"]
        )
        for m in self.client.model_names():
            pinned.add_metric([m], 1.0 if snap.pinned_model == m else 0.0)
        yield pinned


class _AccessLogCollector(Collector):
    def __init__(self, access_log: AccessLog) -> None:
        self.access_log = access_log

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "capmon_access_log_dropped",
            "access-log lines dropped because the log could not keep up or be written (a full disk, a closed pipe)",
            value=self.access_log.dropped,
        )


class GatewayMetrics:
    """``shared_dir``: this is one worker of several (capmon/gateway/workers.py), whose
    counters and histograms prometheus_client keeps in files there (its multiprocess mode,
    chosen by ``PROMETHEUS_MULTIPROC_DIR`` before it is imported); ``/metrics`` then adds
    up every worker's, and the gauges are this worker's view of the shared state."""

    def __init__(self, client: FallbackClient, access_log: AccessLog | None = None, shared_dir: str = "") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._exposed = r
        if shared_dir:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=shared_dir)  # type: ignore[no-untyped-call]
            self._exposed.register(_SnapshotCollector(client))
        # A label lookup costs a lock and a validation: each series' child is kept.
        self._children: dict[tuple[object, ...], Any] = {}
        self.attempts = Counter(
            "capmon_attempts",
            "attempts by target and outcome (ok or the failure kind)",
            ["model", "target", "outcome"],
            registry=r,
        )
        self.attempt_latency = Histogram(
            "capmon_attempt_latency_seconds",
            "one attempt's latency",
            ["model", "target"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.skips = Counter(
            "capmon_skips",
            "requests that passed a target over without sending to it, by why (incapable, open, full, ...)",
            ["model", "target", "why"],
            registry=r,
        )
        self.requests = Counter(
            "capmon_requests",
            'requests finished, by the model that served them ("" when none did) and outcome (ok or the failure kind)',
            ["model", "outcome"],
            registry=r,
        )
        self.request_latency = Histogram(
            "capmon_request_latency_seconds",
            "a request's latency, waits and fallbacks included",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "capmon_fallbacks", "requests that moved from one model to another", ["from_model", "to_model"], registry=r
        )
        self.deployment_moves = Counter(
            "capmon_deployment_moves",
            "requests that moved from one deployment of a model to another (the same model: no fallback)",
            ["model", "from_endpoint", "to_endpoint"],
            registry=r,
        )
        self.api_fallbacks = Counter(
            "capmon_api_fallbacks",
            "fallbacks by each side's provider API (from_api != to_api: across providers)",
            ["from_api", "to_api"],
            registry=r,
        )
        self.retry_waits = Counter(
            "capmon_retry_waits", 'backoff waits before a retry (model "": any)', ["model"], registry=r
        )
        self.retry_wait_seconds = Histogram(
            "capmon_retry_wait_seconds", "how long retry waits are", buckets=WAIT_BUCKETS, registry=r
        )
        self.responses = Counter(
            "capmon_gateway_responses", "HTTP answers of the gateway", ["api", "status"], registry=r
        )
        self.disconnects = Counter(
            "capmon_gateway_disconnects",
            "clients that went away before their answer; their attempts were cancelled",
            ["api"],
            registry=r,
        )
        self.cost = Counter(
            "capmon_cost_usd",
            "what answers cost in USD at the config's prices (answers without a price are not counted)",
            ["model", "deployment", "key"],
            registry=r,
        )
        r.register(_SnapshotCollector(client))
        if access_log is not None:  # this process's drops, in multiprocess mode too
            self._exposed.register(_AccessLogCollector(access_log))
        self._undo: list[Callable[[], None]] = [client.add_observer(self._attempt), client.bus.subscribe(self._event)]

    def close(self) -> None:
        for undo in self._undo:
            undo()
        self._undo.clear()

    def exposition(self) -> bytes:
        return generate_latest(self._exposed)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def response(self, api: str, status: int) -> None:
        """One HTTP answer of the gateway (capmon/gateway/exchange.py tells every one)."""
        self._child(self.responses, api, str(status)).inc()

    def spent(self, ex: Exchange) -> None:
        """One answered exchange with a cost (capmon/gateway/exchange.py tells each once it is done)."""
        if ex.cost is None or ex.model_served is None:
            return
        where = deployment_id(ex.model_served, ex.endpoint or "")
        self._child(self.cost, ex.model_served, where, ex.caller or "").inc(ex.cost)

    def _attempt(self, request: Request, a: Attempt) -> None:
        if a.skip is not None:  # never sent: no attempt, no latency
            self._child(self.skips, a.model, a.target, a.skip.value).inc()
            return
        self._child(self.attempts, a.model, a.target, a.kind.value if a.kind is not None else "ok").inc()
        self._child(self.attempt_latency, a.model, a.target).observe(max(0.0, a.latency))

    def _event(self, e: ev.Event) -> None:
        if isinstance(e, ev.RequestDone):
            model = e.model or ""
            self._child(self.requests, model, "ok" if e.ok else (e.kind or "failed")).inc()
            if e.ok:
                self._child(self.request_latency, model).observe(max(0.0, e.latency))
        elif isinstance(e, ev.FellBack):
            self.fallbacks.labels(e.from_model, e.to_model).inc()
            self.api_fallbacks.labels(e.from_api, e.to_api).inc()
        elif isinstance(e, ev.DeploymentMoved):
            self.deployment_moves.labels(e.model, e.from_endpoint, e.to_endpoint).inc()
        elif isinstance(e, ev.RetryScheduled):
            self.retry_waits.labels(e.model or "").inc()
            self.retry_wait_seconds.observe(max(0.0, e.wait))
