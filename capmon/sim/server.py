"""Run the simulator over HTTP with uvicorn: blocking for the CLI, or as a task in the
running event loop for the dashboard and for tests.

The listening socket is bound here, not by uvicorn, so a taken port is a clear
:class:`SimulatorError` (uvicorn would ``sys.exit``) and port 0 tells us the port it got.

A process that found another process's simulator already listening borrows it and keeps
an eye on it (:class:`BorrowedSimulator`): when it goes away, the borrower says so and
serves that address itself, so its own work goes on.

Listening beyond loopback needs an admin key for /admin, or an explicit open admin
(:func:`capmon.sim.admin.admin_policy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import httpx
import uvicorn
from starlette.applications import Starlette
from uvicorn.config import LOGGING_CONFIG

from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.exceptions import SimulatorError
from capmon.core.types.config import SIMULATOR_DEMO_KEY, is_loopback
from capmon.core.types.config import parse_listen as parse_host_port
from capmon.serving import GuestServer, ListenError, listen
from capmon.sim.admin import ADMIN_KEY_ENV, AdminAccess, AdminPolicy, admin_policy
from capmon.sim.app import SIM_HEADER, create_app, simulator_of
from capmon.sim.faults import ConnectionDropped
from capmon.sim.model import Simulator
from capmon.sim.scenario import Scenario, load_scenario

START_TIMEOUT = 10.0  # seconds for uvicorn to start serving on a bound socket
GRACEFUL_SHUTDOWN = 1.0  # seconds open streams get on exit before they are cut
WATCH_INTERVAL = 1.0  # seconds between two looks at a borrowed simulator


@dataclass(frozen=True)
class SimHandle:
    """A simulator serving on ``host:port`` in this process's event loop."""

    host: str
    port: int
    app: Starlette
    server: GuestServer = field(repr=False)
    task: asyncio.Task[None] = field(repr=False)

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    @property
    def admin_url(self) -> str:
        return f"{self.origin}/admin"

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def simulator(self) -> Simulator:
        return simulator_of(self.app)

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; open requests get ``GRACEFUL_SHUTDOWN`` seconds, then are cut."""
        if self.task.done():
            return
        self.server.exit_now()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout)
        except TimeoutError:
            self.server.force_exit = True
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class _HideDeliberateDrops(logging.Filter):
    """Not errors, so not logged as such: a ``reset`` fault dropping a connection on purpose,
    and requests still open (streams, hung faults) being cut when the simulator stops."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (ConnectionDropped, asyncio.CancelledError)):
            return False
        return not str(record.msg).startswith("Cancel %s running task(s)")


def _quiet_deliberate_drops() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _HideDeliberateDrops) for f in logger.filters):
        logger.addFilter(_HideDeliberateDrops())


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8089`` for IPv6) -> (host, port); port 0: any free port."""
    try:
        return parse_host_port(listen)
    except ValueError as e:
        raise SimulatorError(str(e)) from None


def _bind(host: str, port: int) -> socket.socket:
    try:
        return listen(host, port)
    except ListenError as e:
        raise SimulatorError(f"the simulator cannot listen on {host}:{port}: {e.reason}") from None


def _as_scenario(scenario: Scenario | str | os.PathLike[str]) -> Scenario:
    return scenario if isinstance(scenario, Scenario) else load_scenario(scenario)


def _config(app: Starlette, *, embedded: bool, access_log: bool = False) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        access_log=access_log,
        log_level="warning",
        # Embedded, leave logging config to the host app (uvicorn's dictConfig would replace it).
        log_config=None if embedded else LOGGING_CONFIG,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,  # type: ignore[arg-type]  # uvicorn takes fractions too
        # Streams and hung requests must not keep a stopping simulator alive.
        timeout_keep_alive=5,
    )


async def start_simulator(
    scenario: Scenario | str | os.PathLike[str] = "demo",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    clock: Clock | None = None,
    admin_key: str | None = None,
    open_admin: bool = False,
) -> SimHandle:
    """Start serving in the running event loop; call ``await handle.stop()`` when done.
    ``admin_key`` protects /admin (required beyond loopback unless ``open_admin``)."""
    policy = admin_policy(host, admin_key, open_admin=open_admin)
    app = create_app(_as_scenario(scenario), clock=clock, admin_policy=policy)
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    _quiet_deliberate_drops()
    server = GuestServer(_config(app, embedded=True))
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"capmon-sim:{bound_port}")
    waited, step = 0.0, 0.005
    wait_clock = default_clock()
    while not server.started:
        if task.done():
            sock.close()
            error = task.exception() if not task.cancelled() else None
            raise SimulatorError(f"the simulator on {host}:{bound_port} did not start: {error!r}")
        if waited > START_TIMEOUT:
            server.should_exit = True
            task.cancel()
            sock.close()
            raise SimulatorError(f"the simulator on {host}:{bound_port} did not start within {START_TIMEOUT:g}s")
        await wait_clock.sleep(step)
        waited += step
    simulator_of(app).start()  # schedules count from when it listens
    return SimHandle(host, bound_port, app, server, task)


@contextlib.asynccontextmanager
async def running_simulator(
    scenario: Scenario | str | os.PathLike[str] = "demo",
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    clock: Clock | None = None,
    admin_key: str | None = None,
    open_admin: bool = False,
) -> AsyncIterator[SimHandle]:
    """``async with running_simulator("demo") as sim: httpx.get(sim.base_url + "/models")``"""
    handle = await start_simulator(scenario, host, port, clock=clock, admin_key=admin_key, open_admin=open_admin)
    try:
        yield handle
    finally:
        await handle.stop()


async def probe(host: str, port: int, timeout: float = 1.0) -> bool | None:
    """True: a capmon simulator answers there. None: nothing listens. False: something else does."""
    origin = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    try:
        async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:
            r = await client.get(f"{origin}/v1/models", headers={"Authorization": f"Bearer {SIMULATOR_DEMO_KEY}"})
    except httpx.ConnectError:
        return None
    except httpx.HTTPError:
        return False
    return SIM_HEADER in r.headers


async def ensure_simulator(
    listen: str, scenario: Scenario | str | os.PathLike[str] = "demo", *, clock: Clock | None = None
) -> SimHandle | None:
    """Reuse a simulator already listening at ``listen`` (returns None: nothing to stop), or
    start one in this event loop (returns its handle: ``await handle.stop()`` on exit).
    Raises SimulatorError when the address is taken by something else."""
    host, port = parse_listen(listen)
    found = await probe(host, port)
    if found:
        return None
    if found is False:
        raise SimulatorError(
            f"{listen} is taken by something that is not a capmon simulator; choose another [simulator] listen address"
        )
    return await start_simulator(scenario, host, port, clock=clock, admin_key=embedded_admin_key(host))


def embedded_admin_key(host: str) -> str | None:
    """The admin key for a simulator embedded in a capmon process: on loopback none (as
    always); beyond it, $CAPMON_SIM_ADMIN_KEY, without which start_simulator refuses."""
    return None if is_loopback(host) else (os.environ.get(ADMIN_KEY_ENV) or None)


class BorrowedSimulator:
    """Watches a simulator that another process serves at ``listen`` (one cheap probe per
    ``interval`` on the clock). When nothing listens there any more, it reports that at once
    through ``report(level, message)`` and starts a simulator on that address in this event
    loop, so requests sent there keep being answered. If another process wins the address
    first, it borrows that one instead and keeps watching."""

    def __init__(
        self,
        listen: str,
        scenario: Scenario | str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        report: Callable[[str, str], None],
        interval: float = WATCH_INTERVAL,
    ) -> None:
        self.listen = listen
        self.host, self.port = parse_listen(listen)
        self.scenario = scenario
        self.clock = clock or default_clock()
        self.report = report
        self.interval = interval
        self.handle: SimHandle | None = None  # set once this process took over
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"capmon-sim-watch:{self.listen}")

    async def _watch(self) -> None:
        odd_reported = False
        while True:
            await self.clock.sleep(self.interval)
            found = await probe(self.host, self.port)
            if found is not None:
                # False (something answers, but not as a simulator) is said once; a busy
                # simulator that timed out looks the same, so it is no reason to take over.
                if found is False and not odd_reported:
                    self.report(
                        "warning",
                        f"the simulator at {self.listen} that this process uses does not answer as a capmon simulator",
                    )
                odd_reported = found is False
                continue
            self.report(
                "warning",
                f"the simulator at {self.listen} that this process borrowed from another process "
                f"has gone away; starting one here so work goes on",
            )
            try:
                self.handle = await start_simulator(
                    self.scenario, self.host, self.port, clock=self.clock, admin_key=embedded_admin_key(self.host)
                )
            except SimulatorError as e:
                self.report("warning", f"could not take over {self.listen} ({e}); will look again")
                continue
            self.report("info", f"this process now serves the simulator at {self.listen}")
            return

    async def stop(self) -> None:
        """Stop watching, and stop the simulator this process took over, if any."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.handle is not None:
            await self.handle.stop()


def _warn(message: str) -> None:
    print(f"capmon simulator: WARNING: {message}", file=sys.stderr, flush=True)


def serve_policy(
    host: str, *, admin_key_env: str | None = None, open_admin: bool = False, environ: Mapping[str, str] | None = None
) -> AdminPolicy:
    """How ``capmon sim`` protects /admin on ``host``: the key from ``admin_key_env`` (default
    CAPMON_SIM_ADMIN_KEY), required beyond loopback unless ``open_admin``. A variable named
    explicitly must be set. Raises SimulatorError; prints a warning when reachable from afar."""
    env = os.environ if environ is None else environ
    name = admin_key_env or ADMIN_KEY_ENV
    key = env.get(name) or None
    if admin_key_env and key is None:
        raise SimulatorError(f"--admin-key-env {admin_key_env}: environment variable {admin_key_env} is not set")
    policy = admin_policy(host, key, open_admin=open_admin, key_source=name)
    if policy.access is AdminAccess.OPEN:
        _warn(f"--open-admin: anyone who can reach {host} can change this simulator through /admin")
    elif not is_loopback(host):
        _warn(f"listening on {host}, reachable from other machines; /admin requires the admin key from ${name}")
    return policy


def serve(
    listen: str = "127.0.0.1:8089",
    scenario: Scenario | str | os.PathLike[str] = "demo",
    *,
    access_log: bool = False,
    admin_key_env: str | None = None,
    open_admin: bool = False,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Serve until Ctrl+C (for ``capmon sim``). Raises SimulatorError / ConfigError."""
    host, port = parse_listen(listen)
    scn = _as_scenario(scenario)
    policy = serve_policy(host, admin_key_env=admin_key_env, open_admin=open_admin, environ=environ)
    app = create_app(scn, admin_policy=policy)
    sock = _bind(host, port)
    _quiet_deliberate_drops()
    server = uvicorn.Server(_config(app, embedded=False, access_log=access_log))
    if access_log:  # log_level "warning" (uvicorn's own chatter) also silenced the access log's INFO lines
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)

    async def announce() -> None:
        while not server.started:
            await default_clock().sleep(0.005)
        simulator_of(app).start()
        h = f"[{host}]" if ":" in host else host
        origin = f"http://{h}:{sock.getsockname()[1]}"
        print(
            f"capmon simulator: scenario {scn.name!r} listening on {origin}/v1 "
            f"(key {SIMULATOR_DEMO_KEY}; {policy.describe()}; Ctrl+C to stop)",
            flush=True,
        )

    async def main() -> None:
        watcher = asyncio.create_task(announce())
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl+C it handled gracefully
        pass
    finally:
        sock.close()
    print("capmon simulator: stopped", file=sys.stderr, flush=True)
