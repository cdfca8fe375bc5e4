"""One engine per process for the in-process SDK clients, and the event loop it runs in.

The engine (capmon/runtime.py: the config, the embedded simulator when the config asks,
the shared FallbackClient) and the gateway's app in front of it live on one loop, the
engine's *home*:

- the first request from a **sync** client starts a home on a background thread of its
  own ("capmon-engine"), which every thread's sync clients share;
- the first request from an **async** client starts the home on the caller's own loop,
  so async requests make no thread hop.

Whoever comes later uses that one engine: a request from another thread, or from another
running loop, is handed to the home loop across threads (one engine per process, so the
breakers, limiters and the queue see all of the process's traffic). Two things are refused
with a clear :class:`InProcessError` rather than hanging: a sync client called on the
thread whose running loop is the home (it would block the loop it waits for), and any
request while the home is a caller's loop that is not running (nothing would serve it).
A home whose loop has been closed is gone; the next request builds a new engine.

An engine on a caller's loop closes with that loop: ``asyncio.run`` (and pytest-asyncio,
and ``asyncio.Runner``) cancel the task that holds it open when the main coroutine is done,
and the engine closes then, on its own loop. The background home closes at interpreter
exit (atexit), or by :func:`close_engine` / :func:`aclose_engine`.

After ``fork()`` the child forgets the parent's engine without touching it (its loop
thread does not exist in the child and its sockets are the parent's) and builds its own
on its first request; the leftovers are never reported as unclosed in the child.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import enum
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from starlette.applications import Starlette

from capmon.core.base.exceptions import CapmonError
from capmon.core.types.config import Config, resolve_keys
from capmon.runtime import Engine, load, open_engine

if TYPE_CHECKING:
    from capmon.gateway.settings import GatewaySettings

log = logging.getLogger("capmon.inprocess")

START_TIMEOUT = 60.0  # seconds a sync caller waits for the engine to start (a simulator, Redis)
CLOSE_TIMEOUT = 10.0  # seconds closing the engine may take at exit
THREAD_NAME = "capmon-engine"

T = TypeVar("T")
ConfigLike = Config | str | Path | None


class InProcessError(CapmonError):
    """The in-process engine cannot serve this call (which loop, which config), or did not start."""


class HomeState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    CLOSED = "closed"  # closed, failed to start, or its loop is gone


def settings_for(config: Config) -> GatewaySettings:
    """The gateway's settings for in-process use: no client keys or admin key (nothing
    outside the process can reach the app, and the SDKs' placeholder keys are ignored), no
    CORS and no access log (the gateway's log is the gateway process's); the rest, the
    aliases, the body cap and the deadline, exactly as ``capmon serve`` would take them."""
    from capmon.gateway.settings import load_settings

    g = dataclasses.replace(config.gateway, keys=(), admin_key_env="", cors_origins=(), access_log="")
    return load_settings(dataclasses.replace(config, gateway=g), listen="127.0.0.1:0", environ={})


class Home:
    """One engine, its gateway app, and the loop they run in."""

    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop, *, background: bool) -> None:
        self.config = config
        self.loop = loop
        # the background thread, when the home is ours; None: a caller's loop
        self.thread = (
            threading.Thread(target=_run_home, args=(self,), name=THREAD_NAME, daemon=True) if background else None
        )
        self.thread_id: int | None = None
        self.state = HomeState.STARTING
        self.engine: Engine | None = None
        self.app: Starlette | None = None
        self.ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.closed: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._stop_asked = False
        self._keeper: asyncio.Task[None] | None = None
        # The tasks of the requests in flight on this loop (capmon/inprocess/transport.py), touched
        # only on it: closing the home ends them, so none is destroyed pending when the process exits.
        self.calls: set[asyncio.Task[None]] = set()

    @property
    def ours(self) -> bool:
        return self.thread is not None

    def gone(self) -> bool:
        return self.state is HomeState.CLOSED or self.loop.is_closed()

    def start_thread(self) -> None:
        assert self.thread is not None
        self.thread.start()
        self.thread_id = self.thread.ident

    def begin(self) -> None:
        """On the home loop: start the task that holds the engine open."""
        self._keeper = self.loop.create_task(self._keep(), name="capmon-inprocess-engine")
        self._keeper.add_done_callback(_retrieved)

    async def _keep(self) -> None:
        from capmon.gateway.app import close_app, create_app

        self._stop = asyncio.Event()
        if self._stop_asked:
            self._stop.set()
        try:
            async with open_engine(self.config, role="library") as engine:
                app = create_app(engine.client, settings_for(self.config), in_process=True)
                self.engine, self.app = engine, app
                self.state = HomeState.READY
                self.ready.set_result(None)
                try:
                    await self._stop.wait()
                finally:
                    self.state = HomeState.CLOSED
                    close_app(app)
        except asyncio.CancelledError:
            if not self.ready.done():
                self.ready.set_exception(InProcessError("capmon's in-process engine was stopped as it started"))
            raise
        except Exception as e:
            if not self.ready.done():
                self.ready.set_exception(e)  # the callers waiting for it raise it
            else:
                log.error("capmon's in-process engine failed as it closed: %s", e)
        finally:
            self.state = HomeState.CLOSED
            if not self.closed.done():
                self.closed.set_result(None)

    def ask_stop(self) -> None:
        """On the home loop: close the engine (the keeper returns once it is closed)."""
        self._stop_asked = True
        if self._stop is not None:
            self._stop.set()

    async def shutdown(self) -> None:
        """On the home loop: close the engine and wait until it is closed, then end the
        requests still in flight (streams nobody read to their end): a caller's loop that
        is not asyncio.run's would keep them pending until the process exits."""
        self.ask_stop()
        if self._keeper is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._keeper)
        calls = [t for t in self.calls if not t.done()]
        for task in calls:
            task.cancel()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)

    def silence(self) -> None:
        """Nothing left of this home is ever reported (an abandoned loop's leftovers, at GC)."""
        with contextlib.suppress(Exception):
            self.loop.set_exception_handler(lambda loop, context: None)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # handled in the task: never "exception was never retrieved"


def _run_home(home: Home) -> None:
    """The background thread: the home loop until the engine is closed, then the loop's
    own clean-up (what asyncio.run does, without starting a thread at interpreter exit)."""
    loop = home.loop
    asyncio.set_event_loop(loop)
    try:
        home.begin()
        assert home._keeper is not None
        loop.run_until_complete(asyncio.wait([home._keeper]))
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


class Runtime:
    """The process's one engine: which config it is built from, and where it lives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._home: Home | None = None
        self.config: Config | None = None
        self.built = 0  # engines started in this process (one, unless closed and started again)
        self._abandoned: list[Home] = []  # kept, never collected: their loops cannot close them
        self._atexit = False

    # ------------------------------------------------------------ config

    def adopt(self, config: ConfigLike) -> Config:
        """At a client's construction: the config the process's engine is built from. The
        first client's (found as every capmon command finds it when None); a later client's
        must be the same while an engine runs. A wrong config or a missing key variable is
        a ConfigError now, not at the first request."""
        with self._lock:
            if config is None:
                if self.config is None:
                    self.config = _checked(load(None))
                return self.config
            cfg = config if isinstance(config, Config) else load(str(config))
            if self.config is not None and (cfg is self.config or cfg == self.config):
                return self.config
            home = self._home
            if self.config is not None and home is not None and not home.gone():
                raise InProcessError(
                    f"this process's capmon engine runs the config {self.config.path}; a client with another "
                    f"config ({cfg.path}) cannot share it (one engine per process): close it first with "
                    f"capmon.close_engine(), or make every client with the same config"
                )
            self.config = _checked(cfg)
            return self.config

    # ------------------------------------------------------------ finding the home

    def _live(self, loop: asyncio.AbstractEventLoop | None) -> Home:
        """The home, or a new one (on ``loop``; None: on a background thread)."""
        with self._lock:
            home = self._home
            if home is None or home.gone():
                home = self._new_home(loop)
            return home

    def for_sync(self) -> Home:
        """The home a sync caller's request goes to (started here when there is none)."""
        home = self._home
        if home is None or home.state is not HomeState.READY or home.loop.is_closed():
            home = self._live(None)
        if home.ours:
            if threading.get_ident() == home.thread_id:
                raise InProcessError("a sync capmon client cannot be called on capmon's own engine thread")
        else:
            if asyncio.events._get_running_loop() is home.loop:
                raise InProcessError(
                    "a sync capmon client was called inside the event loop that runs capmon's engine, which it "
                    "would block forever; in async code use capmon.async_openai_client() (or the async variant "
                    "of the client you use)"
                )
            if not home.loop.is_running():
                raise _paused()
        if home.state is not HomeState.READY:
            try:
                home.ready.result(START_TIMEOUT)
            except concurrent.futures.TimeoutError:
                raise InProcessError(f"capmon's in-process engine did not start within {START_TIMEOUT:g}s") from None
        return home

    async def for_async(self) -> Home:
        """The home an async caller's request goes to: this loop's, another thread's
        running loop (reached across threads), or a new one on this loop."""
        loop = asyncio.get_running_loop()
        home = self._home
        if home is not None and home.loop is loop and home.state is HomeState.READY:
            return home
        if home is None or home.gone():
            home = self._live(loop)
        if not home.ours and home.loop is not loop and not home.loop.is_running():
            raise _paused()
        if home.state is not HomeState.READY:
            await asyncio.wrap_future(home.ready)
        return home

    def _new_home(self, loop: asyncio.AbstractEventLoop | None) -> Home:
        """A new home, under the lock: on ``loop`` (the caller's, running in this thread),
        else on a background thread of its own."""
        old = self._home
        if old is not None and old.state is not HomeState.CLOSED:
            self._abandon(old)  # its loop was closed under it: nothing of it can be closed any more
        if self.config is None:
            self.config = _checked(load(None))
        if not self._atexit:
            atexit.register(close_at_exit)
            self._atexit = True
        if loop is None:
            home = Home(self.config, asyncio.new_event_loop(), background=True)
            self._home = home
            self.built += 1
            home.start_thread()
        else:
            home = Home(self.config, loop, background=False)
            self._home = home
            self.built += 1
            home.begin()
        return home

    def _abandon(self, home: Home) -> None:
        """A home nothing can close any more: never reported, and kept (never collected)."""
        home.silence()
        self._abandoned.append(home)

    def current(self) -> Home | None:
        home = self._home
        return home if home is not None and not home.gone() else None

    # ------------------------------------------------------------ closing

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Close the engine (the next request starts a new one), from any thread but the
        loop it runs in (there: ``await aclose()``)."""
        with self._lock:
            home = self._home
            if home is None or home.gone():
                if home is not None and home.state is not HomeState.CLOSED:
                    self._abandon(home)  # its loop was closed with the engine open on it (at exit too)
                self._home = None
                return
            running = asyncio.events._get_running_loop()
            if not home.ours and running is home.loop:
                raise InProcessError("close the engine from its own loop with: await capmon.aclose_engine()")
            self._home = None
        if home.ours or home.loop.is_running():
            home.loop.call_soon_threadsafe(home.ask_stop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                home.closed.result(timeout)
            if home.thread is not None:
                home.thread.join(timeout)
        elif running is None:
            home.loop.run_until_complete(home.shutdown())  # a caller's loop, not running now
        else:
            self._abandon(home)

    async def aclose(self) -> None:
        home = self.current()
        if home is not None and home.loop is asyncio.get_running_loop():
            with self._lock:
                if self._home is home:
                    self._home = None
            await home.shutdown()
            return
        await asyncio.to_thread(self.close)

    def forked(self) -> None:
        """In a forked child: forget the parent's engine without touching it."""
        self._lock = threading.Lock()
        old, self._home = self._home, None
        if old is not None:
            self._abandon(old)

    def call(self, fn: Callable[[Engine], T]) -> T:
        """``fn(engine)`` on the engine's loop (a trip, a pin, a snapshot taken there), from a
        thread other than the engine's; returns what it returns."""
        home = self.current()
        if home is None or home.engine is None:
            raise InProcessError("capmon's in-process engine is not running (it starts on a client's first request)")
        engine = home.engine
        if asyncio.events._get_running_loop() is home.loop:
            raise InProcessError("call_in_engine() waits for the engine's loop; on that loop, use the engine directly")

        async def run() -> T:
            return fn(engine)

        return asyncio.run_coroutine_threadsafe(run(), home.loop).result(CLOSE_TIMEOUT)


def _checked(cfg: Config) -> Config:
    resolve_keys(cfg)  # a missing key variable: one clear ConfigError before any request
    return cfg


def _paused() -> InProcessError:
    return InProcessError(
        "capmon's engine runs in an event loop that is not running now (one engine per process, on the "
        "loop of the first async request); run the requests in that loop, or close the engine there first "
        "(await capmon.aclose_engine())"
    )


RUNTIME = Runtime()


def close_at_exit() -> None:
    try:
        RUNTIME.close()
    except Exception as e:  # at exit there is nobody left to raise to
        log.warning("closing capmon's in-process engine at exit failed: %s", e)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RUNTIME.forked)
