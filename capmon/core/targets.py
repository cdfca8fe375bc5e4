"""A target: one model at one endpoint with one key, and everything the client
keeps about it (breaker, limiter, buckets, stats, key state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from capmon.core.breaker import CircuitBreaker
from capmon.core.config import EndpointConfig, ModelConfig, ResolvedKey
from capmon.core.limiter import AdaptiveLimiter, TokenBucket
from capmon.core.stats import RollingStats


def target_id(model: str, endpoint: str, key_alias: str) -> str:
    return f"{model}@{endpoint}/{key_alias}"


@dataclass(eq=False)
class Target:
    id: str
    rank: int
    model: ModelConfig
    endpoint: EndpointConfig
    key: ResolvedKey
    breaker: CircuitBreaker
    limiter: AdaptiveLimiter
    stats: RollingStats
    rpm: TokenBucket | None = None
    tpm: TokenBucket | None = None
    # The server said "not before": every request avoids this target until then.
    not_before: float = 0.0
    # Quota: parked until a time; auth failures disable the key (kept per key, see router).
    parked_until: float | None = None
    parked_reason: str = ""
    last_status: int | None = None
    last_kind: str | None = None
    probe_latency: float | None = None
    url: str = field(default="", repr=False)

    @property
    def key_ref(self) -> tuple[str, str]:
        return (self.endpoint.name, self.key.alias)
