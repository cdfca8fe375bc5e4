from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.sdk.helpers import fresh_engine


@pytest.fixture(autouse=True)
def _one_engine_per_test() -> Iterator[None]:
    with fresh_engine():
        yield
