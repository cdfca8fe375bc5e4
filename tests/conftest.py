"""Suite-wide test settings, and the fixtures every package's tests share:

* ``http``: a plain httpx client for a simulator or a gateway on loopback;
* ``start_sim``: the one way a test starts simulators (``start_sim(scenario, **kw)``, the
  arguments of :func:`capmon.sim.server.start_simulator`), each stopped when the test ends;
* ``sim``: one simulator playing ``sim_scenario``, a fixture the test's module (or package
  conftest) defines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from hypothesis import settings

if TYPE_CHECKING:  # capmon is imported on use, after the bytecode setting below
    from capmon.sim.scenario import Scenario
    from capmon.sim.server import SimHandle
    from tests.support.simulated import StartSim

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# this project's machines): without it each xdist worker rewrites and compiles every test
# module afresh, and each of the suite's many `capmon` subprocesses compiles capmon itself,
# which together cost more of the suite's time than most of its tests.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Property tests run the same examples on every run of the default suite, so a run cannot go
# red on an example nobody has seen before; `HYPOTHESIS_PROFILE=explore python -m pytest ...`
# searches afresh (run it by hand, and turn what it finds into fixes and fixed examples).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """No proxy from the environment (loopback), and time enough for the largest bodies tests send."""
    async with httpx.AsyncClient(trust_env=False, timeout=30) as c:
        yield c


@pytest.fixture
async def start_sim() -> AsyncIterator[StartSim]:
    from capmon.sim.server import start_simulator

    started: list[SimHandle] = []

    async def start(scenario: Scenario | str, /, **kw: Any) -> SimHandle:
        handle = await start_simulator(scenario, **kw)
        started.append(handle)
        return handle

    try:
        yield start
    finally:
        for handle in reversed(started):
            await handle.stop()


@pytest.fixture
async def sim(start_sim: StartSim, sim_scenario: Scenario) -> SimHandle:
    return await start_sim(sim_scenario)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long randomised runs (``slow``) run only when asked for by name (``-m slow``): a
    narrower ``-m`` of one's own, such as ``-m unit``, replaces the default ``-m 'not slow'``
    but still leaves them out."""
    if "slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
