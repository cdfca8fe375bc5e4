"""The batch writer: results, their audit rows and the job's counters, committed together.

* Outcomes are buffered and committed in one transaction every ``flush_interval``
  seconds (or every ``flush_rows`` outcomes), with the audit rows they belong with and
  the job row's counters, so another process always reads counters that match the
  items. An item counts as done only once its result is committed.
* With nothing to write the job row is still written every ``HEARTBEAT`` seconds: the
  lease's heartbeat, read by runners on other hosts.
* A failed commit is rolled back whole, and so is everything it was to make true: the
  counters go back, and the outcomes, events and audit rows wait in memory to be
  written by the next try. The first failure, or a disk found (nearly) full, calls
  ``on_failing``; the next commit that succeeds calls ``on_saved``; still failing after
  ``give_up`` seconds calls ``on_give_up`` with the error that halts the job.
* A database deleted or replaced under the job (:class:`~capmon.batch.sqlite.DatabaseGone`),
  or a store that refuses for a reason waiting cannot fix (a table dropped, a grant revoked:
  :class:`~capmon.batch.sqlite.StoreRefuses`), is not retried: it calls ``on_give_up`` at once.
* A shared store may discard an outcome (a late answer for an item another worker took
  once this one's lease expired): it is not counted, and a Notice says how many.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capmon.audit import AuditLog
from capmon.batch.pacing import wait_event
from capmon.batch.sqlite import DatabaseGone, Outcome, StoreRefuses
from capmon.batch.states import ItemState
from capmon.batch.store import Store
from capmon.core.base.clock import Clock
from capmon.core.base.exceptions import BatchError
from capmon.core.types import events as ev

HEARTBEAT = 5.0  # seconds between job-row writes when nothing else changes
WRITE_GIVE_UP = 30.0  # seconds of failing commits (a database locked by someone else) before halting
LOW_DISK_BYTES = 256 * 1024  # free space on the database's disk under which nothing new is sent

# What a finished item's BatchItemDone will say once committed: (item id, ok, model, kind).
Finished = tuple[str, bool, str | None, str | None]


class ResultWriter:
    """``job_fields()`` gives the job row's fields a commit writes (counters, state,
    message); it is called after the committed counters count the commit's outcomes."""

    def __init__(
        self,
        job: str,
        where: Path | str,
        clock: Clock,
        bus: ev.EventBus,
        audit: AuditLog,
        *,
        job_fields: Callable[[], dict[str, Any]],
        on_failing: Callable[[BatchError], None],
        on_saved: Callable[[], None],
        on_give_up: Callable[[BatchError], None],
        flush_interval: float = 0.1,
        flush_rows: int = 500,
        give_up: float = WRITE_GIVE_UP,
    ) -> None:
        self.job = job
        self.where = str(where)  # the store, as messages name it
        self.clock = clock
        self.bus = bus
        self.audit = audit
        self._job_fields = job_fields
        self._on_failing = on_failing
        self._on_saved = on_saved
        self._on_give_up = on_give_up
        self.flush_interval = flush_interval
        self.flush_rows = flush_rows
        self.give_up = give_up
        self._store: Store | None = None
        self._job_id = 0
        # Committed counters: what the database says.
        self.done = 0
        self.failed = 0
        self.per_model: collections.Counter[str] = collections.Counter()
        self.finished_uncommitted = 0  # done / failed outcomes waiting for their commit
        # Waiting to be written.
        self._started: dict[int, None] = {}  # keys sent since the last commit (an ordered set)
        self._outcomes: list[Outcome] = []
        self._events: list[tuple[int, Finished]] = []  # (key, its event): published as BatchItemDone once committed
        self.discarded = 0  # outcomes a shared store refused: another worker's items by then
        self._dirty = asyncio.Event()
        self._last_beat = float("-inf")
        self.save_error: BatchError | None = None  # the last failed save, while saving fails
        self._failing_since: float | None = None

    def bind(self, store: Store, job_id: int) -> None:
        """Write to ``store``'s job ``job_id``."""
        self._store, self._job_id = store, job_id

    def count(self, *, done: int, failed: int, per_model: dict[str, int]) -> None:
        """The committed counters, as the store has them when the job opens."""
        self.done, self.failed = done, failed
        self.per_model = collections.Counter(per_model)

    def unbind(self) -> None:
        """The store is closed: nothing more is written."""
        self._store = None

    # ------------------------------------------------------------ what happened

    def started(self, key: int) -> None:
        """An item was sent: written as in flight by the next commit."""
        self._started[key] = None
        self._dirty.set()

    def record(self, outcome: Outcome, finished: Finished | None) -> None:
        """Buffer an outcome (``finished``: a done or failed one, counted once committed)."""
        self._started.pop(outcome.key, None)  # never written as in flight: the outcome says it all
        self._outcomes.append(outcome)
        self._dirty.set()
        if finished is not None:
            self.finished_uncommitted += 1
            self._events.append((outcome.key, finished))
        if len(self._outcomes) >= self.flush_rows:
            self.flush_quietly()

    def unwritten(self) -> list[int]:
        """Keys of the outcomes waiting for their commit."""
        return [o.key for o in self._outcomes]

    @property
    def waiting(self) -> bool:
        return bool(self._outcomes or self._started or self.audit.pending)

    # ------------------------------------------------------------ writing

    def flush(self, force: bool = False) -> None:
        """Commit what waits (and the job row's fields); with nothing waiting, only a
        heartbeat when one is due, or when ``force``. Raises BatchError, with everything
        as it was, when the commit fails."""
        store = self._store
        if store is None:
            return
        wall = self.clock.wall()
        if not (self.waiting or force or self.clock.now() - self._last_beat >= HEARTBEAT):
            return
        outcomes, self._outcomes = self._outcomes, []
        events, self._events = self._events, []
        started = list(self._started)
        self._started.clear()
        rows = self.audit.drain()
        done = failed = 0
        per_model: collections.Counter[str] = collections.Counter()
        for o in outcomes:
            if o.state is ItemState.DONE:
                done += 1
                per_model[o.model or "?"] += 1
            elif o.state is ItemState.FAILED:
                failed += 1
        # The counters written are the ones this commit makes true.
        self.done += done
        self.failed += failed
        self.per_model.update(per_model)
        self.finished_uncommitted -= done + failed
        try:
            discarded = store.commit(
                self._job_id,
                started=started,
                outcomes=outcomes,
                audit_rows=rows,
                now=wall,
                job_fields={**self._job_fields(), "heartbeat": wall},
            )
        except BaseException:
            self.done -= done
            self.failed -= failed
            self.per_model.subtract(per_model)
            self.finished_uncommitted += done + failed
            self._outcomes[:0] = outcomes
            self._events[:0] = events
            self._started.update(dict.fromkeys(started))
            self.audit.requeue(rows)
            raise
        self._last_beat = at = self.clock.now()
        if discarded:
            self._uncount(outcomes, set(discarded))
            events = [e for e in events if e[0] not in discarded]
        publish = self.bus.publish
        for _, (item_id, ok, model, kind) in events:
            publish(ev.BatchItemDone(at=at, wall=wall, job=self.job, item_id=item_id, ok=ok, model=model, kind=kind))

    def _uncount(self, outcomes: list[Outcome], discarded: set[int]) -> None:
        """Outcomes the store discarded were counted as this commit's: they are not."""
        n = 0
        for o in outcomes:
            if o.key not in discarded:
                continue
            n += 1
            if o.state is ItemState.DONE:
                self.done -= 1
                self.per_model[o.model or "?"] -= 1
            elif o.state is ItemState.FAILED:
                self.failed -= 1
        self.discarded += n
        self.bus.publish(
            ev.Notice(
                at=self.clock.now(),
                wall=self.clock.wall(),
                level="info",
                message=f"job {self.job!r}: {n} late answers discarded: their leases had expired and other "
                f"workers took the items (each is stored once)",
            )
        )

    def flush_quietly(self) -> None:
        """Flush now; a failure pauses sending and is left to :meth:`run`, which retries
        (and gives up if the database stays unwritable)."""
        if self.save_error is not None:
            return  # run() is retrying already
        try:
            self.flush()
        except BatchError as e:
            self.failing(e)

    def failing(self, error: BatchError) -> None:
        """A save failed (or will: the disk is full): ``on_failing`` the first time; a
        database that is gone, or a store that refuses for good, halts the job at once."""
        before, self.save_error = self.save_error, error
        if isinstance(error, StoreRefuses):
            if not isinstance(before, StoreRefuses):
                self._on_give_up(self.halt_error(error))
            return
        first = before is None
        if first:
            self._failing_since = self.clock.now()
            self._on_failing(error)

    def store_failing(self, error: BatchError) -> None:
        """A shared store's claim or lease renewal failed (the server is unreachable): saving
        counts as failing, and :meth:`run` tries again at once rather than at the next beat."""
        self.failing(error)
        self._dirty.set()

    def halt_error(self, cause: BatchError) -> BatchError:
        """The error that halts the job because results cannot be saved."""
        lost = self.finished_uncommitted
        if isinstance(cause, DatabaseGone):
            return DatabaseGone(f"job {self.job!r} halted: results cannot be saved: {cause}; nothing more was sent")
        if isinstance(cause, StoreRefuses):
            return StoreRefuses(
                f"job {self.job!r} halted at once: {cause}; waiting cannot fix that, so nothing more was sent"
                + (f"; {lost} answers received since could not be saved and will be sent again" if lost else "")
                + f"; fix it, then run `capmon batch resume {self.job}`"
            )
        return BatchError(
            f"job {self.job!r} halted: results cannot be saved: {cause}; "
            f"nothing new was sent after the first failed save ({self.give_up:g}s ago), "
            f"every result saved before it is kept"
            + (f", {lost} answers received since could not be kept and will be sent again" if lost else "")
            + f"; fix it, then run `capmon batch resume {self.job}`"
        )

    def _saved(self) -> None:
        if self.save_error is None:
            return
        free = self.free_bytes()
        if free is not None and free < LOW_DISK_BYTES:
            return  # this save fitted, the next may not: stay paused
        self.save_error = None
        self._failing_since = None
        self._on_saved()

    async def run(self) -> None:
        """Commit every ``flush_interval`` while something waits, beat while nothing does;
        returns once saving has failed for ``give_up`` seconds (after ``on_give_up``)."""
        while True:
            if not (self.waiting or self.save_error):
                # Idle (paused, waiting for the window or a park): wake when something is sent, or to beat.
                await wait_event(self.clock, self._dirty, HEARTBEAT)
            self._dirty.clear()
            await self.clock.sleep(self.flush_interval)  # let a batch of results gather
            try:
                self.flush(force=self.save_error is not None)
            except BatchError as e:
                self.failing(e)
            else:
                self._saved()
            cause = self.save_error
            if isinstance(cause, DatabaseGone):
                return  # halted already, by failing()
            if (
                cause is not None
                and self._failing_since is not None
                and self.clock.now() - self._failing_since >= self.give_up
            ):
                self._on_give_up(self.halt_error(cause))
                return

    # ------------------------------------------------------------ the disk

    def free_bytes(self) -> int | None:
        return self._store.free_bytes() if self._store is not None else None

    def disk_full(self) -> bool:
        """True, and saving counted as failing, when the database's disk is (nearly) full."""
        free = self.free_bytes()
        if free is None or free >= LOW_DISK_BYTES:
            return False
        self.failing(
            BatchError(
                f"{self.where}: database or disk is full: {free:,} bytes free on the disk "
                f"that holds it (nothing is sent below {LOW_DISK_BYTES:,})"
            )
        )
        return True
