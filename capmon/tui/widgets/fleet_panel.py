"""The fleet: every process sharing this client's state through Redis (capmon/fleet),
beside the shared breakers. Shown only when the state is shared."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from capmon.core.base import text
from capmon.core.types.snapshot import LinkState, SharedStatus
from capmon.tui.widgets.panel import panel_css


class FleetPanel(Static):
    DEFAULT_CSS = (
        panel_css("FleetPanel", "$secondary 50%", "display: none; width: 2fr;")
        + """
    FleetPanel.-shared {
        display: block;
    }
    FleetPanel.-degraded {
        border: round $error;
    }
    """
    )

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Fleet"
        self._last: SharedStatus | None = None

    def show(self, shared: SharedStatus) -> None:
        self.set_class(shared.state is not LinkState.OFF, "-shared")
        self.set_class(shared.state is LinkState.DEGRADED, "-degraded")
        if shared == self._last or shared.state is LinkState.OFF:
            return
        self._last = shared
        where = f" · {shared.url} {shared.namespace}".rstrip() if shared.url else ""
        self.border_title = f"Fleet ({len(shared.processes)}){where}"
        out = Text()
        if shared.state is LinkState.DEGRADED:
            since = f" since {text.timestamp(shared.since)}" if shared.since else ""
            out.append(f"shared state: DEGRADED{since}\n", style="bold white on red")
            if shared.message:  # the notice's words, without the heading's
                out.append(f"{text.clip(shared.message.removeprefix('shared state: '), 80)}\n", style="dim")
        for p in shared.processes:
            mark = "▸ " if p.this else "  "
            out.append(mark, style="bold")
            out.append(f"{p.role:<9}", style="bold" if p.this else "")
            out.append(f" {p.host}:{p.pid}", style="dim")
            out.append(f"  {p.in_flight} in flight")
            if p.degraded:  # this process runs on its own state (its heartbeat says so)
                out.append(" ✖", style="bold red")
            out.append("\n")
        if not shared.processes:
            out.append("no live process registered", style="dim")
        self.update(out)
