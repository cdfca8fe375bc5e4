"""The top line: what is watched, routing, totals, the clock, and the paused mark."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from capmon.core.base import text
from capmon.core.types.snapshot import EngineSnapshot, LinkState


class StatusBar(Static):
    DEFAULT_CSS = """
    StatusBar {
        dock: top;
        height: 1;
        background: $panel;
        color: $foreground;
        padding: 0 1;
    }
    StatusBar.-paused {
        background: $warning 40%;
    }
    """

    def show(self, snap: EngineSnapshot | None, *, description: str, paused: bool, readonly: bool, needle: str) -> None:
        self.set_class(paused, "-paused")
        line = Text()
        line.append("capmon", style="bold")
        line.append(f"  {description}", style="dim")
        if snap is not None:
            line.append("  │  routing: ", style="dim")
            if snap.pinned:
                line.append(f"▸ pinned {snap.pinned} (manual)", style="bold reverse cyan")
            else:
                line.append("automatic", style="bold green")
            line.append("  │  ", style="dim")
            line.append(
                f"{snap.in_flight} in flight · {snap.queued} queued · {snap.succeeded:,} ok · {snap.failed:,} failed"
            )
            spent = snap.spent
            if spent is not None:  # once an answer had a price (no "$0" for a config without); per model: the table's
                line.append(f" · {text.usd(spent)} spent", style="bold")
            down = {t.endpoint for t in snap.targets if t.unreachable_reason}
            if down:
                # Not capacity: an address, DNS, a proxy or TLS (`capmon status` names the cause).
                line.append("  │  ", style="dim")
                line.append(f" UNREACHABLE: {', '.join(sorted(down))} ", style="bold white on red")
            shared = snap.shared
            if shared.state is LinkState.DEGRADED:
                line.append("  │  ", style="dim")
                line.append(" shared state: DEGRADED ", style="bold white on red")
            elif shared.state is LinkState.OK:
                line.append("  │  ", style="dim")
                line.append(f"shared: {len(shared.processes)} processes", style="bold green")
        if needle:
            line.append("  │  ", style="dim")
            line.append(f"filter: {needle}", style="bold magenta")
        if readonly:
            line.append("  │  ", style="dim")
            line.append("READ-ONLY", style="bold white on blue")
        if paused:
            line.append("  │  ", style="dim")
            line.append(" ⏸ PAUSED: display frozen, p resumes ", style="bold black on yellow")
        if snap is not None:
            line.append("  │  ", style="dim")
            line.append(text.timestamp(snap.wall), style="bold")
        self.update(line, layout=False)  # one line, always: no re-layout of the screen
