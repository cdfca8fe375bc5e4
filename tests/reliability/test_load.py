"""Load: one FallbackClient with 1,000 requests in flight against the in-process
simulator over real loopback sockets, for a sustained period.

Checked: every request answered; no connection, file descriptor or asyncio task left
behind; memory flat over the sustained phase (RSS and the number of live objects); no
event lost on the bus (published == delivered == received, one RequestDone per
request). The figures are printed (run with ``-s``). The default run takes about six
seconds with the shipped limits (the client queues what the limiter does not admit);
``pytest -m slow tests/reliability`` runs a full minute of that, and a minute with all
1,000 requests on the wire at once.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass

import pytest

from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.sim.server import running_simulator
from tests.reliability.helpers import ENV, Recorder, open_fds, scenario, sim_config
from tests.support.pools import PoolStats, pool_stats

IN_FLIGHT = 1000


def _status(field: str) -> int:
    """A VmRSS / VmHWM figure from /proc/self/status, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


@dataclass
class Figures:
    seconds: float
    requests: int
    rate: float
    rss_start_mib: float
    rss_end_mib: float
    peak_rss_mib: float
    objects_start: int
    objects_end: int
    fds_before: int
    fds_peak: int
    fds_after: int
    tasks_before: int
    tasks_peak: int
    tasks_after: int
    connections_peak: int
    events: int
    failed_attempts: int

    def show(self) -> str:
        return (
            f"load: {self.requests} requests in {self.seconds:.1f}s = {self.rate:.0f} req/s "
            f"with {IN_FLIGHT} in flight; "
            f"RSS {self.rss_start_mib:.0f} -> {self.rss_end_mib:.0f} MiB (peak {self.peak_rss_mib:.0f}); "
            f"live objects {self.objects_start} -> {self.objects_end}; "
            f"fds {self.fds_before} / peak {self.fds_peak} / after {self.fds_after}; "
            f"tasks {self.tasks_before} / peak {self.tasks_peak} / after {self.tasks_after}; "
            f"pooled connections peak {self.connections_peak}; events {self.events}; "
            f"failed attempts (retried) {self.failed_attempts}"
        )


def _pool(client: FallbackClient) -> PoolStats:
    transport = client._http.transport  # the transport capmon made (capmon/core/routing/transport.py)
    return pool_stats(transport)


# Every request goes on the wire at once: 1,000 pooled connections.
WIDE = f"""
[client]
max_connections = {IN_FLIGHT}
attempt_timeout = 120.0

[limiter]
initial = 400
max = 400
"""
# The shipped defaults: at most 64 in flight per model, the rest queue in the client.
DEFAULTS = ""


async def run_load(label: str, seconds: float, extra: str, warmup: float = 1.0) -> Figures:
    gc.collect()
    fds_before = open_fds()
    tasks_before = len(asyncio.all_tasks())
    rec = Recorder()
    bus = ev.EventBus()
    bus.subscribe(rec)
    # Three models with room for everyone: nothing is rejected, so every attempt succeeds
    # and the figures measure the client and the loopback, not backoff.
    async with running_simulator(scenario(slots=2 * IN_FLIGHT, base_latency=0.02, answer_tokens=8)) as sim:
        async with FallbackClient(sim_config(sim.base_url, extra=extra), environ=ENV, bus=bus) as client:
            done = 0
            stop_at = 0.0
            peaks = {"fds": 0, "tasks": 0, "connections": 0}

            async def worker(i: int) -> None:
                nonlocal done
                n = 0
                while time.monotonic() < stop_at or "end" not in marks:
                    result = await client.chat(f"worker {i} request {n}")
                    assert result.content
                    n += 1
                    done += 1

            marks: dict[str, tuple[float, int, int, int]] = {}

            def mark(name: str) -> None:
                gc.collect()
                marks[name] = (time.monotonic(), done, _status("VmRSS"), len(gc.get_objects()))

            async def sampler() -> None:
                # Warm up (connections opened, limits grown), then measure a sustained
                # phase: both marks are taken with all 1,000 requests in flight.
                await asyncio.sleep(warmup)
                mark("start")
                # The window runs its time, and on a machine too loaded to finish a request in
                # it, on until one has finished: the figures are then of a longer window.
                while time.monotonic() < stop_at or done == marks["start"][1]:
                    peaks["fds"] = max(peaks["fds"], open_fds())
                    peaks["tasks"] = max(peaks["tasks"], len(asyncio.all_tasks()))
                    peaks["connections"] = max(peaks["connections"], _pool(client).open)
                    await asyncio.sleep(0.2)
                mark("end")

            stop_at = time.monotonic() + warmup + seconds
            await asyncio.gather(sampler(), *(worker(i) for i in range(IN_FLIGHT)))  # then every request drains
            (t0, done0, rss_start, objects_start), (t1, done1, rss_end, objects_end) = marks["start"], marks["end"]
            snap = client.snapshot()
            # nothing is left waiting or counted as in flight, and the pool is idle
            assert snap.in_flight == 0 and snap.queued == 0 and not snap.waiting
            assert all(t.in_flight == 0 for t in snap.targets)
            assert not len(client._queue)
            assert _pool(client).in_use == 0
            assert _pool(client).open <= IN_FLIGHT
            stats = sim.simulator.stats()["totals"]
    gc.collect()
    await asyncio.sleep(0)
    figures = Figures(
        seconds=t1 - t0,
        requests=done1 - done0,
        rate=(done1 - done0) / (t1 - t0),
        rss_start_mib=rss_start / 1024,
        rss_end_mib=rss_end / 1024,
        peak_rss_mib=_status("VmHWM") / 1024,
        objects_start=objects_start,
        objects_end=objects_end,
        fds_before=fds_before,
        fds_peak=peaks["fds"],
        fds_after=open_fds(),
        tasks_before=tasks_before,
        tasks_peak=peaks["tasks"],
        tasks_after=len(asyncio.all_tasks()),
        connections_peak=peaks["connections"],
        events=bus.published,
        failed_attempts=rec.counts["AttemptFailed"],
    )
    print(f"\n{label}: " + figures.show())

    # every request answered once, none lost
    counts = (snap.requests, done, snap.succeeded, snap.failed, rec.counts["RequestDone"], stats["completed"])
    assert snap.requests == done and snap.succeeded == done and snap.failed == 0, counts
    # served once each; an attempt that timed out on the client may still have been served
    retried = rec.counts["AttemptFailed"]
    assert done <= stats["completed"] <= done + retried, (counts, retried, stats)
    assert stats["in_flight"] == 0 and stats["rejected"]["capacity"] == 0, stats
    # no event lost: each one delivered to the subscriber, one RequestDone per request
    assert bus.published == bus.delivered == rec.received and bus.subscriber_errors == 0
    assert rec.counts["RequestDone"] == done, (counts, rec.counts)
    assert rec.counts["AttemptStarted"] == done + rec.counts["AttemptFailed"], (counts, rec.counts)
    # nothing left behind
    assert figures.fds_after == fds_before, figures.show()
    assert figures.tasks_after == tasks_before, figures.show()
    # bounded by the pool: both ends of each pooled connection, plus some being closed
    assert figures.fds_peak <= fds_before + 2 * client.config.client.max_connections + 500, figures.show()
    # memory flat over the sustained phase. Both marks are taken with 1,000 requests in
    # flight, whose own objects vary by a few thousand between marks; over the minute-long
    # run a leak of one object per request would add ten times the allowance.
    # In the short default-suite run the limits are still growing, so more requests are
    # in flight at the second mark (each holding ~100 objects): only the long runs judge.
    if seconds >= 30:
        assert figures.objects_end - figures.objects_start < max(5000, figures.requests // 5), figures.show()
    assert figures.rss_end_mib - figures.rss_start_mib < 64, figures.show()
    return figures


async def test_a_thousand_callers_on_the_default_limits_for_a_few_seconds() -> None:
    figures = await run_load("1000 callers, default limits", 2.0, DEFAULTS, warmup=0.5)
    assert figures.requests > 0


# With every request on the wire, httpcore 1.0.9's pool bookkeeping (a scan of every
# connection, per connection, several times per request) makes each request cost
# milliseconds of CPU: about 45 requests a second, so just draining 1,000 in-flight
# requests takes over 20 s. Too slow for the default run; see the report.
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_thousand_requests_on_the_wire_for_a_minute() -> None:
    figures = await run_load("1000 on the wire", 60.0, WIDE, warmup=5.0)
    assert figures.requests > 0 and figures.connections_peak > IN_FLIGHT // 2


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_thousand_callers_on_the_default_limits_for_a_minute() -> None:
    figures = await run_load("1000 callers, default limits", 60.0, DEFAULTS, warmup=5.0)
    assert figures.requests > IN_FLIGHT
