"""The gateway's traces (OpenTelemetry; the ``otel`` extra): one SERVER span per proxied
request and a CLIENT span under it per attempt, named and described by OpenTelemetry's
GenAI conventions (``chat {model}``, ``gen_ai.*``, ``error.type``) and capmon's own
(``capmon.*``: fallbacks, attempts, waits, the decision after each attempt, each
target's breaker). A ``traceparent`` the client sent is continued.

The spans are made after the fact, when the reply is done (capmon/gateway/exchange.py
calls :meth:`GatewayTraces.finish`), from the exchange and its attempts' records with
their own start and end times: nothing is added on the way to the first byte, and the
core knows nothing of tracing. A BatchSpanProcessor hands them in batches, from its own
thread, to a relay process that encodes and sends them (capmon/gateway/trace_relay.py:
OTLP's encoder would hold the GIL the event loop needs); stopping the gateway flushes
what is left.

Only imported when ``[telemetry] otlp_endpoint`` is set (capmon/gateway/telemetry.py).
No prompt or answer text, no key and no error message from a provider goes into a span.
Every attribute costs CPU twice (made on the loop, flattened by the exporter's thread), so
each span carries what the request's story needs and no copy of what another span says.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.parse
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue
from starlette.types import Scope

from capmon import __version__
from capmon.core.base.secrets import redact
from capmon.core.providers.dialect import DIALECTS
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config
from capmon.core.types.result import Attempt, Decision
from capmon.gateway.exchange import Exchange
from capmon.gateway.models import ModelNames
from capmon.gateway.settings import AUTO
from capmon.gateway.trace_relay import STOP_WAIT, RelayExporter

log = logging.getLogger("capmon.gateway")

TRACED_PATHS = frozenset(("/v1/chat/completions", "/v1/responses", "/v1/messages"))
OPERATION = "chat"  # gen_ai.operation.name: chat completions, Responses and Messages alike
PROVIDER = {api: dialect.GENAI_PROVIDER for api, dialect in DIALECTS.items()}  # gen_ai.provider.name of an API
_PROVIDER_BY_NAME = {api.value: name for api, name in PROVIDER.items()}
_TRACE_HEADERS = (b"traceparent", b"tracestate")
SHUTDOWN_S = STOP_WAIT + 1.0  # seconds stopping the gateway waits for the last spans to go out
EXPORT_TIMEOUT = 5.0  # seconds per export request to the collector
# Spans per batch handed to the relay (the SDK's default is 512): flattening one holds the
# GIL while the event loop may wait for it, so batches are kept to well under a millisecond.
EXPORT_BATCH = 64


def otlp_url(endpoint: str) -> str:
    """The traces' URL at a collector: ``http://host:4318`` gets OTLP/HTTP's ``/v1/traces``;
    a URL with a path is taken as it is."""
    parts = urllib.parse.urlsplit(endpoint)
    return endpoint.rstrip("/") + "/v1/traces" if parts.path in ("", "/") else endpoint


def otlp_provider(config: Config) -> TracerProvider:
    """The tracer provider ``capmon serve`` exports with: batched, over OTLP/HTTP (protobuf)
    to ``[telemetry] otlp_endpoint`` from the relay process (capmon/gateway/trace_relay.py).
    The SDK's standard variables apply (OTEL_EXPORTER_OTLP_HEADERS for a token, read by the
    relay; OTEL_TRACES_SAMPLER, OTEL_BSP_*)."""
    exporter = RelayExporter(otlp_url(config.telemetry.otlp_endpoint), config.telemetry.service_name, EXPORT_TIMEOUT)
    provider = TracerProvider(resource=resource(config))
    batch = None if os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") else EXPORT_BATCH
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=batch))
    return provider


def resource(config: Config) -> Resource:
    return Resource.create({"service.name": config.telemetry.service_name, "service.version": __version__})


def _seconds(value: float) -> float:
    return round(value, 6)


def _ns(wall: float) -> int:
    return int(wall * 1e9)


class GatewayTraces:
    """Spans for one gateway's proxied requests, on ``provider`` (its own: nothing global)."""

    def __init__(self, provider: TracerProvider, client: FallbackClient) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("capmon.gateway", __version__)
        self.propagator = TraceContextTextMapPropagator()
        config = client.config
        # the names a request may ask for (the targets do not matter here: only whether it may)
        self.names = ModelNames([m.name for m in config.models], {**dict.fromkeys(config.gateway.aliases), AUTO: None})
        self.servers: dict[str, tuple[str, int]] = {}
        for e in config.endpoints:
            url = urllib.parse.urlsplit(e.base_url)
            port = url.port or (443 if url.scheme == "https" else 80)
            self.servers[e.name] = (url.hostname or "", port)
        self.targets = {t.id: t for t in client.targets}
        self._failed_once = False

    def finish(self, ex: Exchange, scope: Scope) -> None:
        if ex.path not in TRACED_PATHS:  # health checks, metrics, the control API: no GenAI spans
            return
        try:
            self._spans(ex, scope)
        except Exception as e:  # a trace must never cost an answer; say so once
            if not self._failed_once:
                self._failed_once = True
                log.warning("a request's trace was not recorded: %s", redact(f"{type(e).__name__}: {e}"))

    def close(self) -> None:
        """Flush the spans not yet sent, then stop the exporter (the gateway is stopping),
        waiting at most SHUTDOWN_S for a collector that does not answer."""
        closing = threading.Thread(target=self.provider.shutdown, name="capmon-traces-shutdown", daemon=True)
        closing.start()
        closing.join(SHUTDOWN_S)
        if closing.is_alive():
            log.warning("the last spans were not all sent to the collector within %gs", SHUTDOWN_S)

    # ------------------------------------------------------------ building

    def _parent(self, scope: Scope) -> Mapping[str, str]:
        return {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in _TRACE_HEADERS
        }

    def _spans(self, ex: Exchange, scope: Scope) -> None:
        carrier = self._parent(scope)
        parent = self.propagator.extract(carrier) if carrier else None
        asked = ex.model_requested
        requested = asked if asked is not None and self.names.accepts(asked) else None
        start = ex.wall
        end = ex.wall + (ex.latency or 0.0)
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": OPERATION,
            "url.path": ex.path,
            "capmon.request_id": ex.request_id,
            "capmon.attempts": ex.attempts,
            "capmon.fallbacks": ex.fallbacks,
        }
        if requested is not None:
            attrs["gen_ai.request.model"] = requested
        if ex.served_api:
            attrs["gen_ai.provider.name"] = _PROVIDER_BY_NAME.get(ex.served_api, ex.served_api)
        if ex.model_served is not None:
            attrs["capmon.model"] = ex.model_served
            # The id the serving endpoint knows the model by: its deployment's (the provider's own word first)
            attrs["gen_ai.response.model"] = ex.response_model or ex.deployment or ex.model_served
        if ex.deployment is not None:
            attrs["capmon.deployment"] = ex.deployment
        if ex.status is not None:
            attrs["http.response.status_code"] = ex.status
        if ex.tokens_in is not None:
            attrs["gen_ai.usage.input_tokens"] = ex.tokens_in
        if ex.tokens_out is not None:
            attrs["gen_ai.usage.output_tokens"] = ex.tokens_out
        if ex.tokens_cached is not None:
            attrs["gen_ai.usage.cache_read.input_tokens"] = ex.tokens_cached
        if ex.cost is not None:
            attrs["capmon.cost_usd"] = ex.cost
        if ex.caller is not None:
            attrs["capmon.caller"] = ex.caller  # the client key's alias, never the key
        if ex.priority is not None:
            attrs["capmon.priority"] = ex.priority
        if ex.ttfb is not None:
            attrs["capmon.ttfb_s"] = _seconds(ex.ttfb)
        sent = [a for a in ex.records if a.decision is not Decision.SKIP]
        if sent:
            attrs["capmon.wait_s"] = _seconds(_waited(start, sent))
        skips = [a for a in ex.records if a.decision is Decision.SKIP]
        if skips:
            attrs["capmon.skipped"] = [f"{a.target}={a.skip or 'skip'}" for a in skips]
        if ex.error_kind is not None:
            attrs["error.type"] = ex.error_kind
        name = f"{OPERATION} {requested}" if requested else OPERATION
        span = self.tracer.start_span(name, parent, SpanKind.SERVER, attrs, start_time=_ns(start))
        if not span.is_recording():  # not sampled (the client's traceparent, OTEL_TRACES_SAMPLER): nothing more to make
            return
        if ex.error_kind is not None:
            span.set_status(Status(StatusCode.ERROR, ex.error_kind))
        context = trace.set_span_in_context(span)
        for a in skips:  # never sent: an event of the request's span, not a span of a call
            what: dict[str, AttributeValue] = {"capmon.target": a.target, "capmon.model": a.model}
            what["capmon.skip"], what["capmon.reason"] = a.skip or "skip", a.reason
            span.add_event("capmon.skip", what, timestamp=_ns(a.started))
        for a in sent:
            self._attempt(a, ex, context)
        span.end(end_time=_ns(max(end, start)))

    def _attempt(self, a: Attempt, ex: Exchange, context: Context) -> None:
        wire = a.deployment or a.model  # the id this attempt's endpoint knows the model by
        attrs: dict[str, AttributeValue] = {
            "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER.get(a.api, a.api.value),
            "gen_ai.request.model": wire,
            "capmon.model": a.model,
            "capmon.endpoint": a.endpoint,
            "capmon.deployment": wire,
            "capmon.decision": a.decision.value,
        }
        server = self.servers.get(a.endpoint)
        if server is not None:
            attrs["server.address"], attrs["server.port"] = server
        if a.status is not None:
            attrs["http.response.status_code"] = a.status
        if a.kind is not None:
            attrs["error.type"] = a.kind.value
        if a.wait > 0:
            attrs["capmon.wait_s"] = _seconds(a.wait)
        if a.hint is not None:
            attrs["capmon.hint_s"] = _seconds(a.hint)
        if a.dropped:
            attrs["capmon.dropped"] = list(a.dropped)
        if a.continues is not None:  # it continued a broken answer from this character (a `continued` record)
            attrs["capmon.continued.model"] = a.model
            attrs["capmon.continued.offset"] = a.continues
        target = self.targets.get(a.target)
        if target is not None:  # as it is now, after this request: whether the attempt's failures tripped it
            attrs["capmon.breaker_state"] = target.state.view().breaker.state.value
        if a.decision is Decision.OK:  # the usage is the request span's only: summed over spans, it counts once
            attrs["gen_ai.response.model"] = ex.response_model or wire
        span = self.tracer.start_span(f"{OPERATION} {wire}", context, SpanKind.CLIENT, attrs, start_time=_ns(a.started))
        if a.kind is not None:
            span.set_status(Status(StatusCode.ERROR, a.kind.value))
        span.end(end_time=_ns(a.started + a.latency))


def _waited(start: float, sent: list[Attempt]) -> float:
    """Seconds the request spent before its first attempt and between attempts (in line,
    backing off, waiting for a slot), from the attempts' own times."""
    waited, at = 0.0, start
    for a in sent:
        waited += max(0.0, a.started - at)
        at = a.started + a.latency
    return waited
