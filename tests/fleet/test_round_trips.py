"""The hot path costs two Redis round trips per request (ADMIT and SETTLE), and none for
a target the mirror already knows is closed to it. Counted twice: every write this
process sends to Redis (a wrapper on redis-py's connection), and the scripts the server
ran (INFO commandstats on a redis-server of the test's own; the commands a script runs
inside count there too, so only EVALSHA is compared)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from redis.asyncio.connection import AbstractConnection

from capmon.core.control.breaker import State
from capmon.core.types.config import Config
from tests.fleet.helpers import FLAGSHIP, client, fleet_config, store, until
from tests.support.scripted import OVERLOADED, Script, serve


def _commands(admin: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in admin.info("commandstats").items()}


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests this process has written to Redis (each one round trip)."""
    count = [0]
    real = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
        count[0] += 1
        await real(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return count


async def test_a_request_costs_two_round_trips(redis_server: Any, namespace: str, writes: list[int]) -> None:
    script = Script()
    async with serve(script) as url:
        cfg = _quiet(fleet_config(url, redis_server.url, namespace))
        async with client(cfg) as c:
            await c.chat("warm up")  # seeds the target, loads the scripts
            # The background loops' first rounds (a heartbeat and a reconciliation each, besides
            # the join's) are done, and nothing of them is still on its way to Redis.
            calls = store(c).link.calls
            await until(lambda: calls["heartbeat"] >= 2 and calls["reconcile"] >= 2)
            await _quiet_for(writes, 0.1)
            admin = redis_server.client()
            admin.config_resetstat()
            n = 40
            before = writes[0]
            for _ in range(n):
                assert (await c.chat("hi")).model == "flagship"
            sent = writes[0] - before
            calls = _commands(admin)
            admin.close()
    assert sent == 2 * n
    assert calls["evalsha"] == 2 * n and "eval" not in calls and "script|load" not in calls, calls


async def test_a_target_the_mirror_knows_is_open_costs_no_round_trip(
    redis_server: Any, namespace: str, writes: list[int]
) -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    async with serve(script) as url:
        cfg = _quiet(
            fleet_config(url, redis_server.url, namespace, breaker="[breaker]\nprobe_interval = 60\ncooldown = 60\n")
        )
        async with client(cfg) as c:
            for _ in range(3):
                await c.chat("trip it")
            assert c.target(FLAGSHIP).state.view().breaker.state is State.OPEN
            admin = redis_server.client()
            admin.config_resetstat()
            before = writes[0]
            for _ in range(20):
                assert (await c.chat("hi")).model == "medium"
            sent = writes[0] - before
            calls = _commands(admin)
            admin.close()
    assert sent == 40  # medium's ADMIT and SETTLE; flagship's open breaker: nothing
    assert calls["evalsha"] == 40, calls


async def _quiet_for(writes: list[int], seconds: float) -> None:
    """Until no write has gone to Redis for ``seconds``."""
    last, still = writes[0], 0.0
    while still < seconds:
        await asyncio.sleep(0.02)
        still = still + 0.02 if writes[0] == last else 0.0
        last = writes[0]


def _quiet(cfg: Config) -> Config:
    """No background calls (heartbeat, reconciliation) while counting."""
    return dataclasses.replace(cfg, shared=dataclasses.replace(cfg.shared, heartbeat=60.0, reconcile=60.0))
