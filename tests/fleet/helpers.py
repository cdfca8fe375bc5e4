"""Configs and waits shared by the fleet's tests."""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Callable, Iterable
from typing import Any

from capmon.core.base.clock import default_clock
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config, parse_config
from capmon.core.types.events import EventBus
from capmon.fleet import RedisState, shared_state
from tests.support.configs import ENV, config_toml

# Times for real-time tests: a probe 0.2 s after a trip, a ramp of 0.3 s.
FAST_BREAKER = """
[breaker]
failure_threshold = 3
probe_interval = 0.2
cooldown = 0.4
cooldown_multiplier = 2.0
ramp_duration = 0.3
"""


KEY_A = '[{ env = "TEST_KEY_A", alias = "a" }]'


def fleet_config(base_url: str, redis_url: str, namespace: str, **kw: Any) -> Config:
    return parse_config(fleet_text(base_url, redis_url, namespace, **kw), "fleet-test.toml")


def fleet_text(
    base_url: str,
    redis_url: str,
    namespace: str,
    *,
    shared: str = "",
    extra: str = "",
    breaker: str = FAST_BREAKER,
    flagship: str = "",
    medium: str = "",
    keys: str = KEY_A,
    models: Iterable[str] = ("flagship", "medium"),
) -> str:
    """flagship and medium (or ``models`` of them) on one endpoint, sharing their state in Redis
    at ``redis_url`` under ``namespace`` with short leases and beats. The model lines
    (``flagship``, ``medium``), ``shared`` lines, ``breaker`` and ``extra`` are TOML, as tests
    write them."""
    own = {"flagship": flagship, "medium": medium}
    return config_toml(
        base_url,
        keys=keys,
        models={m: tomllib.loads(own[m]) for m in models},
        shared={
            "backend": "redis",
            "url": redis_url,
            "namespace": namespace,
            "lease_ttl": 0.6,
            "heartbeat": 0.1,
            "reconcile": 0.2,
            **tomllib.loads(shared),
        },
        extra=breaker + "\n" + extra,
    )


def client(config: Config, *, role: str = "library", bus: EventBus | None = None) -> FallbackClient:
    """A FallbackClient on the shared state (start it: ``async with`` does)."""
    bus = bus or EventBus()
    factory = shared_state(config, clock=default_clock(), publish=bus.publish, role=role, environ=ENV)
    return FallbackClient(config, environ=ENV, bus=bus, state=factory)


def store(c: FallbackClient) -> RedisState:
    assert isinstance(c.state, RedisState)
    return c.state


async def until(check: Callable[[], bool], timeout: float = 2.0, step: float = 0.002) -> float:
    """Wait (real time) until ``check()``; returns the seconds it took."""
    t0 = time.perf_counter()
    while not check():
        if time.perf_counter() - t0 > timeout:
            raise AssertionError(f"not within {timeout}s")
        await asyncio.sleep(step)
    return time.perf_counter() - t0


FLAGSHIP = "flagship@ep/a"
MEDIUM = "medium@ep/a"


def is_probe(body: dict) -> bool:
    return body.get("max_tokens") == 1 and body.get("messages", [{}])[0].get("content") == "ping"


async def deafen(state: RedisState) -> None:
    """Make a process hear nothing from the fleet (its subscription and its
    reconciliation stop), so that only its own calls meet Redis: a process that is
    behind, whose writes must not undo what it has not heard of."""
    await state.supervisor.aclose()  # its heartbeat, reconciliation and rejoin stop for good
    await state._drop_pubsub()
