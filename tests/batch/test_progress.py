"""The terminal progress line."""

from __future__ import annotations

import datetime as dt
import io

from capmon.batch.progress import ProgressLine, render
from capmon.core.base.text import duration
from capmon.core.types.events import BatchProgress


def progress(**kw: object) -> BatchProgress:
    base = dict(
        at=10.0,
        wall=dt.datetime(2026, 3, 2, 20, 0).timestamp(),
        job="nightly",
        total=2000,
        done=880,
        failed=20,
        parked=3,
        pending=1087,
        in_flight=10,
        per_model=(("flagship", 600), ("medium", 280)),
        rate=12.3,
        eta=90.0,
        state="running",
    )
    base.update(kw)
    return BatchProgress(**base)  # type: ignore[arg-type]


def test_the_line_shows_counts_models_rate_and_eta() -> None:
    text = render(progress(), 200)
    for part in (
        "nightly",
        "45%",
        "900/2000",
        "done 880",
        "failed 20",
        "parked 3",
        "flagship 600",
        "medium 280",
        "12.3/s",
        "ETA 1m30s",
        "[",
    ):
        assert part in text, (part, text)


def test_a_narrow_terminal_drops_the_model_split_before_the_counts() -> None:
    text = render(progress(), 80)
    assert len(text) <= 80 and "parked 3" in text and "flagship" not in text


def test_waiting_for_the_window_says_when_it_opens() -> None:
    p = progress(state="waiting-window", opens_at=dt.datetime(2026, 3, 2, 22, 0).timestamp(), rate=0.0, eta=None)
    assert "window opens" in render(p, 200) and "(in 2h00m)" in render(p, 200)
    assert "PAUSED" in render(progress(state="paused"), 200)


def test_it_accepts_a_plain_core_event_too() -> None:
    p = BatchProgress(
        at=0,
        wall=0,
        job="j",
        total=None,
        done=1,
        failed=0,
        parked=0,
        pending=0,
        in_flight=0,
        per_model=(),
        rate=0.0,
        eta=None,
        state="running",
    )
    assert "1/?" in render(p)


def test_nothing_is_written_when_stderr_is_not_a_terminal() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    line.update(progress())
    line.clear()
    assert out.getvalue() == ""


def test_on_a_terminal_it_redraws_in_place() -> None:
    out = io.StringIO()
    line = ProgressLine(out, enabled=True, width=200)
    line.update(progress())
    line.update(progress(done=881, per_model=()))
    line.clear()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n") and "\n" not in text[:-1]
    first, second = text.split("\r")[1:]
    assert "flagship" in first and "flagship" not in second
    assert len(second.rstrip("\n")) == len(first)  # padded over the longer line before


def test_durations_read_naturally() -> None:
    assert [duration(x) for x in (None, 5, 65, 3700, 90000)] == ["-", "5s", "1m05s", "1h01m", "1d01h"]
