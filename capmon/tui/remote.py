"""The dashboard attached to a gateway: ``capmon --connect http://HOST:PORT``.

:class:`RemoteSource` is a :class:`~capmon.tui.source.DashboardSource` like the local
one, so the dashboard is the same app: its snapshots are polled from the gateway's
GET /capmon/snapshot at the dashboard's refresh rate, its events come from GET
/capmon/events (SSE, resumed with ``Last-Event-ID`` after a reconnect) onto a local
bus, and trip / reset / force-close / pin are POSTed to the gateway with the admin key.

Time: a snapshot's ``now`` is the gateway's loop clock and the widgets count down from
the snapshot's own ``now``, so no clock of this process is compared with the gateway's;
the event log stays on the events' wall time.

A gateway that goes away is said once (a notice in the log, a toast, and the status bar
until it returns); the tables keep its last snapshot, both feeds retry, and the
dashboard carries on when it answers again. What goes wrong at start (a wrong address,
a refused key) is raised before the screen opens: one line and exit code 2.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capmon.connect import (
    ConnectOptions,
    GatewayAddress,
    GatewayClient,
    GatewayError,
    GatewayInfo,
    GatewayUnreachable,
    KeyRefused,
    resolve,
)
from capmon.core.base import text
from capmon.core.base.clock import Clock, default_clock
from capmon.core.base.exceptions import CapmonError
from capmon.core.types import events as ev
from capmon.core.types.config import REFRESH_MAX, REFRESH_MIN, DashboardConfig
from capmon.core.types.events import BatchProgress, EventBus, Notice
from capmon.core.types.snapshot import EngineSnapshot
from capmon.exitcodes import EXIT_OK
from capmon.tui.digest import LOGGED, EventDigester
from capmon.tui.source import WorkerSpec, refuse_if_readonly
from capmon.tui.traffic import NoTraffic

RETRY_MAX = 5.0  # seconds between two tries at most while the gateway does not answer


@dataclass(frozen=True)
class Attachment:
    """What the dashboard learns from a gateway before its screen opens."""

    info: GatewayInfo
    snapshot: EngineSnapshot
    history: tuple[ev.Event, ...]  # the tail of the gateway's recent events that its log shows
    last_event: int | None  # the number of the last event read: the event feed resumes after it


def log_tail(events: Sequence[ev.Event]) -> list[ev.Event]:
    """The newest of ``events`` that the dashboard's catch-up on open writes whole: it
    writes the oldest lines first and stops at its limit, so more would hide the newest."""
    logged = [e for e in events if EventDigester.wants(e)]

    def fits(n: int) -> bool:
        digest = EventDigester().digest(logged[len(logged) - n :], toasts=False)
        return digest.left_out == 0 and len(digest.lines) <= EventDigester().max_lines

    lo, hi = 0, len(logged)  # fits(lo); more lines never fit in fewer events, so search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return logged[len(logged) - lo :]


async def _history(http: GatewayClient, upto: int) -> tuple[list[ev.Event], int | None]:
    """The gateway's recent events, up to the one numbered ``upto`` (its last when asked)."""
    if upto <= 0:
        return [], None
    events: list[ev.Event] = []
    last: int | None = None
    async with contextlib.aclosing(http.events(None, LOGGED)) as stream:
        async for seq, event in stream:
            last = seq
            if event is not None:
                events.append(event)
            if seq >= upto:
                break
    return events, last


async def attach(address: GatewayAddress) -> Attachment:
    """Ask the gateway what it is, for its snapshot and its recent events. Raises
    GatewayError (a CapmonError) when it is unreachable, no gateway, or refuses the key."""
    async with GatewayClient(address) as http:
        info = await http.info()
        if address.admin_key is not None and info.readonly and info.admin_key_configured:
            # An open gateway takes any key for reads, so a wrong admin key shows only here.
            raise KeyRefused(
                f"the gateway at {address.origin} refused the admin key in ${address.admin_key_env}: "
                f"it is not that gateway's admin key (unset it for a read-only view)"
            )
        snapshot = await http.snapshot()
        history, last = await _history(http, info.events)
    return Attachment(info, snapshot, tuple(log_tail(history)), last)


class RemoteSource:
    """A gateway's client, watched and steered over its control API."""

    def __init__(
        self,
        address: GatewayAddress,
        attached: Attachment,
        *,
        refresh: float = DashboardConfig.refresh,
        readonly: bool = False,
        retry_max: float = RETRY_MAX,
        clock: Clock | None = None,
    ) -> None:
        self.address = address
        self.info = attached.info
        self.clock: Clock = clock or default_clock()
        self.bus = EventBus(history=max(500, len(attached.history) + 50))
        self.models = list(attached.info.models)
        self._forced_readonly = readonly
        self.readonly = readonly or attached.info.readonly
        # The batch panel names why it has no batch: a gateway's traffic is its clients' requests.
        self.traffic = NoTraffic("no batch: the gateway serves its clients' requests")
        self.refresh = refresh
        self.retry_max = max(retry_max, refresh)
        self._snap = attached.snapshot
        self._generation = 0  # bumped when an action's answer replaces the snapshot
        self.last_event = attached.last_event
        self._http: GatewayClient | None = None
        self.down_since: float | None = None  # wall time the gateway stopped answering
        self._down_reason = ""
        self._down_word = ""
        self._stream_said: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        for e in attached.history:  # on the bus before the app opens: its catch-up logs them, no toasts
            self.bus.publish(e)
        self.description = self._describe()  # the status bar's: what is watched, or that it is lost
        self._say(
            "info",
            f"attached to the gateway at {address.shown} (capmon {self.info.version}, models {', '.join(self.models)})",
        )
        if self.readonly:
            self._say("warning", f"read-only: {self._why_readonly()}")

    def _why_readonly(self) -> str:
        if self._forced_readonly:
            return "--readonly"
        if self.address.admin_key is None:
            return (
                f"no admin key (set {self.address.admin_key_env} to the gateway's admin key, or name the "
                f"variable with --admin-key-env, to trip, reset and pin)"
            )
        if not self.info.admin_key_configured:
            return "the gateway has no admin key (gateway.admin_key_env in its config), so it takes no actions"
        return "the gateway does not take this admin key"

    def _describe(self) -> str:
        where = f"gateway {self.address.shown}"
        if self.down_since is not None:
            return (
                f"{where} ✖ {self._down_word} since {text.timestamp(self.down_since)}, retrying · "
                f"its last snapshot, {text.timestamp(self._snap.wall)}"
            )
        what = f"simulator {self.info.simulator}" if self.info.simulator else ", ".join(self.models)
        return f"{where} · {what}"

    def _say(self, level: str, message: str) -> None:
        self.bus.publish(Notice(at=self.clock.now(), wall=self.clock.wall(), level=level, message=message))

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._http = GatewayClient(self.address)

    def workers(self) -> list[WorkerSpec]:
        return [
            WorkerSpec("gateway snapshots", "remote:snapshots", self.poll_snapshots),
            WorkerSpec("gateway events", "remote:events", self.follow_events),
        ]

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    def _client(self) -> GatewayClient:
        if self._http is None:
            raise CapmonError("the dashboard is not connected to the gateway yet")
        return self._http

    # ------------------------------------------------------------ the feeds

    async def poll_snapshots(self) -> None:
        """The gateway's snapshot every ``refresh`` seconds; while it does not answer, the
        last one stays and the tries space out up to ``retry_max``."""
        delay = self.refresh
        while True:
            generation = self._generation
            try:
                snap = await self._client().snapshot()
            except GatewayError as e:
                self._lost(e)
                delay = min(self.retry_max, delay * 2)
            else:
                if generation == self._generation:  # else an action's newer answer came in meanwhile
                    self._snap = snap
                if self.down_since is not None:
                    await self._back()
                delay = self.refresh
            await self.clock.sleep(delay)

    async def follow_events(self) -> None:
        """The gateway's events that the dashboard shows onto the bus, resumed after the last
        one seen whenever the stream ends (the gateway stopped) or breaks."""
        delay = self.refresh
        while True:
            try:
                async with contextlib.aclosing(self._client().events(self.last_event, LOGGED)) as stream:
                    async for seq, event in stream:
                        self.last_event = seq
                        delay = self.refresh
                        if event is not None:
                            self.bus.publish(event)
            except GatewayUnreachable:
                pass  # the snapshot poll says so, once
            except GatewayError as e:
                if str(e) not in self._stream_said:
                    self._stream_said.add(str(e))
                    self._say("error", f"the gateway's events: {e}")
            await self.clock.sleep(delay)
            delay = min(self.retry_max, delay * 2)

    def _lost(self, e: GatewayError) -> None:
        reason = str(e)
        if self.down_since is None:
            self.down_since = self.clock.wall()
        elif reason == self._down_reason:
            return
        self._down_reason = reason
        self._down_word = (
            "UNREACHABLE"
            if isinstance(e, GatewayUnreachable)
            else "REFUSES THE KEY"
            if isinstance(e, KeyRefused)
            else "NOT ANSWERING"
        )
        self.description = self._describe()
        said = e.reason if isinstance(e, GatewayUnreachable) else reason
        self._say(
            "error",
            f"lost the gateway at {self.address.shown}: {said}; retrying every "
            f"{text.duration(self.retry_max)} at most; the tables keep its last snapshot",
        )

    async def _back(self) -> None:
        assert self.down_since is not None
        away = self.clock.wall() - self.down_since
        self.down_since, self._down_reason = None, ""
        self.description = self._describe()
        self._stream_said.clear()
        self._say("info", f"the gateway at {self.address.shown} answers again (away {text.duration(away)})")
        with contextlib.suppress(GatewayError):  # it may have come back with another config or admin key
            info = await self._client().info()
            self.info = info
            self.models = list(info.models)
            self.description = self._describe()
            readonly = self._forced_readonly or info.readonly
            if readonly != self.readonly:
                self.readonly = readonly
                self._say(
                    "warning",
                    f"read-only: {self._why_readonly()}"
                    if readonly
                    else "the gateway takes the admin key again: trip, reset and pin act on it",
                )

    # ------------------------------------------------------------ reading

    def snapshot(self) -> EngineSnapshot:
        return self._snap

    def batch(self) -> BatchProgress | None:
        return None

    @property
    def batch_paused(self) -> bool:
        return False

    @property
    def can_pause_batch(self) -> bool:
        return False

    # ------------------------------------------------------------ manual actions

    def _send(self, what: str, path: str, body: Mapping[str, Any]) -> None:
        """Start the action; the snapshot after it replaces ours, a refusal becomes an error
        notice (a toast and a log line). Raises CapmonError when it cannot be sent at all."""
        http = self._client()
        if self.down_since is not None:
            raise GatewayError(f"the gateway at {self.address.shown} does not answer; not sent")
        task = asyncio.get_running_loop().create_task(self._act(http, what, path, body), name=f"gateway {what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _act(self, http: GatewayClient, what: str, path: str, body: Mapping[str, Any]) -> None:
        try:
            await http.act(path, body)
            snap = await http.snapshot()  # the action answers with what it moved; show the whole at once
        except GatewayError as e:
            self._say("error", f"{what} not done: {e}")
            return
        self._snap = snap
        self._generation += 1

    @refuse_if_readonly
    def pin(self, model: str | None) -> None:
        self._send("automatic routing" if model is None else f"pin {model}", "/capmon/pin", {"model": model})

    @refuse_if_readonly
    def trip(self, target: str) -> None:
        self._send(f"trip {target}", "/capmon/trip", {"target": target})

    @refuse_if_readonly
    def reset(self, target: str) -> None:
        self._send(f"reset {target}", "/capmon/reset", {"target": target})

    @refuse_if_readonly
    def force_close(self, target: str) -> None:
        self._send(f"force close {target}", "/capmon/force-close", {"target": target})

    def pause_batch(self) -> None:
        raise CapmonError("a gateway runs no batch job to pause")

    def resume_batch(self) -> None:
        raise CapmonError("a gateway runs no batch job to resume")


@dataclass(frozen=True)
class RemoteDashboardOptions:
    connect: ConnectOptions
    refresh: float | None = None  # seconds between refreshes (and snapshot polls); None: [dashboard] refresh's default
    readonly: bool = False  # no trip / reset / pin, whatever the keys allow

    def __post_init__(self) -> None:
        if self.refresh is not None and not REFRESH_MIN <= self.refresh <= REFRESH_MAX:
            raise CapmonError(
                f"refresh must be between {REFRESH_MIN:g} and {REFRESH_MAX:g} seconds, got {self.refresh:g}"
            )


def run_remote_dashboard(options: RemoteDashboardOptions) -> int:
    """The dashboard on a gateway, until the person quits. Raises CapmonError (before the
    screen opens) when the address is wrong or unreachable or the key is refused."""
    from capmon.tui.app import CapmonApp

    address = resolve(options.connect)
    attached = asyncio.run(attach(address))
    refresh = DashboardConfig.refresh if options.refresh is None else options.refresh
    source = RemoteSource(address, attached, refresh=refresh, readonly=options.readonly)
    app = CapmonApp(source, refresh=refresh)
    app.run()
    return app.return_code or EXIT_OK
