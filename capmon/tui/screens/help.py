"""`?`: every key the dashboard answers to, and what the states mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from capmon.core.control.breaker import State
from capmon.tui import format as fmt

STATE_HELP = {
    State.CLOSED: "takes traffic",
    State.HALF_OPEN: "the client's probe is out: it decides",
    State.RAMP: "recovering: admits a share, a slot more per clean answer",
    State.OPEN: "tripped: probed at growing intervals",
    State.FORCED_OPEN: "tripped by hand: no traffic until reset",
    State.FORCED_CLOSED: "closed by hand: traffic whatever happens",
}


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        background: $background 60%;
    }
    HelpScreen > VerticalScroll {
        width: 84;
        height: auto;
        max-height: 90%;
        border: thick $primary;
        background: $surface;
        padding: 1 2;
    }
    """

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, keys: list[tuple[str, str]], *, readonly: bool) -> None:
        super().__init__()
        self.keys = keys
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._render_help())

    def _render_help(self) -> Table:
        outer = Table.grid(padding=(0, 0))
        outer.add_column()
        outer.add_row(Text("capmon keys", style="bold"))
        keys = Table.grid(padding=(0, 2))
        keys.add_column(style="bold cyan", no_wrap=True)
        keys.add_column()
        for key, what in self.keys:
            keys.add_row(key, what)
        outer.add_row(keys)
        if self.readonly:
            outer.add_row(
                Text("read-only: trip, reset, close, model switch and batch pause are off", style="italic yellow")
            )
        outer.add_row(Text(""))
        outer.add_row(Text("breaker states", style="bold"))
        states = Table.grid(padding=(0, 2))
        states.add_column(no_wrap=True)
        states.add_column()
        for state, what in STATE_HELP.items():
            look = fmt.STATES[state]
            states.add_row(Text(f"{look.glyph} {look.word}", style=look.style), what)
        outer.add_row(states)
        outer.add_row(Text(""))
        outer.add_row(
            Text(
                "Fleet panel (a [shared] config): every process sharing this state through Redis, ▸ this one, "
                "✖ one running on its own state; 'shared state: DEGRADED' when Redis is lost.",
                style="dim",
            )
        )
        outer.add_row(
            Text(
                "Mouse: click a row to select it, click a key in the footer to run it. Escape closes this.", style="dim"
            )
        )
        return outer

    def action_close(self) -> None:
        self.dismiss(None)
