"""Pilot tests: keys, modals, the palette, pause, filter, read-only, batch control."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import AsyncIterator

import pytest
from textual.command import CommandInput, CommandList
from textual.pilot import Pilot
from textual.widgets import OptionList

from capmon.core.base.exceptions import CapmonError
from capmon.core.types import events as ev
from capmon.core.types.snapshot import FleetProcess, LinkState, ModelSpend, SharedStatus
from capmon.tui.app import CapmonApp
from capmon.tui.screens import ConfirmScreen, HelpScreen, ModelSwitchScreen
from capmon.tui.source import ReadOnlyError, WorkerSpec
from tests.tui.conftest import SIZE
from tests.tui.fakes import FakeSource, outage, steady, target, trip_event
from tests.tui.screen_text import screen_text


@contextlib.asynccontextmanager
async def running(source: FakeSource, **kw: object) -> AsyncIterator[tuple[CapmonApp, Pilot]]:
    kw.setdefault("drain_every", 0.0)  # drain each burst at once: no waiting in tests
    # No background refreshes unless a test asks: a quiet app lets Pilot see it idle
    # sooner (manual actions and the filter redraw at once anyway).
    kw.setdefault("refresh", 30.0)
    app = CapmonApp(source, **kw)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(app, pilot)
        yield app, pilot


async def settle(app: CapmonApp, pilot: Pilot) -> None:
    while not app.started:
        await pilot.pause(0.01)
    await pilot.pause()
    app.drain_events(flush=True)
    await pilot.pause()


def row_states(app: CapmonApp) -> dict[str, str]:
    return {str(row.value): app.table.get_cell(row, "state").plain for row in app.table.rows}


# ---------------------------------------------------------------- what shows


async def test_rows_for_every_target_in_preference_order_and_the_batch() -> None:
    async with running(steady()) as (app, pilot):
        assert [str(k.value) for k in app.table.rows] == [
            "flagship@sim/sim-key",
            "claude@sim/sim-key",
            "medium@sim/sim-key",
            "small@sim/sim-key",
        ]
        text = screen_text(app)
        assert "● closed" in text and "Batch: demo · running" in text and "done 648" in text
        assert "routing: automatic" in text


async def test_the_outage_shows_the_countdown_retries_fallbacks_and_a_toast() -> None:
    source = outage()
    async with running(source) as (app, pilot):
        source.flush_pending()
        await settle(app, pilot)
        text = screen_text(app)
        assert "○ open" in text and "14s" in text  # cool-down from the deadline and the clock
        assert "Retries waiting (6)" in text and "item-00310" in text and "1.9s" in text
        assert "37 fallbacks flagship (openai) → claude (anthropic)" in text
        assert "12 fallbacks medium → small" in text  # within one provider: no APIs
        assert "parked 59m" in text
        assert any(n.title == "Breaker tripped" for n in app._notifications)


async def test_countdowns_follow_the_clock_not_a_sleeping_widget() -> None:
    source = outage()
    async with running(source) as (app, pilot):
        assert app.table.get_cell("flagship@sim/sim-key", "state").plain == "○ open, probe 14s"
        source.clock.advance(5.0)
        app.refresh_view()
        await pilot.pause()
        assert app.table.get_cell("flagship@sim/sim-key", "state").plain == "○ open, probe 9.2s"
        assert "4.6s" in screen_text(app)  # the 9.6 s retry, 5 s later


async def test_the_fleet_panel_shows_the_processes_and_a_degraded_link_and_hides_without_sharing() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        assert not app.fleet_panel.display and "shared" not in screen_text(app)  # memory: one process, no panel
        wall = source.clock.wall()
        procs = (
            FleetProcess("a", "host-a", 101, "gateway", 7, wall - 60, wall, False, this=True),
            FleetProcess("b", "host-b", 202, "batch", 3, wall - 30, wall, False),
        )
        source.shared = SharedStatus("redis", LinkState.OK, wall - 60, "", "redis://127.0.0.1:6379/0", "capmon", procs)
        app.refresh_view()
        await pilot.pause()
        text = screen_text(app)
        assert app.fleet_panel.display
        assert "Fleet (2)" in text and "shared: 2 processes" in text
        assert "gateway" in text and "host-b:202" in text and "7 in flight" in text
        source.shared = dataclasses.replace(
            source.shared, state=LinkState.DEGRADED, since=wall, message="connection refused"
        )
        app.refresh_view()
        await pilot.pause()
        text = screen_text(app)
        assert "shared state: DEGRADED" in text and "connection refused" in text
        assert app.fleet_panel.has_class("-degraded")


async def test_an_unreachable_endpoint_shows_in_the_status_bar_and_the_last_column() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        assert "UNREACHABLE" not in screen_text(app)
        flagship = next(t for t in source.targets.values() if t.model == "flagship")
        why = "endpoint sim (api.example.invalid) is unreachable: DNS lookup failed (...)"
        source.targets[flagship.target] = dataclasses.replace(
            flagship, unreachable_reason=why, never_reached=True, last_status=None
        )
        app.refresh_view()
        await pilot.pause()
        assert "UNREACHABLE: sim" in screen_text(app)
        assert app.table.get_cell(flagship.target, "last").plain == "net"


async def test_the_spend_so_far_shows_in_the_status_bar_once_an_answer_had_a_price() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        source.spend = (ModelSpend("small", 0.0, 40, 40),)  # answers without a price: no spend shown, no "$0"
        app.refresh_view()
        await pilot.pause()
        assert "spent" not in screen_text(app)
        source.spend = (ModelSpend("flagship", 1.25, 100, 0), ModelSpend("medium", 0.0042, 30, 2))
        app.refresh_view()
        await pilot.pause()
        shown = screen_text(app)
        assert "2 failed · $1.2542 spent" in shown
        assert "spent: flagship $1.2500 · medium $0.0042" in shown


# ---------------------------------------------------------------- trip, reset, force close


async def test_trip_asks_first_and_trips_the_selected_row_on_yes() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        await pilot.press("down", "down", "t")
        assert isinstance(app.screen, ConfirmScreen)
        assert "Trip medium?" in screen_text(app)
        await pilot.press("y")
        await settle(app, pilot)
        assert source.calls == [("trip", "medium@sim/sim-key")]
        assert row_states(app)["medium@sim/sim-key"] == "✋ open (manual)"
        assert any(n.title == "Tripped by hand" for n in app._notifications)
        assert "tripped by hand" in screen_text(app)


async def test_a_cancelled_trip_changes_nothing() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        for cancel in ("n", "escape"):
            await pilot.press("t", cancel)
            assert not isinstance(app.screen, ConfirmScreen)
        assert source.calls == []
        assert row_states(app)["flagship@sim/sim-key"] == "● closed"


async def test_the_confirmation_buttons_work_with_the_mouse() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        await pilot.press("t")
        await pilot.click("#yes")
        await pilot.pause()
        assert source.calls == [("trip", "flagship@sim/sim-key")]


async def test_a_click_selects_the_row_that_t_then_trips() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        await pilot.click("ModelsTable", offset=(4, 5))  # border, header, flagship, claude, medium, small
        await pilot.press("t", "y")
        await pilot.pause()
        assert source.calls == [("trip", "small@sim/sim-key")]


async def test_reset_closes_the_selected_breaker_at_once() -> None:
    source = outage()
    async with running(source) as (app, pilot):
        assert row_states(app)["flagship@sim/sim-key"] == "○ open, probe 14s"
        await pilot.press("r")
        await pilot.pause()
        assert source.calls == [("reset", "flagship@sim/sim-key")]
        assert row_states(app)["flagship@sim/sim-key"] == "● closed"


async def test_force_close_asks_then_shows_a_manual_state() -> None:
    source = outage()
    async with running(source) as (app, pilot):
        await pilot.press("c")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause()
        assert row_states(app)["flagship@sim/sim-key"] == "✋ closed (manual)"


async def test_a_second_confirmation_cannot_open_on_top_of_the_first() -> None:
    async with running(steady()) as (app, pilot):
        await pilot.press("t", "t", "m")
        assert isinstance(app.screen, ConfirmScreen)
        assert len(app.screen_stack) == 2


# ---------------------------------------------------------------- pin and unpin


async def test_pin_from_the_model_switch_and_back_to_automatic() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        await pilot.press("m")
        assert isinstance(app.screen, ModelSwitchScreen)
        await pilot.press("down", "down", "down", "enter")  # automatic, flagship, claude, [medium]
        await settle(app, pilot)
        assert source.pinned == "medium"
        text = screen_text(app)
        assert "pinned medium (manual)" in text and "▸ medium" in text
        assert "pinned medium: traffic goes there first" in text

        await pilot.press("m", "down", "escape")  # escape: no change
        assert not isinstance(app.screen, ModelSwitchScreen) and source.pinned == "medium"

        await pilot.press("m")
        await pilot.press("home", "enter")
        await settle(app, pilot)
        assert source.pinned is None
        assert "automatic routing (unpinned)" in screen_text(app)

        source.pinned = "small"
        await pilot.press("a")  # straight back to automatic, no dialog
        assert source.pinned is None
        assert source.calls == [("pin", "medium"), ("pin", None), ("pin", None)]


async def palette(app: CapmonApp, pilot: Pilot, query: str) -> str:
    """Open the palette, search (one Input change, not a key per letter), return what it lists."""
    await pilot.press("ctrl+p")
    app.screen.query_one(CommandInput).value = query
    for _ in range(25):  # the palette searches in the background
        await pilot.pause(0.02)
        if app.screen.query_one(CommandList).option_count:
            break
    return screen_text(app)


async def test_pin_and_unpin_from_the_command_palette() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        assert "Pin model: small" in await palette(app, pilot, "Pin model: small")
        await pilot.press("enter")
        await settle(app, pilot)
        assert source.pinned == "small"

        await palette(app, pilot, "Automatic routing")
        await pilot.press("enter")
        await settle(app, pilot)
        assert source.pinned is None
        assert source.calls == [("pin", "small"), ("pin", None)]


# ---------------------------------------------------------------- view: pause, filter, help


async def test_pause_freezes_the_screen_while_data_keeps_coming() -> None:
    source = outage()
    async with running(source, refresh=0.1) as (app, pilot):
        await pilot.press("p")
        assert app.paused and "PAUSED" in screen_text(app)
        before = app.table.get_cell("flagship@sim/sim-key", "state").plain
        source.clock.advance(3.0)
        source.emit(ev.Notice, level="info", message="arrived while paused")
        await pilot.pause(0.2)
        app.drain_events(flush=True)
        await pilot.pause()
        assert app.table.get_cell("flagship@sim/sim-key", "state").plain == before
        assert "arrived while paused" not in screen_text(app)
        assert "1 held while paused" in screen_text(app)  # the log says it is holding lines

        await pilot.press("p")
        await pilot.pause()
        assert not app.paused and "PAUSED" not in screen_text(app)
        assert app.table.get_cell("flagship@sim/sim-key", "state").plain == "○ open, probe 11s"
        assert "arrived while paused" in screen_text(app)


async def test_filter_narrows_the_rows_and_escape_clears_it() -> None:
    async with running(outage()) as (app, pilot):
        await pilot.press("slash")
        await pilot.press(*"med")
        await pilot.pause()
        assert app.table.row_count == 2 and app.needle == "med"
        assert "filter: med" in screen_text(app)
        await pilot.press("enter")
        assert app.focused is app.table  # keys act on rows again
        assert app.table.row_count == 2

        await pilot.press("slash", "escape")
        await pilot.pause()
        assert app.needle == "" and app.table.row_count == 5

        await pilot.press("slash", "q", "t", "p")  # letters go to the filter, not to the bindings
        assert app.is_running and not app.paused and not isinstance(app.screen, ConfirmScreen)
        assert app.needle == "qtp" and app.table.row_count == 0


async def test_help_lists_the_keys() -> None:
    async with running(steady()) as (app, pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for word in ("Trip", "Reset", "Pause view", "Filter", "Model", "command palette", "half-open"):
            assert word in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


# ---------------------------------------------------------------- read-only


async def test_readonly_hides_and_refuses_every_manual_action() -> None:
    source = steady(readonly=True)
    async with running(source) as (app, pilot):
        shown = {b.binding.action for b in app.screen.active_bindings.values() if b.enabled}
        assert not shown & {"trip", "reset", "force_close", "switch_model", "toggle_batch", "automatic"}
        assert {"quit", "help", "toggle_pause", "filter"} <= shown
        footer = screen_text(app).splitlines()[-1]
        assert "Trip" not in footer and "Model" not in footer and "Reset" not in footer
        assert "READ-ONLY" in screen_text(app)

        await pilot.press("t", "r", "c", "m", "b", "a")
        await pilot.pause()
        assert len(app.screen_stack) == 1 and source.calls == []

        await app.run_action("trip")
        assert not app.pin_model("small") and not app.reset_target("flagship")
        app.request_trip("flagship")
        await pilot.pause()
        assert len(app.screen_stack) == 1 and source.calls == [] and source.pinned is None
        with pytest.raises(ReadOnlyError):
            source.trip("flagship")


async def test_readonly_palette_offers_no_routing_commands() -> None:
    source = steady(readonly=True)
    async with running(source) as (app, pilot):
        text = await palette(app, pilot, "Pin model")
        assert "Pin model: small" not in text
        await pilot.press("enter")
        await pilot.pause()
        assert source.pinned is None and source.calls == []


# ---------------------------------------------------------------- batch


async def test_b_pauses_and_space_resumes_the_batch() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        await pilot.press("b")
        await pilot.pause()
        assert source.batch_paused and "Batch: demo · paused" in screen_text(app)
        await pilot.press("space")
        await pilot.pause()
        assert not source.batch_paused and "Batch: demo · running" in screen_text(app)
        assert source.calls == [("pause_batch", None), ("resume_batch", None)]


async def test_a_batch_that_cannot_be_paused_has_no_key() -> None:
    source = FakeSource(list(steady().targets.values()), batch=None)
    async with running(source) as (app, pilot):
        assert "Batch pause" not in screen_text(app)
        await pilot.press("b")
        assert source.calls == []


# ---------------------------------------------------------------- events and errors


async def test_a_flood_of_fallbacks_becomes_one_line_per_second_and_pair() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        written = app.log_view.written
        for n in range(5000):
            source.emit(
                ev.FellBack, request_id=n, item_id=None, from_model="flagship", to_model="medium", reason="full"
            )
            source.emit(ev.AttemptStarted, request_id=n, item_id=None, model="medium", target="t", attempt=2)
        await pilot.pause()
        app.drain_events(flush=True)
        await pilot.pause()
        assert app.log_view.written - written == 1
        assert "5000 fallbacks flagship → medium" in screen_text(app)


async def test_events_published_from_another_thread_reach_the_log() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        t = threading.Thread(target=lambda: source.emit(ev.Notice, level="warning", message="from a thread"))
        t.start()
        t.join()
        await pilot.pause()
        app.drain_events(flush=True)
        await pilot.pause()
        assert "from a thread" in screen_text(app)


async def test_a_trip_event_makes_a_toast_and_a_log_line() -> None:
    source = steady()
    async with running(source) as (app, pilot):
        trip_event(source, "flagship")
        await pilot.pause()
        app.drain_events(flush=True)
        await pilot.pause()
        assert any(n.title == "Breaker tripped" and "flagship" in n.message for n in app._notifications)
        assert "flagship breaker closed → open" in screen_text(app)


async def test_a_failing_worker_is_a_toast_and_a_log_line_not_a_crash() -> None:
    async def broken() -> None:
        raise RuntimeError("the traffic worker fell over")

    source = FakeSource(list(steady().targets.values()), workers=[WorkerSpec("traffic", "traffic", broken)])
    async with running(source) as (app, pilot):
        await pilot.pause(0.2)
        assert app.is_running
        assert any("fell over" in n.message and n.severity == "error" for n in app._notifications)
        assert "traffic: RuntimeError: the traffic worker fell over" in screen_text(app)


async def test_an_engine_that_cannot_start_exits_with_code_2() -> None:
    class NoStart(FakeSource):
        async def start(self) -> None:
            raise CapmonError("127.0.0.1:8089 is taken by something that is not a capmon simulator")

    app = CapmonApp(NoStart(list(steady().targets.values())))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
    assert app.return_code == 2


async def test_quit_stops_the_workers_then_the_source() -> None:
    stopped_first: list[bool] = []
    source = steady()

    async def forever() -> None:
        try:
            await source.clock.sleep(0)
            import asyncio

            await asyncio.Event().wait()
        finally:
            stopped_first.append(not source.stopped)

    source._workers = [WorkerSpec("probe x", "probe:x", forever)]
    app = CapmonApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await settle(app, pilot)
        await pilot.press("q")
        await pilot.pause()
    assert source.stopped and stopped_first == [True]


async def test_a_model_on_two_deployments_shows_each_and_its_id_in_a_wider_column() -> None:
    rows = [
        target("claude", 0, endpoint="anthropic", deployment="claude-sonnet-4-5"),
        target("claude", 0, endpoint="vertex", deployment="claude-sonnet-4-5@20250929"),
        target("small", 1, deployment="sim-small"),
    ]
    async with running(FakeSource(rows)) as (app, pilot):
        names = [app.table.get_cell(row, "model").plain.strip() for row in app.table.rows]
        text = screen_text(app)
    assert names == ["claude@anthropic (claude-sonnet-4-5)", "claude@vertex (claude-sonnet-4-5@20250929)", "small"]
    assert "claude@vertex (claude-sonnet-4-5@20250929)" in text  # on screen whole, not clipped


async def test_pin_trip_and_reset_one_deployment_from_the_switch_the_palette_and_the_row() -> None:
    rows = [
        target("claude", 0, endpoint="anthropic", deployment="claude-sonnet-4-5"),
        target("claude", 0, endpoint="vertex", deployment="claude-sonnet-4-5@20250929"),
        target("small", 1, deployment="sim-small"),
    ]
    source = FakeSource(rows)
    async with running(source) as (app, pilot):
        await pilot.press("m")
        assert isinstance(app.screen, ModelSwitchScreen)
        text = screen_text(app)
        assert "Pin claude at anthropic" in text and "Pin claude at vertex" in text
        assert "Pin small at" not in text  # one endpoint: the model is the deployment
        await pilot.press("down", "down", "down", "enter")  # automatic, claude, at anthropic, [at vertex]
        await settle(app, pilot)
        assert source.pinned == "claude@vertex"
        assert "pinned claude@vertex (manual)" in screen_text(app)
        marked = [str(r.value) for r in app.table.rows if app.table.get_cell(r, "model").plain.startswith("▸")]
        assert marked == ["claude@vertex/sim-key"]  # the pin mark on that deployment's row only

        await pilot.press("m")  # the switch opens on what is pinned now
        assert app.screen.query_one(OptionList).highlighted == 3
        await pilot.press("escape")

        # The selected row (the first: claude at anthropic) trips that deployment, named so.
        await pilot.press("t")
        assert isinstance(app.screen, ConfirmScreen) and "Trip claude at anthropic?" in screen_text(app)
        await pilot.press("enter")
        await settle(app, pilot)
        assert row_states(app)["claude@anthropic/sim-key"].endswith("(manual)")
        assert not row_states(app)["claude@vertex/sim-key"].endswith("(manual)")

        # The palette: reset the deployment, then trip the whole model.
        assert "Reset breaker: claude@anthropic" in await palette(app, pilot, "Reset breaker: claude@anthropic")
        await pilot.press("enter")
        await settle(app, pilot)
        assert not row_states(app)["claude@anthropic/sim-key"].endswith("(manual)")
        assert "Pin deployment: claude@anthropic" in await palette(app, pilot, "Pin deployment: claude@anthropic")
        await pilot.press("enter")
        await settle(app, pilot)
    assert source.pinned == "claude@anthropic"
    assert source.calls == [
        ("pin", "claude@vertex"),
        ("trip", "claude@anthropic/sim-key"),
        ("reset", "claude@anthropic"),
        ("pin", "claude@anthropic"),
    ]
