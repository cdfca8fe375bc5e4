"""Every test module here is marked ``unit`` or ``integration`` (pyproject.toml says what
each means), so that ``pytest -m unit tests/core`` runs the units alone."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
KINDS = ("unit", "integration")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    wrong = sorted(
        {
            item.path.name
            for item in items
            if item.path.parent == HERE and sum(item.get_closest_marker(k) is not None for k in KINDS) != 1
        }
    )
    if wrong:
        raise pytest.UsageError(f"tests/core: mark each module unit or integration (pytestmark), not both: {wrong}")
