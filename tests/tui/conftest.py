"""Dashboard tests: every rendering is deterministic (ManualClock, UTC, fixed size)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.clocks import utc_zone

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    # The log and status bar print local clock times: pin the zone so they match everywhere.
    with utc_zone():
        yield
