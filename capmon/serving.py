"""Serving an ASGI app from inside capmon's own event loop: the simulator and the gateway
both run uvicorn as a guest. One home for how that is done: the listening socket (with
TCP_NODELAY on every connection) and a uvicorn server that leaves the signals to its
host and stops the moment it is told to."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import resource
import socket
from collections.abc import Iterator

import uvicorn


class ListenError(OSError):
    """The address cannot be listened on; ``in_use`` when something already listens there."""

    def __init__(self, where: str, reason: str, in_use: bool) -> None:
        super().__init__(f"cannot listen on {where}: {reason}")
        self.where = where
        self.reason = reason
        self.in_use = in_use


def listen(
    host: str, port: int, backlog: int = 1024, *, reuse_port: bool = False, listening: bool = True
) -> socket.socket:
    """A bound, listening, non-blocking socket for ``host:port`` (port 0: any free one).
    ``reuse_port``: SO_REUSEPORT, so that several processes listen on the port and the
    kernel spreads connections over them; ``listening`` False: bound only (a process
    that holds the port for its workers without taking connections itself)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not implied: asyncio sets TCP_NODELAY only on sockets that say they
    # are TCP, and accepted connections inherit it. Without it every answer written in two
    # parts (headers, then body) waits out a delayed ACK (about 40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listening:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ListenError(where, e.strerror or str(e), e.errno == errno.EADDRINUSE) from None
    return sock


class GuestServer(uvicorn.Server):
    """uvicorn in someone else's loop: it must not take over the process's signal handlers
    (the host owns Ctrl+C), and it stops as soon as it is asked to (uvicorn's own loop
    looks at ``should_exit`` only on its ticks, and its shutdown pauses 0.1 s twice; tests
    start hundreds). It relies on uvicorn 0.5x's internals: servers, server_state, lifespan."""

    def __init__(self, config: uvicorn.Config, tick: float = 0.1) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()
        self._tick = tick

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                async with asyncio.timeout(self._tick):  # not wait_for: it can swallow a cancel (3.11)
                    await self._exit.wait()
            should_exit = await self.on_tick(counter)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            # Cancelled with its loop (the end of an asyncio.run that an in-process engine
            # ran in) it never reaches its shutdown: stop listening all the same, so the
            # address is free for the next engine (capmon/inprocess/home.py).
            for server in getattr(self, "servers", ()):
                server.close()

    def exit_now(self, force: bool = False) -> None:
        self.should_exit = True
        self.force_exit = self.force_exit or force
        self._exit.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown (stop accepting, ask connections to close, give open requests
        ``timeout_graceful_shutdown``, then cut them) with its fixed 0.1 s pauses made 10 ms."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(self._drain(), timeout=self.config.timeout_graceful_shutdown)
        except TimeoutError:
            logging.getLogger("uvicorn.error").error(
                "Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks)
            )
            for t in self.server_state.tasks:
                t.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _drain(self) -> None:
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            await asyncio.sleep(0.01)
        for server in self.servers:
            await server.wait_closed()


class Throttled:
    """One log line per ``interval`` at most for an event that can recur thousands of
    times a second (a flood of refused connections, an accept loop out of descriptors):
    the first is logged at once, the rest are counted and told in one line when the
    interval is over, so the log says how many without growing with the attack."""

    def __init__(self, logger: logging.Logger, level: int = logging.WARNING, interval: float = 1.0) -> None:
        self.logger = logger
        self.level = level
        self.interval = interval
        self._last: float | None = None
        self._suppressed = 0
        self._message = ""
        self._flush: asyncio.TimerHandle | None = None

    def note(self, message: str) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._last is None or now - self._last >= self.interval:
            self._last = now
            self.logger.log(self.level, "%s", message)
            return
        self._suppressed += 1
        self._message = message
        if self._flush is None:
            self._flush = loop.call_at(self._last + self.interval, self._told)

    def _told(self) -> None:
        self._flush = None
        if self._suppressed:
            count, self._suppressed = self._suppressed, 0
            self._last = asyncio.get_running_loop().time()
            self.logger.log(self.level, "%s (%d more like it in the last %gs)", self._message, count, self.interval)

    def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None


# asyncio.constants.ACCEPT_RETRY_DELAY: how long its accept loop waits after EMFILE.
ACCEPT_RETRY_DELAY = 1.0
RETRY_SLACK = 0.1


class AcceptErrors:
    """The loop's exception handler while a server runs in it. Out of descriptors,
    asyncio's accept loop logs every failed accept with its traceback (Python 3.11 goes on
    trying the whole backlog in one pass: 35,000 tracebacks in 3 s were seen); this says
    it once a second with a count and hands everything else to the handler it replaced."""

    def __init__(self, loop: asyncio.AbstractEventLoop, where: str) -> None:
        self.loop = loop
        self.where = where
        self.previous = loop.get_exception_handler()
        self.throttle = Throttled(logging.getLogger("capmon.serving"), logging.ERROR)
        self._retry_at: float | None = None

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if isinstance(exc, OSError) and message.startswith("socket.accept()"):
            # asyncio stops reading the socket and tries again in ACCEPT_RETRY_DELAY.
            self._retry_at = loop.time() + ACCEPT_RETRY_DELAY
            self.throttle.note(
                f"{self.where} cannot accept a connection: {exc.strerror or exc} (the process's descriptor "
                f"limit, ulimit -n, is reached; new connections wait in the backlog)"
            )
            return
        if isinstance(exc, ValueError | OSError | KeyError) and "_start_serving" in message:
            # That retry, come after the server closed its socket: nothing is left to accept on.
            logging.getLogger("capmon.serving").debug("%s: an accept retry after close: %r", self.where, exc)
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def __enter__(self) -> AcceptErrors:
        self.loop.set_exception_handler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.throttle.close()
        # An accept retry still pending would fail on the closed socket after we are gone.
        if self._retry_at is not None and self.loop.time() < self._retry_at + RETRY_SLACK and not self.loop.is_closed():
            self.loop.call_at(self._retry_at + RETRY_SLACK, self._restore)
        else:
            self._restore()

    def _restore(self) -> None:
        if self.loop.get_exception_handler() is self:
            self.loop.set_exception_handler(self.previous)


def raise_descriptor_limit(wanted: int) -> int:
    """Raise this process's soft limit of open descriptors towards ``wanted`` (never past
    the hard limit, never lower); the limit it has after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft) if soft != resource.RLIM_INFINITY else wanted
