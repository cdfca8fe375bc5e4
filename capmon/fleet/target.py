"""One target's state shared by the fleet: :class:`RedisTarget`, the state seam's
``TargetState`` over Redis.

It keeps a local mirror (a :class:`~capmon.core.control.seam.MemoryTarget`: breaker, limiter,
buckets, keys) fresh from every answer Redis gives, and uses it two ways:

* while Redis is there, the mirror answers the reads (``ready_at``, ``view``) and
  saves round trips (a breaker open, a key disabled, a hint not over, a target full
  until a slot frees: no call). Each attempt costs one ADMIT and one SETTLE script;
  the breaker's evidence is counted by the local breaker, and a move it makes is
  written by compare-and-set inside those scripts. What a settle decides is
  capmon/core/control/decisions.py's, as for a MemoryTarget: applied here to the mirror and
  sent to SETTLE, which decides only what needs the fleet's counts;
* while Redis is lost, the mirror *is* the state: admissions are local, with the
  fleet's limit divided among the processes last seen alive.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from capmon.core.control import decisions
from capmon.core.control.breaker import State, ramp_share
from capmon.core.control.decisions import KeyMove, KeyState, Outcome, Verdict
from capmon.core.control.limiter import Learned, Slot, TokenBucket
from capmon.core.control.policy import LimiterSignal
from capmon.core.control.seam import Admission, MemoryTarget, Standing, TargetSpec, TargetView
from capmon.core.control.survival import is_refusal
from capmon.core.types.failure import Failure
from capmon.fleet import codec
from capmon.fleet.link import ERRORS
from capmon.fleet.scripts import ManualAction

if TYPE_CHECKING:
    from capmon.fleet.store import RedisState

log = logging.getLogger("capmon.fleet")

_VERDICTS = frozenset(v.value for v in Verdict)

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
        self._full_until = 0.0
        self._limit_full = False  # ... and whether what was full was the limit, not a ramp's share of it
        # When ADMIT last found the target full (said so, or gave its last slot): what a survival
        # goes by for the fleet's free slots (a slot it adds does not make this older).
        self._seen_full = -FULL_NAP
        self._refusals = 0  # the fleet's refusals timed, as far as this process has taken them
        # After ADMIT found a bucket empty: (until, the least cost it holds off). A smaller
        # request may still fit the tpm bucket, and a refund here refills it: both ask again.
        self._bucket_wait = (0.0, 0)
        self._probe_hold = 0.0
        self._probe_until: float | None = None
        self._probe_lease: str | None = None
        self._local_slots: dict[str, Slot] = {}  # lease -> the local limiter's slot (in-flight count)
        self._fleet_learned: Learned | None = None  # what the fleet learned, as last heard (not the degraded share)
        self._asking = 0  # ADMIT calls on their way: room() counts them as in flight

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
        return max(self.local.not_before, until or 0.0, self._bucket_until(cost))

    def room(self, now: float, cost: int) -> float:
        # The fleet's learned limit (mirrored) less this process's own requests in flight,
        # and none while ADMIT last said the target is full or a bucket empty: the buckets
        # and the fleet's count live in Redis, and a reading here costs no round trip. An ADMIT
        # on its way counts as in flight: a burst's requests read their rooms before any answer.
        if self._shared and (now < self._full_until or now < self._bucket_until(cost)):
            return 0.0
        return self.local.room(now, cost, self._asking)

    def press(self) -> None:
        # passed to SETTLE with each answer: this process's work was turned away by a full
        # target (ADMIT said so fleet-wide, or this process's own requests fill the limit)
        self.local.press(full=self._shared and self._limit_full and self._store.clock.now() < self._full_until)

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

    def standing(self, now: float) -> Standing:
        return self.local.standing(now)

    # ------------------------------------------------------------ applying what Redis says

    def apply(
        self,
        h: codec.SharedTarget | None,
        offset: float,
        key: codec.KeyNews | None = None,
        *,
        force: bool = False,
        force_key: bool = False,
    ) -> bool:
        """Take a shared hash into the mirror if it is not older than the last one, and
        the key's state if it is not older than the last one (``apply_key``)."""
        if h is None:
            return False
        run, ver = h.run, h.ver
        if run == self._run and ver < self._ver and not force:
            return False
        if run != self._run:
            self._refusals = 0  # a hash rebuilt (Redis restarted, or flushed): its count starts over
        self._run, self._ver = run, ver
        origin = h.origin
        if h.refusals > self._refusals:
            # another process's refusal: its time counts toward this process's survival time
            # too (the process that probes next may have had none of its own)
            if origin != self._store.id:
                self.local.refusals.refused(h.refused_in)
            self._refusals = h.refusals
        label = None if origin == self._store.id else f"fleet: {origin}" if origin else "fleet"
        b = self.local.breaker
        gen = h.gen
        pending = b.changes != self._synced_changes
        if force or not (pending and gen == self._synced_gen):
            b.adopt(h.record(offset), label)
            self._synced_gen, self._synced_changes = gen, b.changes
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
        if key is not None:
            self.apply_key(key, force=force_key)
        now_state, until_local, reason = keys.state(self.spec.key_ref, self.id, now_local)
        if now_state is not was and now_state is not KeyState.OK and label is not None:
            self.local.emit_key(KeyMove(now_state, reason).kind, until_local, f"{reason} [{label}]")
        return True

    def apply_key(self, key: codec.KeyNews, *, force: bool = False) -> None:
        """Take the key's state unless this process already took (or made) a newer one:
        a read from before a settle disabled the key, or before a reset, answered late,
        must not undo it. ``force``: rejoining, Redis's state is the fleet's."""
        ref = self.spec.key_ref
        versions = self._store.key_versions
        if not force and key.ver < versions.get(ref, -1.0):
            return
        versions[ref] = key.ver
        if key.disabled:
            self.local._keys.disabled[ref] = key.disabled
        else:
            self.local._keys.disabled.pop(ref, None)

    def _key_moved(self) -> None:
        """This process changed the key's state here first: until Redis answers with the
        version that change makes, no read of the version before it is taken."""
        versions = self._store.key_versions
        ref = self.spec.key_ref
        versions[ref] = versions.get(ref, 0.0) + 0.5

    def slot_freed(self) -> None:
        self._full_until = 0.0

    def _took(self, res: Any, start: int) -> tuple[float, codec.SharedTarget | None]:
        """(offset, hash) from a script's answer whose hash is at index ``start``
        (Garbage if any of it is)."""
        if not isinstance(res, list) or len(res) <= start:
            raise codec.Garbage(self._hash, "", res, "not a script's answer")
        h = codec.target(codec.flat_hash(res[start], self._hash), self._hash, self.id)
        return self._store.link.observe(res[1]), h

    def _disabled(self, raw: object) -> codec.KeyNews:
        return codec.key_news(raw, self._key)

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
        seeded = res[0] == "seeded"  # a Redis that lost the target may have lost the key's versions too
        self.apply(h, offset, self._disabled(res[2]), force=seeded or h is None or h.run != self._run, force_key=seeded)

    # ------------------------------------------------------------ attempts

    async def admit(self, cost: int) -> Admission | None:
        if not self._shared:
            return await self.local.admit(cost)
        store = self._store
        now = store.clock.now()
        if now < self._full_until or now < self._bucket_until(cost) or decisions.gate(self.local.gates(now)):
            return None  # the mirror already says no: no round trip
        self._asking += 1
        try:
            return await self._admit(cost, now)
        except ERRORS as e:
            store.lost(e)
            return await self.local.admit(cost)
        finally:
            self._asking -= 1

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
        self._store.link.verdicts[verdict] += 1
        # Full by the limit itself, not only by a ramp's share of it: what presses the limiter
        # (MemoryTarget.press's rule, on the fleet's count).
        self._limit_full = count >= int(h.limit + 1e-9)
        last = verdict == "ok" and count >= self._cap(h, offset)
        if last or verdict == "full":
            self._seen_full = now
        if verdict == "ok":
            if last:
                self._full_until = now + FULL_NAP  # that was the last slot: no call until one frees
            self._local_slots[lease] = self.local.limiter.take()
            self._store.track(self.id, lease)
            slot = Slot(count, h.epoch)
            ramp = h.state is State.RAMP and self.local.breaker.ramp_admitted(h.gen)
            lim = self.local.limiter
            return Admission(self.id, h.gen, False, slot, cost, now, lease=lease, ask=lim.asks(slot), ramp=ramp)
        if verdict == "full":
            self._full_until = now + FULL_NAP
        elif verdict == Verdict.RPM and retry_at > 0:
            self._bucket_wait = (retry_at + offset, 0)
        elif verdict == Verdict.TPM and retry_at > 0:
            self._bucket_wait = (retry_at + offset, cost)
        return None

    def _bucket_until(self, cost: int) -> float:
        until, least = self._bucket_wait
        return until if cost >= least else 0.0

    def _cap(self, h: codec.SharedTarget, offset: float) -> int:
        """How many leases the target admits at once now (ADMIT's own rule)."""
        share = 1.0
        if h.state is State.RAMP:
            b = self._store.config.breaker
            share = ramp_share(
                self._store.clock.now(), h.ramp_from + offset, h.ramp_share, b.ramp_start, b.ramp_duration
            )
        return decisions.slots(share, h.limit)

    async def begin_probe(self, *, early: bool = False) -> Admission | None:
        # ``early``: this process's demand makes a probe due before the shared schedule
        # (capmon/core/control/demand.py); BEGIN_PROBE grants it unless a server's hint or the
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

    def survival_after(self) -> float | None:
        return self.local.survival_after()  # the fleet's refusals, as this process heard of them

    def survived(self, adm: Admission) -> bool:
        """The mirror's breaker decides, as for an answer. A ramp's step rides on this
        process's next call (the admission it lets in writes it before it is decided); a
        probe's ramp is written now, not with that call (the probe's answer, a service time
        away, if this process has no traffic there)."""
        if adm.lease is None:  # admitted by the mirror alone (Redis was away)
            return self.local.survived(adm)
        # The fleet's requests filled the ramp lately (ADMIT said "full", or gave this process
        # the last slot, within FULL_NAP): none of its slots is free, whatever this process's own show.
        full = self._store.clock.now() - self._seen_full < FULL_NAP
        grew = self.local.survived(adm, full=full)
        if grew and adm.probe:
            if self._shared:
                self._store.push_soon(self)
        elif grew:
            self._full_until = 0.0  # the mirror's "full" predates the slot just added
        return grew

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
                Admission(
                    self.id,
                    adm.generation,
                    adm.probe,
                    local_slot,
                    adm.cost,
                    adm.at,
                    ramp=adm.ramp,
                    survived=adm.survived,
                ),
                failure,
                used_tokens=used_tokens,
                cancelled=cancelled,
                unused=unused,
            )
        adm.settled = True
        self.local.limiter.release(local_slot, LimiterSignal.NEUTRAL)  # the local count of ours in flight
        now = store.clock.now()
        plan = decisions.plan_settle(
            Outcome(failure, cancelled, unused, used_tokens),
            probe=adm.probe,
            cost=adm.cost,
            max_hint=store.config.breaker.cooldown_max,
        )
        # The shared limiter decides news in SETTLE; the local breaker counts its own
        # evidence now, from the epoch the mirror knows (fresh as of the last answer).
        news = decisions.overload_is_news(plan.limiter, adm.slot.epoch, self._epoch)
        self.local.refusals.record(plan.breaker, failure, now - adm.at)
        self.local.breaker.record(
            adm.generation,
            plan.breaker,
            sent_at=adm.at,
            hint=plan.hint,
            news=news,
            probe=adm.probe,
            basis=self.local.limiter.limit,
            floor=self.local.limiter.start,
            young=adm.ramp and not adm.survived,
        )
        key = plan.key
        if key is not None:
            self.local.move_key(key, now)
            if key.state is KeyState.DISABLED:
                self._key_moved()
        self._full_until = 0.0
        if plan.refund_tokens or plan.refund_request:
            self._bucket_wait = (0.0, 0)
        for _ in range(2):
            pending = self._pending()
            try:
                res = await store.link.call(
                    "settle",
                    store.link.scripts.settle,
                    [self._hash, self._leases, self._key, self._tpm, store.keys.events, self._waiting, self._rpm],
                    [
                        adm.lease,
                        plan.limiter.value,
                        adm.slot.position,
                        adm.slot.epoch,
                        plan.breaker.value,
                        adm.generation,
                        max(0.0, now - adm.at),
                        -1 if plan.hint is None else plan.hint,
                        int(adm.probe),
                        "none" if key is None else "disable" if key.state is KeyState.DISABLED else "park",
                        "" if key is None else key.reason,
                        0.0 if key is None else key.park_for,
                        -1 if plan.block_for is None else plan.block_for,
                        plan.refund_tokens,
                        *self._settle_args,
                        store.id,
                        pending[0] if pending else "",
                        store.keys.proc_prefix,
                        self._rpm_rate,
                        int(plan.refund_request),
                        store.config.shared.lease_ttl,
                        self.local.limiter.start,
                        int(self.local.pressed_since(adm.at)),
                        max(0.0, now - adm.at) if is_refusal(plan.breaker, failure) else -1,
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
                # SETTLE's own part, on the mirror alone: the fleet's count is no longer known
                self.local.not_before = decisions.not_before_after(
                    self.local.not_before, now, plan.block_for, self.local.limiter.in_flight
                )
                break
            news = res[2] == 1 or res[2] == "1"
            break
        return decisions.reports_news(plan, news)

    # ------------------------------------------------------------ by hand

    def trip(self, reason: str) -> None:
        self._manual(ManualAction.TRIP, reason, self.local.trip)

    def force_close(self, reason: str) -> None:
        self._manual(ManualAction.FORCE_CLOSE, reason, self.local.force_close)

    def reset(self, reason: str) -> None:
        self._bucket_wait, self._full_until = (0.0, 0), 0.0
        self._key_moved()
        self._manual(ManualAction.RESET, reason, self.local.reset)

    def _manual(self, action: ManualAction, reason: str, apply_locally: Any) -> None:
        apply_locally(reason)  # at once here, whatever Redis does
        self._synced_changes = self.local.breaker.changes  # written by MANUAL, not by compare-and-set
        self._store.manual(self, action, reason)

    async def write_manual(self, action: ManualAction, reason: str) -> None:
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
        self._full_until = self._probe_hold = 0.0
        self._bucket_wait = (0.0, 0)
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
