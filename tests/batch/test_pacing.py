"""The off-peak window and the start rate."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from capmon.batch.pacing import RateGate, Window
from capmon.core.base.clock import LoopClock
from capmon.core.base.exceptions import BatchError


def at(h: int, m: int, s: int = 0, day: int = 2) -> float:
    return dt.datetime(2026, 3, day, h, m, s).timestamp()


def test_a_day_window_is_open_inside_only() -> None:
    w = Window.parse("09:30-17:00")
    assert not w.is_open(at(9, 29, 59)) and w.is_open(at(9, 30)) and w.is_open(at(16, 59, 59))
    assert not w.is_open(at(17, 0))
    assert w.opens_at(at(8, 0)) == at(9, 30)
    assert w.opens_at(at(18, 0)) == at(9, 30, day=3)
    assert w.opens_at(at(12, 0)) == at(12, 0)


def test_a_window_can_wrap_midnight() -> None:
    w = Window.parse("22:00-06:00")
    assert w.is_open(at(23, 0)) and w.is_open(at(0, 0)) and w.is_open(at(5, 59)) and not w.is_open(at(6, 0))
    assert not w.is_open(at(21, 59))
    assert w.opens_at(at(6, 0)) == at(22, 0)
    assert w.opens_at(at(21, 0)) == at(22, 0)
    assert str(w) == "22:00-06:00"


def test_a_window_can_end_at_midnight() -> None:
    w = Window.parse("20:00-24:00")
    assert w.is_open(at(23, 59, 59)) and not w.is_open(at(0, 0)) and not w.is_open(at(19, 59))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("22-06", "expected HH:MM-HH:MM"),
        ("25:00-06:00", "not a time of day"),
        ("10:61-11:00", "not a time of day"),
        ("08:00-08:00", "start and end are the same"),
    ],
)
def test_a_bad_window_is_refused(text: str, expected: str) -> None:
    with pytest.raises(BatchError, match=expected):
        Window.parse(text)


@pytest.mark.looptime
async def test_the_rate_gate_spaces_starts_evenly() -> None:
    gate = RateGate(4.0, LoopClock())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    starts = []
    for _ in range(9):
        await gate.wait()
        starts.append(loop.time() - t0)
    assert starts[0] == pytest.approx(0.0)
    assert starts[-1] == pytest.approx(2.0, abs=0.01)
    assert all(b - a >= 0.25 - 1e-6 for a, b in zip(starts, starts[1:], strict=False))


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(BatchError, match="^rate: "):
        RateGate(0, LoopClock())
