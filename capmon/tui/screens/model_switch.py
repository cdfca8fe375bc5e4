"""Pick the model traffic goes to first (or one of its deployments), or go back to automatic routing."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from capmon.core.types.config import deployment_id
from capmon.core.types.snapshot import EngineSnapshot, TargetSnapshot
from capmon.tui import format as fmt

AUTOMATIC = "\x00automatic"  # an option id no model can have


@dataclass(frozen=True)
class ModelChoice:
    """What the person chose: a model or a deployment (``model@endpoint``) to pin, or None
    for automatic routing."""

    model: str | None


class ModelSwitchScreen(ModalScreen[ModelChoice | None]):
    """Dismissed with a ModelChoice, or None when cancelled."""

    DEFAULT_CSS = """
    ModelSwitchScreen {
        align: center middle;
        background: $background 60%;
    }
    ModelSwitchScreen > Vertical {
        width: 70;
        height: auto;
        border: thick $accent;
        background: $surface;
        padding: 1 2;
    }
    ModelSwitchScreen #title {
        text-style: bold;
    }
    ModelSwitchScreen #hint {
        color: $text-muted;
        margin-bottom: 1;
    }
    ModelSwitchScreen OptionList {
        height: auto;
        max-height: 16;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, models: list[str], snapshot: EngineSnapshot | None) -> None:
        super().__init__()
        self.models = models
        self.snapshot = snapshot

    def compose(self) -> ComposeResult:
        pinned = self.snapshot.pinned if self.snapshot else None
        with Vertical():
            yield Label("Switch model", id="title")
            yield Label("Traffic follows at once. Enter picks, escape cancels.", id="hint")
            yield OptionList(*self._options(pinned), id="models")

    def _options(self, pinned: str | None) -> list[Option]:
        auto = Text("⇄ Automatic routing", style="bold")
        auto.append("  preference order", style="dim")
        if pinned is None:
            auto.append("  ← now", style="bold green")
        options = [Option(auto, id=AUTOMATIC)]
        for model in self.models:
            line = Text(f"▸ Pin {model}", style="bold")
            targets = [t for t in (self.snapshot.targets if self.snapshot else ()) if t.model == model]
            if targets:
                line.append("  ")
                line.append_text(fmt.state_text(targets[0]))
            if pinned == model:
                line.append("  ← now", style="bold green")
            options.append(Option(line, id=model))
            options += self._deployments(model, targets, pinned)
        return options

    @staticmethod
    def _deployments(model: str, targets: list[TargetSnapshot], pinned: str | None) -> list[Option]:
        """One option per deployment of a model served at more than one endpoint: that one first."""
        endpoints = list(dict.fromkeys(t.endpoint for t in targets))
        if len(endpoints) < 2:
            return []
        out = []
        for endpoint in endpoints:
            name = deployment_id(model, endpoint)
            line = Text(f"    ▸ Pin {model} at {endpoint}", style="bold")
            first = next(t for t in targets if t.endpoint == endpoint)
            line.append("  ")
            line.append_text(fmt.state_text(first))
            if pinned == name:
                line.append("  ← now", style="bold green")
            out.append(Option(line, id=name))
        return out

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        pinned = self.snapshot.pinned if self.snapshot else None
        ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
        options.highlighted = ids.index(pinned) if pinned in ids else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        chosen = event.option.id
        self.dismiss(ModelChoice(None if chosen == AUTOMATIC else chosen))

    def action_cancel(self) -> None:
        self.dismiss(None)
