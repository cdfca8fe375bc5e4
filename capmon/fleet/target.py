"""One target's state shared by the fleet: :class:`RedisTarget`, the state seam's
``TargetState`` over Redis.

It keeps a local mirror (a :class:`~capmon.core.state.MemoryTarget`: breaker, limiter,
buckets, keys) fresh from every answer Redis gives, and uses it two ways:

* while Redis is there, the mirror answers the reads (``ready_at``, ``view``) and
  saves round trips (a breaker open, a key disabled, a hint not over, a target full
  until a slot frees: no call). Each attempt costs one ADMIT and one SETTLE script;
  the breaker's evidence is counted by the local breaker, and a move it makes is
  written by compare-and-set inside those scripts;
* while Redis is lost, the mirror *is* the state: admissions are local, with the
  fleet's limit divided among the processes last seen alive.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Any

from capmon.core.breaker import State
from capmon.core.errors import Failure
from capmon.core.events import KeyParked
from capmon.core.limiter import Learned, Slot, TokenBucket
from capmon.core.policy import CANCELLED, BreakerSignal, KeyAction, LimiterSignal, policy_for
from capmon.core.state import DEFAULT_QUOTA_PARK, Admission, KeyState, MemoryTarget, TargetSpec, TargetView
from capmon.fleet import codec
from capmon.fleet.link import ERRORS

if TYPE_CHECKING:
    from capmon.fleet.store import RedisState

log = logging.getLogger("capmon.fleet")

_VERDICTS = frozenset(("ok", "full", "state", "disabled", "parked", "hint", "rpm", "tpm"))

# After an ADMIT found the target full, no call is made until a slot frees (news on
# pub/sub, or a settle here) or this long: a safety net for a missed message.
FULL_NAP = 1.0


class RedisTarget:
    def __init__(self, spec: TargetSpec, local: MemoryTarget, store: RedisState) -> None:
        self.id = spec.id
        self.spec = spec
        self.local = local
        self._store = store
        k = store.keys
        self._hash, self._leases, self._key = k.target(spec.id), k.leases(spec.id), k.key(spec.key_ref)
        self._rpm, self._tpm, self._waiting = k.rpm(spec.id), k.tpm(spec.id), k.waiting(spec.id)
        self.key_ref_text = f"{spec.key_ref[0]}/{spec.key_ref[1]}"
        m, cfg = spec.model, store.config
        self._rpm_rate, self._tpm_rate = float(m.rpm), float(m.tpm)
        b, lim = cfg.breaker, local.limiter
        self._admit_args = [m.rpm, m.tpm, b.ramp_start, b.ramp_duration]
        self._settle_args = [
            m.tpm,
            lim.min,
            lim.max,
            lim.decrease,
            b.failure_threshold,
            b.probe_interval,
            b.cooldown_multiplier,
            b.cooldown,
            b.cooldown_max,
        ]
        # The shared hash this mirror last applied: (run, version); a hash from an
        # older version (a message overtaken by an answer) is not applied.
        self._run = ""
        self._ver = -1
        # The shared breaker generation the local breaker last agreed with, and its
        # change count then: a local move since is written by compare-and-set.
        self._synced_gen = local.breaker.generation
        self._synced_changes = local.breaker.changes
        self._epoch = 0  # the shared limiter's cut count, mirrored
        self.fleet_in_flight = 0  # leases of every process, as the last ADMIT saw them
        self._full_until = 0.0
        self._retry_at = 0.0
        self._probe_hold = 0.0
        self._probe_owner = ""
        self._probe_until: float | None = None
        self._probe_lease: str | None = None
        self._local_slots: dict[str, Slot] = {}  # lease -> the local limiter's slot (in-flight count)
        self._fleet_learned: Learned | None = None  # what the fleet learned, as last heard (not the degraded share)

    # ------------------------------------------------------------ reading (the mirror)

    @property
    def _shared(self) -> bool:
        return self._store.link.ok

    def usable(self) -> bool:
        return self.local.usable()

    def ready_at(self, now: float, cost: int) -> float | None:
        if not self._shared:
            return self.local.ready_at(now, cost)
        key, until, _ = self.local._keys.state(self.spec.key_ref, self.id, now)
        if key is KeyState.DISABLED or not self.local.breaker.state.admits:
            return None
        return max(self.local.not_before, until or 0.0, self._retry_at)

    def probe_due_at(self) -> float | None:
        b = self.local.breaker
        if not self._shared:
            return b.probe_due_at()
        state = b.state
        if state is State.OPEN:
            due = b.probe_due_at()
            return None if due is None else max(due, self._probe_hold)
        if state is State.HALF_OPEN and self._probe_lease is None and self._probe_until is not None:
            return max(self._probe_until, self._probe_hold)  # another's probe: take over if its owner goes silent
        return None

    def view(self) -> TargetView:
        return self.local.view()

    # ------------------------------------------------------------ applying what Redis says

    def apply(
        self,
        h: codec.SharedTarget | None,
        offset: float,
        disabled: str | None = None,
        *,
        force: bool = False,
        redis_now: float | None = None,
    ) -> bool:
        """Take a shared hash into the mirror if it is not older than the last one."""
        if h is None:
            return False
        run, ver = h.run, h.ver
        if run == self._run and ver < self._ver and not force:
            return False
        self._run, self._ver = run, ver
        origin = h.origin
        label = None if origin == self._store.id else f"fleet: {origin}" if origin else "fleet"
        b = self.local.breaker
        gen = h.gen
        pending = b.changes != self._synced_changes
        if force or not (pending and gen == self._synced_gen):
            b.adopt(h.record(offset), label)
            self._synced_gen, self._synced_changes = gen, b.changes
        self._probe_owner = h.probe_owner
        until = h.probe_until
        self._probe_until = until + offset if until > 0 and b.state is State.HALF_OPEN else None
        if self._shared or self._store.joining:
            self._fleet_learned = h.learned()
            self.local.limiter.mirror(self._fleet_learned)
        self._epoch = h.epoch
        nb = h.not_before
        self.local.not_before = nb + offset if nb > 0 else 0.0
        now_local = self._store.clock.now()
        keys = self.local._keys
        park = h.park_until
        was = keys.state(self.spec.key_ref, self.id, now_local)[0]
        if park > 0 and park + offset > now_local:
            keys.parked[self.id] = (park + offset, h.park_reason)
        else:
            keys.parked.pop(self.id, None)
        if disabled is not None:
            if disabled:
                keys.disabled[self.spec.key_ref] = disabled
            else:
                keys.disabled.pop(self.spec.key_ref, None)
        now_state, until_local, reason = keys.state(self.spec.key_ref, self.id, now_local)
        if now_state is not was and now_state is not KeyState.OK and label is not None:
            kind = "auth" if now_state is KeyState.DISABLED else "quota"
            self._emit_key(kind, until_local, f"{reason} [{label}]")
        return True

    def apply_key(self, disabled: str) -> None:
        if disabled:
            self.local._keys.disabled[self.spec.key_ref] = disabled
        else:
            self.local._keys.disabled.pop(self.spec.key_ref, None)

    def slot_freed(self) -> None:
        self._full_until = 0.0

    def _took(self, res: Any, start: int) -> tuple[float, codec.SharedTarget | None]:
        """(offset, hash) from a script's answer whose hash is at index ``start``
        (Garbage if any of it is)."""
        if not isinstance(res, list) or len(res) <= start:
            raise codec.Garbage(self._hash, "", res, "not a script's answer")
        h = codec.target(codec.flat_hash(res[start], self._hash), self._hash, self.id)
        return self._store.link.observe(res[1]), h

    def _disabled(self, raw: object) -> str:
        return codec.key_disabled(raw, self._key)

    def _pending(self) -> tuple[str, int, int] | None:
        """The local breaker's move not yet written: (transition JSON, its generation, change count)."""
        b = self.local.breaker
        if b.changes == self._synced_changes:
            return None
        rec = b.export()  # applies a time-driven move first (a ramp completing)
        return codec.transition(rec, self._synced_gen, self._store.clock.now()), rec.generation, b.changes

    def _cas_done(self, cas: str, pending: tuple[str, int, int] | None) -> bool:
        """After a script ran our compare-and-set: True when Redis's breaker must be adopted."""
        if pending is None or not cas:
            return False
        if cas == "ok":
            self._synced_gen, self._synced_changes = pending[1], pending[2]
            return False
        self._synced_changes = self.local.breaker.changes  # another process moved first: its state wins
        return True

    async def seed(self) -> None:
        """Rebuild this target in a Redis that lacks it, from the mirror (whoever comes first)."""
        store = self._store
        now = store.clock.now()
        probe_in = (self._probe_until - now) if self._probe_until is not None else -1.0
        if self._probe_lease is not None:
            probe_in = store.config.shared.lease_ttl
        keys = self.local._keys
        fields = codec.seed(
            self.local,
            now,
            self.key_ref_text,
            probe_in,
            keys.parked.get(self.id),
            self._fleet_learned or self.local.limiter.learned(),
        )
        res = await store.link.call(
            "seed",
            store.link.scripts.seed,
            [self._hash, self._key, store.keys.events],
            [fields, keys.disabled.get(self.spec.key_ref, ""), store.new_token(), store.id],
        )
        offset, h = self._took(res, 3)
        self.apply(h, offset, self._disabled(res[2]), force=res[0] == "seeded" or h is None or h.run != self._run)

    # ------------------------------------------------------------ attempts

    async def admit(self, cost: int) -> Admission | None:
        if not self._shared:
            return await self.local.admit(cost)
        store = self._store
        now = store.clock.now()
        if now < self._full_until or now < self._retry_at or now < self.local.not_before:
            return None  # the mirror already says no: no round trip
        if (
            self.local.breaker.share() <= 0.0
            or self.local._keys.state(self.spec.key_ref, self.id, now)[0] is not KeyState.OK
        ):
            return None
        try:
            return await self._admit(cost, now)
        except ERRORS as e:
            store.lost(e)
            return await self.local.admit(cost)

    async def _admit(self, cost: int, now: float) -> Admission | None:
        store = self._store
        for _ in range(2):
            lease = store.new_lease()
            pending = self._pending()
            res = await store.link.call(
                "admit",
                store.link.scripts.admit,
                [
                    self._hash,
                    self._leases,
                    self._key,
                    self._rpm,
                    self._tpm,
                    store.keys.budget,
                    store.keys.events,
                    self._waiting,
                ],
                [
                    lease,
                    store.config.shared.lease_ttl,
                    cost,
                    *self._admit_args,
                    store.take_earned(),
                    store.budget_cap,
                    store.budget_start,
                    store.id,
                    pending[0] if pending else "",
                ],
                hot=True,
            )
            if res[0] == "missing":
                await self.seed()
                continue
            return self._admitted(res, lease, pending, cost, now)
        return None

    def _admitted(
        self, res: Any, lease: str, pending: tuple[str, int, int] | None, cost: int, now: float
    ) -> Admission | None:
        # everything parsed before anything is used: garbage leaves no half-applied answer
        offset, h = self._took(res, 7)
        where = self._hash
        if res[0] not in _VERDICTS or len(res) < 9:
            raise codec.Garbage(where, "verdict", res[0], "not ADMIT's answer")
        verdict, count = res[0], codec.integer(res[2], where, "leases")
        retry_at = codec.number(res[3], where, "retry_at", 0.0)
        budget = codec.budget(res[4], res[8], self._store.keys.budget, self._store.budget_cap)
        cas, disabled = codec.text(res[5], where, "cas"), self._disabled(res[6])
        if h is None:
            raise codec.Garbage(where, "", None, "ADMIT answered without the target")
        if budget is not None:
            self._store.mirror_budget(*budget)
        self.apply(h, offset, disabled, force=self._cas_done(cas, pending))
        self.fleet_in_flight = count
        self._store.link.verdicts[verdict] += 1
        if verdict == "ok":
            if count >= self._cap(h, offset):
                self._full_until = now + FULL_NAP  # that was the last slot: no call until one frees
            self._local_slots[lease] = self.local.limiter.take()
            self._store.track(self.id, lease)
            return Admission(
                self.id,
                h.gen,
                False,
                Slot(count, h.epoch),
                cost,
                now,
                lease=lease,
            )
        if verdict == "full":
            self._full_until = now + FULL_NAP
        elif retry_at > 0:
            self._retry_at = retry_at + offset
        return None

    def _cap(self, h: codec.SharedTarget, offset: float) -> int:
        """How many leases the target admits at once now (ADMIT's own rule)."""
        limit = h.limit
        b = self._store.config.breaker
        if h.state is State.RAMP and b.ramp_duration > 0:
            since = self._store.clock.now() - (h.ramp_from + offset)
            share = min(
                1.0,
                max(
                    h.ramp_share,
                    b.ramp_start + (1.0 - b.ramp_start) * since / b.ramp_duration,
                ),
            )
            if share < 1.0:
                return math.floor(min(limit, max(1, math.ceil(share * max(1.0, limit)))) + 1e-9)
        return math.floor(limit + 1e-9)

    async def begin_probe(self, *, early: bool = False) -> Admission | None:
        # ``early``: this process's demand makes a probe due before the shared schedule
        # (capmon/core/demand.py); BEGIN_PROBE grants it unless a server's hint or the
        # fleet's last probe (the floor) holds it, so the fleet still sends one at a time.
        if not self._shared:
            return await self.local.begin_probe(early=early)
        store = self._store
        now = store.clock.now()
        due = self.probe_due_at()
        if due is None:
            return None
        early = early and due > now + 1e-9
        if early and (self.local.breaker.state is not State.OPEN or now < self._probe_hold):
            return None
        if due > now + 1e-9 and not early:
            return None
        if self.local._keys.state(self.spec.key_ref, self.id, now)[0] is not KeyState.OK:
            return None
        try:
            return await self._begin_probe(now, early)
        except ERRORS as e:
            store.lost(e)
            return await self.local.begin_probe(early=early)

    async def _begin_probe(self, now: float, early: bool = False) -> Admission | None:
        store = self._store
        for _ in range(2):
            lease = store.new_lease()
            res = await store.link.call(
                "begin_probe",
                store.link.scripts.begin_probe,
                [self._hash, self._leases, store.keys.events],
                [
                    self._synced_gen,
                    store.id,
                    store.config.shared.lease_ttl,
                    lease,
                    store.config.shared.lease_ttl,
                    "1" if early else "0",
                    store.config.breaker.probe_floor,
                ],
            )
            if res[0] == "missing":
                await self.seed()
                continue
            offset, h = self._took(res, 2)
            if h is None:
                raise codec.Garbage(self._hash, "", None, "BEGIN_PROBE answered without the target")
            if res[0] != "ok":
                self.apply(h, offset, force=True)
                self._probe_hold = store.clock.now() + 0.02  # not due in Redis's time yet, or taken
                return None
            self._probe_lease = lease
            self.apply(h, offset, force=True)
            self._local_slots[lease] = self.local.limiter.take()
            store.track(self.id, lease)
            return Admission(self.id, h.gen, True, Slot(1, self._epoch), 0, now, lease=lease)
        return None

    def holds(self, adm: Admission) -> bool:
        return self.local.holds(adm)

    async def settle(
        self,
        adm: Admission,
        failure: Failure | None,
        *,
        used_tokens: int | None = None,
        cancelled: bool = False,
        unused: bool = False,
    ) -> bool:
        if adm.settled:
            return False
        if adm.lease is None:
            return await self.local.settle(adm, failure, used_tokens=used_tokens, cancelled=cancelled, unused=unused)
        store = self._store
        local_slot = self._local_slots.pop(adm.lease, None) or Slot(1, 0)
        store.untrack(self.id, adm.lease)
        if adm.lease == self._probe_lease:
            self._probe_lease = None
        if not self._shared:
            # Redis went away while this attempt was out: settle it on the mirror alone.
            return await self.local.settle(
                Admission(self.id, adm.generation, adm.probe, local_slot, adm.cost, adm.at),
                failure,
                used_tokens=used_tokens,
                cancelled=cancelled,
                unused=unused,
            )
        adm.settled = True
        self.local.limiter.release(local_slot, LimiterSignal.NEUTRAL)  # the local count of ours in flight
        pol = CANCELLED if cancelled else policy_for(failure)
        hint = failure.retry_after if failure is not None else None
        hint = hint if hint is not None and math.isfinite(hint) and hint >= 0 else None
        now = store.clock.now()
        b = self.local.breaker
        # The shared limiter decides news in SETTLE; the local breaker counts its own
        # evidence now, from the epoch the mirror knows (fresh as of the last answer).
        news = not adm.probe and pol.limiter is LimiterSignal.OVERLOAD and adm.slot.epoch == self._epoch
        b.record(
            adm.generation,
            pol.breaker,
            sent_at=adm.at,
            hint=hint,
            news=news,
            probe=adm.probe,
            basis=self.local.limiter.limit,
        )
        park_for = 0.0
        if pol.key is KeyAction.DISABLE and failure is not None:
            self.local._keys.disabled[self.spec.key_ref] = failure.reason
            self._emit_key("auth", None, failure.reason)
        elif pol.key is KeyAction.PARK and failure is not None:
            park_for = hint if hint is not None and hint > 0 else DEFAULT_QUOTA_PARK
            self.local._keys.parked[self.id] = (now + park_for, failure.reason)
            self._emit_key("quota", now + park_for, failure.reason)
        refund = max(0, adm.cost - used_tokens) if failure is None and used_tokens is not None else 0
        if unused and not adm.probe:
            refund = adm.cost  # given back before anything was sent: its charges come back
        self._full_until = 0.0
        for _ in range(2):
            pending = self._pending()
            try:
                res = await store.link.call(
                    "settle",
                    store.link.scripts.settle,
                    [self._hash, self._leases, self._key, self._tpm, store.keys.events, self._waiting, self._rpm],
                    [
                        adm.lease,
                        pol.limiter.value,
                        adm.slot.position,
                        adm.slot.epoch,
                        pol.breaker.value,
                        adm.generation,
                        max(0.0, now - adm.at),
                        -1 if hint is None else hint,
                        int(adm.probe),
                        pol.key.value,
                        failure.reason if failure is not None and pol.key is not KeyAction.NONE else "",
                        park_for,
                        int(pol.hint_blocks),
                        refund,
                        *self._settle_args,
                        store.id,
                        pending[0] if pending else "",
                        store.keys.proc_prefix,
                        self._rpm_rate,
                        int(unused),
                        store.config.shared.lease_ttl,
                    ],
                    hot=True,
                )
                if res[0] == "missing":
                    await self.seed()
                    continue
                offset, h = self._took(res, 5)
                self.apply(h, offset, self._disabled(res[4]), force=self._cas_done(res[3], pending))
            except ERRORS as e:
                store.lost(e)
                if pol.hint_blocks and hint is not None and self.local.limiter.in_flight == 0 and not adm.probe:
                    self.local.not_before = max(
                        self.local.not_before, now + min(hint, store.config.breaker.cooldown_max)
                    )
                break
            news = res[2] == 1 or res[2] == "1"
            break
        return news or pol.breaker is BreakerSignal.DOWN

    def _emit_key(self, kind: str, until: float | None, reason: str) -> None:
        clock = self._store.clock
        self._store.publish(
            KeyParked(
                at=clock.now(),
                wall=clock.wall(),
                target=self.id,
                model=self.spec.model.name,
                key_alias=self.spec.key_alias,
                kind=kind,
                until=until,
                reason=reason,
            )
        )

    # ------------------------------------------------------------ by hand

    def trip(self, reason: str) -> None:
        self._manual("trip", reason, self.local.trip)

    def force_close(self, reason: str) -> None:
        self._manual("force_close", reason, self.local.force_close)

    def reset(self, reason: str) -> None:
        self._retry_at = self._full_until = 0.0
        self._manual("reset", reason, self.local.reset)

    def _manual(self, action: str, reason: str, apply_locally: Any) -> None:
        apply_locally(reason)  # at once here, whatever Redis does
        self._synced_changes = self.local.breaker.changes  # written by MANUAL, not by compare-and-set
        self._store.manual(self, action, reason)

    async def write_manual(self, action: str, reason: str) -> None:
        store = self._store
        for _ in range(2):
            res = await store.link.call(
                "manual",
                store.link.scripts.manual,
                [self._hash, self._key, store.keys.events],
                [action, reason, store.id, store.config.breaker.probe_interval],
            )
            if res[0] == "missing":
                await self.seed()
                continue
            offset, h = self._took(res, 3)
            self.apply(h, offset, self._disabled(res[2]), force=True)
            return

    async def push(self) -> None:
        """Rejoining: write the move the local breaker made while Redis was away."""
        pending = self._pending()
        if pending is None:
            return
        store = self._store
        res = await store.link.call(
            "transition", store.link.scripts.transition, [self._hash, store.keys.events], [pending[0], store.id]
        )
        if res[0] == "missing":
            await self.seed()
            return
        offset, h = self._took(res, 2)
        self.apply(h, offset, force=self._cas_done(res[0], pending))

    # ------------------------------------------------------------ degraded

    def go_local(self, processes: int) -> None:
        """Redis is lost: this process takes its share of the fleet's limit and buckets."""
        n = max(1, processes)
        lim = self.local.limiter
        learned = lim.learned()
        share = max(1.0, learned.limit / n)
        capacity = None if learned.capacity is None else max(lim.min, int(share))
        lim.mirror(Learned(share, capacity, learned.epoch, learned.hold, 0))
        clock = self._store.clock
        self.local.rpm = TokenBucket(max(1e-3, self._rpm_rate / n), clock) if self._rpm_rate else None
        self.local.tpm = TokenBucket(max(1e-3, self._tpm_rate / n), clock) if self._tpm_rate else None
        self._full_until = self._retry_at = self._probe_hold = 0.0
        b = self.local.breaker
        if self._probe_lease is None and b.state is State.HALF_OPEN:
            # Another process's probe, whose outcome this one can no longer hear: back to
            # open with the probe due, so that this process probes for itself.
            rec = b.export()
            b.adopt(
                dataclasses.replace(
                    rec,
                    state=State.OPEN,
                    generation=rec.generation + 1,
                    next_probe=clock.now(),
                    reason="shared state lost while another process probed",
                ),
                "local",
            )
