"""Dashboard tests: every rendering is deterministic (ManualClock, UTC, fixed size)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def utc() -> Iterator[None]:
    # The log and status bar print local clock times: pin the zone so they match everywhere.
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()
