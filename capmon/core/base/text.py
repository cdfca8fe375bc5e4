"""Plain text for people: tables, durations, timestamps, latencies, percentiles.

One definition of each, so that the dashboard, ``capmon status``, the batch commands
and the report say the same thing about the same value (a p99 is the same p99
everywhere). Pure functions on values: no Rich, no Textual, and no clock (a caller
that needs "now" passes it in), so the core can use them too.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import Literal

# (size in seconds, unit, size of the next smaller unit, its unit), largest first.
_SPANS = ((86_400, "d", 3600, "h"), (3600, "h", 60, "m"), (60, "m", 1, "s"))

Precision = Literal["min", "s", "ms"]


def table(rows: Sequence[Sequence[str]], *, numbers_right: bool = False) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks.
    ``numbers_right``: cells that are numbers (digits and dots) are right-aligned,
    except in the first column."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def cell(i: int, c: str) -> str:
        if numbers_right and i and c.replace(".", "").isdigit():
            return c.rjust(widths[i])
        return c.ljust(widths[i])

    return ["  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in rows]


def duration(seconds: float | None, *, parts: int = 2, tenths_below: float = 0.0) -> str:
    """A span of time in its largest units: 5s, 1m05s, 1h01m, 1d01h (``parts=1``: 5s,
    1m, 1h, 1d), rounded to the second; tenths under ``tenths_below`` seconds (4.2s).
    "-" when there is no span to show (None, NaN, negative)."""
    if seconds is None or not seconds >= 0:
        return "-"
    if seconds < tenths_below:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    for size, unit, sub, sub_unit in _SPANS:
        if s >= size:
            head = f"{s // size}{unit}"
            return head if parts == 1 else f"{head}{s % size // sub:02d}{sub_unit}"
    return f"{s}s"


def countdown(seconds: float) -> str:
    """Time left until a deadline, as the dashboard shows it: never negative, tenths
    under ten seconds (4.2s, 42s, 3m05s, 1h02m)."""
    return duration(max(0.0, seconds), tenths_below=10.0)


def latency(seconds: float | None) -> str:
    """A round trip: 740ms under a second, 1.92s above; "-" for none."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.2f}s"


def _local(wall: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(wall)


def timestamp(wall: float | None, *, date: bool = False, precision: Precision = "s") -> str:
    """A wall-clock time in local time: 14:03:27 (``precision`` "min": 14:03, "ms":
    14:03:27.125), with the date first when ``date`` (2026-12-01 14:03:27); "-" for none."""
    if wall is None:
        return "-"
    t = _local(wall)
    text = t.strftime("%H:%M" if precision == "min" else "%H:%M:%S")
    if precision == "ms":
        text += f".{t.microsecond // 1000:03d}"
    return f"{t:%Y-%m-%d} {text}" if date else text


def day_time(wall: float, now_wall: float) -> str:
    """A wall-clock time to the minute, with the weekday when it is not on the day of
    ``now_wall``: 14:03, or Tue 14:03."""
    t = _local(wall)
    same_day = t.date() == _local(now_wall).date()
    return timestamp(wall, precision="min") if same_day else f"{t:%a} {timestamp(wall, precision='min')}"


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it
    (``q`` in [0, 1]; the values sorted). None for no values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def clip(text: str, width: int) -> str:
    """At most ``width`` characters: a longer text is cut and ends with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def shorten(text: str, width: int) -> str:
    """``text`` on one line (runs of whitespace become one space), clipped to ``width``."""
    return clip(" ".join(text.split()), width)


def usd(x: float | None) -> str:
    """An amount of USD as capmon prints it ("-" for none): one answer's is a fraction of a cent."""
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"${x:,.2f}"
    if abs(x) >= 0.01:
        return f"${x:.4f}"
    return "$" + (f"{x:.6f}".rstrip("0").rstrip(".") or "0")  # $0.0035, not $0.003500
