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
import collections
import dataclasses
import json
import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capmon.audit import AuditLog, RunnerDecision
from capmon.batch import lease
from capmon.batch.client import BatchClient
from capmon.batch.defaults import DEFAULT_CONCURRENCY
from capmon.batch.ingest import Ingest, Refused
from capmon.batch.pacing import Pacing, Window
from capmon.batch.scheduler import Scheduler
from capmon.batch.states import BatchKind, ItemState, JobState
from capmon.batch.store import DatabaseGone, JobInfo, JobStore, Outcome, StoredItem
from capmon.batch.writer import LOW_DISK_BYTES, WRITE_GIVE_UP, ResultWriter
from capmon.core import events as ev
from capmon.core.clock import Clock
from capmon.core.errors import Kind
from capmon.core.exceptions import BatchError, CapmonError, DeadlineExceeded, RequestFailed
from capmon.core.result import Attempt, ChatRequest, ChatResult

log = logging.getLogger("capmon.batch")

# Kinds the runner parks: they say "not now", not "never".
PARK_KINDS = frozenset({Kind.CAPACITY, Kind.RATE_LIMITED, Kind.TRANSIENT})
# Kinds that say "not with this key": the job halts until a person fixes it.
HALT_KINDS = frozenset({Kind.AUTH, Kind.QUOTA})
MAX_ERROR_MESSAGE = 2000  # characters of an error message stored with an item
RATE_SPAN = 30.0  # seconds of history behind the rate shown

_SURROGATE = re.compile("[\ud800-\udfff]")


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
    db_path: Path

    @property
    def ok(self) -> bool:
        return self.state is JobState.FINISHED and self.failed == 0


def _utf8_size(text: str) -> tuple[int, str]:
    """(bytes, text) of an answer as stored: a lone surrogate (a JSON "\\ud800") cannot
    be stored, so it becomes U+FFFD."""
    if text.isascii():
        return len(text), text
    try:
        return len(text.encode("utf-8")), text
    except UnicodeEncodeError:
        text = _SURROGATE.sub("\ufffd", text)
        return len(text.encode("utf-8")), text


def _cap(message: str | None) -> str | None:
    if message is None or len(message) <= MAX_ERROR_MESSAGE:
        return message
    return message[: MAX_ERROR_MESSAGE - 1] + "…"


# (ok, model, kind) of a finished item, for its BatchItemDone.
Finish = tuple[bool, str | None, str | None]


def _failed(item: StoredItem, attempts: int, first: str | None, kind: str, message: str | None) -> Outcome:
    """An item that failed for good, with why."""
    return Outcome(
        item.key,
        ItemState.FAILED,
        attempts=attempts,
        parks=item.parks,
        first_model=first,
        error_kind=kind,
        error_message=message,
    )


class BatchRunner:
    def __init__(
        self,
        client: BatchClient,
        db_path: Path,
        job: str,
        *,
        input_path: Path | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        rate: float | None = None,
        window: Window | str | None = None,
        clock: Clock | None = None,
        bus: ev.EventBus | None = None,
        flush_interval: float = 0.1,
        flush_rows: int = 500,
        progress_interval: float = 0.5,
        park_base: float = 5.0,
        park_cap: float = 300.0,
        rng: random.Random | None = None,
        accept_changed_input: bool = False,
        remap: Mapping[str, str] | None = None,
        write_give_up: float = WRITE_GIVE_UP,
    ) -> None:
        if not job or not job.strip():
            raise BatchError("a job needs a name")
        self.pacing = Pacing.of(concurrency, rate, window)
        self.client = client
        self.db_path = Path(db_path)
        self.job = job
        self.input_path = Path(input_path) if input_path is not None else None
        self.concurrency = self.pacing.concurrency
        self.rate = self.pacing.rate
        self.window = self.pacing.window
        self.clock: Clock = clock or client.clock
        self.bus: ev.EventBus = bus or client.bus
        self.progress_interval = progress_interval
        self.accept_changed_input = accept_changed_input
        self._remap_asked = dict(remap or {})
        self._remap: dict[str, str] = {}
        self.max_response_bytes = client.config.client.max_response_bytes

        self._store: JobStore | None = None
        self._info: JobInfo | None = None
        self._owner = lease.new_owner()
        self._phase = JobState.STARTING  # then ingesting, running, and at the end finished | stopped | halted
        self._message = ""
        self._halt: BatchError | None = None
        self._total: int | None = None
        self._active: dict[int, StoredItem] = {}  # in flight, by key
        self._attempt_base: dict[str, int] = {}  # item id -> attempts before this send (audit numbering)
        self._rate_samples: collections.deque[tuple[float, int]] = collections.deque()
        self._workers: list[asyncio.Task[None]] = []
        self.sent = 0

        self._scheduler = Scheduler(
            self.clock, self.pacing, self._page, park_base=park_base, park_cap=park_cap, rng=rng
        )
        self._audit = AuditLog(
            clock=self.clock,
            accept=lambda r: r.job == self.job,
            numbering=lambda r, a: self._attempt_base.get(r.item_id or "", 0) + a.number,
        )
        self._writer = ResultWriter(
            job,
            self.db_path,
            self.clock,
            self.bus,
            self._audit,
            job_fields=self._job_fields,
            on_failing=self._save_failing,
            on_saved=self._saved_again,
            on_give_up=self._stop_for,
            flush_interval=flush_interval,
            flush_rows=flush_rows,
            give_up=write_give_up,
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

    def _rate_now(self) -> float:
        s = self._rate_samples
        if len(s) < 2 or s[-1][0] - s[0][0] < 1.0:
            return 0.0
        return (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])

    def _sample(self) -> None:
        now = self.clock.now()
        self._rate_samples.append((now, self._writer.done + self._writer.failed))
        while len(self._rate_samples) > 2 and now - self._rate_samples[0][0] > RATE_SPAN:
            self._rate_samples.popleft()

    def progress(self) -> ev.BatchProgress:
        """Cheap, in-memory counters. ``done`` and ``failed`` count committed results only."""
        now, wall = self.clock.now(), self.clock.wall()
        w = self._writer
        state = self._state()
        in_flight = len(self._active) + w.finished_uncommitted
        parked = self._scheduler.parked
        total = self._total
        pending = max(0, total - w.done - w.failed - parked - in_flight) if total is not None else 0
        rate = self._rate_now() if state is JobState.RUNNING else 0.0
        remaining = (total - w.done - w.failed) if total is not None else None
        eta = remaining / rate if rate > 0 and remaining is not None else None
        opens = self.window.opens_at(wall) if state is JobState.WAITING_WINDOW and self.window else None
        return ev.BatchProgress(
            at=now,
            wall=wall,
            job=self.job,
            total=total,
            done=w.done,
            failed=w.failed,
            parked=parked,
            pending=pending,
            in_flight=in_flight,
            per_model=tuple(w.per_model.most_common()),
            rate=rate,
            eta=eta,
            state=state,
            opens_at=opens,
            message=self._message,
        )

    @staticmethod
    def _counters(p: ev.BatchProgress) -> dict[str, Any]:
        return {
            "done": p.done,
            "failed": p.failed,
            "parked": p.parked,
            "pending": p.pending,
            "in_flight": p.in_flight,
            "per_model": dict(p.per_model),
            "rate": round(p.rate, 3),
            "eta": None if p.eta is None else round(p.eta, 1),
            "opens_at": p.opens_at,
        }

    def _job_fields(self) -> dict[str, Any]:
        """What every commit writes to the job row: the counters it makes true."""
        p = self.progress()
        return {"counters": self._counters(p), "state": p.state, "message": self._message}

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
        detach = None
        tasks: list[asyncio.Task[Any]] = []
        final = JobState.STOPPED
        try:
            await self._open()
            detach = self.client.add_observer(self._audit.observe)
            self._phase = JobState.RUNNING
            self._sample()
            self._publish_progress()
            workers = self._workers = [
                asyncio.create_task(self._worker(), name=f"capmon-batch:{self.job}:{i}")
                for i in range(self.concurrency)
            ]
            tasks = [*workers, asyncio.create_task(self._writer.run()), asyncio.create_task(self._ticker())]
            # Not gather: on a halt the workers are cancelled, and that is not this task's cancellation.
            await asyncio.wait(workers)
            for w in workers:
                if not w.cancelled() and (error := w.exception()) is not None:
                    raise error
            final = JobState.HALTED if self._halt is not None else JobState.FINISHED
        finally:
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if detach is not None:
                detach()
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
        while True:
            await self.clock.sleep(self.progress_interval)
            self._sample()
            self._publish_progress()

    async def _close(self, final: JobState) -> None:
        """Put unanswered items back, commit everything, give up the lease."""
        store = self._store
        if store is None:
            return
        try:
            for item in list(self._active.values()):
                self._record(item, self._back(item), None)
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
                    p = self.progress()
                    # An ingest cut short stays "ingesting": the next run goes on reading the file.
                    state = final if self._info.ingested else JobState.INGESTING
                    store.release(
                        self._info.id,
                        self._owner,
                        state=state,
                        message=self._message,
                        counters=self._counters(p),
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

    def _rescue(self, store: JobStore) -> None:
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
            f"to go on, move it back (mv {copy} {store.path}) or pass --db {copy}, "
            f"then run `capmon batch resume {self.job}`"
        )

    # ------------------------------------------------------------ opening

    async def _open(self) -> None:
        store = self._store = JobStore(self.db_path)
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
                    f"{self.db_path}: database or disk is full: {free:,} bytes free on the disk that holds "
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
        }

    def _page(self, after_key: int, limit: int) -> list[StoredItem]:
        assert self._store is not None and self._info is not None
        return self._store.pending_page(self._info.id, after_key, limit)

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
            await self._send(item)

    def _request(self, item: StoredItem) -> ChatRequest:
        model = self._remap.get(item.model, item.model) if item.model else None
        return ChatRequest(
            messages=tuple(json.loads(item.messages_json)),
            model=model,
            max_tokens=item.max_tokens,
            temperature=item.temperature,
            item_id=item.id,
            job=self.job,
        )

    async def _send(self, item: StoredItem) -> None:
        self._active[item.key] = item
        self._attempt_base[item.id] = item.attempts
        self._writer.started(item.key)
        self.sent += 1
        try:
            result = await self.client.chat(self._request(item))
        except asyncio.CancelledError:
            self._record(item, self._back(item), None)
            raise
        except RequestFailed as e:
            self._on_failed(item, e)
        except Exception as e:
            log.exception("item %s: the client raised %s", item.id, type(e).__name__)
            kind = BatchKind.INTERNAL if not isinstance(e, CapmonError) else BatchKind.ERROR
            failed = _failed(item, item.attempts, item.first_model, kind, _cap(f"{type(e).__name__}: {e}"))
            self._record(item, failed, (False, None, kind))
        else:
            self._on_done(item, result)

    # ------------------------------------------------------------ what became of an item

    @staticmethod
    def _back(item: StoredItem, attempts: int | None = None, first: str | None = None) -> Outcome:
        """Back to pending, as it was (a parked item keeps its parks and due time)."""
        return Outcome(
            item.key,
            ItemState.PENDING,
            attempts=item.attempts if attempts is None else attempts,
            parks=item.parks,
            not_before=item.not_before,
            first_model=first or item.first_model,
        )

    def _on_done(self, item: StoredItem, result: ChatResult) -> None:
        first = item.first_model or (result.attempts[0].model if result.attempts else result.model)
        attempts = item.attempts + len(result.attempts)
        size, content = _utf8_size(result.content or "")
        if size > self.max_response_bytes:
            self._refuse_oversized(item, result, size, attempts, first)
            return
        usage = result.usage if isinstance(result.usage, dict) else dict(result.usage or {})
        sent_max: int | None
        try:
            cap = self.client.config.model(result.model).max_tokens
            sent_max = min(item.max_tokens or cap, cap)
        except KeyError:
            sent_max = item.max_tokens
        outcome = Outcome(
            item.key,
            ItemState.DONE,
            attempts=attempts,
            parks=item.parks,
            first_model=first,
            model=result.model,
            endpoint=result.endpoint,
            content=content if result.content is not None else None,
            fell_back=result.fell_back or first != result.model,
            max_tokens=sent_max,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            latency=result.latency,
        )
        self._record(item, outcome, (True, result.model, None))

    def _refuse_oversized(
        self, item: StoredItem, result: ChatResult, size: int, attempts: int, first: str | None
    ) -> None:
        reason = (
            f"the answer from {result.model} is {size:,} bytes, over client.max_response_bytes "
            f"({self.max_response_bytes:,}): not stored"
        )
        last = result.attempts[-1] if result.attempts else None
        self._audit.decision(
            RunnerDecision.REFUSE,
            job=self.job,
            item=item.id,
            attempt=attempts,
            model=result.model,
            endpoint=result.endpoint,
            key_alias=last.key_alias if last else None,
            status=last.status if last else None,
            kind=Kind.OVERSIZED,
            reason=reason,
        )
        self._record(item, _failed(item, attempts, first, Kind.OVERSIZED, reason), (False, None, Kind.OVERSIZED))

    def _on_failed(self, item: StoredItem, e: RequestFailed) -> None:
        kind = e.failure.kind
        attempts = item.attempts + len(e.attempts)
        first = item.first_model or (e.attempts[0].model if e.attempts else None)
        if isinstance(e, DeadlineExceeded) or kind in PARK_KINDS:
            self._park(item, e, attempts, first)
        elif kind in HALT_KINDS:
            self._record(item, self._back(item, attempts, first), None)
            self._stop_for(BatchError(_halt_message(self.job, kind, str(e))))
        else:
            self._record(item, _failed(item, attempts, first, kind, _cap(str(e))), (False, None, kind))

    def _park(self, item: StoredItem, e: RequestFailed, attempts: int, first: str | None) -> None:
        parks = item.parks + 1
        hint = e.failure.retry_after
        delay = self._scheduler.park_delay(parks, hint)
        last: Attempt | None = e.attempts[-1] if e.attempts else None
        self._audit.decision(
            RunnerDecision.PARK,
            job=self.job,
            item=item.id,
            attempt=attempts,
            model=last.model if last else None,
            endpoint=last.endpoint if last else None,
            key_alias=last.key_alias if last else None,
            status=e.failure.status,
            kind=e.failure.kind,
            hint=hint,
            wait=delay,
            reason=f"parked for {delay:.1f}s (park {parks}): {e}",
        )
        due_wall = self.clock.wall() + delay
        parked = dataclasses.replace(item, attempts=attempts, parks=parks, not_before=due_wall, first_model=first)
        self._record(
            item,
            Outcome(item.key, ItemState.PARKED, attempts=attempts, parks=parks, not_before=due_wall, first_model=first),
            None,
        )
        self._scheduler.park(parked, delay)

    def _record(self, item: StoredItem, outcome: Outcome, finished: Finish | None) -> None:
        """Hand an outcome to the writer; done / failed ones count once committed."""
        self._active.pop(item.key, None)
        self._attempt_base.pop(item.id, None)
        self._writer.record(outcome, None if finished is None else (item.id, *finished))
        if not self._active:
            self._scheduler.notify()

    # ------------------------------------------------------------ stopping

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


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _halt_message(job: str, kind: Kind, detail: str) -> str:
    if kind is Kind.AUTH:
        what = (
            "the provider refused the key (401/403): that is the key, not capacity; fix the key (or the model's access)"
        )
    else:
        what = (
            "a quota or spend limit is used up: that is billing, not capacity, and retrying will not help; "
            "raise the limit or wait for its reset"
        )
    return f"job {job!r} halted: {what}, then run `capmon batch resume {job}`. Last error: {detail}"
