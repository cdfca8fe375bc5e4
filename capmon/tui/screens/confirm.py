"""A yes / no question in a modal: `y` or enter confirms, `n` or escape cancels."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
        background: $background 60%;
    }
    ConfirmScreen > Vertical {
        width: 64;
        height: auto;
        border: thick $error 80%;
        background: $surface;
        padding: 1 2;
    }
    ConfirmScreen #question {
        text-style: bold;
        width: 1fr;
    }
    ConfirmScreen #detail {
        color: $text-muted;
        margin: 1 0;
        width: 1fr;
    }
    ConfirmScreen Horizontal {
        height: auto;
        align: right middle;
    }
    ConfirmScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n", "answer(False)", "No"),
        Binding("escape", "answer(False)", "Cancel", show=False),
    ]

    def __init__(self, question: str, detail: str = "", *, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.yes = yes
        self.no = no

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question, id="question")
            if self.detail:
                yield Label(self.detail, id="detail")
            with Horizontal():
                yield Button(f"{self.no} (n)", id="no")
                yield Button(f"{self.yes} (y)", id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)
