"""What every route of the gateway works with: one shared client and what is built
around it. One per app; routes find it on ``request.app.state.gateway``."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from capmon.core.routing.client import FallbackClient
from capmon.gateway.access_log import AccessLog
from capmon.gateway.auth import Authenticator
from capmon.gateway.exchange import ExchangeTracer
from capmon.gateway.feed import EventFeed
from capmon.gateway.metrics import GatewayMetrics
from capmon.gateway.models import ModelNames
from capmon.gateway.settings import GatewaySettings
from capmon.gateway.shape import BodyReader


@dataclass(eq=False)
class Gateway:
    client: FallbackClient
    settings: GatewaySettings
    auth: Authenticator
    names: ModelNames
    metrics: GatewayMetrics
    feed: EventFeed
    started: int  # wall-clock seconds: the "created" of /v1/models
    access_log: AccessLog | None = None
    tracer: ExchangeTracer | None = None  # [telemetry] otlp_endpoint: capmon/gateway/traces.py
    reader: BodyReader = field(init=False)  # the proxied bodies, against the settings' limits

    def __post_init__(self) -> None:
        self.reader = BodyReader(self.settings.body_limits)

    def close(self) -> None:
        self.metrics.close()
        self.feed.close()
        if self.access_log is not None:
            self.access_log.close()
        if self.tracer is not None:
            self.tracer.close()  # flushes the spans not yet exported


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw
