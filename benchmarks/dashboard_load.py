"""How the dashboard holds up under a flood of events.

Runs the real app headless (``run_test``) on the scripted source from
tests/tui/fakes.py, publishes ~1,000 bus events a second (the mix a busy client
makes: attempts, retries, fallbacks, now and then a breaker move) for ~20 s while
the tables refresh at the default rate and the clock moves, and prints:

* the process CPU share (process time / wall time; goal: under half a core), and
* how long a key press takes to show on screen (``p`` then ``/``; goal: under 100 ms):
  from the key event, as the terminal driver posts it, to the first frame showing it.

    python benchmarks/dashboard_load.py [--seconds 20] [--rate 1000] [--from-thread]

Headless, Textual skips turning frames into terminal bytes; this script does that
part as well (into nowhere), so the CPU share includes it.
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.tui.fakes when run as a script

from textual import events  # noqa: E402
from textual._compositor import CompositorUpdate  # noqa: E402

from capmon.core.types import events as ev  # noqa: E402
from capmon.tui.app import CapmonApp  # noqa: E402
from tests.tui.fakes import FakeSource, outage  # noqa: E402

SIZE = (160, 48)
MODELS = ("flagship", "medium", "small")


def event_mix(source: FakeSource) -> Callable[[int], ev.Event]:
    """Event n of a busy client's stream: per 100, 40 attempts started, 30 requests
    done, 10 failed attempts, 10 retries scheduled, 8 fallbacks, 1 breaker move,
    1 notice."""
    clock = source.clock

    def make(n: int) -> ev.Event:
        k = n % 100
        at, wall = clock.now(), clock.wall()
        model = MODELS[n % 3]
        target = f"{model}@sim/sim-key"
        if k < 40:
            return ev.AttemptStarted(
                at=at, wall=wall, request_id=n, item_id=f"item-{n}", model=model, target=target, attempt=1
            )
        if k < 70:
            return ev.RequestDone(
                at=at,
                wall=wall,
                request_id=n,
                item_id=f"item-{n}",
                ok=True,
                model=model,
                target=target,
                attempts=1,
                latency=0.8,
                kind=None,
            )
        if k < 80:
            return ev.AttemptFailed(
                at=at,
                wall=wall,
                request_id=n,
                item_id=f"item-{n}",
                model=model,
                target=target,
                attempt=1,
                kind="capacity",
                status=503,
                reason="overloaded",
                hint=None,
            )
        if k < 90:
            return ev.RetryScheduled(
                at=at,
                wall=wall,
                request_id=n,
                item_id=f"item-{n}",
                model=None,
                attempt=2,
                max_attempts=50,
                reason="overloaded",
                wait=1.0,
                deadline=at + 1.0,
            )
        if k < 98:
            return ev.FellBack(
                at=at,
                wall=wall,
                request_id=n,
                item_id=f"item-{n}",
                from_model=model,
                to_model=MODELS[(n + 1) % 3],
                reason="Selected model is at capacity.",
            )
        if k == 98:
            new = "open" if (n // 100) % 2 == 0 else "closed"
            return ev.BreakerChanged(
                at=at,
                wall=wall,
                target=target,
                model=model,
                old="closed" if new == "open" else "open",
                new=new,
                reason="3 capacity failures in a row",
                manual=False,
                cooldown_until=at + 20 if new == "open" else None,
            )
        return ev.Notice(at=at, wall=wall, level="info", message=f"notice {n}")

    return make


class FrameWatch:
    """Hooks the app's frame output. Headless, Textual composes every frame but skips
    turning it into terminal bytes: we do that part too (into nowhere), so the CPU
    figure includes what a real terminal costs, and we note when a frame shows a
    change we are waiting for."""

    def __init__(self, app: CapmonApp) -> None:
        self.app = app
        self.frames = 0
        self._waiting: list[tuple[Callable[[], bool], asyncio.Future[float]]] = []
        original = app._display

        def display(screen: object, renderable: object) -> None:
            original(screen, renderable)  # type: ignore[arg-type]
            if isinstance(renderable, CompositorUpdate):
                renderable.render_segments(app.console)  # the bytes a terminal would get
                self.frames += 1
                now = time.perf_counter()
                for cond, fut in list(self._waiting):
                    if not fut.done() and cond():
                        fut.set_result(now)
                        self._waiting.remove((cond, fut))

        app._display = display  # type: ignore[method-assign]

    def next_frame_where(self, cond: Callable[[], bool]) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiting.append((cond, fut))
        return fut


async def key_latency(
    app: CapmonApp, watch: FrameWatch, key: str, character: str | None, shown: Callable[[], bool]
) -> float:
    """Seconds from a key arriving (as the terminal driver posts it) to the first frame
    that shows its effect."""
    frame = watch.next_frame_where(shown)
    t0 = time.perf_counter()
    app.post_message(events.Key(key, character))
    return await asyncio.wait_for(frame, 5.0) - t0


async def run(seconds: float, rate: float, from_thread: bool) -> None:
    source = outage()
    make = event_mix(source)
    app = CapmonApp(source)  # the default refresh (0.33 s) and drain rate
    published = 0
    stop = threading.Event()

    def feed_batch(n0: int, count: int) -> None:
        for i in range(count):
            source.bus.publish(make(n0 + i))

    async def feeder() -> None:
        # 100 batches a second, paced on the wall clock; the fake clock moves with it
        # so countdowns tick and cells change on every refresh.
        nonlocal published
        start = time.perf_counter()
        last = start
        while not stop.is_set():
            now = time.perf_counter()
            due = int((now - start) * rate) - published
            source.clock.advance(now - last)
            last = now
            if due > 0:
                feed_batch(published, due)
                published += due
            await asyncio.sleep(0.01)

    def thread_feeder() -> None:
        nonlocal published
        start = time.perf_counter()
        while not stop.is_set():
            due = int((time.perf_counter() - start) * rate) - published
            if due > 0:
                feed_batch(published, due)
                published += due
            time.sleep(0.01)

    latencies: dict[str, list[float]] = {"p (pause)": [], "/ (filter)": []}
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        watch = FrameWatch(app)
        while not app.started:
            await pilot.pause(0.01)
        thread = None
        task = None
        if from_thread:
            thread = threading.Thread(target=thread_feeder, daemon=True)
            thread.start()
        else:
            task = asyncio.create_task(feeder())
        cpu0, wall0 = time.process_time(), time.perf_counter()
        next_probe = wall0 + 1.0
        filter_open = lambda: app.filter_bar.has_class("-open")  # noqa: E731
        while time.perf_counter() - wall0 < seconds:
            await asyncio.sleep(0.05)
            if time.perf_counter() >= next_probe:
                latencies["p (pause)"].append(await key_latency(app, watch, "p", "p", lambda: app.paused))
                await key_latency(app, watch, "p", "p", lambda: not app.paused)
                latencies["/ (filter)"].append(await key_latency(app, watch, "slash", "/", filter_open))
                await key_latency(app, watch, "escape", "\x1b", lambda: not filter_open())
                next_probe = time.perf_counter() + 2.0
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        stop.set()
        if task is not None:
            await task
        if thread is not None:
            thread.join()
        lines = app.log_view.written
        refreshes = app.refreshes
        frames = watch.frames

    print(
        f"dashboard under load: {wall:.1f} s, {published:,} events published "
        f"({published / wall:,.0f}/s, {'from a thread' if from_thread else 'on the loop'}), size {SIZE[0]}x{SIZE[1]}"
    )
    print(f"  CPU: {cpu:.2f} s of process time in {wall:.1f} s wall = {cpu / wall:.0%} of one core (goal < 50%)")
    print(
        f"  table refreshes: {refreshes} ({refreshes / wall:.1f}/s); frames drawn: {frames} ({frames / wall:.1f}/s); "
        f"log lines written: {lines} (fallbacks coalesced per second and pair)"
    )
    for key, values in latencies.items():
        if values:
            print(
                f"  key {key} to screen: median {statistics.median(values) * 1000:.0f} ms, "
                f"max {max(values) * 1000:.0f} ms over {len(values)} presses (goal < 100 ms)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second")
    parser.add_argument("--from-thread", action="store_true", help="publish from another thread, not the app's loop")
    args = parser.parse_args()
    asyncio.run(run(args.seconds, args.rate, args.from_thread))


if __name__ == "__main__":
    main()
