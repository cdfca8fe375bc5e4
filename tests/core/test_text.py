"""The one text module: every command and the dashboard format a value the same way."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from capmon.core.base import text
from capmon.core.types.stats import Outcome, RollingStats
from tests.support.clocks import utc_zone

pytestmark = pytest.mark.unit

NOON = 1_764_590_400.0  # 2025-12-01 12:00:00 UTC, a Monday


@pytest.fixture
def utc() -> Iterator[None]:
    with utc_zone():
        yield


def test_a_table_pads_columns_and_trims_line_ends() -> None:
    rows = [("model", "served", "p99"), ("flagship", "7", "-"), ("m", "1234", "1.92s")]
    assert text.table(rows) == ["model     served  p99", "flagship  7       -", "m         1234    1.92s"]
    right = text.table(rows, numbers_right=True)
    assert right == ["model     served  p99", "flagship       7  -", "m           1234  1.92s"]
    assert text.table([]) == []


@pytest.mark.parametrize(
    "seconds, shown",
    [
        (None, "-"),
        (math.nan, "-"),
        (-1, "-"),
        (0, "0s"),
        (5, "5s"),
        (59.4, "59s"),
        (59.6, "1m00s"),
        (65, "1m05s"),
        (3700, "1h01m"),
        (90000, "1d01h"),
    ],
)
def test_durations_in_their_two_largest_units(seconds: float | None, shown: str) -> None:
    assert text.duration(seconds) == shown


@pytest.mark.parametrize("seconds, shown", [(42, "42s"), (600, "10m"), (3594.5, "59m"), (7300, "2h"), (90000, "1d")])
def test_a_duration_in_one_unit(seconds: float, shown: str) -> None:
    assert text.duration(seconds, parts=1) == shown


def test_a_countdown_has_tenths_near_its_end_and_never_goes_below_zero() -> None:
    assert [text.countdown(s) for s in (9.96, 4.5, 0.04, -3, math.nan)] == ["10.0s", "4.5s", "0.0s", "0.0s", "0.0s"]
    assert [text.countdown(s) for s in (10, 185.2, 3720)] == ["10s", "3m05s", "1h02m"]


def test_latencies_are_milliseconds_under_a_second() -> None:
    shown = [text.latency(s) for s in (None, 0.0004, 0.74, 0.9996, 1.0, 1.924)]
    assert shown == ["-", "0ms", "740ms", "1000ms", "1.00s", "1.92s"]


def test_timestamps_in_local_time(utc: None) -> None:
    wall = NOON + 3 * 60 + 27.125
    assert text.timestamp(wall) == "12:03:27"
    assert text.timestamp(wall, precision="min") == "12:03"
    assert text.timestamp(wall, precision="ms") == "12:03:27.125"
    assert text.timestamp(wall, date=True) == "2025-12-01 12:03:27"
    assert text.timestamp(wall, date=True, precision="min") == "2025-12-01 12:03"
    assert text.timestamp(None) == "-"


def test_a_time_of_day_names_its_day_when_that_is_not_today(utc: None) -> None:
    assert text.day_time(NOON, now_wall=NOON + 3600) == "12:00"
    assert text.day_time(NOON + 86_400, now_wall=NOON) == "Tue 12:00"


@pytest.mark.parametrize("q, expected", [(0.0, 1), (0.5, 2), (0.51, 3), (0.99, 4), (1.0, 4)])
def test_percentiles_are_nearest_rank(q: float, expected: float) -> None:
    assert text.percentile([1, 2, 3, 4], q) == expected


def test_no_values_no_percentile() -> None:
    assert text.percentile([], 0.99) is None


def test_the_dashboard_windows_use_the_same_percentile_as_the_report() -> None:
    s = RollingStats()
    latencies = [0.1 * i for i in range(1, 11)]  # one bucket, fewer than its sample cap
    for x in latencies:
        s.record(1000.0, Outcome.OK, x)
    w = s.window(1000.5, 10)
    assert (w.p50, w.p99) == (text.percentile(latencies, 0.5), text.percentile(latencies, 0.99))
    assert (w.p50, w.p99) == (latencies[4], latencies[9])


def test_clipping_and_shortening() -> None:
    assert text.clip("flagship-large", 8) == "flagshi…"
    assert text.clip("small", 8) == "small"
    assert text.shorten("a  very\n long   reason", 12) == "a very long…"
