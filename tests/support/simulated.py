"""Models of the simulator for core tests that go through the real simulator over HTTP, and
the type of the ``start_sim`` fixture (tests/conftest.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from capmon.sim.scenario import ModelSpec, Scenario

if TYPE_CHECKING:
    from capmon.sim.server import SimHandle


class StartSim(Protocol):
    """Starts a simulator on loopback (start_simulator's arguments); it stops when the test ends."""

    async def __call__(self, scenario: Scenario | str, /, **kw: Any) -> SimHandle: ...


def sim_model(name: str, slots: int = 4, *, base_latency: float = 0.1, answer_tokens: int = 20, **kw: Any) -> ModelSpec:
    """``sim-NAME``: no noise and no per-token time, so every answer takes ``base_latency``."""
    return ModelSpec(
        name=f"sim-{name}",
        slots=slots,
        base_latency=base_latency,
        per_token=0.0,
        noise=0.0,
        answer_tokens=answer_tokens,
        context_window=128_000,
        **kw,
    )


def deployments_scenario(east: int = 4, west: int = 4, **west_kw: Any) -> Scenario:
    """The simulator's side of tests/support/configs.py's ``two_deployments``: sim-m-east and
    sim-m-west with these slots (0: every request refused for capacity, the simulator's 503),
    sim-m-west with ``west_kw`` too, and sim-backup."""
    return Scenario(models=(sim_model("m-east", east), sim_model("m-west", west, **west_kw), sim_model("backup")))
