"""A trip or a manual action in one process reaches the others by pub/sub, not by the
periodic read; reconciliation catches what a subscriber missed. How fast is a figure, not a
test (a loaded 2-core machine's scheduler decides the tail): python -m benchmarks.fleet prints
trip propagation p50 / p99."""

from __future__ import annotations

import time

from capmon.core.base.text import percentile
from capmon.core.control.breaker import State
from capmon.core.types import events as ev
from capmon.core.types.events import EventBus
from tests.fleet.helpers import FLAGSHIP, client, fleet_config, store, until
from tests.support.scripted import OVERLOADED, Script, ok, serve


def _when(bus: EventBus, new: str, stamps: list[float]) -> None:
    bus.subscribe(
        lambda e: stamps.append(time.perf_counter())
        if isinstance(e, ev.BreakerChanged) and e.target == FLAGSHIP and e.new == new
        else None
    )


async def test_trips_and_manual_actions_reach_the_other_process_pushed_not_polled(
    redis_url: str, namespace: str
) -> None:
    script = Script()
    down = {"on": False}
    script.set("flagship", lambda n, body: OVERLOADED if down["on"] else ok("flagship"))
    bus_a, bus_b = EventBus(), EventBus()
    tripped_a: list[float] = []
    opened_b: list[float] = []
    _when(bus_a, "open", tripped_a)
    _when(bus_b, "open", opened_b)
    async with serve(script) as url:
        # No reconciliation within the test (a minute apart): whatever reaches B was pushed.
        breaker = "[breaker]\nprobe_interval = 30\ncooldown = 30\n"
        cfg = fleet_config(url, redis_url, namespace, breaker=breaker, shared="reconcile = 60")
        async with client(cfg, bus=bus_a) as a, client(cfg, bus=bus_b) as b:
            await a.chat("hi")
            await b.chat("hi")
            tb = b.target(FLAGSHIP).state
            sb = store(b)
            heard = sb.messages
            delays = []
            # Over a hundred samples, so that the p99 (nearest rank) is not the single worst one:
            # one stall of a loaded machine's scheduler is not the fleet's propagation.
            for i in range(50):  # automatic trips: three capacity failures in a row in process A
                down["on"] = True
                for _ in range(3):
                    assert (await a.chat("hi")).model == "medium"
                await until(lambda i=i: len(opened_b) > i)
                delays.append(opened_b[i] - tripped_a[i])
                down["on"] = False
                a.reset("flagship")
                await until(lambda: tb.view().breaker.state is State.CLOSED)
            for action, seen in ((a.trip, State.FORCED_OPEN), (a.reset, State.CLOSED)) * 26:
                t0 = time.perf_counter()
                action("flagship")
                delays.append(await until(lambda seen=seen: tb.view().breaker.state is seen))
            t0 = time.perf_counter()
            a.pin("medium")
            await until(lambda: b.pinned == "medium")
            delays.append(time.perf_counter() - t0)
    assert len(delays) == 50 + 52 + 1
    # Every one arrived within until()'s 2 s, long before a reconciliation could: pushed, by
    # messages. The median says the push is at once; the tail is the machine's, not the fleet's.
    assert sb.messages > heard
    assert percentile(sorted(delays), 0.5) < 0.5, sorted(delays)[len(delays) // 2]


async def test_news_a_process_did_not_hear_reaches_it_by_the_periodic_reconciliation(
    redis_url: str, namespace: str
) -> None:
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_url, namespace)  # reconcile every 0.2 s
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            await b.chat("hi")
            sb = store(b)
            await sb._drop_pubsub()  # B hears no news from now on; it only reads
            heard = sb.messages
            a.trip("flagship")
            took = await until(lambda: b.target(FLAGSHIP).state.view().breaker.state is State.FORCED_OPEN)
            assert took < 0.2 + 0.1
            assert sb.messages == heard  # not by a message: by the read


async def test_a_process_whose_subscription_was_cut_subscribes_again(redis_server, namespace: str) -> None:
    async with serve(Script()) as url:
        cfg = fleet_config(url, redis_server.url, namespace, shared="", extra="")
        async with client(cfg) as a, client(cfg) as b:
            await a.chat("hi")
            await b.chat("hi")
            sb = store(b)
            first = sb._listen_task
            admin = redis_server.client()
            assert admin.client_kill_filter(_type="pubsub") >= 2
            admin.close()
            await until(lambda: sb._listen_task is not None and sb._listen_task is not first)
            assert sb.link.ok  # Redis itself was there all along: not degraded
            heard = sb.messages
            a.trip("flagship")
            await until(lambda: b.target(FLAGSHIP).state.view().breaker.state is State.FORCED_OPEN, timeout=1.0)
            await until(lambda: sb.messages > heard, timeout=1.0)  # by a message on the new subscription
