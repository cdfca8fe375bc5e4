"""SVG snapshots of the main states, from scripted data on a ManualClock.

Update the baselines with ``pytest tests/tui/test_snapshots.py --snapshot-update``
and look at every changed SVG before committing it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

import capmon.tui.app
from capmon.tui.app import CapmonApp
from tests.tui.conftest import SIZE
from tests.tui.fakes import FakeSource, fleet, outage, steady


class StillApp(CapmonApp):
    """The dashboard with toasts that stay: a toast's timeout runs on the real clock, so on
    a loaded machine the snapshot could be taken after a 5 s toast was gone."""

    CSS_PATH = str(Path(capmon.tui.app.__file__).with_name(CapmonApp.CSS_PATH))  # beside the app's module

    def notify(self, message: str, *args: Any, **kw: Any) -> None:
        kw["timeout"] = 3600.0
        super().notify(message, *args, **kw)


def app_for(source: FakeSource) -> CapmonApp:
    # A long refresh: the first refresh happens on start, and nothing moves after it.
    return StillApp(source, refresh=10.0, drain_every=0.0)


def settled(source: FakeSource) -> Callable[[Pilot], object]:
    async def run_before(pilot: Pilot) -> None:
        app = pilot.app
        assert isinstance(app, CapmonApp)
        while not app.started:
            await pilot.pause(0.01)
        source.flush_pending()  # the outage's trip, fallbacks and parked key arrive live
        await pilot.pause()
        app.drain_events(flush=True)
        await pilot.pause()

    return run_before


def test_steady(snap_compare) -> None:
    """Everything closed; the demo job a third done."""
    source = steady()
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source))


def test_outage(snap_compare) -> None:
    """Flagship open and counting down, retries waiting, fallbacks logged, a toast."""
    source = outage()
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source))


def test_model_switch_open(snap_compare) -> None:
    """The model switch over the outage: automatic routing is the current choice."""
    source = outage()
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source), press=["m"])


def test_help_screen(snap_compare) -> None:
    source = steady()
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source), press=["question_mark"])


def test_readonly(snap_compare) -> None:
    """No trip / reset / model / batch keys in the footer; READ-ONLY in the status bar."""
    source = steady(readonly=True)
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source))


def test_paused_and_filtered(snap_compare) -> None:
    """The paused mark, a pinned model and the filter bar."""
    source = outage()
    source.pinned = "medium"
    assert snap_compare(
        app_for(source), terminal_size=SIZE, run_before=settled(source), press=["p", "slash", "m", "e", "d"]
    )


def test_fleet_degraded(snap_compare) -> None:
    """Shared with a gateway and a batch worker, Redis lost: the Fleet panel and the status bar say so."""
    source = fleet(degraded=True)
    assert snap_compare(app_for(source), terminal_size=SIZE, run_before=settled(source))
