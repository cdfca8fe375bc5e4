"""The capmon dashboard.

Tables are drawn from ``source.snapshot()`` on a timer (``refresh`` seconds); the bus only
drives the event log and toasts. Workers (probes, traffic) run as Textual workers
in the app's loop; whatever goes wrong in one of them, or in a refresh, is reported
in one place (:meth:`CapmonApp.report_error`: a toast and a log line), never a crash.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Footer
from textual.worker import Worker, WorkerState

from capmon.core.base.exceptions import CapmonError
from capmon.core.types.config import REFRESH_MAX, REFRESH_MIN, DashboardConfig
from capmon.core.types.events import BatchProgress, Event
from capmon.core.types.snapshot import EngineSnapshot, TargetSnapshot
from capmon.core.types.states import JobState
from capmon.exitcodes import EXIT_OK, EXIT_USAGE
from capmon.tui.commands import ModelCommands
from capmon.tui.digest import LOGGED, EventDigester
from capmon.tui.screens import ConfirmScreen, HelpScreen, ModelChoice, ModelSwitchScreen
from capmon.tui.source import DashboardSource
from capmon.tui.widgets import BackoffPanel, BatchPanel, EventLog, FilterBar, FleetPanel, ModelsTable, StatusBar

# Actions that change what the engine does; a read-only dashboard neither shows nor runs them.
CONTROL_ACTIONS = frozenset({"switch_model", "automatic", "trip", "reset", "force_close", "toggle_batch"})
# Dashboard actions that make no sense behind a modal (a second confirmation on top of the first).
SCREEN_ACTIONS = CONTROL_ACTIONS | {"toggle_pause", "filter", "help"}

# Bindings kept out of the footer for room, but listed by the help screen.
LISTED_HIDDEN = frozenset({"automatic"})
# Keys the help screen lists besides the bindings.
EXTRA_KEYS = [
    ("↑ ↓ / click", "select a model row (t, r, c act on it)"),
    ("ctrl+p", "command palette: Pin model: X, Automatic routing, Trip / Reset breaker: X"),
    ("escape", "clear the filter, close a dialog"),
]


class CapmonApp(App[int]):
    CSS_PATH = "capmon.tcss"
    TITLE = "capmon"
    COMMANDS = App.COMMANDS | {ModelCommands}

    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("p", "toggle_pause", "Pause view"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("m", "switch_model", "Model…"),
        Binding("a", "automatic", "Automatic routing (unpin)", show=False),
        Binding("t", "trip", "Trip…"),
        Binding("r", "reset", "Reset"),
        Binding("c", "force_close", "Force close…"),
        Binding("b,space", "toggle_batch", "Batch pause"),
    ]

    paused: reactive[bool] = reactive(False)
    needle: reactive[str] = reactive("")

    @dataclass
    class EventsArrived(Message):
        """Bus events wait in the inbox: one message per burst, not per event."""

    def __init__(
        self, source: DashboardSource, *, refresh: float = DashboardConfig.refresh, drain_every: float = 0.25
    ) -> None:
        super().__init__()
        self.source = source
        self.refresh_every = refresh
        self.drain_every = drain_every
        self.snap: EngineSnapshot | None = None
        self.batch: BatchProgress | None = None
        self.started = False
        self.refreshes = 0
        self._digester = EventDigester()
        # Filled by the bus subscriber in any thread; drained on the app's thread.
        self._inbox: collections.deque[Event] = collections.deque(maxlen=20_000)
        self._drain_pending = False
        self._last_drain = 0.0
        self._hold_timer: Timer | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._stopped = False
        self._batch_state: JobState | None = None
        self._errors_shown: set[str] = set()
        self._widgets_found = False  # on_mount has found the widgets the watchers below draw on

    # ------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield ModelsTable(id="models")
        with Horizontal(id="middle"):
            yield BackoffPanel(id="backoff")
            yield BatchPanel(id="batch")
            yield FleetPanel(id="fleet")
        yield EventLog(id="log")
        yield FilterBar(id="filter")
        yield Footer()

    async def on_mount(self) -> None:
        # Kept as attributes: App.query_one searches the *current* screen, which is a
        # modal while a dialog is open, and the tables keep refreshing underneath it.
        self.status_bar = self.query_one(StatusBar)
        self.table = self.query_one(ModelsTable)
        self.backoff_panel = self.query_one(BackoffPanel)
        self.batch_panel = self.query_one(BatchPanel)
        self.fleet_panel = self.query_one(FleetPanel)
        self.log_view = self.query_one(EventLog)
        self.filter_bar = self.query_one(FilterBar)
        self._widgets_found = True
        self._unsubscribe = self.source.bus.subscribe(self._on_bus_event)
        self.table.focus()
        self._show_status()
        # Catch up on what happened before the dashboard opened (the bus keeps a ring);
        # old news goes to the log, not to toasts.
        self.show_events(self.source.bus.recent(types=LOGGED), toasts=False)
        self.run_worker(self._run_engine(), name="engine", group="engine", exclusive=True, exit_on_error=False)
        self.set_interval(self.refresh_every, self.refresh_view, name="refresh")

    async def _run_engine(self) -> None:
        try:
            await self.source.start()
        except Exception as e:  # a simulator that cannot bind, a key variable missing: say so and leave
            self.exit(return_code=EXIT_USAGE, message=Text(f"capmon: {e}", style="bold red"))
            return
        self.started = True
        self.refresh_bindings()
        self.refresh_view()
        for spec in self.source.workers():
            self.run_worker(spec.run(), name=spec.name, group=spec.group, exclusive=True, exit_on_error=False)

    # ------------------------------------------------------------ refresh from snapshots

    def refresh_view(self, force: bool = False) -> None:
        if not self.started or self._stopped or not self.is_running or (self.paused and not force):
            return
        try:
            self.snap = self.source.snapshot()
            self.batch = self.source.batch()
            self.table.show(self.snap, self.needle)
            self.backoff_panel.show(self.snap)
            self.batch_panel.show(
                self.batch,
                why_none=self._why_no_batch(),
                can_pause=self.source.can_pause_batch and not self.source.readonly,
            )
            self.fleet_panel.show(self.snap.shared)
            self._show_status()
            self._watch_batch_state(self.batch)
            self.refreshes += 1
        except Exception as e:
            self.report_error("refresh", e)

    def _why_no_batch(self) -> str:
        return getattr(getattr(self.source, "traffic", None), "name", "") or "no batch"

    def _show_status(self) -> None:
        self.status_bar.show(
            self.snap,
            description=self.source.description,
            paused=self.paused,
            readonly=self.source.readonly,
            needle=self.needle,
        )

    def _watch_batch_state(self, batch: BatchProgress | None) -> None:
        state = batch.state if batch is not None else None
        if state != self._batch_state and state is JobState.FINISHED and batch is not None:
            self.log_view.add(
                batch.wall,
                Text(f"✔ batch {batch.job} finished: {batch.done:,} done, {batch.failed:,} failed", style="bold cyan"),
            )
            self.notify(f"{batch.done:,} done, {batch.failed:,} failed", title=f"Batch {batch.job} finished")
        self._batch_state = state

    # ------------------------------------------------------------ events -> log and toasts

    def _on_bus_event(self, event: Event) -> None:
        """Called in whatever thread published: keep it cheap and thread-safe."""
        if not self._digester.wants(event):
            return
        self._inbox.append(event)
        if not self._drain_pending:
            self._request_drain()

    def _request_drain(self) -> None:
        self._drain_pending = True
        self.post_message(self.EventsArrived())  # thread-safe in Textual

    def on_capmon_app_events_arrived(self, _: EventsArrived) -> None:
        # At most one drain per drain_every: a flood becomes a few coalesced lines.
        wait = self._last_drain + self.drain_every - time.monotonic()
        if wait > 0:
            self.set_timer(wait, self.drain_events)
        else:
            self.drain_events()

    def drain_events(self, flush: bool = False) -> None:
        """Write what the inbox holds. ``flush``: fallbacks of the current second too."""
        self._drain_pending = False
        if self._stopped:
            return
        self._last_drain = time.monotonic()
        events: list[Event] = []
        while self._inbox:
            events.append(self._inbox.popleft())
        self.show_events(events, now_wall=None if flush else self.source.clock.wall())
        if self._digester.holding and self._hold_timer is None:
            # Fallback counts wait for their second to end: come back when it has.
            wall = self.source.clock.wall()
            self._hold_timer = self.set_timer(max(0.05, int(wall) + 1 - wall), self._end_of_second)

    def _end_of_second(self) -> None:
        self._hold_timer = None
        self.drain_events()

    def show_events(self, events: list[Event], *, toasts: bool = True, now_wall: float | None = None) -> None:
        digest = self._digester.digest(events, toasts=toasts, now_wall=now_wall)
        if not digest.lines and not digest.toasts:
            return
        log = self.log_view
        for wall, line in digest.lines:
            log.add(wall, line)
        if digest.left_out:
            log.add(
                digest.lines[-1][0],
                Text(f"… {digest.left_out} more events in this burst (log rate-limited)", style="dim"),
            )
        for toast in digest.toasts:
            self.notify(
                toast.message,
                title=toast.title,
                severity=toast.severity,  # type: ignore[arg-type]
                timeout=toast.timeout,
            )

    # ------------------------------------------------------------ errors, in one place

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if event.state == WorkerState.ERROR and worker.error is not None:
            self.report_error(worker.name or "worker", worker.error)
        elif event.state == WorkerState.SUCCESS and worker.group == "traffic":
            self.log_view.add(self._wall(), Text(f"• {worker.name} stopped", style="dim"))

    def report_error(self, where: str, error: BaseException) -> None:
        if self._stopped:  # on the way out: nothing left to show it on
            return
        message = f"{where}: {error}" if isinstance(error, CapmonError) else f"{where}: {type(error).__name__}: {error}"
        if message in self._errors_shown:  # the same failure on every refresh: said once
            return
        self._errors_shown.add(message)
        self.log_view.add(self._wall(), Text(f"✖ {message}", style="bold red"))
        self.notify(message, title="Error", severity="error", timeout=10)

    def _wall(self) -> float:
        return self.snap.wall if self.snap is not None else self.source.clock.wall()

    # ------------------------------------------------------------ bindings

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in CONTROL_ACTIONS and self.source.readonly:
            return False
        if action == "toggle_batch" and not self.source.can_pause_batch:
            return False
        if action in SCREEN_ACTIONS and isinstance(self.screen, ModalScreen):
            return False
        return True

    def help_keys(self) -> list[tuple[str, str]]:
        keys: list[tuple[str, str]] = []
        for b in self.BINDINGS:
            assert isinstance(b, Binding)
            if not b.show and b.action not in LISTED_HIDDEN:
                continue
            if self.source.readonly and b.action in CONTROL_ACTIONS:
                continue
            if b.action == "toggle_batch" and not self.source.can_pause_batch:
                continue
            shown = b.key_display or b.key.replace(",", " / ")
            keys.append((shown, b.description))
        return keys + EXTRA_KEYS

    # ------------------------------------------------------------ actions: the view

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.help_keys(), readonly=self.source.readonly))

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        if not self._widgets_found:
            return
        self.log_view.freeze(paused)
        self._show_status()
        if not paused:
            self.refresh_view()

    def action_filter(self) -> None:
        self.filter_bar.open()

    def on_filter_bar_changed(self, event: FilterBar.Changed) -> None:
        self.needle = event.text

    def on_filter_bar_done(self, _: FilterBar.Done) -> None:
        self.table.focus()

    def watch_needle(self, needle: str) -> None:
        if not self._widgets_found:
            return
        # Applies to the frozen snapshot too: filtering is not new data.
        if self.snap is not None:
            self.table.show(self.snap, needle)
        self._show_status()

    async def action_quit(self) -> None:
        await self.shutdown_engine()
        self.exit(0)

    async def on_unmount(self) -> None:
        await self.shutdown_engine()

    async def shutdown_engine(self) -> None:
        """Stop the workers first, then the engine they use (client, simulator)."""
        if self._stopped:
            return
        self._stopped = True
        if self._unsubscribe is not None:
            self._unsubscribe()
        workers = [w for w in self.workers if w.group != "engine" and not w.is_finished]
        for w in workers:
            w.cancel()
        await asyncio.gather(*(w.wait() for w in workers), return_exceptions=True)
        try:
            await asyncio.wait_for(self.source.stop(), timeout=5.0)
        except Exception as e:  # leaving anyway; never hang on the way out
            self.log.error(f"stopping the engine: {e!r}")

    # ------------------------------------------------------------ actions: the engine

    def _selected(self) -> TargetSnapshot | None:
        target = self.table.selected_target
        if target is None or self.snap is None:
            self.notify("Select a model row first (arrow keys or a click).", severity="warning")
            return None
        return next((t for t in self.snap.targets if t.target == target), None)

    def _control(self, what: str, fn: Callable[..., Any], *args: Any) -> bool:
        """Run a manual action; refusals and errors become toasts, never crashes."""
        if self.source.readonly:
            self.notify(f"Read-only dashboard: {what} is not allowed.", severity="warning")
            return False
        try:
            fn(*args)
        except (CapmonError, RuntimeError, KeyError) as e:
            self.notify(f"{what}: {e}", title="Not done", severity="error")
            return False
        # A manual action shows its effect at once, even on a paused display.
        self.refresh_view(force=True)
        return True

    def pin_model(self, model: str | None) -> bool:
        return self._control("automatic routing" if model is None else f"pin {model}", self.source.pin, model)

    def reset_target(self, target: str) -> bool:
        return self._control(f"reset {target}", self.source.reset, target)

    def request_trip(self, target: str, label: str | None = None) -> None:
        if self.source.readonly:
            self.notify("Read-only dashboard: trip is not allowed.", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._control(f"trip {label or target}", self.source.trip, target)

        self.push_screen(
            ConfirmScreen(
                f"Trip {label or target}?",
                "No traffic goes to it until you reset it (r). Fallbacks take over.",
                yes="Trip",
            ),
            answered,
        )

    def action_switch_model(self) -> None:
        def chosen(choice: ModelChoice | None) -> None:
            if choice is not None:
                self.pin_model(choice.model)

        self.push_screen(ModelSwitchScreen(list(self.source.models), self.snap), chosen)

    def action_automatic(self) -> None:
        self.pin_model(None)

    def action_trip(self) -> None:
        t = self._selected()
        if t is not None:
            # one row of a model served at several endpoints is one deployment of it
            several = self.snap is not None and any(
                o.model == t.model and o.endpoint != t.endpoint for o in self.snap.targets
            )
            self.request_trip(t.target, f"{t.model} at {t.endpoint}" if several else t.model)

    def action_reset(self) -> None:
        t = self._selected()
        if t is not None:
            self.reset_target(t.target)

    def action_force_close(self) -> None:
        t = self._selected()
        if t is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._control(f"force close {t.model}", self.source.force_close, t.target)

        self.push_screen(
            ConfirmScreen(
                f"Force {t.model} closed?",
                "It takes traffic whatever its errors, until you reset it (r).",
                yes="Force close",
            ),
            answered,
        )

    def action_toggle_batch(self) -> None:
        if self.source.batch_paused:
            self._control("resume the batch", self.source.resume_batch)
        else:
            self._control("pause the batch", self.source.pause_batch)


@dataclass(frozen=True)
class DashboardOptions:
    config: str | None = None  # a config path; None: the usual search (capmon/core/types/config.py find_config)
    refresh: float | None = None  # seconds between table refreshes; None: the config's [dashboard] refresh
    readonly: bool = False  # no manual trip / reset / pin / batch pause
    job: Path | None = None  # run this JSONL file as the traffic worker instead of the demo job
    attach: str | None = None  # show the progress of this job, run by `capmon batch run` elsewhere
    traffic: bool = True  # False: probes only

    def __post_init__(self) -> None:
        if self.refresh is not None and not REFRESH_MIN <= self.refresh <= REFRESH_MAX:
            raise CapmonError(
                f"refresh must be between {REFRESH_MIN:g} and {REFRESH_MAX:g} seconds, got {self.refresh:g}"
            )


def run_dashboard(options: DashboardOptions) -> int:
    """The live dashboard on the configured engine, until the person quits."""
    from capmon.runtime import load, require_extras
    from capmon.tui.source import LiveSource

    config = load(options.config)
    require_extras(config)  # an extra the config needs and lacks: one line, before the screen opens
    if options.job is not None and not options.job.is_file():
        raise CapmonError(f"{options.job}: no such input file")
    source = LiveSource(
        config, readonly=options.readonly, job_input=options.job, attach=options.attach, traffic=options.traffic
    )
    if options.attach is not None:
        # A job that is not there is a usage error: say so before the screen opens.
        from capmon.batch.store import locate, read_progress

        read_progress(locate(), options.attach)
    app = CapmonApp(source, refresh=config.dashboard.refresh if options.refresh is None else options.refresh)
    app.run()
    return app.return_code or EXIT_OK
