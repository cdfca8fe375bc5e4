"""The simulator's over-HTTP tests: the ``sim`` fixture (tests/conftest.py) plays the fast
two-model scenario unless a module overrides ``sim_scenario``."""

from __future__ import annotations

import pytest

from capmon.sim.scenario import Scenario
from tests.sim.helpers import fast_scenario


@pytest.fixture
def sim_scenario() -> Scenario:
    return fast_scenario()
