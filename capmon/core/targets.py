"""A target: one model at one endpoint with one key. What is fixed about it (config,
URL, key) and what the client observes of it (rolling stats, last answer) live here;
what decides admission lives behind the state seam (capmon/core/state.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from capmon.core.config import EndpointConfig, ModelConfig, ResolvedKey
from capmon.core.errors import Kind
from capmon.core.state import KeyRef, TargetState
from capmon.core.stats import RollingStats


def target_id(model: str, endpoint: str, key_alias: str) -> str:
    """The one place a target id is made; nothing else parses one."""
    return f"{model}@{endpoint}/{key_alias}"


@dataclass(eq=False)
class Target:
    id: str
    rank: int
    model: ModelConfig
    endpoint: EndpointConfig
    key: ResolvedKey
    state: TargetState
    stats: RollingStats = field(default_factory=RollingStats)
    url: str = field(default="", repr=False)
    last_status: int | None = None
    last_kind: Kind | None = None
    probe_latency: float | None = None

    @property
    def key_ref(self) -> KeyRef:
        return (self.endpoint.name, self.key.alias)
