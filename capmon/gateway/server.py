"""uvicorn serving the gateway in the running event loop, on a socket bound here (so a
taken port is a clear error, and port 0 says which port it got). ``capmon serve`` and
the tests use the same server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette

from capmon.core.base.clock import default_clock
from capmon.core.base.exceptions import CapmonError
from capmon.gateway.connections import ConnectionLimits, protocol_for
from capmon.gateway.settings import GatewaySettings
from capmon.serving import GuestServer, ListenError, listen

START_TIMEOUT = 10.0  # seconds for uvicorn to start serving on the bound socket
GRACEFUL_SHUTDOWN = 2  # seconds open requests get to finish when the gateway stops
TICK = 1.0  # seconds between uvicorn's housekeeping ticks (its own default is 0.1 s)


class GatewayError(CapmonError):
    """The gateway cannot start (its address is taken, cannot be bound, or it did not start)."""


def bind(host: str, port: int, *, reuse_port: bool = False, listening: bool = True) -> socket.socket:
    try:
        return listen(host, port, backlog=2048, reuse_port=reuse_port, listening=listening)
    except ListenError as e:
        if e.in_use:
            raise GatewayError(
                f"{e.where} is already in use; choose another address with --listen or [gateway] listen"
            ) from None
        raise GatewayError(f"cannot listen on {e.where}: {e.reason}") from None


@dataclass
class GatewayServer:
    """A gateway serving on ``host:port`` in this loop; ``await stop()`` when done."""

    host: str
    port: int
    app: Starlette
    server: GuestServer = field(repr=False)
    task: asyncio.Task[None] = field(repr=False)
    sock: socket.socket = field(repr=False)

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def stop_soon(self, force: bool = False) -> None:
        self.server.exit_now(force)

    async def wait(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.sock.close()

    async def stop(self) -> None:
        self.stop_soon()
        await self.wait()


def limits_of(settings: GatewaySettings) -> ConnectionLimits:
    return ConnectionLimits(
        header_timeout=settings.header_timeout,
        keep_alive_timeout=settings.keep_alive_timeout,
        write_timeout=settings.write_timeout,
        max_connections=settings.max_connections,
    )


def _config(app: Starlette, limits: ConnectionLimits | None, http: str) -> uvicorn.Config:
    limits = limits or limits_of(app.state.gateway.settings)
    return uvicorn.Config(
        app,
        http=protocol_for(limits, http),  # uvicorn's protocol with the gateway's limits
        lifespan="off",
        access_log=False,
        # The gateway reads no X-Forwarded-* (it has no trusted proxies to name), so uvicorn's
        # middleware for them would only cost a call per request.
        proxy_headers=False,
        # The gateway writes a Date of now on each reply (capmon/gateway/exchange.py): uvicorn's
        # is refreshed every ten ticks, ten seconds stale with the gateway's TICK.
        date_header=getattr(app.state, "gateway", None) is None,
        log_level="warning",
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
    )


async def start_server(
    app: Starlette,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    *,
    limits: ConnectionLimits | None = None,
    http: str | None = None,
) -> GatewayServer:
    """Serve ``app`` in the running loop on ``sock`` (bound to ``host:port`` when None),
    with the connection ``limits`` of the gateway's settings unless given (an app that is
    not a gateway, such as a test's upstream, must give them), and the settings' HTTP
    parser unless ``http`` names one."""
    sock = sock or bind(host, port)
    bound = sock.getsockname()[1]
    gateway = getattr(app.state, "gateway", None)
    parser = http or (gateway.settings.http if gateway is not None else "httptools")
    server = GuestServer(_config(app, limits, parser), tick=TICK)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=f"capmon-gateway:{bound}")
    clock, waited, step = default_clock(), 0.0, 0.005
    while not server.started:
        if task.done():
            sock.close()
            error = task.exception() if not task.cancelled() else None
            raise GatewayError(f"the gateway on {host}:{bound} did not start: {error!r}")
        if waited > START_TIMEOUT:
            server.exit_now(True)
            task.cancel()
            sock.close()
            raise GatewayError(f"the gateway on {host}:{bound} did not start within {START_TIMEOUT:g}s")
        await clock.sleep(step)
        waited += step
    logging.getLogger("capmon.gateway").debug("serving on %s:%d", host, bound)
    return GatewayServer(host, bound, app, server, task, sock)
