"""Every fault of the issue against a real redis-server: unreachable at start, lost
mid-run, back, restarted empty. (A process killed while holding leases:
test_processes.py.)"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from capmon.core.control.breaker import State
from capmon.core.types import events as ev
from capmon.core.types.events import EventBus
from capmon.core.types.snapshot import LinkState
from capmon.gateway.readiness import readiness
from capmon.status import format_snapshot
from tests.fleet.helpers import FLAGSHIP, MEDIUM, client, fleet_config, store, until
from tests.support.configs import write_config
from tests.support.scripted import OVERLOADED, Reply, Script, free_port, ok, serve

ROOT = Path(__file__).resolve().parents[2]


def _notices(bus: EventBus) -> list[ev.Notice]:
    """Every Notice from now on (the bus's ring of recent events is too short for a load)."""
    seen: list[ev.Notice] = []
    bus.subscribe(lambda e: seen.append(e) if isinstance(e, ev.Notice) else None)
    return seen


async def test_unreachable_at_start_warns_and_runs_on_local_state(namespace: str, caplog: Any) -> None:
    script = Script()
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    bus = EventBus()
    notices = _notices(bus)
    caplog.set_level(logging.WARNING, logger="capmon.fleet")
    async with serve(script) as url:
        async with client(fleet_config(url, nobody, namespace), bus=bus) as c:
            results = [await c.chat("hi") for _ in range(3)]
            snap = c.snapshot()
    assert all(r.model == "flagship" for r in results)
    assert snap.shared.backend == "redis" and snap.shared.state is LinkState.DEGRADED
    assert snap.shared.label == "shared state: degraded"
    line = f"shared state: Redis at {nobody} unreachable"
    assert snap.shared.message.startswith(line) and snap.shared.message.endswith("running on local state")
    assert any(n.level == "warning" and n.message.startswith(line) for n in notices)
    assert any(r.getMessage().startswith(line) for r in caplog.records)


def test_unreachable_at_start_with_required_exits_2_in_one_line_without_the_password(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path / "config.toml",
        f"http://127.0.0.1:{free_port()}/v1",
        simulated=True,
        keys=[("CAPMON_NO_SUCH_KEY", "a")],
        models=["m"],
        shared={"backend": "redis", "url_env": "CAPMON_TEST_SHARED_URL", "required": True},
    )
    env = {**os.environ, "CAPMON_TEST_SHARED_URL": f"redis://capmon:hunter2-very-secret@127.0.0.1:{port}/3"}
    out = subprocess.run(
        [sys.executable, "-m", "capmon.cli", "status", "--once", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(
        f"capmon: {config}: shared.required: Redis at redis://***@127.0.0.1:{port}/3 is unreachable ("
    )
    assert "set required = false" in lines[0]
    assert "hunter2" not in out.stderr + out.stdout and "Traceback" not in out.stderr


async def test_redis_lost_mid_run_loses_no_request_and_the_fleet_rejoins_within_5_s(
    redis_server: Any, namespace: str
) -> None:
    script = Script()
    for m in ("flagship", "medium"):
        script.always(m, Reply(200, ok(m).body, delay=0.01))
    bus_a = EventBus()
    notices = _notices(bus_a)
    async with serve(script) as url:
        cfg = fleet_config(url, redis_server.url, namespace)
        async with client(cfg, bus=bus_a) as a, client(cfg) as b:
            loop = asyncio.get_running_loop()
            done: list[str] = []
            states: set[LinkState] = set()
            stop = loop.time() + 2.0

            async def worker(c: Any) -> None:
                while loop.time() < stop:
                    done.append((await c.chat("hi")).model)
                    states.add(c.snapshot().shared.state)

            workers = asyncio.gather(*(worker(c) for c in (a, b) for _ in range(6)))
            await asyncio.sleep(0.3)
            served_before = len(done)
            redis_server.stop()  # Redis is gone mid-run
            await until(lambda: not store(a).link.ok and not store(b).link.ok, timeout=1.0)
            snap = a.snapshot()
            assert snap.shared.state is LinkState.DEGRADED and snap.shared.label == "shared state: degraded"
            ready = readiness(a)  # the gateway's /ready: still ready (local state serves), and says why not whole
            assert ready.ready and ready.reason.endswith("; shared state: degraded")
            assert ready.as_json()["shared"] == "shared state: degraded"
            assert "shared state: degraded" in format_snapshot(snap)  # capmon status
            await asyncio.sleep(0.4)
            assert len(done) > served_before + 20  # requests go on, on local state
            redis_server.start()  # and it is back (empty)
            t0 = time.perf_counter()
            await until(lambda: store(a).link.ok and store(b).link.ok, timeout=5.0)
            rejoined = time.perf_counter() - t0
            await workers  # raises if any request failed
            admin = redis_server.client()
            try:  # the fleet is registered again and its targets rebuilt
                assert admin.zcard(f"{namespace}:procs") == 2
                assert admin.exists(f"{namespace}:t:{{{FLAGSHIP}}}") and admin.exists(f"{namespace}:t:{{{MEDIUM}}}")
            finally:
                admin.close()
    assert rejoined < 5.0
    assert states == {LinkState.OK, LinkState.DEGRADED}
    assert len(done) == script.served()  # every request answered, none lost
    messages = [n.message for n in notices]
    # lost once: the connections from before the restart are dropped, not tried and lost again
    assert sum(m.startswith(f"shared state: Redis at {redis_server.url} lost") for m in messages) == 1, messages
    assert any(m == f"shared state: rejoined Redis at {redis_server.url}" for m in messages)


async def test_degraded_processes_share_the_fleet_limit_instead_of_each_taking_all_of_it(
    redis_server: Any, namespace: str
) -> None:
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_server.url, namespace, flagship="max_concurrency = 8")
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            await b.chat("hi")
            await until(lambda: len(a.snapshot().shared.processes) == 2)
            redis_server.stop()
            await a.chat("hi")  # the first call after the loss finds it
            await b.chat("hi")
            for c in (a, b):
                assert c.target(FLAGSHIP).state.view().limiter.limit <= 8 / 2 + 1  # half each (+ what it learned since)


async def test_redis_restarted_empty_is_rebuilt_from_the_live_processes_and_no_breaker_stays_open(
    redis_server: Any, namespace: str
) -> None:
    script = Script()
    down = {"on": True}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else ok("flagship"))
    async with serve(script) as url:
        cfg = fleet_config(
            url,
            redis_server.url,
            namespace,
            breaker="[breaker]\nprobe_interval = 0.5\ncooldown = 0.5\nramp_duration = 0.2\n",
        )
        async with client(cfg) as a, client(cfg) as b:
            for _ in range(3):
                await a.chat("hi")
            ta, tb = a.target(FLAGSHIP).state, b.target(FLAGSHIP).state
            await until(lambda: tb.view().breaker.state is State.OPEN)
            learned = tb.view().limiter.limit
            redis_server.stop()
            redis_server.start()  # empty: no target, no breaker, no registry
            admin = redis_server.client()
            try:
                # the processes find their connections dead, rejoin and push what Redis lacks
                await until(lambda: admin.zcard(f"{namespace}:procs") == 2, timeout=5.0)
                await until(lambda: admin.exists(f"{namespace}:t:{{{FLAGSHIP}}}") == 1, timeout=1.0)
                shared = admin.hgetall(f"{namespace}:t:{{{FLAGSHIP}}}")
                assert shared["state"] == "open"  # rebuilt as the processes knew it, probe schedule kept
                assert float(shared["limit"]) == learned
            finally:
                admin.close()
            down["on"] = False
            await until(
                lambda: ta.view().breaker.state is State.CLOSED and tb.view().breaker.state is State.CLOSED, timeout=3.0
            )
            assert (await b.chat("hi")).model == "flagship"


async def test_more_than_100_connections_at_once_are_no_lost_redis(redis_url: str) -> None:
    # redis-py 8's asyncio pool allowed 100 connections and raised past them, which the
    # process took for a lost Redis (a gateway at 1,000 QPS with a stall degraded). The
    # connections are opened one after another: a burst of them would also test how fast a
    # loaded machine connects within the link's 0.5 s timeout.
    from capmon.core.base.clock import default_clock
    from capmon.core.types.config import SharedConfig
    from capmon.fleet.link import Link
    from capmon.fleet.settings import Settings, show_url

    link = Link(Settings(SharedConfig(backend="redis"), "test.toml", redis_url, show_url(redis_url)), default_clock())
    pool = link.client.connection_pool
    held = []
    try:
        for _ in range(120):
            held.append(await pool.get_connection())
        assert len({id(c) for c in held}) == 120
    finally:
        for c in held:
            await pool.release(c)
        await link.client.aclose()
