"""Start what a capmon command needs: the config, the embedded simulator (when the
config enables it) and the shared FallbackClient.

This is the one place where the CLI, batch jobs and the dashboard get an engine,
so they all behave the same way on a fresh machine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Mapping

from capmon.core.clock import Clock
from capmon.core.config import Config, find_config, load_config, resolve_keys
from capmon.core.events import EventBus
from capmon.core.exceptions import ConfigError
from capmon.core.router import FallbackClient


@dataclass
class Engine:
    config: Config
    client: FallbackClient
    bus: EventBus
    simulator_url: str | None  # the simulator's origin when one serves this config
    simulator_started: bool  # True: it runs in this process and stops with it


def load(explicit: str | None = None) -> Config:
    """Find and load the config; a wrong one raises ConfigError naming file and key."""
    return load_config(find_config(explicit))


def scenario_ref(config: Config) -> str:
    """A scenario named in the config: a bundled name, or a path relative to the config file."""
    ref = config.simulator.scenario
    if ref.endswith(".toml") and not Path(ref).is_absolute():
        base = Path(config.path).parent if config.path and not config.path.startswith("<") else Path.cwd()
        return str(base / ref)
    return ref


@contextlib.asynccontextmanager
async def open_engine(
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Clock | None = None,
    bus: EventBus | None = None,
    with_simulator: bool = True,
) -> AsyncIterator[Engine]:
    keys = resolve_keys(config, environ)  # a missing key variable is reported now, before anything starts
    handle = None
    url = None
    if config.simulator.enabled and with_simulator:
        from capmon.sim.server import ensure_simulator

        try:
            handle = await ensure_simulator(config.simulator.listen, scenario_ref(config), clock=clock)
        except ConfigError as e:
            if e.key:  # the scenario file itself is wrong: its own file and key say where
                raise
            # The scenario could not be found or read: say which config key named it.
            raise ConfigError(config.path, "simulator.scenario", f"{e.file}: {e.detail}") from None
        url = handle.origin if handle is not None else f"http://{config.simulator.listen}"
    bus = bus or EventBus()
    client = FallbackClient(config, clock=clock, bus=bus, keys=keys)
    try:
        yield Engine(config=config, client=client, bus=bus, simulator_url=url, simulator_started=handle is not None)
    finally:
        await client.aclose()
        if handle is not None:
            await handle.stop()
