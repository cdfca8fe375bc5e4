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
