"""``capmon serve``: the gateway in front of the engine the config describes (on the
shipped config, the bundled simulator), until Ctrl+C or SIGTERM.

Exit codes: 0 when stopped otherwise, 130 when stopped by a signal; a wrong config, a
missing key variable, a taken address or an open gateway asked to listen beyond
loopback raise CapmonError, which the CLI prints as one line with exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TextIO

from capmon.core.base.exceptions import ConfigError
from capmon.core.types.config import Config, is_loopback
from capmon.core.types.snapshot import LinkState
from capmon.exitcodes import EXIT_INTERRUPTED, EXIT_OK
from capmon.gateway.app import close_app, create_app
from capmon.gateway.gateway_log import GatewayLog
from capmon.gateway.server import bind, start_server
from capmon.gateway.settings import GatewaySettings, load_settings
from capmon.gateway.telemetry import require_otel
from capmon.runtime import Engine, load, open_engine, require_extras
from capmon.serving import AcceptErrors, raise_descriptor_limit

log = logging.getLogger("capmon.gateway")

RESERVED_DESCRIPTORS = 256  # the process's own: the listening socket, the simulator, Redis, logs


@dataclass(frozen=True)
class ServeOptions:
    listen: str | None = None  # HOST:PORT; None: [gateway] listen
    config: str | None = None  # None: $CAPMON_CONFIG, ./config.toml, the user config, the bundled demo
    environ: Mapping[str, str] | None = None  # None: os.environ
    access_log: str | None = None  # PATH or - (stderr); None: [gateway] access_log
    workers: int | None = None  # processes on the port; None: [gateway] workers
    loop: str | None = None  # asyncio | uvloop; None: [gateway] loop
    worker: int | None = None  # set by the supervisor in each worker it starts (capmon/gateway/workers.py)
    standby: bool = False  # the supervisor's spare: imported, it waits on stdin for the number of a worker to be


def check_exposure(config: Config, settings: GatewaySettings) -> None:
    """An open gateway (no client keys) would hand the provider keys' use to anyone who
    can reach it: it listens on loopback only."""
    if settings.open and not is_loopback(settings.host):
        raise ConfigError(
            config.path,
            "gateway.keys",
            f"listening on {settings.listen} (not loopback) needs at "
            f"least one client key, e.g. keys = [{{ env = "
            f'"CAPMON_GATEWAY_KEY", alias = "team" }}]',
        )


def banner(settings: GatewaySettings, engine: Engine, port: int) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    aliases = ", ".join(settings.aliases)
    auth = f"{len(settings.keys)} client key(s)" if settings.keys else "no client keys: loopback only, any key works"
    admin = "admin key set" if settings.admin is not None else "control API read-only (no gateway.admin_key_env)"
    sim = f"; simulator {engine.simulator_url}" if engine.simulator_url else ""
    if settings.worker is not None:
        sim += f"; worker {settings.worker} of {settings.workers}"
    shared = engine.client.state.shared_status()
    if shared.state is not LinkState.OFF:  # which fleet it joined, or that it could not
        sim += f"; {shared.label} ({shared.url} {shared.namespace})"
    if engine.client.config.telemetry.otlp_endpoint:
        sim += f"; traces to {engine.client.config.telemetry.otlp_endpoint}"
    return (
        f"capmon gateway: listening on http://{host}:{port}/v1 (models: {', '.join(settings.models)}; "
        f"aliases: {aliases}; {auth}; {admin}{sim}; Ctrl+C to stop)"
    )


def check_descriptors(settings: GatewaySettings) -> None:
    """Each client connection may hold an upstream one too: ask for descriptors enough for
    ``max_connections`` of both, and say so when the hard limit is lower (past it, accepts
    fail; the log says that once a second)."""
    wanted = 2 * settings.max_connections + RESERVED_DESCRIPTORS
    got = raise_descriptor_limit(wanted)
    if got < wanted:
        log.warning(
            "the process may open %d descriptors (ulimit -n), fewer than gateway.max_connections = %d "
            "needs (%d); connections past the limit wait unaccepted",
            got,
            settings.max_connections,
            wanted,
        )


async def _run(config: Config, settings: GatewaySettings, env: Mapping[str, str], out: TextIO) -> int:
    # Before the engine: a taken port says so before anything starts. A worker shares the
    # port with the others (SO_REUSEPORT), the kernel spreading connections over them; it
    # listens only once it serves (the server's start listens), so that no connection
    # waits on it while its engine starts, or is reset when it cannot start (a restart).
    worker = settings.worker is not None
    sock = bind(settings.host, settings.port, reuse_port=worker, listening=not worker)
    check_descriptors(settings)
    stopped_by: list[int] = []
    try:
        with AcceptErrors(asyncio.get_running_loop(), f"the gateway on {settings.listen}"):
            async with open_engine(config, environ=env, role="gateway") as engine:
                app = create_app(engine.client, settings)
                server = await start_server(app, settings.host, settings.port, sock=sock)
                loop = asyncio.get_running_loop()

                def stop(signum: int) -> None:
                    force = bool(stopped_by)
                    stopped_by.append(signum)
                    app.state.gateway.feed.close()  # event streams end now rather than at the graceful timeout
                    server.stop_soon(force=force)

                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, stop, signum)
                print(banner(settings, engine, server.port), file=out, flush=True)
                try:
                    await server.wait()
                finally:
                    for signum in (signal.SIGINT, signal.SIGTERM):
                        loop.remove_signal_handler(signum)
                    close_app(app)
    finally:
        sock.close()
    return EXIT_INTERRUPTED if stopped_by else EXIT_OK


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``[gateway] loop`` names (None: asyncio's own)."""
    if loop != "uvloop":
        return None
    import uvloop  # checked to be installed by load_settings

    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def serve(options: ServeOptions, out: TextIO | None = None) -> int:
    """Run the gateway until a signal stops it. Raises CapmonError when it cannot start."""
    if options.standby:
        from capmon.gateway.workers import stand_by

        number = stand_by(sys.stdin)
        if number is None:  # the supervisor stopped without needing it
            return EXIT_OK
        options = dataclasses.replace(options, standby=False, worker=number)
    env = os.environ if options.environ is None else options.environ
    config = load(options.config)
    settings = load_settings(
        config,
        listen=options.listen,
        environ=env,
        access_log=options.access_log,
        workers=options.workers,
        loop=options.loop,
        worker=options.worker,
    )
    check_exposure(config, settings)
    # Before anything starts: what the config asks of an extra that is not installed
    # (the simulator, Redis, aiohttp; traces without the otel extra).
    require_extras(config)
    require_otel(config)
    with GatewayLog(settings.worker) as gateway_log:
        if settings.workers > 1 and settings.worker is None:
            from capmon.gateway.workers import supervise

            return supervise(options, settings, env, out or sys.stdout)
        with (
            contextlib.suppress(KeyboardInterrupt),  # a Ctrl+C before the handlers are in place
            asyncio.Runner(loop_factory=loop_factory(settings.loop)) as runner,
        ):
            code = runner.run(_run(config, settings, env, out or sys.stdout))
            # The log's last line, not a print: a stderr nobody reads must not keep the gateway from exiting.
            who = f"capmon gateway worker {settings.worker}" if settings.worker is not None else "capmon gateway"
            gateway_log.last = f"{who}: stopped"
            return code
        return EXIT_INTERRUPTED
