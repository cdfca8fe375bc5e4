"""The row filter, shown by `/`: rows whose model or target contains the text."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Input, Label


class FilterBar(Horizontal):
    DEFAULT_CSS = """
    FilterBar {
        layer: overlay;
        dock: bottom;
        margin-bottom: 1;  /* above the footer, over the event log */
        height: 3;
        display: none;
        padding: 0 1;
        background: $boost;
    }
    FilterBar.-open {
        display: block;
    }
    FilterBar Label {
        padding: 1 1 0 0;
        text-style: bold;
    }
    FilterBar Input {
        width: 1fr;
    }
    """

    BINDINGS = [Binding("escape", "clear", "Clear filter", show=False)]

    @dataclass
    class Changed(Message):
        """The filter text changed (typing updates the table at once)."""

        text: str

    class Done(Message):
        """Enter or escape: give the focus back to the table."""

    def compose(self) -> ComposeResult:
        yield Label("filter /")
        yield Input(placeholder="model or target; enter keeps it, escape clears it", id="filter-input")

    @property
    def input(self) -> Input:
        return self.query_one("#filter-input", Input)

    def open(self) -> None:
        self.add_class("-open")
        self.input.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Changed(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not event.value.strip():
            self.remove_class("-open")
        self.post_message(self.Done())

    def action_clear(self) -> None:
        self.input.value = ""
        self.remove_class("-open")
        self.post_message(self.Changed(""))
        self.post_message(self.Done())
