""":class:`RedisState`: the state seam's ``StateStore`` shared by every process on one
Redis namespace, so that many processes on many machines act as one client.

What it adds to the per-target scripts (capmon/fleet/target.py): the pin and the retry
budget for the fleet, news by pub/sub (every move, manual action and key action is
published; each process applies what is newer than its mirror), a reconciliation
every ``[shared] reconcile`` seconds (one pipeline that reads everything: the backstop
against missed messages), the process registry with a heartbeat that also renews this
process's leases, and the degraded mode: when Redis is lost every call goes on with
local state, and a reconnect loop rejoins within seconds of Redis coming back (it
re-subscribes, re-registers, seeds what an emptied Redis lacks, pushes what this
process decided meanwhile, replays the manual actions made while away).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import secrets as pysecrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from redis.asyncio.client import PubSub

from capmon.core.clock import Clock
from capmon.core.config import Config
from capmon.core.events import Event, Notice
from capmon.core.snapshot import FleetProcess, LinkState, SharedStatus
from capmon.core.state import MemoryState, TargetSpec
from capmon.core.tasks import cancel_and_wait
from capmon.fleet.codec import fnum
from capmon.fleet.link import ERRORS, Link, describe
from capmon.fleet.scripts import Keys, as_hash
from capmon.fleet.settings import Settings, SharedStateUnavailable
from capmon.fleet.target import RedisTarget

REJOIN_EVERY = 1.0  # seconds between reconnect attempts while degraded
_BUDGET_START, _BUDGET_CAP = 10.0, 100.0  # capmon/core/limiter.py, Budget's defaults

_log = logging.getLogger("capmon.fleet")


class RedisState:
    def __init__(
        self,
        config: Config,
        specs: Iterable[TargetSpec],
        clock: Clock,
        publish: Callable[[Event], None],
        settings: Settings,
        role: str = "library",
    ) -> None:
        specs = list(specs)
        self.config = config
        self.clock = clock
        self.publish = publish
        self.settings = settings
        self.role = role
        self.keys = Keys(settings.namespace)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{pysecrets.token_hex(2)}"
        self.local = MemoryState(config, specs, clock, publish)  # the mirror, and the state while degraded
        self.link = Link(settings, clock)
        self._targets = {s.id: RedisTarget(s, self.local.target(s.id), self) for s in specs}
        self._started_wall = clock.wall()
        self._lease_ids = itertools.count(1)
        self._leases: dict[str, set[str]] = {s.id: set() for s in specs}
        self._ratio = config.client.retry_budget
        self.budget_start, self.budget_cap = _BUDGET_START, max(_BUDGET_START, _BUDGET_CAP)
        self._balance = self.budget_start  # the fleet's retry budget, mirrored
        self._earned = 0.0  # earned here since the last ADMIT carried it
        self._spending = 0  # retries spent here whose SPEND has not answered yet
        self._budget_ver = -1
        self._listener: Callable[[], None] | None = None
        self._processes: tuple[FleetProcess, ...] = ()
        self._pending_manual: list[tuple[str | None, str, str]] = []  # (target or None for the pin, action, arg)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._supervisor: asyncio.Task[None] | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._pubsub: PubSub | None = None
        self._wake = asyncio.Event()
        self._started = False
        self._closed = False
        self.joining = False  # rejoining: answers are applied whole, though calls still go local
        self.messages = 0  # pub/sub messages applied

    # ------------------------------------------------------------ the seam

    @property
    def pinned(self) -> str | None:
        return self.local.pinned

    def pin(self, model: str | None) -> None:
        self.local.pin(model)
        self._pending_manual = [m for m in self._pending_manual if m[0] is not None]
        if self.link.ok:
            self._spawn(self._write_pin(model))
        else:
            self._pending_manual.append((None, "pin", model or ""))

    async def _write_pin(self, model: str | None) -> None:
        try:
            await self.link.call(
                "pin", self.link.scripts.pin, [self.keys.pin, self.keys.events], [model or "", self.id]
            )
        except ERRORS as e:
            self.lost(e)
            self._pending_manual.append((None, "pin", model or ""))

    def target(self, target_id: str) -> RedisTarget:
        return self._targets[target_id]

    @property
    def targets(self) -> list[RedisTarget]:
        return list(self._targets.values())

    def spend_retry(self) -> bool:
        if not self.link.ok:
            return self.local.spend_retry()
        # The fleet's balance as last seen: spend it here at once, and in Redis by a
        # script of its own (not on the hot path); the next answer corrects the mirror.
        if self._balance < 1.0 - 1e-9:
            return False
        self._balance = max(0.0, self._balance - 1.0)
        self._spending += 1
        self._spawn(self._spend())
        return True

    async def _spend(self) -> None:
        try:
            res = await self.link.call("spend", self.link.scripts.spend, [self.keys.budget], [self.budget_start])
        except ERRORS as e:
            self._spending -= 1
            self.lost(e)
            return
        self._spending -= 1
        self.mirror_budget(float(res[1]), int(res[2]))

    def on_request(self) -> None:
        self.local.on_request()
        self._earned += self._ratio
        self._balance = min(self.budget_cap, self._balance + self._ratio)

    def take_earned(self) -> float:
        earned, self._earned = self._earned, 0.0
        return earned

    def mirror_budget(self, balance: float, version: int) -> None:
        """The fleet's balance as Redis said it, unless an answer about a later one came
        first. Spends on their way to Redis are not in it yet (or maybe they are:
        counting them twice only errs toward fewer retries)."""
        if version < self._budget_ver:
            return
        self._budget_ver = version
        self._balance = max(0.0, balance - self._spending)

    def set_listener(self, fn: Callable[[], None]) -> None:
        self._listener = fn

    def _changed(self) -> None:
        if self._listener is not None:
            try:
                self._listener()
            except Exception:  # the router's business; never break the reader
                _log.exception("state listener failed")

    # ------------------------------------------------------------ leases

    def new_lease(self) -> str:
        return f"{self.id}#{next(self._lease_ids)}"

    def new_token(self) -> str:
        return pysecrets.token_hex(8)

    def track(self, target_id: str, lease: str) -> None:
        self._leases[target_id].add(lease)

    def untrack(self, target_id: str, lease: str) -> None:
        self._leases[target_id].discard(lease)

    # ------------------------------------------------------------ manual actions

    def manual(self, target: RedisTarget, action: str, reason: str) -> None:
        if self.link.ok:
            self._spawn(self._write_manual(target, action, reason))
        else:
            self._pending_manual.append((target.id, action, reason))

    async def _write_manual(self, target: RedisTarget, action: str, reason: str) -> None:
        try:
            await target.write_manual(action, reason)
        except ERRORS as e:
            self.lost(e)
            self._pending_manual.append((target.id, action, reason))
        self._changed()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ joining, losing, rejoining

    async def start(self) -> None:
        """Join the fleet. Unreachable: a warning and local state (``required``: raise)."""
        if self._started:
            return
        self._started = True
        try:
            await self._join()
        except ERRORS as e:
            await self._drop_pubsub()
            reason = describe(e)
            if self.settings.config.required:
                await self.link.aclose()
                raise SharedStateUnavailable(
                    f"{self.settings.file}: shared.required: Redis at {self.settings.shown} is unreachable ({reason}); "
                    f"start it, or set required = false to run on local state"
                ) from None
            self._degrade(
                f"shared state: Redis at {self.settings.shown} unreachable ({reason}); running on local state"
            )
        else:
            _log.info(
                "shared state: joined Redis at %s, namespace %r, as %s (%s)",
                self.settings.shown,
                self.settings.namespace,
                self.id,
                self.role,
            )
            self._changed()  # what the fleet knew before this process came: an open breaker's probe, say
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def _join(self) -> None:
        await self.link.client.ping()
        self.joining = True
        try:
            fresh = await self._heartbeat()
            await self._subscribe()  # before reading: no news goes by between the read and the subscription
            await self._reconcile(rejoin=True, fresh=fresh)
            for tid, action, arg in list(self._pending_manual):
                if tid is None:
                    await self.link.call(
                        "pin", self.link.scripts.pin, [self.keys.pin, self.keys.events], [arg, self.id]
                    )
                else:
                    await self._targets[tid].write_manual(action, arg)
                self._pending_manual.pop(0)
        finally:
            self.joining = False
        self.link.joined()

    def lost(self, exc: BaseException) -> None:
        """A call to Redis failed: this one and every one after it use local state."""
        self._degrade(f"shared state: Redis at {self.settings.shown} lost ({describe(exc)}); running on local state")

    def _degrade(self, message: str) -> None:
        if not self.link.degrade(message):
            return
        live = sum(1 for p in self._processes if not p.degraded) or len(self._processes) or 1
        for t in self._targets.values():
            t.go_local(live)
        self._notice("warning", message)
        if self._listen_task is not None and not self._listen_task.done():
            self._listen_task.cancel()
        self._wake.set()
        self._changed()

    def _notice(self, level: str, message: str) -> None:
        getattr(_log, level if level in ("info", "warning", "error") else "warning")("%s", message)
        self.publish(Notice(at=self.clock.now(), wall=self.clock.wall(), level=level, message=message))

    async def _supervise(self) -> None:
        sc = self.settings.config
        next_beat = next_check = self.clock.now()
        while not self._closed:
            if self.link.ok:
                now = self.clock.now()
                try:
                    if now >= next_beat:
                        next_beat = now + sc.heartbeat
                        await self._heartbeat()
                    if now >= next_check:
                        next_check = now + sc.reconcile
                        await self._reconcile()
                except ERRORS as e:
                    self.lost(e)
                    continue
                delay = max(0.0, min(next_beat, next_check) - self.clock.now())
            else:
                try:
                    await self._drop_pubsub()
                    await self.link.drop_connections()
                    await self._join()
                except ERRORS:
                    delay = min(REJOIN_EVERY, sc.heartbeat)
                else:
                    self._notice("info", f"shared state: rejoined Redis at {self.settings.shown}")
                    self._changed()
                    next_beat = next_check = self.clock.now() + min(sc.heartbeat, sc.reconcile)
                    continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

    # ------------------------------------------------------------ pub/sub

    async def _subscribe(self) -> None:
        await self._drop_pubsub()
        client = self.link.subscriber()
        ps = client.pubsub(ignore_subscribe_messages=True)
        try:
            await ps.subscribe(self.keys.events)
        except BaseException:
            await ps.aclose()  # type: ignore[no-untyped-call]
            await client.aclose()
            raise
        self._pubsub = ps
        self._listen_task = asyncio.ensure_future(self._listen(ps, client))

    async def _listen(self, ps: PubSub, client: Any) -> None:
        try:
            while True:
                msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is not None and msg.get("type") == "message":
                    self._on_message(msg.get("data"))
        except asyncio.CancelledError:
            raise
        except ERRORS as e:
            if not self._closed and self._listen_task is asyncio.current_task():
                self._listen_task = self._pubsub = None
                self._spawn(self._resubscribe(e))
        finally:
            try:
                await ps.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()
            except ERRORS:
                pass

    async def _resubscribe(self, exc: BaseException) -> None:
        """The subscription broke: subscribe again and read everything, since news may
        have gone by meanwhile; if Redis itself is gone, that is the degraded mode."""
        if self._listen_task is not None or not self.link.ok:
            return
        try:
            await self._subscribe()
            await self._reconcile()
        except ERRORS as e:
            self.lost(e)
        else:
            _log.info("shared state: subscribed again after %s", describe(exc))

    async def _drop_pubsub(self) -> None:
        task, self._listen_task, self._pubsub = self._listen_task, None, None
        if task is not None and not task.done():
            task.cancel()
            await cancel_and_wait([task])

    def _on_message(self, data: Any) -> None:
        try:
            msg = json.loads(data)
        except (TypeError, ValueError):
            return
        kind = msg.get("k")
        if kind == "b":
            h = as_hash(msg.get("h") or {})
            t = self._targets.get(h.get("id", ""))
            if t is None:
                return
            disabled = msg.get("disabled")  # the key's state, which holds for every target of that key here
            t.apply(h, self.link.offset, disabled if isinstance(disabled, str) else None)
        elif kind == "freed":
            t = self._targets.get(str(msg.get("id")))
            if t is None or msg.get("to", self.id) != self.id:
                return  # another process's turn
            t.slot_freed()
        elif kind == "pin":
            if msg.get("origin") != self.id:
                model = msg.get("model") or None
                if model != self.local.pinned:
                    self.local.pin(model)
        else:
            return
        self.messages += 1
        self._changed()

    # ------------------------------------------------------------ reconciliation and the registry

    async def _reconcile(self, *, rejoin: bool = False, fresh: bool = False) -> None:
        """Read everything in one pipeline and adopt what is newer; seed what is missing.
        Rejoining, a target Redis kept unchanged gets the move this process made
        meanwhile; one that another process changed is adopted as it is."""
        targets = list(self._targets.values())
        pipe = self.link.client.pipeline(transaction=False)
        for t in targets:
            pipe.hgetall(self.keys.target(t.id))
            pipe.hget(self.keys.key(t.spec.key_ref), "disabled")
        pipe.get(self.keys.pin)
        pipe.hmget(self.keys.budget, "balance", "ver")
        out = await pipe.execute()
        self.link.calls["reconcile"] += 1
        offset = self.link.offset
        changed = False
        for i, t in enumerate(targets):
            h, disabled = as_hash(out[2 * i]), out[2 * i + 1]
            if not h:
                await t.seed()
                changed = True
                continue
            unchanged = h.get("run") == t._run and int(fnum(h, "ver")) == t._ver
            if rejoin and unchanged:
                t.apply_key(disabled or "")
                await t.push()
            else:
                changed = t.apply(h, offset, disabled or "", force=rejoin) or changed
        pin, balance = out[-2], out[-1]
        if rejoin and fresh and self.local.pinned is not None and pin is None:
            await self.link.call(
                "pin", self.link.scripts.pin, [self.keys.pin, self.keys.events], [self.local.pinned, self.id]
            )
        elif (pin or None) != self.local.pinned and not any(m[0] is None for m in self._pending_manual):
            self.local.pin(pin or None)
            self._changed()
        if balance[0] is not None:
            self.mirror_budget(float(balance[0]), int(balance[1] or 0))
        if changed:
            self._changed()  # a probe schedule or a slot may have come with it

    async def _heartbeat(self) -> bool:
        """Register, renew leases and probes, list the fleet. True when the namespace was empty."""
        sc = self.settings.config
        ttl = max(3 * sc.heartbeat, 0.5)
        in_flight = sum(t.local.limiter.in_flight for t in self._targets.values())
        fields = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "role": self.role,
            "in_flight": in_flight,
            "started": f"{self._started_wall:.3f}",
            "degraded": 0 if self.link.ok else 1,
        }
        leases = {self.keys.leases(tid): sorted(ids) for tid, ids in self._leases.items() if ids}
        probes = {self.keys.target(t.id): True for t in self._targets.values() if t._probe_lease is not None}
        res = await self.link.call(
            "heartbeat",
            self.link.scripts.heartbeat,
            [self.keys.procs, self.keys.proc(self.id), self.keys.meta],
            [
                self.id,
                ttl,
                json.dumps(fields),
                json.dumps(leases),
                sc.lease_ttl,
                json.dumps(probes),
                self.keys.proc_prefix,
                self.new_token(),
            ],
        )
        self.link.observe(res[0])
        procs = []
        for raw in res[2]:
            p = as_hash(raw)
            procs.append(
                FleetProcess(
                    id=p.get("id", ""),
                    host=p.get("host", ""),
                    pid=int(fnum(p, "pid")),
                    role=p.get("role", ""),
                    in_flight=int(fnum(p, "in_flight")),
                    started=fnum(p, "started"),
                    seen=fnum(p, "seen"),
                    degraded=p.get("degraded") == "1",
                    this=p.get("id") == self.id,
                )
            )
        self._processes = tuple(sorted(procs, key=lambda p: (p.host, p.pid, p.id)))
        return int(res[1]) == 1

    # ------------------------------------------------------------ status and closing

    def shared_status(self) -> SharedStatus:
        link = self.link
        return SharedStatus(
            backend="redis",
            state=link.state,
            since=link.since,
            message=link.message,
            url=self.settings.shown,
            namespace=self.settings.namespace,
            processes=self._processes if link.state is LinkState.OK else tuple(p for p in self._processes if p.this),
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait([self._supervisor, *self._tasks])
        await self._drop_pubsub()
        if self.link.ok:
            try:  # leave the registry and give back what is still held
                pipe = self.link.client.pipeline(transaction=False)
                pipe.zrem(self.keys.procs, self.id)
                pipe.delete(self.keys.proc(self.id))
                for tid, ids in self._leases.items():
                    if ids:
                        pipe.zrem(self.keys.leases(tid), *ids)
                await pipe.execute()
            except ERRORS:
                pass
        await self.link.aclose()
        self.link.state = LinkState.OFF  # what is still settled after this is settled locally
