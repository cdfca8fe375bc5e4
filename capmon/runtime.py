"""Start what a capmon command needs: the config, the embedded simulator (when the
config enables it) and the shared FallbackClient.

This is the one place where the CLI, batch jobs and the dashboard get an engine,
so they all behave the same way on a fresh machine.

With ``[shared] backend = "redis"`` the client's state is shared with every process on
the same Redis namespace (capmon/fleet): the engine joins the fleet at start under its
``role`` (gateway, batch, dashboard, library), and leaves it when it stops.

What the config asks of capmon's extras (the embedded simulator: ``sim``; Redis:
``fleet``; the aiohttp transport by name: ``aiohttp``) is checked before anything starts
(:func:`require_extras`): one line naming the setting and the extra to install.

When the config's simulator address already has a simulator (another capmon process's),
the engine borrows it and watches it: if that process exits, the engine says so at once
(a warning Notice on its bus, and in the log) and serves the address itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.exceptions import ConfigError
from capmon.core.base.extras import Extra, require
from capmon.core.routing.client import FallbackClient
from capmon.core.routing.transport import resolve
from capmon.core.types.config import Config, find_config, load_config, resolve_keys
from capmon.core.types.events import EventBus, Notice

if TYPE_CHECKING:
    from capmon.sim.server import BorrowedSimulator

log = logging.getLogger("capmon.runtime")


@dataclass
class Engine:
    config: Config
    client: FallbackClient
    bus: EventBus
    simulator_url: str | None  # the simulator's origin when one serves this config
    simulator_started: bool  # True: it runs in this process and stops with it (also after a takeover)


def load(explicit: str | None = None) -> Config:
    """Find and load the config; a wrong one raises ConfigError naming file and key."""
    return load_config(find_config(explicit))


def require_extras(config: Config, *, with_simulator: bool = True) -> None:
    """Raise MissingExtra, naming the config file and its setting, when the config asks
    for what an extra that is not installed brings. A command calls it before anything
    starts (the dashboard before its screen opens); :func:`open_engine` calls it too."""
    if config.simulator.enabled and with_simulator:
        require(Extra.SIM, f"{config.path}: simulator.enabled = true")
    if config.shared.backend == "redis":
        require(Extra.FLEET, f'{config.path}: shared.backend = "redis"')
    resolve(config.client.transport, config.path)


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
    role: str = "library",
) -> AsyncIterator[Engine]:
    require_extras(config, with_simulator=with_simulator)
    keys = resolve_keys(config, environ)  # a missing key variable is reported now, before anything starts
    bus = bus or EventBus()
    shared = None
    if config.shared.backend == "redis":
        from capmon.fleet import shared_state

        # the URL is read now: a missing variable is one clear line before anything starts
        shared = shared_state(config, clock=clock or default_clock(), publish=bus.publish, role=role, environ=environ)
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
    client = FallbackClient(config, clock=clock, bus=bus, keys=keys, state=shared)
    engine = Engine(config=config, client=client, bus=bus, simulator_url=url, simulator_started=handle is not None)
    watch = None
    try:
        await client.start()  # joins the fleet; unreachable with [shared] required = true: raises, exit 2
    except BaseException:
        await client.aclose()
        if handle is not None:
            await handle.stop()
        raise
    if url is not None and handle is None:
        watch = _watch_borrowed(engine, clock)
    try:
        yield engine
    finally:
        await client.aclose()
        if watch is not None:
            await watch.stop()
        if handle is not None:
            await handle.stop()


def _watch_borrowed(engine: Engine, clock: Clock | None) -> BorrowedSimulator:
    """Watch the simulator another process serves; take over when it goes."""
    from capmon.sim.server import BorrowedSimulator

    time = clock or default_clock()

    def report(level: str, message: str) -> None:
        getattr(log, level if level in ("info", "warning", "error") else "warning")("%s", message)
        engine.bus.publish(Notice(at=time.now(), wall=time.wall(), level=level, message=message))
        if watch.handle is not None:
            engine.simulator_started = True

    watch = BorrowedSimulator(engine.config.simulator.listen, scenario_ref(engine.config), clock=clock, report=report)
    watch.start()
    return watch
