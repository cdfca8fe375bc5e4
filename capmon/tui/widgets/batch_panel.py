"""Batch progress: bar, counts, per-model split, rate and ETA."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from capmon.core.events import BatchProgress
from capmon.tui import format as fmt

STATE_STYLE = {"running": "bold green", "paused": "bold black on yellow", "waiting-window": "yellow",
               "finished": "bold cyan"}


class BatchPanel(Vertical):
    DEFAULT_CSS = """
    BatchPanel {
        border: round $success 50%;
        border-title-style: bold;
        padding: 0 1;
        height: 1fr;
    }
    BatchPanel ProgressBar {
        height: 1;
        margin: 0 0 1 0;
    }
    BatchPanel ProgressBar Bar {
        width: 1fr;
    }
    BatchPanel #batch-counts {
        height: auto;
    }
    BatchPanel #batch-models {
        height: auto;
        margin-top: 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Batch"
        self._last: BatchProgress | None = None
        self._why_none = "no batch"

    def compose(self) -> ComposeResult:
        # The bar's own ETA reads real time: ours comes from the batch layer instead.
        yield ProgressBar(total=1, show_eta=False, id="batch-bar")
        yield Static(id="batch-counts")
        yield Static(id="batch-models")

    def show(self, progress: BatchProgress | None, *, why_none: str = "no batch", can_pause: bool = True) -> None:
        counts = self.query_one("#batch-counts", Static)
        models = self.query_one("#batch-models", Static)
        bar = self.query_one("#batch-bar", ProgressBar)
        if progress is None:
            self.border_title = "Batch"
            self.border_subtitle = ""
            bar.update(total=1, progress=0)
            counts.update(Text(why_none, style="dim"))
            models.update("")
            return
        state = Text(progress.state, style=STATE_STYLE.get(progress.state, ""))
        self.border_title = f"Batch: {progress.job} · {progress.state}"
        if progress.state == "paused":
            self.border_subtitle = "b: resume" if can_pause else "paused elsewhere"
        else:
            self.border_subtitle = "b: pause" if can_pause else "read-only"
        total = progress.total if progress.total is not None else progress.done + progress.failed + progress.pending
        bar.update(total=max(1, total), progress=progress.done + progress.failed)

        grid = Table.grid(padding=(0, 2))
        for _ in range(4):
            grid.add_column()
        grid.add_row(_kv("done", progress.done, "green"), _kv("failed", progress.failed, "red"),
                     _kv("parked", progress.parked, "yellow"), _kv("pending", progress.pending, ""))
        eta = fmt.duration(progress.eta) if progress.eta is not None else "-"
        grid.add_row(_kv("in flight", progress.in_flight, ""), Text.assemble(("rate ", "dim"), f"{progress.rate:.1f}/s"),
                     Text.assemble(("ETA ", "dim"), eta), Text.assemble(("state ", "dim"), state))
        counts.update(grid)

        served = sum(n for _, n in progress.per_model) or 1
        split = Table.grid(padding=(0, 1))
        split.add_column(no_wrap=True)
        split.add_column(justify="right", no_wrap=True)
        split.add_column(no_wrap=True)
        for model, n in progress.per_model:
            width = 20
            filled = round(n / served * width)
            split.add_row(model, str(n), Text("█" * filled, style="cyan") + Text("░" * (width - filled), style="dim"))
        models.update(split if progress.per_model else Text("no item served yet", style="dim"))


def _kv(label: str, value: int, style: str) -> Text:
    return Text.assemble((f"{label} ", "dim"), (f"{value:,}", style if value else ""))
