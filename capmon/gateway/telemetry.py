"""Whether the gateway traces, and the one place that imports OpenTelemetry for it: only
when ``[telemetry] otlp_endpoint`` is set is capmon/gateway/traces.py (and with it the
``otel`` extra) imported; without it nothing is imported and nothing changes."""

from __future__ import annotations

import importlib

from capmon.core.config import Config
from capmon.core.exceptions import ConfigError
from capmon.core.router import FallbackClient
from capmon.gateway.exchange import ExchangeTracer

# What capmon/gateway/traces.py needs of the extra (pyproject.toml: capmon[otel]).
OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


def require_otel(config: Config) -> None:
    """Raise, naming the file and key, when the config asks for traces and the extra is missing."""
    if not config.telemetry.otlp_endpoint:
        return
    for name in OTEL_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            raise ConfigError(
                config.path,
                "telemetry.otlp_endpoint",
                "traces need OpenTelemetry, which is not installed: pip install 'capmon[otel]'",
            ) from None


def open_tracer(client: FallbackClient) -> ExchangeTracer | None:
    """The gateway's tracer exporting to ``[telemetry] otlp_endpoint``; None without one."""
    if not client.config.telemetry.otlp_endpoint:
        return None
    require_otel(client.config)
    from capmon.gateway.traces import GatewayTraces, otlp_provider

    return GatewayTraces(otlp_provider(client.config), client)
