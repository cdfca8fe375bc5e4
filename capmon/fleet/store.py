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

from capmon.core.base.clock import Clock
from capmon.core.base.tasks import cancel_and_wait
from capmon.core.control.seam import MemoryState, TargetSpec
from capmon.core.types.capability import Feature, Lessons
from capmon.core.types.config import Config, deployment_id
from capmon.core.types.events import CapabilityLearned, Event, Notice
from capmon.core.types.snapshot import FleetProcess, LinkState, SharedStatus
from capmon.fleet import codec
from capmon.fleet.codec import Garbage
from capmon.fleet.link import ERRORS, Link, describe, wrong_type
from capmon.fleet.scripts import Keys, ManualAction
from capmon.fleet.settings import Settings, SharedStateUnavailable
from capmon.fleet.supervisor import Supervisor
from capmon.fleet.target import RedisTarget

REJOIN_EVERY = 1.0  # seconds between reconnect attempts while degraded
REPAIRS_AT_ONCE = 16  # keys repaired in a row before the next rejoin waits its turn
_BUDGET_START, _BUDGET_CAP = 10.0, 100.0  # capmon/core/control/limiter.py, Budget's defaults

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
        # The version of each key's state this process last took from Redis, or made
        # itself (then half a version ahead, until Redis answers): RedisTarget.apply_key.
        self.key_versions: dict[tuple[str, str], float] = {}
        # (the target, or None for the pin; the action; its argument)
        self._pending_manual: list[tuple[str | None, ManualAction, str]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self.supervisor = Supervisor(clock)
        self._listen_task: asyncio.Task[None] | None = None
        self._garbage: dict[str, Garbage] = {}  # keys to repair before rejoining, by key
        self._named: set[str] = set()  # keys (and kinds of message) already logged as garbage
        self._by_key = {self.keys.target(s.id): s.id for s in specs}
        self._reconnect = False  # Redis was lost: the pooled connections may be dead; drop them before rejoining
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
            self._pending_manual.append((None, ManualAction.PIN, model or ""))

    async def _write_pin(self, model: str | None) -> None:
        try:
            await self.link.call(
                "pin", self.link.scripts.pin, [self.keys.pin, self.keys.events], [model or "", self.id]
            )
        except ERRORS as e:
            self.lost(e)
            self._pending_manual.append((None, ManualAction.PIN, model or ""))

    @property
    def lessons(self) -> Lessons:
        return self.local.lessons

    def learn(self, deployment: str, feature: Feature, why: str) -> bool:
        """A lesson this process learned goes to the fleet: into the lessons hash, which a
        process that joins later reads, and to every process now by pub/sub. While Redis is
        lost it stays here, and the rejoin writes it (``_reconcile``)."""
        if not self.local.learn(deployment, feature, why):
            return False
        if self.link.ok:
            self._spawn(self._write_lesson(deployment, feature, why))
        return True

    async def _write_lesson(self, deployment: str, feature: Feature, why: str) -> None:
        field = codec.lesson_key(deployment, feature)
        why = why[: codec.TEXT_MAX]
        message = json.dumps({"k": "lesson", "d": field, "why": why, "origin": self.id})
        try:
            pipe = self.link.client.pipeline(transaction=True)
            pipe.hset(self.keys.lessons, field, why)
            pipe.publish(self.keys.events, message)
            await pipe.execute()
            self.link.calls["lesson"] += 1
        except ERRORS as e:
            self.lost(e)

    def _heard_lesson(self, deployment: str, feature: Feature, why: str) -> bool:
        """Another process's lesson: this one skips that deployment for requests that need
        the feature too, and says so once (the event names the first of its targets there)."""
        if not self.local.learn(deployment, feature, why):
            return False
        for t in self._targets.values():
            model, endpoint = t.spec.model.name, t.spec.key_ref[0]  # a key ref names its endpoint
            if deployment_id(model, endpoint) == deployment:
                now = self.clock.now()
                reason = f"{why} (learned by another process)"
                self.publish(
                    CapabilityLearned(
                        at=now, wall=self.clock.wall(), model=model, endpoint=endpoint, feature=feature, reason=reason
                    )
                )
                break
        return True

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
        try:
            budget = codec.budget(res[1], res[2], self.keys.budget, self.budget_cap)
        except Garbage as e:
            self.lost(e)
            return
        if budget is not None:
            self.mirror_budget(*budget)

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

    def manual(self, target: RedisTarget, action: ManualAction, reason: str) -> None:
        if self.link.ok:
            self._spawn(self._write_manual(target, action, reason))
        else:
            self._pending_manual.append((target.id, action, reason))

    async def _write_manual(self, target: RedisTarget, action: ManualAction, reason: str) -> None:
        try:
            await target.write_manual(action, reason)
        except ERRORS as e:
            self.lost(e)
            self._pending_manual.append((target.id, action, reason))
        self._changed()

    def push_soon(self, target: RedisTarget) -> None:
        """Write ``target``'s pending breaker move now, in the background, rather than with
        this process's next call for it (which may be far off when it has no traffic there)."""
        if self.link.ok:
            self._spawn(self._push(target))

    async def _push(self, target: RedisTarget) -> None:
        try:
            await target.push()
        except ERRORS as e:
            self.lost(e)

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
        except Garbage as e:
            await self._drop_pubsub()
            self.lost(e)  # Redis is there: repaired by the rejoin task
        except ERRORS as e:
            await self._drop_pubsub()
            reason = describe(e)
            if self.settings.config.required:
                await self.link.aclose()
                raise SharedStateUnavailable(
                    f"{self.settings.file}: shared.required: Redis at {self.settings.shown} is unreachable ({reason}); "
                    f"start it, or set required = false to run on local state"
                ) from None
            self._reconnect = True
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
        self.supervisor.run("heartbeat", self._beating)
        self.supervisor.run("reconciliation", self._reconciling)
        self.supervisor.run("rejoin", self._rejoining)

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
        """A call to Redis failed, or found garbage: this one and every one after it use
        local state until the rejoin task has repaired what was found and rejoined."""
        if isinstance(exc, Garbage):
            self._garbage[exc.where] = exc
            first = self._first_time(exc.where)
            self._degrade(
                f"shared state: garbage in Redis at {self.settings.shown} ({describe(exc)}); "
                "running on local state while it is re-seeded from this process's state",
                quiet=not first,
            )
            return
        self._reconnect = True
        self._degrade(f"shared state: Redis at {self.settings.shown} lost ({describe(exc)}); running on local state")

    def _first_time(self, what: str) -> bool:
        """Garbage is named in the log once per key (or kind of message), not at every sighting."""
        if what in self._named:
            return False
        self._named.add(what)
        return True

    def _degrade(self, message: str, *, quiet: bool = False) -> None:
        if not self.link.degrade(message):
            return
        live = sum(1 for p in self._processes if not p.degraded) or len(self._processes) or 1
        for t in self._targets.values():
            t.go_local(live)
        if quiet:
            _log.debug("%s", message)
        else:
            self._notice("warning", message)
        task, self._listen_task = self._listen_task, None
        self.supervisor.forget("listener")
        if task is not None and not task.done():
            task.cancel()
        self._wake.set()
        self._changed()

    def _notice(self, level: str, message: str) -> None:
        getattr(_log, level if level in ("info", "warning", "error") else "warning")("%s", message)
        self.publish(Notice(at=self.clock.now(), wall=self.clock.wall(), level=level, message=message))

    # The three loops below run under the supervisor (capmon/fleet/supervisor.py): one
    # that raises or is cancelled is logged and started again, never lost for good.

    async def _beating(self) -> None:
        """Register, renew this process's leases and probes, list the fleet."""
        while not self.supervisor.closed:  # redis-py can turn a cancellation into a timeout
            if self.link.ok and not self.joining:
                try:
                    await self._heartbeat()
                except ERRORS as e:
                    self.lost(e)
            await asyncio.sleep(self.settings.config.heartbeat)

    async def _reconciling(self) -> None:
        """Read everything: the backstop against missed news."""
        while not self.supervisor.closed:  # redis-py can turn a cancellation into a timeout
            if self.link.ok and not self.joining:
                try:
                    await self._reconcile()
                except ERRORS as e:
                    self.lost(e)
            await asyncio.sleep(self.settings.config.reconcile)

    async def _rejoining(self) -> None:
        """While degraded: repair the garbage found, reconnect, rejoin."""
        repaired = 0
        while not self.supervisor.closed:
            if self.link.ok:
                self._wake.clear()
                await self._wake.wait()
                repaired = 0
                continue
            try:
                await self._repair_all()
                await self._drop_pubsub()
                if self._reconnect:  # not after garbage: the pool is sound, and calls may be in flight on it
                    self._reconnect = False
                    await self.link.drop_connections()
                await self._join()
            except Garbage as g:  # found while rejoining: repaired on the next turn
                self.lost(g)
                repaired += 1
                if repaired >= REPAIRS_AT_ONCE:
                    repaired = 0
                    await asyncio.sleep(REJOIN_EVERY)
            except ERRORS:
                await asyncio.sleep(min(REJOIN_EVERY, self.settings.config.heartbeat))
            else:
                self._notice("info", f"shared state: rejoined Redis at {self.settings.shown}")
                self._changed()

    # ------------------------------------------------------------ repairing garbage

    async def _repair_all(self) -> None:
        while self._garbage:
            g = next(iter(self._garbage.values()))
            keys = await self._suspects(g)
            for key in keys:  # every bad key goes first: re-seeding one may read another
                await self._remove(key, g)
            for key in keys:
                await self._reseed(key)
            self._garbage.pop(g.where, None)

    async def _suspects(self, g: Garbage) -> list[str]:
        keys = [k for k in g.suspects if self.keys.type_of(k) is not None]
        if self.keys.procs in keys and await self.link.client.type(self.keys.procs) == "zset":
            # the heartbeat reads every registered process's hash
            members = await self.link.client.zrange(self.keys.procs, 0, -1)
            keys += [self.keys.proc(str(m)) for m in members]
        return keys

    async def _remove(self, key: str, g: Garbage) -> None:
        """Delete ``key`` if it still holds what no process writes (a wrong type, a bad
        field); :meth:`_reseed` then writes back what this process knows of it."""
        client = self.link.client
        expected = self.keys.type_of(key)
        actual = await client.type(key)
        if actual == "none":
            bad = False
        elif actual != expected:
            bad = True
        else:
            try:
                await self._check(key)
                bad = False
            except Garbage:
                bad = True
        if bad:
            await client.delete(key)
            if self._first_time(f"repair {key}"):
                _log.warning("shared state: removed garbage from Redis key %r (%s); re-seeding it", key, describe(g))

    async def _check(self, key: str) -> None:
        """Read ``key`` and parse it as the store does: Garbage if it holds any."""
        client = self.link.client
        if key in self._by_key:
            codec.target(codec.flat_hash(await client.hgetall(key), key), key, self._by_key[key])
        elif key == self.keys.pin:
            codec.pin(await client.get(key), key)
        elif key == self.keys.budget:
            balance, ver = await client.hmget(key, "balance", "ver")
            codec.budget(balance, ver, key, self.budget_cap)
        elif key == self.keys.lessons:
            codec.lessons(await client.hgetall(key), key)
        elif key.startswith(self.keys.proc_prefix):
            codec.process(codec.flat_hash(await client.hgetall(key), key), key, self.id)
        elif key.startswith(f"{self.keys.ns}:key:"):
            disabled, ver = await client.hmget(key, "disabled", "ver")
            codec.key_fields(disabled, ver, key)

    async def _reseed(self, key: str) -> None:
        """What this process knows of ``key``, written where Redis has none: a target
        seeded from the mirror; the pin, the budget, our leases and a disabled key as
        mirrored. The rest (buckets, the registry, the waiting list) the scripts rebuild."""
        client = self.link.client
        if key in self._by_key:
            await self._targets[self._by_key[key]].seed()  # only if missing: another may have been first
        elif key == self.keys.pin and self.local.pinned is not None:
            await client.set(key, self.local.pinned, nx=True)
        elif key == self.keys.budget:
            await client.hsetnx(key, "balance", f"{self._balance:.17g}")
        else:
            for t in self._targets.values():
                ours = self._leases[t.id]
                if key == self.keys.leases(t.id) and ours:
                    redis_now = self.clock.now() - self.link.offset
                    expiry = redis_now + self.settings.config.lease_ttl
                    await client.zadd(key, {lease: expiry for lease in ours}, nx=True)
                elif key == self.keys.key(t.spec.key_ref) and t.spec.key_ref in t.local._keys.disabled:
                    if await client.hsetnx(key, "disabled", t.local._keys.disabled[t.spec.key_ref]):
                        await client.hincrby(key, "ver", 1)

    # ------------------------------------------------------------ pub/sub

    async def _subscribe(self) -> None:
        await self._drop_pubsub()
        client = self.link.subscriber()
        ps = client.pubsub(ignore_subscribe_messages=True)
        try:
            await ps.subscribe(self.keys.events)
        except BaseException:
            await ps.aclose()
            await client.aclose()
            raise
        self._pubsub = ps
        self._listen_task = task = asyncio.ensure_future(self._listen(ps, client))
        self.supervisor.watch("listener", task, self._relisten)

    async def _listen(self, ps: PubSub, client: Any) -> None:
        """Read the channel until the subscription breaks (the supervisor then has it
        subscribe again). A message that cannot be applied is skipped, never fatal."""
        try:
            while True:
                msg = await ps.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if msg is None or msg.get("type") != "message":
                    continue
                try:
                    self._on_message(msg.get("data"))
                except Exception as e:  # a bug applying news must not cost the news after it
                    if self._first_time(f"message failed {type(e).__name__}"):
                        _log.exception("shared state: a message could not be applied; skipped")
        finally:
            try:
                await ps.aclose()
                await client.aclose()
            except ERRORS:
                pass

    def _relisten(self) -> None:
        """The listener ended without being asked to (its subscription broke, or it was
        cancelled or failed): subscribe again, unless Redis itself is gone (then the
        rejoin task subscribes)."""
        if self._listen_task is not None and self._listen_task.done():
            self._listen_task = self._pubsub = None
        if not self._closed:
            self._spawn(self._resubscribe())

    async def _resubscribe(self) -> None:
        """Subscribe again and read everything, since news may have gone by meanwhile."""
        if self._listen_task is not None or not self.link.ok:
            return
        try:
            await self._subscribe()
            await self._reconcile()
        except ERRORS as e:
            self.lost(e)
        else:
            _log.info("shared state: subscribed again to %s", self.keys.events)

    async def _drop_pubsub(self) -> None:
        self.supervisor.forget("listener")
        task, self._listen_task, self._pubsub = self._listen_task, None, None
        if task is not None and not task.done():
            task.cancel()
            await cancel_and_wait([task])

    def _on_message(self, data: Any) -> None:
        """Apply one message; a malformed one is skipped and named once per kind of fault."""
        try:
            msg = codec.message(data, self.keys.events)
        except Garbage as g:
            if self._first_time(f"message {g.field}"):
                _log.warning("shared state: skipped a malformed message (%s)", describe(g))
            return
        if isinstance(msg, codec.TargetNews):
            t = self._targets.get(msg.hash.id)
            if t is None:
                return
            # the key's state, which holds for every target of that key here
            t.apply(msg.hash, self.link.offset, msg.key)
        elif isinstance(msg, codec.SlotFreed):
            t = self._targets.get(msg.id)
            if t is None or (msg.to and msg.to != self.id):
                return  # another process's turn
            t.slot_freed()
        elif isinstance(msg, codec.Lesson):
            if msg.origin == self.id or not self._heard_lesson(msg.deployment, msg.feature, msg.why):
                return
        elif msg.origin != self.id and msg.model != self.local.pinned:
            self.local.pin(msg.model)
        self.messages += 1
        self._changed()

    # ------------------------------------------------------------ reconciliation and the registry

    async def _reconcile(self, *, rejoin: bool = False, fresh: bool = False) -> None:
        """Read everything in one pipeline and adopt what is newer; seed what is missing.
        Rejoining, a target Redis kept unchanged gets the move this process made
        meanwhile; one that another process changed is adopted as it is."""
        targets = list(self._targets.values())
        pipe = self.link.client.pipeline(transaction=False)
        read: list[str] = []
        for t in targets:
            pipe.hgetall(self.keys.target(t.id))
            pipe.hmget(self.keys.key(t.spec.key_ref), "disabled", "ver")
            read += [self.keys.target(t.id), self.keys.key(t.spec.key_ref)]
        pipe.get(self.keys.pin)
        pipe.hmget(self.keys.budget, "balance", "ver")
        pipe.hgetall(self.keys.lessons)
        read += [self.keys.pin, self.keys.budget, self.keys.lessons]
        out = await pipe.execute(raise_on_error=False)
        self.link.calls["reconcile"] += 1
        for key, answer in zip(read, out, strict=True):
            if isinstance(answer, Exception):
                raise wrong_type(answer, [key]) or answer
        # all of it parsed before any of it is applied: garbage anywhere changes nothing
        hashes = [
            (
                codec.target(codec.flat_hash(out[2 * i], read[2 * i]), read[2 * i], t.id),
                codec.key_fields(out[2 * i + 1][0], out[2 * i + 1][1], read[2 * i + 1]),
            )
            for i, t in enumerate(targets)
        ]
        pin = codec.pin(out[-3], self.keys.pin)
        budget = codec.budget(out[-2][0], out[-2][1], self.keys.budget, self.budget_cap)
        lessons = codec.lessons(out[-1], self.keys.lessons)
        offset = self.link.offset
        changed = False
        for t, (h, disabled) in zip(targets, hashes, strict=True):
            if h is None:
                await t.seed()
                changed = True
                continue
            unchanged = h.run == t._run and h.ver == t._ver
            if rejoin and unchanged:
                t.apply_key(disabled, force=True)
                await t.push()
            else:
                changed = t.apply(h, offset, disabled, force=rejoin, force_key=rejoin) or changed
        if rejoin and fresh and self.local.pinned is not None and pin is None:
            await self.link.call(
                "pin", self.link.scripts.pin, [self.keys.pin, self.keys.events], [self.local.pinned, self.id]
            )
        elif pin != self.local.pinned and not any(m[0] is None for m in self._pending_manual):
            self.local.pin(pin)
            self._changed()
        if budget is not None:
            self.mirror_budget(*budget)
        for deployment, feature, why in lessons:
            changed = self._heard_lesson(deployment, feature, why) or changed
        heard = {(d, f) for d, f, _ in lessons}
        missing = [x for x in self.local.lessons.items() if (x[0], x[1]) not in heard]
        if missing:  # learned while Redis was lost, or Redis lost them: the fleet hears them now
            for lesson in missing:
                await self._write_lesson(*lesson)
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
        own = [self.keys.procs, self.keys.proc(self.id), self.keys.meta]
        res = await self.link.call(
            "heartbeat",
            self.link.scripts.heartbeat,
            own,
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
            suspects=[*own, *leases, *probes],
        )
        procs = []
        for raw in res[2] if isinstance(res[2], list) else ():
            registered = codec.flat_hash(raw, self.keys.procs)
            procs.append(codec.process(registered, self.keys.proc(registered.get("id", "")), self.id))
        fresh = codec.integer(res[1], self.keys.meta, "fresh", 0, 1) == 1
        self.link.observe(res[0])
        self._processes = tuple(sorted(procs, key=lambda p: (p.host, p.pid, p.id)))
        return fresh

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
        await self.supervisor.aclose()
        await cancel_and_wait(self._tasks)
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
