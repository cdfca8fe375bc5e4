"""Batch progress: bar, counts, per-model split, rate and ETA."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

from capmon.core.base import text
from capmon.core.types.events import BatchProgress
from capmon.core.types.states import JobState
from capmon.tui.widgets.panel import panel_css

STATE_STYLE = {
    JobState.RUNNING: "bold green",
    JobState.PAUSED: "bold black on yellow",
    JobState.WAITING_WINDOW: "yellow",
    JobState.FINISHED: "bold cyan",
}


class BatchPanel(Vertical):
    DEFAULT_CSS = (
        panel_css("BatchPanel", "$success 50%")
        + """
    BatchPanel ProgressBar {
        height: 1;
        margin: 0 0 1 0;
    }
    BatchPanel ProgressBar Bar {
        width: 1fr;
    }
    BatchPanel #batch-counts {
        height: 2;
        text-wrap: nowrap;  /* a narrow terminal crops the fields, never pushes a line out */
        text-overflow: ellipsis;
    }
    BatchPanel #batch-models {
        height: auto;
        margin-top: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Batch"
        self._last: BatchProgress | None = None
        self._model_rows = -1

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
            counts.update(Text(why_none, style="dim"), layout=False)
            self._show_models(models, "", 0)
            return
        state = Text(progress.state, style=STATE_STYLE.get(progress.state, ""))
        self.border_title = f"Batch: {progress.job} · {progress.state}"
        if progress.state is JobState.PAUSED:
            self.border_subtitle = "b: resume" if can_pause else "paused elsewhere"
        elif progress.state in (JobState.RUNNING, JobState.WAITING_WINDOW):
            self.border_subtitle = "b: pause" if can_pause else ""
        else:
            self.border_subtitle = ""
        total = progress.total if progress.total is not None else progress.done + progress.failed + progress.pending
        bar.update(total=max(1, total), progress=progress.done + progress.failed)

        eta = text.duration(progress.eta)
        # Two fixed lines of fixed-width fields (cheaper to redraw than a Rich Table).
        counts.update(
            Text.assemble(
                _kv("done", progress.done, "green", 14),
                _kv("failed", progress.failed, "red", 12),
                _kv("parked", progress.parked, "yellow", 12),
                _kv("pending", progress.pending, "", 16),
                "\n",
                _kv("in flight", progress.in_flight, "", 14),
                _field("rate", f"{progress.rate:.1f}/s", "", 12),
                _field("ETA", eta, "", 12),
                ("state ", "dim"),
                state,
                no_wrap=True,
            ),
            layout=False,
        )
        message = progress.message  # the batch layer's word on a halt or a wait
        served = sum(n for _, n in progress.per_model) or 1
        name_width = max((len(m) for m, _ in progress.per_model), default=0)
        split = Text(no_wrap=True)
        for i, (model, n) in enumerate(progress.per_model):
            filled = round(n / served * 20)
            split.append(("\n" if i else "") + f"{model.ljust(name_width)} {n:>6,} ")
            split.append("█" * filled, style="cyan")
            split.append("░" * (20 - filled), style="dim")
        lines = len(progress.per_model)
        if progress.workers:  # a job shared by workers in PostgreSQL: each one's share
            shares = " · ".join(f"{w} {n:,}" for w, n in progress.workers)
            split.append(("\n" if lines else "") + text.shorten(f"workers: {shares}", 120), style="dim")
            lines += 1
        if message:
            split.append(("\n" if lines else "") + text.shorten(message, 120), style="italic")
            lines += 1
        self._show_models(models, split if lines else Text("no item served yet", style="dim"), lines)

    def _show_models(self, widget: Static, content: object, rows: int) -> None:
        # Re-lay out only when the number of model lines changes, not on every refresh.
        widget.update(content, layout=rows != self._model_rows)  # type: ignore[arg-type]
        self._model_rows = rows


def _kv(label: str, value: int, style: str, width: int) -> Text:
    return _field(label, f"{value:,}", style if value else "", width)


def _field(label: str, value: str, style: str, width: int) -> Text:
    pad = max(1, width - len(label) - 1 - len(value))
    return Text.assemble((f"{label} ", "dim"), (value, style), " " * pad)
