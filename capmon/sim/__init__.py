"""The simulated provider: an OpenAI-compatible API on loopback that really runs out of
capacity, driven by a scenario (see ``scenarios/demo.toml`` for the format).

Scenario loading is imported eagerly (pure); the web app and server are imported on
first use, so ``import capmon.sim`` stays cheap.
"""

from __future__ import annotations

from capmon.lazy import lazy_exports
from capmon.sim.scenario import (
    ModelSpec,
    PenaltySpec,
    Phase,
    Scenario,
    bundled_scenarios,
    load_scenario,
    parse_scenario,
)

_LAZY = {
    "Simulator": "capmon.sim.model",
    "create_app": "capmon.sim.app",
    "BorrowedSimulator": "capmon.sim.server",
    "SimHandle": "capmon.sim.server",
    "ensure_simulator": "capmon.sim.server",
    "running_simulator": "capmon.sim.server",
    "serve": "capmon.sim.server",
    "start_simulator": "capmon.sim.server",
}

__all__ = [
    "ModelSpec",
    "PenaltySpec",
    "Phase",
    "Scenario",
    "bundled_scenarios",
    "load_scenario",
    "parse_scenario",
    *_LAZY,
]


__getattr__ = lazy_exports(__name__, _LAZY)
