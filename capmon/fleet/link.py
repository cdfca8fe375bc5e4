"""The connection to Redis and its health: ok, or degraded (running on local state).

Commands go through one client with short timeouts and no retries, so a lost Redis is
noticed at the first call that needs it and that call goes on with local state.
Pub/sub has its own connection, read with ``get_message(timeout=...)`` in a loop and
no socket timeout (a quiet channel is not a dead one). Every script returns Redis's
clock; :meth:`Link.observe` keeps the offset that converts shared times to this
process's clock.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from capmon.core.base import secrets
from capmon.core.base.clock import Clock
from capmon.core.types.snapshot import LinkState
from capmon.fleet.codec import Garbage, number
from capmon.fleet.scripts import Scripts
from capmon.fleet.settings import Settings

log = logging.getLogger("capmon.fleet")

# What a lost, restarting or hung Redis raises through redis-py, and what garbage in
# Redis raises (capmon/fleet/codec.py): both are faults the process degrades for.
ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError, asyncio.TimeoutError, Garbage)


def wrong_type(exc: BaseException, suspects: list[str]) -> Garbage | None:
    """A WRONGTYPE from a command or a script, as Garbage naming the keys it may be in."""
    if isinstance(exc, ResponseError) and "WRONGTYPE" in str(exc):
        return Garbage(suspects[0] if suspects else "?", "", None, "a key of the wrong type", tuple(suspects))
    return None


COMMAND_TIMEOUT = 0.5  # seconds: a call slower than this counts as Redis lost
# Connections a process may hold to Redis at once. redis-py 8's asyncio pool allows 100 and
# raises past them ("Too many connections"), which the process takes for a lost Redis: a
# gateway with 100 requests admitting or settling at once (1,000 QPS and a stall) degraded.
MAX_CONNECTIONS = 1024


def describe(exc: BaseException) -> str:
    """An exception as one line without secrets."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return secrets.redact(text)[:200]


class Link:
    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.settings = settings
        self._clock = clock
        self.client = self._client(COMMAND_TIMEOUT)
        self.scripts = Scripts(self.client)
        self.state = LinkState.DEGRADED  # until start() joins
        self.since: float | None = None
        self.message = "not started"
        self.offset = 0.0  # this process's clock minus Redis's
        self.calls: collections.Counter[str] = collections.Counter()  # round trips by script
        self.verdicts: collections.Counter[str] = collections.Counter()  # ADMIT's answers: ok, full, rpm, ...
        self.hot: collections.deque[float] = collections.deque(maxlen=200_000)  # seconds per ADMIT / SETTLE
        self.losses = 0
        self.on_change: Callable[[], None] | None = None

    def _client(self, timeout: float | None, decode: bool = True) -> Redis:
        return Redis.from_url(
            self.settings.url,
            decode_responses=decode,
            socket_timeout=timeout,
            socket_connect_timeout=COMMAND_TIMEOUT,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            client_name="capmon",
            max_connections=MAX_CONNECTIONS,
        )

    def subscriber(self) -> Redis:
        """Messages come as bytes: one that is not UTF-8 is the decoder's to refuse
        (capmon/fleet/codec.py), not an error inside redis-py's reader."""
        return self._client(None, decode=False)

    @property
    def ok(self) -> bool:
        return self.state is LinkState.OK

    def observe(self, redis_now: Any) -> float:
        """Redis's clock as a script returned it: the offset to this process's clock."""
        self.offset = self._clock.now() - number(redis_now, "a script's answer", "now", 0.0)
        return self.offset

    async def call(
        self,
        kind: str,
        script: Any,
        keys: list[str],
        args: list[Any],
        hot: bool = False,
        suspects: list[str] | None = None,
    ) -> Any:
        """One script; a WRONGTYPE raises Garbage naming ``suspects`` (its keys unless the
        script also touches keys named in its arguments)."""
        t0 = self._clock.now()
        try:
            out = await script(keys=keys, args=args)
        except ResponseError as e:
            raise (wrong_type(e, suspects or keys) or e) from None
        except AttributeError as e:
            # redis-py's asyncio connection, closed (a timeout, a server that refused it) while
            # a command was on its way, writes on a writer it no longer has: a lost connection,
            # which the process degrades for, not a failed request (seen at 200 QPS under load).
            raise RedisConnectionError(f"the connection closed under a command ({e})") from None
        self.calls[kind] += 1
        if hot:
            self.hot.append(self._clock.now() - t0)
        return out

    def joined(self) -> None:
        self._set(LinkState.OK, f"shared through Redis at {self.settings.shown}")

    def degrade(self, message: str) -> bool:
        """Running on local state from now on; False if it already was."""
        if self.state is LinkState.DEGRADED and self.since is not None:
            return False
        self.losses += 1
        self._set(LinkState.DEGRADED, message)
        return True

    def _set(self, state: LinkState, message: str) -> None:
        self.state, self.message, self.since = state, message, self._clock.wall()
        if self.on_change is not None:
            self.on_change()

    async def drop_connections(self) -> None:
        """Close every pooled connection: after Redis restarts, the old ones are dead, and
        the first command on one would say "closed by server" and degrade us again."""
        try:
            await self.client.connection_pool.disconnect()
        except ERRORS:
            pass

    async def aclose(self) -> None:
        try:
            await self.client.aclose()
        except ERRORS:
            pass
