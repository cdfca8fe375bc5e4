"""Retries waiting: every request that sleeps before its next attempt, soonest first."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from capmon.core.base import text
from capmon.core.types.snapshot import EngineSnapshot, WaitingRetry
from capmon.tui.widgets.panel import panel_css

# Column widths; the reason takes what is left. Plain Text lines rather than a Rich
# Table: this panel redraws on every refresh, and a Table costs several times more.
ITEM, MODEL, TRY, IN = 12, 10, 6, 7


def _cell(value: str, width: int, *, right: bool = False) -> str:
    value = text.clip(value, width)
    return value.rjust(width) if right else value.ljust(width)


class BackoffPanel(Static):
    """A countdown per waiting retry, from its deadline and the snapshot's clock."""

    # A narrow panel crops lines rather than folding them.
    DEFAULT_CSS = panel_css("BackoffPanel", "$warning 50%", "text-wrap: nowrap; text-overflow: ellipsis;")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Retries waiting"
        self._snap: EngineSnapshot | None = None

    def on_resize(self) -> None:
        # Column widths follow the panel's width: lay the last snapshot out again.
        if self._snap is not None:
            self.show(self._snap)

    def show(self, snap: EngineSnapshot) -> None:
        self._snap = snap
        waiting = snap.waiting
        self.border_title = f"Retries waiting ({len(waiting)})"
        self.border_subtitle = f"{snap.queued} queued for a free model" if snap.queued else ""
        if not waiting:
            # A fixed-size panel: redraw it without re-laying out the screen.
            self.update(Text("No retry is waiting: every request is in flight or done.", style="dim"), layout=False)
            return
        width = self.content_size.width or 80
        reason_width = max(10, width - ITEM - MODEL - TRY - IN - 5)
        room = max(1, self.content_size.height - 1) if self.content_size.height else 8
        shown = waiting if len(waiting) <= room else waiting[: room - 1]
        out = Text(no_wrap=True, overflow="crop")
        # The countdown before the reason: on a narrow panel the reason is what gets cropped.
        out.append(
            f"{_cell('item', ITEM)} {_cell('model', MODEL)} {_cell('try', TRY, right=True)} "
            f"{_cell('in', IN, right=True)}  {_cell('reason', reason_width)}",
            style="bold",
        )
        for w in shown:
            out.append("\n")
            self._line(out, w, snap.now, reason_width)
        if len(shown) < len(waiting):
            out.append(f"\n… {len(waiting) - len(shown)} more", style="dim")
        self.update(out, layout=False)

    @staticmethod
    def _line(out: Text, w: WaitingRetry, now: float, reason_width: int) -> None:
        out.append(_cell(w.item_id or f"#{w.request_id}", ITEM) + " ")
        if w.model:
            out.append(_cell(w.model, MODEL), style="bold")
        else:
            out.append(_cell("any", MODEL), style="italic dim")
        out.append(" " + _cell(f"{w.attempt}/{w.max_attempts}", TRY, right=True) + " ")
        out.append(_cell(text.countdown(w.deadline - now), IN, right=True), style="bold yellow")
        out.append("  ")
        out.append(_cell(" ".join(w.reason.split()), reason_width), style="dim")
