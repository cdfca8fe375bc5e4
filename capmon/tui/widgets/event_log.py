"""The event log: breaker moves, fallbacks, key parking, pins, manual actions."""

from __future__ import annotations

import collections

from rich.text import Text
from textual.widgets import RichLog

from capmon.core.base import text
from capmon.tui.widgets.panel import panel_css


class EventLog(RichLog):
    """A bounded log. While the display is paused, lines are held back (up to a
    limit) and written when it resumes, so the screen stays still."""

    DEFAULT_CSS = panel_css("EventLog", "$accent 50%", "min-height: 3; overflow-y: auto; scrollbar-size-vertical: 1;")

    def __init__(self, *, id: str | None = None, max_lines: int = 1000) -> None:
        super().__init__(id=id, max_lines=max_lines, wrap=False, markup=False, highlight=False, auto_scroll=True)
        self.border_title = "Events"
        self.held: collections.deque[Text] = collections.deque(maxlen=max_lines)
        self.frozen = False
        self.written = 0

    def add(self, wall: float, line: Text) -> None:
        stamped = Text.assemble((text.timestamp(wall) + "  ", "dim"), line)
        if self.frozen:
            self.held.append(stamped)
            self.border_subtitle = f"{len(self.held)} held while paused"
            return
        self.write(stamped)
        self.written += 1

    def freeze(self, frozen: bool) -> None:
        self.frozen = frozen
        if not frozen:
            while self.held:
                self.write(self.held.popleft())
                self.written += 1
        self.border_subtitle = f"{len(self.held)} held while paused" if frozen and self.held else ""
