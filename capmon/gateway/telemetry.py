"""Whether the gateway traces, and the one place that imports OpenTelemetry for it: only
when ``[telemetry] otlp_endpoint`` is set is capmon/gateway/traces.py (and with it the
``otel`` extra) imported; without it nothing is imported and nothing changes."""

from __future__ import annotations

from capmon.core.base.extras import Extra, require
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config
from capmon.gateway.exchange import ExchangeTracer


def require_otel(config: Config) -> None:
    """Raise MissingExtra, naming the file and key, when the config asks for traces and
    the otel extra is missing."""
    if config.telemetry.otlp_endpoint:
        require(Extra.OTEL, f"{config.path}: telemetry.otlp_endpoint")


def open_tracer(client: FallbackClient) -> ExchangeTracer | None:
    """The gateway's tracer exporting to ``[telemetry] otlp_endpoint``; None without one."""
    if not client.config.telemetry.otlp_endpoint:
        return None
    require_otel(client.config)
    from capmon.gateway.traces import GatewayTraces, otlp_provider

    return GatewayTraces(otlp_provider(client.config), client)
