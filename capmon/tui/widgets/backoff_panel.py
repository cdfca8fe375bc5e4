"""Retries waiting: every request that sleeps before its next attempt, soonest first."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from capmon.core.snapshot import EngineSnapshot
from capmon.tui import format as fmt


class BackoffPanel(Static):
    """A countdown per waiting retry, from its deadline and the snapshot's clock."""

    DEFAULT_CSS = """
    BackoffPanel {
        border: round $warning 50%;
        border-title-style: bold;
        padding: 0 1;
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Retries waiting"

    def show(self, snap: EngineSnapshot) -> None:
        waiting = snap.waiting
        self.border_title = f"Retries waiting ({len(waiting)})"
        self.border_subtitle = f"{snap.queued} queued for a free model" if snap.queued else ""
        if not waiting:
            self.update(Text("No retry is waiting: every request is in flight or done.", style="dim"))
            return
        # Rows that fit: the panel's height minus borders and the header line.
        room = max(1, self.size.height - 1) if self.size.height else 8
        shown = waiting if len(waiting) <= room else waiting[: room - 1]
        table = Table(box=None, expand=True, show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("item", no_wrap=True, ratio=2, overflow="ellipsis")
        table.add_column("model", no_wrap=True, ratio=1, overflow="ellipsis")
        table.add_column("try", justify="right", no_wrap=True)
        table.add_column("reason", no_wrap=True, ratio=4, overflow="ellipsis")
        table.add_column("in", justify="right", no_wrap=True, min_width=5)
        for w in shown:
            table.add_row(
                w.item_id or f"#{w.request_id}",
                Text(w.model, style="bold") if w.model else Text("any", style="italic dim"),
                f"{w.attempt}/{w.max_attempts}",
                Text(" ".join(w.reason.split()), style="dim"),
                Text(fmt.duration(w.deadline - snap.now), style="bold yellow"),
            )
        if len(shown) < len(waiting):
            table.add_row(Text(f"… {len(waiting) - len(shown)} more", style="dim"), "", "", "", "")
        self.update(table)
