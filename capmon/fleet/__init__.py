"""The fleet: many processes on many machines acting as one client, through Redis.

``[shared] backend = "redis"`` makes :func:`shared_state` the state seam's factory
(``FallbackClient(config, state=...)``, as capmon/runtime.py does): breakers with
their generations and one probe for the fleet, manual actions, key state, rpm / tpm
buckets, fleet-wide concurrency leases, the learned capacity and the retry budget are
kept in Redis, news goes by pub/sub, and a lost Redis leaves every process running on
its local state until it comes back. The core never imports this package
(ARCHITECTURE.md, "The state seam").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from capmon.core.base.clock import Clock
from capmon.core.control.seam import TargetSpec
from capmon.core.types.config import Config
from capmon.core.types.events import Event
from capmon.fleet.codec import ROLES
from capmon.fleet.settings import SharedStateUnavailable, resolve, show_url
from capmon.fleet.store import RedisState

__all__ = ["ROLES", "RedisState", "SharedStateUnavailable", "shared_state", "show_url"]


def shared_state(
    config: Config,
    *,
    clock: Clock,
    publish: Callable[[Event], None],
    role: str = "library",
    environ: Mapping[str, str] | None = None,
) -> Callable[[list[TargetSpec]], RedisState]:
    """The factory ``FallbackClient(state=...)`` takes. Reads ``[shared]``'s URL now (a
    missing variable or a bad URL is a ConfigError); connects in ``start()``."""
    settings = resolve(config, environ)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    return lambda specs: RedisState(config, specs, clock, publish, settings, role)
