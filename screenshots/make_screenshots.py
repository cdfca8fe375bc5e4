"""Make the screenshots of the README and docs/: deterministic runs of the dashboard on scripted
data (tests/tui/fakes.py) and a fixed clock, saved as SVG.

    python screenshots/make_screenshots.py          # writes screenshots/*.svg

Same data, same clock, same size: the files only change when the dashboard does.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # for tests.tui.fakes when run as a script

from textual.pilot import Pilot  # noqa: E402

from capmon.tui.app import CapmonApp  # noqa: E402
from tests.tui.fakes import FakeSource, fleet, outage, steady  # noqa: E402

SIZE = (160, 42)

Step = Callable[[CapmonApp, Pilot], Awaitable[None]]


async def nothing(app: CapmonApp, pilot: Pilot) -> None:
    return None


async def open_model_switch(app: CapmonApp, pilot: Pilot) -> None:
    await pilot.press("m", "down")  # the highlight on "Pin flagship", over the outage
    await pilot.pause()


SHOTS: list[tuple[str, Callable[[], FakeSource], Step, str]] = [
    ("steady", steady, nothing, "capmon: steady state"),
    ("outage", outage, nothing, "capmon: flagship out, retries waiting, fallbacks"),
    ("model-switch", outage, open_model_switch, "capmon: the model switch"),
    ("fleet-degraded", lambda: fleet(degraded=True), nothing, "capmon: a fleet that lost its Redis"),
]


async def shoot(name: str, make: Callable[[], FakeSource], step: Step, title: str) -> Path:
    source = make()
    app = CapmonApp(source, refresh=60.0, drain_every=0.0)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        while not app.started:
            await pilot.pause(0.01)
        source.flush_pending()  # the outage's events arrive live: log lines and toasts
        await pilot.pause()
        app.drain_events(flush=True)
        await pilot.pause()
        await step(app, pilot)
        await pilot.pause()
        path = HERE / f"{name}.svg"
        # Fixed title and file name: no date in the output, so reruns are byte-stable.
        path.write_text(app.export_screenshot(title=title), encoding="utf-8")
    return path


async def main() -> None:
    os.environ["TZ"] = "UTC"  # the clock in the status bar and the log
    time.tzset()
    for name, make, step, title in SHOTS:
        print(await shoot(name, make, step, title))


if __name__ == "__main__":
    asyncio.run(main())
