"""Batch progress: the event the runner publishes, and the one-line view on a terminal.

Plain text and ``\\r`` only (no Rich, no Textual): ``capmon batch`` must work, and be
importable, on a machine without the dashboard's dependencies.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from capmon.batch.states import JobState
from capmon.core.base import text
from capmon.core.types.events import BatchProgress


def _bar(share: float, width: int) -> str:
    filled = int(round(share * width))
    return "#" * filled + "-" * (width - filled)


def render(p: BatchProgress, width: int = 100) -> str:
    """One line, at most ``width`` characters: the parts that matter most survive."""
    total = p.total
    finished = p.done + p.failed
    head = p.job
    if p.state == JobState.PAUSED:
        head += " PAUSED"
    elif p.state not in (JobState.RUNNING, JobState.FINISHED):
        head += f" {p.state}"
    if total:
        share = finished / total if total else 0.0
        count = f"{share:4.0%} {finished}/{total}"
    else:
        share, count = 0.0, f"{finished}/?"
    counts = f"done {p.done}  failed {p.failed}  parked {p.parked}"
    if p.in_flight:
        counts += f"  in flight {p.in_flight}"
    models = "  ".join(f"{m} {n}" for m, n in p.per_model)
    if p.state == JobState.WAITING_WINDOW:
        opens = p.opens_at
        speed = (
            f"window opens {text.day_time(opens, p.wall)} (in {text.duration(opens - p.wall)})"
            if opens
            else "waiting for the window"
        )
    elif p.state == JobState.FINISHED:
        speed = "finished"
    else:
        speed = f"{p.rate:.1f}/s  ETA {text.duration(p.eta)}"
    message = p.message

    def line(bar_width: int, with_models: bool) -> str:
        parts = [head]
        parts.append(f"[{_bar(share, bar_width)}] {count}" if bar_width else count)
        parts.append(counts)
        if with_models and models:
            parts.append(models)
        parts.append(speed)
        if message and p.state in (JobState.HALTED, JobState.STOPPED):
            parts.append(message)
        return " | ".join(parts)

    for bar_width, with_models in ((20, True), (10, True), (10, False), (0, False)):
        shown = line(bar_width, with_models)
        if len(shown) <= width:
            return shown
    return shown[: max(0, width - 3)] + "..." if width > 3 else ""


class ProgressLine:
    """Redraws one line on a terminal with ``\\r``; does nothing when the stream is not a
    terminal (a log file must not fill with carriage returns)."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None, width: int | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._width = width
        self._shown = 0

    def width(self) -> int:
        if self._width is not None:
            return self._width
        return max(20, shutil.get_terminal_size((100, 20)).columns - 1)

    def update(self, p: BatchProgress) -> None:
        if not self.enabled:
            return
        shown = render(p, self.width())
        pad = max(0, self._shown - len(shown))
        self.stream.write("\r" + shown + " " * pad)
        self.stream.flush()
        self._shown = len(shown)

    def clear(self) -> None:
        """End the line, so what is printed next starts on its own line."""
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = 0
