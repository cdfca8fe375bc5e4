"""`capmon sim`: serve the simulated provider until Ctrl+C, or list the bundled scenarios.

capmon/cli.py parses the flags into :class:`SimOptions`; ``python -m capmon.sim`` is the
same command through the same parser (capmon/sim/__main__.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from capmon.core.base import text
from capmon.core.base.extras import Extra, require
from capmon.core.types.config import DEFAULT_LISTEN, SimulatorConfig
from capmon.exitcodes import EXIT_OK


@dataclass(frozen=True)
class SimOptions:
    listen: str = DEFAULT_LISTEN  # HOST:PORT; port 0 takes a free port (the line printed on start names it)
    scenario: str = SimulatorConfig.scenario  # a bundled scenario's name, or a scenario TOML file
    access_log: bool = False  # one line per request on stdout (uvicorn's access log)
    admin_key_env: str | None = None  # the variable holding the /admin key; None: CAPMON_SIM_ADMIN_KEY
    open_admin: bool = False  # beyond loopback with /admin open to anyone who can reach it
    list_scenarios: bool = False  # print the bundled scenarios instead of serving


def scenario_list() -> list[str]:
    """The bundled scenarios, one line each: name and description."""
    from capmon.sim.scenario import bundled_scenarios, load_scenario

    return text.table([(name, load_scenario(name).description) for name in bundled_scenarios()])


def run_sim(options: SimOptions) -> int:
    """Raises CapmonError (SimulatorError, ConfigError) for a bad address, scenario or key variable,
    MissingExtra without the sim extra."""
    if options.list_scenarios:
        print("\n".join(scenario_list()))
        return EXIT_OK
    require(Extra.SIM, "capmon sim")
    from capmon.sim.server import serve

    serve(
        options.listen,
        options.scenario,
        access_log=options.access_log,
        admin_key_env=options.admin_key_env,
        open_admin=options.open_admin,
    )
    return EXIT_OK
