"""BatchRunner: send every item of a job through the shared client, durably.

The runner opens the job (:mod:`capmon.batch.ingest` checks and reads its input), runs
``concurrency`` workers that take items from the :mod:`~capmon.batch.scheduler` and
send them, decides what each answer or failure makes of its item, and hands outcomes to
the :mod:`~capmon.batch.writer`. What it promises:

* An item counts as done only once its result is committed, so a ``kill -9`` at any
  moment loses no result that was ever shown as done.
* An item is never failed for capacity reasons: when the client gives up on it for
  capacity, rate limiting, transient errors or its deadline, the item is *parked* and
  comes back after a growing delay, until it is done.
* Auth and quota failures are not the item's fault and every other item would fail
  the same way, so they halt the job (items go back to pending) with a BatchError
  that says what to fix; ``resume`` goes on once it is fixed.
* Cancelling ``run()`` stops cleanly: in-flight items go back to pending.
* A failed save (a full disk, a database locked by someone else) pauses new sends at
  once: items in flight finish and their results wait in memory while the save is
  retried. Saving again goes on as before; still failing after ``write_give_up``
  seconds halts the job with the cause, and ``resume`` sends again what was not saved.
  A disk that is full is seen before the next save fails: the free space on the
  database's disk is checked before every send.
* No answer larger than ``client.max_response_bytes`` is stored: such an item fails as
  ``oversized`` and its audit trail says so.
* Slowing down as capacity errors rise is the client's job (AIMD per target): the
  runner adds no throttle of its own beyond the job's ``rate`` and ``window``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capmon.audit import AuditLog
from capmon.batch import lease
from capmon.batch.client import BatchClient
from capmon.batch.defaults import DEFAULT_LEASE_TTL
from capmon.batch.ingest import Ingest, Refused
from capmon.batch.items import request_of
from capmon.batch.meter import Counts, ProgressMeter, counters
from capmon.batch.options import OptionError, RunnerOptions
from capmon.batch.outcomes import Finish, OutcomePolicy, Verdict, back
from capmon.batch.pacing import Pacing
from capmon.batch.scheduler import Scheduler
from capmon.batch.spend_cap import SpendCap
from capmon.batch.sqlite import DatabaseGone, JobInfo, Outcome, StoredItem
from capmon.batch.states import ItemState, JobState
from capmon.batch.store import Db, PgLocation, Store, open_store
from capmon.batch.writer import LOW_DISK_BYTES, WRITE_GIVE_UP, ResultWriter
from capmon.core.base import text
from capmon.core.base.clock import Clock
from capmon.core.base.exceptions import BatchError, RequestFailed
from capmon.core.types import events as ev
from capmon.core.types.failure import Failure, Kind
from capmon.core.types.result import Attempt, ChatResult, Request

log = logging.getLogger("capmon.batch")

CLAIM_MAX = 64  # items claimed at once from a shared store, at most
SHARED_WRITE_GIVE_UP = 600.0  # a server restarting or failing over: pause this long before halting
RECOUNT = 2.0  # seconds between reads of a shared job's counts
INGEST_WAIT = 0.25  # seconds between looks at an ingest another worker does
POLL = 0.25  # seconds between claims while the other workers hold every item left


@dataclass(frozen=True)
class JobSummary:
    job: str
    total: int
    done: int
    failed: int
    parked: int
    pending: int
    state: JobState  # finished | stopped | halted
    per_model: tuple[tuple[str, int], ...]
    sent: int  # items sent by this run
    elapsed: float  # clock seconds this run took
    db_path: Db

    @property
    def ok(self) -> bool:
        return self.state is JobState.FINISHED and self.failed == 0


class BatchRunner:
    def __init__(
        self,
        client: BatchClient,
        db_path: Db,
        job: str,
        options: RunnerOptions | None = None,
        *,
        clock: Clock | None = None,
        bus: ev.EventBus | None = None,
    ) -> None:
        if not job or not job.strip():
            raise BatchError("a job needs a name")
        o = self.options = options or RunnerOptions()
        self.pacing = Pacing.of(o.concurrency, o.rate, o.window)
        self.client = client
        self.db_path: Db = db_path if isinstance(db_path, PgLocation) else Path(db_path)
        shared = isinstance(self.db_path, PgLocation)
        self.job = job
        self.input_path = Path(o.input_path) if o.input_path is not None else None
        self.concurrency = self.pacing.concurrency
        self.rate = self.pacing.rate
        self.window = self.pacing.window
        self.clock: Clock = clock or client.clock
        self.bus: ev.EventBus = bus or client.bus
        self.progress_interval = o.progress_interval
        self.accept_changed_input = o.accept_changed_input
        self._remap_asked = dict(o.remap)
        self._remap: dict[str, str] = {}
        self.max_response_bytes = client.config.client.max_response_bytes
        self._cap = SpendCap(o.max_cost)

        self._store: Store | None = None
        self._info: JobInfo | None = None
        self._owner = lease.new_owner()
        self._phase = JobState.STARTING  # then ingesting, running, and at the end finished | stopped | halted
        self._message = ""
        self._halt: BatchError | None = None
        self._total: int | None = None
        self._active: dict[int, StoredItem] = {}  # in flight, by key
        self._attempt_base: dict[str, int] = {}  # item id -> attempts before this send (audit numbering)
        self._workers: list[asyncio.Task[None]] = []
        self.sent = 0

        self._meter = ProgressMeter(job, self.clock, self.window)
        # A shared store's items are claimed a few at a time (the rest stay free for the other
        # workers); a worker that dies gives them back when their leases expire.
        if o.lease_ttl is not None and not 0.1 <= o.lease_ttl <= 3600:
            raise OptionError("lease_ttl", "expected seconds between 0.1 and 3600", value=f"{o.lease_ttl:g}")
        self.lease_ttl = o.lease_ttl or DEFAULT_LEASE_TTL
        self._scheduler = Scheduler(
            self.clock,
            self.pacing,
            self._page,
            page_size=max(4, min(CLAIM_MAX, 2 * self.pacing.concurrency)) if shared else None,
            poll=min(POLL, self.lease_ttl / 4),
            park_base=o.park_base,
            park_cap=o.park_cap,
            rng=o.rng,
        )
        self._audit = AuditLog(
            clock=self.clock,
            accept=lambda r: r.job == self.job,
            numbering=lambda r, a: self._attempt_base.get(r.item_id or "", 0) + a.number,
        )
        self._policy = OutcomePolicy(job, client.config, self.clock, self._audit, self._scheduler.park_delay)
        self._writer = ResultWriter(
            job,
            str(self.db_path),
            self.clock,
            self.bus,
            self._audit,
            job_fields=self._job_fields,
            on_failing=self._save_failing,
            on_saved=self._saved_again,
            on_give_up=self._stop_for,
            flush_interval=o.flush_interval,
            flush_rows=o.flush_rows,
            give_up=o.write_give_up or (SHARED_WRITE_GIVE_UP if shared else WRITE_GIVE_UP),
        )

    # ------------------------------------------------------------ control

    @property
    def paused(self) -> bool:
        return self._scheduler.paused

    @property
    def halt(self) -> BatchError | None:
        """The error that halts the job (``run()`` raises it when it ends), once there is one."""
        return self._halt

    @property
    def save_error(self) -> BatchError | None:
        """Why results cannot be saved right now (sending is paused meanwhile), or None."""
        return self._writer.save_error

    def pause(self) -> None:
        """Start nothing new; items in flight finish."""
        self._scheduler.pause()

    def resume(self) -> None:
        self._scheduler.resume()

    def toggle_pause(self) -> bool:
        (self.resume if self.paused else self.pause)()
        return self.paused

    # ------------------------------------------------------------ progress

    def _state(self) -> JobState:
        if self._phase is not JobState.RUNNING:
            return self._phase
        if self.paused or self.save_error is not None:
            return JobState.PAUSED
        if self.window is not None and not self.window.is_open(self.clock.wall()):
            return JobState.WAITING_WINDOW
        return JobState.RUNNING

    def _sample(self) -> None:
        self._meter.sample(self._writer.done + self._writer.failed)

    def progress(self) -> ev.BatchProgress:
        """Cheap, in-memory counters. ``done`` and ``failed`` count committed results only."""
        w = self._writer
        return self._meter.progress(
            Counts(
                state=self._state(),
                total=self._total,
                done=w.done,
                failed=w.failed,
                parked=self._scheduler.parked,
                in_flight=len(self._active) + w.finished_uncommitted,
                per_model=tuple(w.per_model.most_common()),
                message=self._message,
            )
        )

    def _job_fields(self) -> dict[str, Any]:
        """What every commit writes to the job row: the counters it makes true."""
        p = self.progress()
        return {"counters": counters(p), "state": p.state, "message": self._message}

    def _publish_progress(self) -> None:
        self.bus.publish(self.progress())

    def _note(self, message: str, level: str = "warning") -> None:
        """A message for people: a Notice on the bus (`capmon batch` prints them, the
        dashboard shows them), and a log record for programs that keep logs."""
        log.info("%s", message)
        self.bus.publish(ev.Notice(at=self.clock.now(), wall=self.clock.wall(), level=level, message=message))

    # ------------------------------------------------------------ run

    async def run(self) -> JobSummary:
        """Ingest (if the job is new), then send until every item is done or failed."""
        t0 = self.clock.now()
        sent_before = self.sent
        detach: list[Callable[[], None]] = []
        tasks: list[asyncio.Task[Any]] = []
        final = JobState.STOPPED
        try:
            await self._open()
            detach.append(self.client.add_observer(self._audit.observe))
            detach.append(self.client.add_observer(self._spent))
            self._phase = JobState.RUNNING
            self._sample()
            self._publish_progress()
            workers = self._workers = [
                asyncio.create_task(self._worker(), name=f"capmon-batch:{self.job}:{i}")
                for i in range(self.concurrency)
            ]
            tasks = [*workers, asyncio.create_task(self._writer.run()), asyncio.create_task(self._ticker())]
            if self._store is not None and self._store.shared:
                tasks.append(asyncio.create_task(self._renew_leases()))
            # Not gather: on a halt the workers are cancelled, and that is not this task's cancellation.
            await asyncio.wait(workers)
            for w in workers:
                if not w.cancelled() and (error := w.exception()) is not None:
                    raise error
            final = JobState.HALTED if self._halt is not None else JobState.FINISHED
            ended = self._writer.done + self._writer.failed + self._writer.finished_uncommitted
            if final is JobState.FINISHED and self._cap.reached and ended < (self._total or 0):
                final = JobState.PAUSED
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for undo in detach:
                undo()
            await self._close(final)
        if self._halt is not None:
            raise self._halt
        return self._summary(final, t0, sent_before)

    def _summary(self, state: JobState, t0: float, sent_before: int) -> JobSummary:
        total = self._total or 0
        w = self._writer
        parked = self._scheduler.parked
        return JobSummary(
            job=self.job,
            total=total,
            done=w.done,
            failed=w.failed,
            parked=parked,
            pending=max(0, total - w.done - w.failed - parked),
            state=state,
            per_model=tuple(w.per_model.most_common()),
            sent=self.sent - sent_before,
            elapsed=self.clock.now() - t0,
            db_path=self.db_path,
        )

    async def _ticker(self) -> None:
        last_count = self.clock.now()
        while True:
            await self.clock.sleep(self.progress_interval)
            if self._store is not None and self._store.shared and self.clock.now() - last_count >= RECOUNT:
                last_count = self.clock.now()
                self._recount()
            self._sample()
            self._publish_progress()

    def _recount(self) -> None:
        """The job's counts as the store has them: other workers finish items too."""
        if self._store is None or self._info is None or self._writer.save_error is not None:
            return
        try:
            counts = self._store.counts(self._info.id)
            served = self._store.served_by_model(self._info.id)
        except BatchError as e:
            self._writer.store_failing(e)
            return
        self._writer.count(done=counts[ItemState.DONE], failed=counts[ItemState.FAILED], per_model=served)

    async def _renew_leases(self) -> None:
        """Keep the leases of every item this worker holds (queued, in flight, parked, or with
        an answer not committed yet); a worker that stops renewing gives them back."""
        while True:
            await self.clock.sleep(self.lease_ttl / 3)
            if self._store is None or self._info is None:
                continue
            keys = sorted({*self._active, *self._scheduler.held(), *self._writer.unwritten()})
            try:
                self._store.renew(self._info.id, keys)
            except BatchError as e:
                self._writer.store_failing(e)

    async def _close(self, final: JobState) -> None:
        """Put unanswered items back, commit everything, give up the lease."""
        store = self._store
        if store is None:
            return
        try:
            for item in list(self._active.values()):
                self._record(item, back(item), None)
            self._phase = final
            if final is JobState.HALTED and self._halt is not None:
                self._message = str(self._halt)
            gone = self._writer.save_error if isinstance(self._writer.save_error, DatabaseGone) else store.gone()
            if gone is not None:
                # The last results go into the open file, and the rescue copies it out.
                store.keep_open_file()
                self._writer.save_error = gone
                if self._halt is None:  # found only now, as the job ended
                    self._halt = self._writer.halt_error(gone)
            if self._info is not None:
                try:
                    self._writer.flush(force=True)
                    if store.shared:
                        self._recount()
                    p = self.progress()
                    # An ingest cut short stays "ingesting": the next run goes on reading the file.
                    state = final if self._info.ingested else JobState.INGESTING
                    store.release(
                        self._info.id,
                        self._owner,
                        state=state,
                        message=self._message,
                        counters=counters(p),
                        heartbeat=self.clock.wall(),
                        updated=self.clock.wall(),
                    )
                except BatchError as e:
                    # Still unwritable: what is not saved is sent again on resume (a lease of a
                    # process that is gone is free). The first cause is the one to report.
                    lease.forget_owner(self._owner)
                    self._writer.save_error = self._writer.save_error or e
                    if self._halt is None:
                        self._halt = BatchError(
                            f"job {self.job!r} stopped: its last results cannot be saved: {e}; "
                            f"run `capmon batch resume {self.job}` to send them again"
                        )
                    log.info("job %r: last save failed: %s", self.job, e)
                self.bus.publish(self.progress())
            if gone is not None:
                self._rescue(store)
        finally:
            store.close()
            self._store = None
            self._writer.unbind()

    def _rescue(self, store: Store) -> None:
        """The database was deleted or replaced under the job: its file lives on only while this
        connection holds it open, so copy it out (every result, the last ones included) and say where."""
        done = self._writer.done
        try:
            copy = store.rescue()
        except BatchError as e:
            self._halt = DatabaseGone(
                f"{self._halt}; its {done} saved results could not be copied out ({e}) and are lost: "
                f"the job must be run again"
            )
            return
        self._halt = DatabaseGone(
            f"{self._halt}; the job as it stood ({done} done) was copied from the still-open file to {copy}: "
            f"to go on, move it back (mv {copy} {store.where}) or pass --db {copy}, "
            f"then run `capmon batch resume {self.job}`"
        )

    # ------------------------------------------------------------ opening

    async def _open(self) -> None:
        store = self._store = open_store(self.db_path, lease_ttl=self.lease_ttl)
        waited = False
        # Ingest happens once: in a shared store another worker may be creating or reading the job.
        while not store.lock_ingest(self.job):
            if not waited:
                self._note(f"job {self.job!r}: another worker is reading its input; waiting for it", "info")
                waited = True
            await self.clock.sleep(INGEST_WAIT)
        try:
            await self._open_locked(store)
        finally:
            store.unlock_ingest(self.job)

    async def _open_locked(self, store: Store) -> None:
        ingest = Ingest(
            store,
            self.job,
            self.input_path,
            models=self.client.model_names(),
            clock=self.clock,
            accept_changed_input=self.accept_changed_input,
            note=self._note,
        )
        info = store.job(self.job)
        wall = self.clock.wall()
        created = info is None
        if info is None:
            info = ingest.create(self._settings({}))
        store.claim(info.id, self._owner, wall)
        self._writer.bind(store, info.id)
        try:
            free = self._writer.free_bytes()
            if free is not None and free < LOW_DISK_BYTES:
                raise BatchError(
                    f"{store.where}: database or disk is full: {free:,} bytes free on the disk that holds "
                    f"it; nothing was sent; free space, then run `capmon batch resume {self.job}`"
                )
            if not created:  # a new job was fingerprinted a moment ago
                info = ingest.check(info)
        except BaseException:
            store.release(info.id, self._owner)  # refused: the job stays as it was
            raise
        self._info = info
        if not info.ingested:
            self._phase = JobState.INGESTING
            try:
                info = self._info = await ingest.read(info, self._ingested)
            except Refused:
                self._info = None  # deleted: nothing to release
                raise
        try:
            self._remap = ingest.remap(info, self._remap_asked)
        except BaseException:
            self._info = None
            store.release(info.id, self._owner)
            raise
        store.requeue_in_flight(info.id)
        store.set_job(info.id, settings=self._settings(info.settings), state=JobState.RUNNING, message="", updated=wall)
        counts = store.counts(info.id)
        self._total = info.total
        self._writer.count(
            done=counts[ItemState.DONE], failed=counts[ItemState.FAILED], per_model=store.served_by_model(info.id)
        )
        self._scheduler.load_parked(store.parked(info.id), wall)
        self._cap.spent = sum(row[3] for row in store.spend(self.job))  # its earlier runs'
        if self._cap.add(None):  # reached already: nothing is sent
            self._cap_reached()

    def _ingested(self, total: int) -> None:
        self._total = total

    def _settings(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **saved,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "window": str(self.window) if self.window else None,
            "max_response_bytes": self.max_response_bytes,
            "remap": self._remap,
            "max_cost": self._cap.cap,
        }

    def _page(self, after_key: int, limit: int) -> list[StoredItem] | None:
        assert self._store is not None and self._info is not None
        try:
            page = self._store.take(self._info.id, after_key, limit)
        except BatchError as e:
            if not self._store.shared:
                raise
            # The server is unreachable: sending pauses (visibly) until a save succeeds again.
            self._writer.store_failing(e)
            return None
        if page and self._store.shared:
            # An item of ours whose lease ran out (the server was away) can come back to us: held once.
            held = {*self._active, *self._scheduler.held()}
            page = [i for i in page if i.key not in held] or None
        return page

    # ------------------------------------------------------------ workers

    async def _worker(self) -> None:
        sched = self._scheduler
        while self._halt is None:
            if not await sched.gates():
                return
            item = sched.take()
            if item is None:
                if sched.drained and not self._active:
                    sched.notify()  # the others may be idle, waiting for a park that will not come
                    return
                await sched.idle()
                continue
            if sched.rated:
                await sched.pace()
                if not sched.may_start():
                    sched.put_back(item)
                    continue
            if self._writer.disk_full():
                sched.put_back(item)
                continue
            if sched.halted:  # the cap was reached while this worker waited for its pace: not sent
                sched.put_back(item)
                return
            await self._send(item)

    def _request(self, item: StoredItem) -> Request:
        model = self._remap.get(item.model, item.model) if item.model else None
        return request_of(item, model=model, job=self.job)

    async def _answer(self, request: Request) -> ChatResult:
        """An item's whole answer. Streamed when the job asks (``RunnerOptions.stream``,
        ``capmon batch run --stream``): a stream that breaks mid-answer is continued
        (``[client] continuations``; capmon/core/routing/continuation.py), so 2,000 tokens of an
        answer are not lost to a 529 near the end; the stream is read to its end and its result
        is the whole answer. Else (or from a client that only answers plainly) plain: a plain
        answer that breaks is a transient failure, sent again whole."""
        stream_chunks = getattr(self.client, "stream_chunks", None)
        if not self.options.stream or stream_chunks is None:
            return await self.client.chat(request)
        asked = dataclasses.replace(request, extra={**request.extra, "stream_options": {"include_usage": True}})
        stream = stream_chunks(asked)
        try:
            async for _ in stream:
                pass
        finally:
            await stream.aclose()
        if stream.result is None:  # a stream that ended without its end: never taken as an answer
            raise RequestFailed(
                Failure(Kind.TRANSIENT, "the stream ended before its answer was whole"), stream.attempts
            )
        result: ChatResult = stream.result
        return result

    async def _send(self, item: StoredItem) -> None:
        self._active[item.key] = item
        self._attempt_base[item.id] = item.attempts
        self._writer.started(item.key)
        self.sent += 1
        try:
            result = await self._answer(self._request(item))
        except asyncio.CancelledError:
            self._record(item, back(item), None)
            raise
        except RequestFailed as e:
            self._apply(item, self._policy.request_failed(item, e))
        except Exception as e:
            log.exception("item %s: the client raised %s", item.id, type(e).__name__)
            self._apply(item, self._policy.raised(item, e))
        else:
            self._apply(item, self._policy.done(item, result))

    def _apply(self, item: StoredItem, verdict: Verdict) -> None:
        self._record(item, verdict.outcome, verdict.finished)
        if verdict.park is not None:
            self._scheduler.park(*verdict.park)
        if verdict.halt is not None:
            self._stop_for(verdict.halt)

    def _record(self, item: StoredItem, outcome: Outcome, finished: Finish | None) -> None:
        """Hand an outcome to the writer; done / failed ones count once committed."""
        self._active.pop(item.key, None)
        self._attempt_base.pop(item.id, None)
        self._writer.record(outcome, None if finished is None else (item.id, *finished))
        if not self._active:
            self._scheduler.notify()

    # ------------------------------------------------------------ stopping

    def _spent(self, request: Request, attempt: Attempt) -> None:
        """The client's observer: an answer of this job counts its cost toward the cap."""
        if request.job == self.job and attempt.cost is not None and self._cap.add(attempt.cost):
            self._cap_reached()

    def _cap_reached(self) -> None:
        """Start nothing more; the items in flight finish and their answers are kept, then
        the run ends paused (``run`` sees the cap reached)."""
        cap = self._cap
        self._message = (
            f"spend {text.usd(cap.spent)} reached --max-cost {text.usd(cap.cap)}: paused, the items in flight "
            f"finish; `capmon batch resume {self.job} --max-cost USD` raises the cap"
        )
        self._note(self._message)
        self._scheduler.halt()  # every worker ends once its item is answered; none is cancelled
        self._publish_progress()

    def _stop_for(self, error: BatchError) -> None:
        """Halt the job: start nothing more, and cancel what is in flight (it would only
        fail the same way, or wait for a key that will not come back soon); those items
        go back to pending."""
        if self._halt is not None:
            return
        self._halt = error
        self.bus.publish(ev.Notice(at=self.clock.now(), wall=self.clock.wall(), level="error", message=str(error)))
        self._scheduler.halt()  # paused workers must see the halt too
        me = asyncio.current_task()
        for w in self._workers:
            if w is not me:
                w.cancel()

    def _save_failing(self, error: BatchError) -> None:
        """The writer's first failed save: start nothing new until one succeeds (what is in flight finishes)."""
        self._scheduler.block()
        self._message = (
            f"cannot save results: {error}; sending paused (the items in flight finish); the job halts "
            f"if saving still fails in {self._writer.give_up:g}s"
        )
        self._note(self._message, "error")
        self._publish_progress()

    def _saved_again(self) -> None:
        self._message = ""
        self._scheduler.unblock()
        self._note(f"job {self.job!r}: results are saved again; sending goes on", "info")
