"""BatchRunner: send every item of a job through the shared client, durably.

* Items are read from the job database a page at a time and sent by a pool of
  ``concurrency`` workers; ``rate`` caps how many start per second and ``window``
  restricts starts to a daily off-peak window. Slowing down as capacity errors rise
  is the client's job (AIMD per target): the runner adds no throttle of its own.
* Results are buffered and committed in one transaction every ``flush_interval``
  seconds (or every ``flush_rows`` results), together with their audit rows and the
  job's counters. An item counts as done only once its result is committed, so a
  ``kill -9`` at any moment loses no result that was ever shown as done.
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
  database's disk is checked before every send, and under ``LOW_DISK_BYTES`` counts
  as a failed save.
* No answer larger than ``client.max_response_bytes`` is stored: such an item fails as
  ``oversized`` and its audit trail says so.
* The input is checked whole before anything is sent (see :mod:`capmon.batch.changes`),
  and items naming a model the config no longer has are refused unless ``remap``
  says where they go.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import heapq
import itertools
import json
import logging
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from capmon import audit
from capmon.audit import AuditLog
from capmon.batch import changes
from capmon.batch import store as st
from capmon.batch.items import BAD_INPUT, Item, parse_line, read_lines, sniff_file
from capmon.batch.pacing import RateGate, Window
from capmon.batch.progress import JobProgress
from capmon.batch.store import DEFAULT_MAX_RESPONSE_BYTES, OVERSIZED, JobInfo, JobStore, Outcome, StoredItem
from capmon.core import events as ev
from capmon.core.clock import Clock
from capmon.core.exceptions import BatchError, CapmonError, DeadlineExceeded, RequestFailed
from capmon.core.result import Attempt, ChatRequest, ChatResult

log = logging.getLogger("capmon.batch")

# Kinds the runner parks: they say "not now", not "never".
PARK_KINDS = frozenset({"capacity", "rate_limited", "transient"})
# Kinds that say "not with this key": the job halts until a person fixes it.
HALT_KINDS = frozenset({"auth", "quota"})
INTERNAL = "internal"  # the client raised something it should not have: a bug, kept visible
MAX_ERROR_MESSAGE = 2000  # characters of an error message stored with an item

INGEST_CHUNK = 2000  # lines per ingest transaction
RATE_SPAN = 30.0  # seconds of history behind the rate shown
HEARTBEAT = 5.0  # seconds between job-row writes when nothing else changes
WRITE_GIVE_UP = 30.0  # seconds of failing commits (a database locked by someone else) before halting
LOW_DISK_BYTES = 256 * 1024  # free space on the database's disk under which nothing new is sent


@dataclass(frozen=True)
class JobSummary:
    job: str
    total: int
    done: int
    failed: int
    parked: int
    pending: int
    state: str  # finished | stopped | halted
    per_model: tuple[tuple[str, int], ...]
    sent: int  # items sent by this run
    elapsed: float  # clock seconds this run took
    db_path: Path

    @property
    def ok(self) -> bool:
        return self.state == "finished" and self.failed == 0


FINGERPRINT_PREFIX = "sha256:"
_SURROGATE = re.compile("[\ud800-\udfff]")


def fingerprint(path: Path) -> tuple[int, str]:
    """(size, "sha256:" + hash of the whole file), read in blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return size, FINGERPRINT_PREFIX + h.hexdigest()


def _legacy_fingerprint(path: Path) -> tuple[int, str]:
    """What schema-1 jobs stored: (size, hash of the first 64 KiB)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        size = f.seek(0, 2)
    return size, hashlib.sha256(head).hexdigest()[:32]


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
    return message[:MAX_ERROR_MESSAGE - 1] + "…"


class BatchRunner:
    def __init__(self, client: Any, db_path: Path, job: str, *, input_path: Path | None = None,
                 concurrency: int = 16, rate: float | None = None, window: str | None = None,
                 clock: Clock | None = None, bus: ev.EventBus | None = None,
                 flush_interval: float = 0.1, flush_rows: int = 500, progress_interval: float = 0.5,
                 park_base: float = 5.0, park_cap: float = 300.0, rng: random.Random | None = None,
                 accept_changed_input: bool = False, remap: Mapping[str, str] | None = None,
                 write_give_up: float = WRITE_GIVE_UP) -> None:
        if not job or not job.strip():
            raise BatchError("a job needs a name")
        if concurrency < 1:
            raise BatchError(f"--concurrency: expected a whole number >= 1, got {concurrency}")
        self.client = client
        self.db_path = Path(db_path)
        self.job = job
        self.input_path = Path(input_path) if input_path is not None else None
        self.concurrency = concurrency
        self.clock: Clock = clock or client.clock
        self.bus: ev.EventBus = bus or client.bus
        self.rate = rate
        self.window = Window.parse(window) if window else None
        self._rate_gate = RateGate(rate, self.clock) if rate else None
        self.flush_interval = flush_interval
        self.flush_rows = flush_rows
        self.progress_interval = progress_interval
        self.park_base = park_base
        self.park_cap = park_cap
        self._rng = rng or random.Random()
        self.accept_changed_input = accept_changed_input
        self._remap_asked = dict(remap or {})
        self._remap: dict[str, str] = {}
        self.write_give_up = write_give_up
        self.max_response_bytes = _max_response_bytes(client)

        self._store: JobStore | None = None
        self._info: JobInfo | None = None
        self._owner = st.new_owner()
        self._phase = "starting"  # starting | ingesting | running | finished | stopped | halted
        self._message = ""
        self._paused = False
        self._unpaused = asyncio.Event()
        self._unpaused.set()
        self._changed = asyncio.Event()
        self._dirty = asyncio.Event()  # something waits to be written
        self._halt: BatchError | None = None

        # Committed counters: what the database says.
        self._total: int | None = None
        self._done = 0
        self._failed = 0
        self._per_model: collections.Counter[str] = collections.Counter()
        # In memory, not yet (or never) in the database.
        self._queue: collections.deque[StoredItem] = collections.deque()
        self._after_key = 0
        self._exhausted = False
        self._parked: list[tuple[float, int, StoredItem]] = []  # heap of (due on the clock, key, item)
        self._active: dict[int, StoredItem] = {}
        self._attempt_base: dict[str, int] = {}  # item id -> attempts before this send (audit numbering)
        self._started: dict[int, None] = {}  # keys sent since the last commit (ordered set)
        self._outcomes: list[Outcome] = []
        self._pending_events: list[tuple[str, bool, str | None, str | None]] = []  # BatchItemDone after commit
        self._finished_uncommitted = 0  # done / failed outcomes waiting for their commit
        self._audit = AuditLog(None, clock=self.clock, accept=lambda r: r.job == self.job,
                               numbering=lambda r, a: self._attempt_base.get(r.item_id or "", 0) + a.number)
        self._rate_samples: collections.deque[tuple[float, int]] = collections.deque()
        self._last_beat = float("-inf")
        self._write_failing_since: float | None = None
        self._save_error: BatchError | None = None  # the last failed save, while saving fails
        self._saveable = asyncio.Event()
        self._saveable.set()
        self._workers: list[asyncio.Task[None]] = []
        self.sent = 0

    # ------------------------------------------------------------ control

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def save_error(self) -> BatchError | None:
        """Why results cannot be saved right now (sending is paused meanwhile), or None."""
        return self._save_error

    def pause(self) -> None:
        """Start nothing new; items in flight finish."""
        self._paused = True
        self._unpaused.clear()

    def resume(self) -> None:
        self._paused = False
        self._unpaused.set()
        self._notify()

    def toggle_pause(self) -> bool:
        (self.resume if self._paused else self.pause)()
        return self._paused

    # ------------------------------------------------------------ progress

    def _state(self) -> str:
        if self._phase != "running":
            return self._phase
        if self._paused or self._save_error is not None:
            return "paused"
        if self.window is not None and not self.window.is_open(self.clock.wall()):
            return "waiting-window"
        return "running"

    def _rate_now(self) -> float:
        s = self._rate_samples
        if len(s) < 2 or s[-1][0] - s[0][0] < 1.0:
            return 0.0
        return (s[-1][1] - s[0][1]) / (s[-1][0] - s[0][0])

    def _sample(self) -> None:
        now = self.clock.now()
        self._rate_samples.append((now, self._done + self._failed))
        while len(self._rate_samples) > 2 and now - self._rate_samples[0][0] > RATE_SPAN:
            self._rate_samples.popleft()

    def progress(self) -> JobProgress:
        """Cheap, in-memory counters. ``done`` and ``failed`` count committed results only."""
        now, wall = self.clock.now(), self.clock.wall()
        state = self._state()
        in_flight = len(self._active) + self._finished_uncommitted
        parked = len(self._parked)
        total = self._total
        pending = max(0, total - self._done - self._failed - parked - in_flight) if total is not None else 0
        rate = self._rate_now() if state == "running" else 0.0
        remaining = (total - self._done - self._failed) if total is not None else None
        eta = remaining / rate if rate > 0 and remaining is not None else None
        opens = self.window.opens_at(wall) if state == "waiting-window" and self.window else None
        return JobProgress(
            at=now, wall=wall, job=self.job, total=total, done=self._done, failed=self._failed, parked=parked,
            pending=pending, in_flight=in_flight, per_model=tuple(self._per_model.most_common()), rate=rate,
            eta=eta, state=state, opens_at=opens, message=self._message,
        )

    def _counters(self, p: JobProgress) -> dict[str, Any]:
        return {"done": p.done, "failed": p.failed, "parked": p.parked, "pending": p.pending,
                "in_flight": p.in_flight, "per_model": dict(p.per_model), "rate": round(p.rate, 3),
                "eta": None if p.eta is None else round(p.eta, 1), "opens_at": p.opens_at}

    def _publish_progress(self) -> None:
        self.bus.publish(self.progress())

    # ------------------------------------------------------------ run

    async def run(self) -> JobSummary:
        """Ingest (if the job is new), then send until every item is done or failed."""
        t0 = self.clock.now()
        sent_before = self.sent
        detach = None
        tasks: list[asyncio.Task[Any]] = []
        final = "stopped"
        try:
            await self._open()
            detach = self._audit.attach(self.client)
            self._phase = "running"
            self._sample()
            self._publish_progress()
            workers = self._workers = [asyncio.create_task(self._worker(), name=f"capmon-batch:{self.job}:{i}")
                                       for i in range(self.concurrency)]
            tasks = [*workers, asyncio.create_task(self._writer()), asyncio.create_task(self._ticker())]
            # Not gather: on a halt the workers are cancelled, and that is not this task's cancellation.
            await asyncio.wait(workers)
            for w in workers:
                if not w.cancelled() and w.exception() is not None:
                    raise w.exception()  # type: ignore[misc]
            final = "halted" if self._halt is not None else "finished"
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

    def _summary(self, state: str, t0: float, sent_before: int) -> JobSummary:
        total = self._total or 0
        parked = len(self._parked)
        return JobSummary(job=self.job, total=total, done=self._done, failed=self._failed, parked=parked,
                          pending=max(0, total - self._done - self._failed - parked), state=state,
                          per_model=tuple(self._per_model.most_common()), sent=self.sent - sent_before,
                          elapsed=self.clock.now() - t0, db_path=self.db_path)

    async def _close(self, final: str) -> None:
        """Put unanswered items back, commit everything, give up the lease."""
        store = self._store
        if store is None:
            return
        try:
            for key, item in list(self._active.items()):
                self._record(item, Outcome(key, st.PENDING, attempts=item.attempts, parks=item.parks,
                                           not_before=item.not_before, first_model=item.first_model), None)
            self._phase = final
            if final == "halted" and self._halt is not None:
                self._message = str(self._halt)
            if self._info is not None:
                try:
                    self._flush(force=True)
                    p = self.progress()
                    # An ingest cut short stays "ingesting": the next run goes on reading the file.
                    state = final if self._info.ingested else "ingesting"
                    store.release(self._info.id, self._owner, state=state, message=self._message,
                                  counters=self._counters(p), heartbeat=self.clock.wall(), updated=self.clock.wall())
                except BatchError as e:
                    # Still unwritable: what is not saved is sent again on resume (a lease of a
                    # process that is gone is free). The first cause is the one to report.
                    st.forget_owner(self._owner)
                    self._save_error = self._save_error or e
                    if self._halt is None:
                        self._halt = BatchError(f"job {self.job!r} stopped: its last results cannot be saved: {e}; "
                                                f"run `capmon batch resume {self.job}` to send them again")
                    log.info("job %r: last save failed: %s", self.job, e)
                self.bus.publish(self.progress())
        finally:
            store.close()
            self._store = None

    async def _worker(self) -> None:
        while self._halt is None:
            if not await self._gates():
                return
            item = self._take()
            if item is None:
                if self._all_sent():
                    self._notify()  # the others may be idle, waiting for a park that will not come
                    return
                await self._idle()
                continue
            if self._rate_gate is not None:
                await self._rate_gate.wait()
                if self._halt is not None or self._paused or self._save_error is not None or not self._window_open():
                    self._put_back(item)
                    continue
            if self._disk_full():
                self._put_back(item)
                continue
            await self._send(item)

    def _window_open(self) -> bool:
        return self.window is None or self.window.is_open(self.clock.wall())

    async def _gates(self) -> bool:
        """Wait while paused, while results cannot be saved, or outside the window; False
        when the job is halting."""
        while self._halt is None:
            if self._paused:
                await self._unpaused.wait()
                continue
            if self._save_error is not None:
                await self._saveable.wait()
                continue
            if not self._window_open():
                assert self.window is not None
                wall = self.clock.wall()
                # Sleep in steps, so a clock that jumps (a laptop waking up) is noticed.
                await self._wait_changed(min(max(0.01, self.window.opens_at(wall) - wall), 60.0))
                continue
            return True
        return False

    def _all_sent(self) -> bool:
        return self._exhausted and not self._queue and not self._parked and not self._active

    def _take(self) -> StoredItem | None:
        # Within a microsecond counts as due: float noise must not leave a parked item a
        # hair in the future of a (fast-forwarded) clock that never gets there.
        if self._parked and self._parked[0][0] <= self.clock.now() + 1e-6:
            return heapq.heappop(self._parked)[2]
        if not self._queue and not self._exhausted:
            assert self._store is not None and self._info is not None
            page = self._store.pending_page(self._info.id, self._after_key, max(256, 4 * self.concurrency))
            if page:
                self._after_key = page[-1].key
                self._queue.extend(page)
            else:
                self._exhausted = True
        return self._queue.popleft() if self._queue else None

    def _put_back(self, item: StoredItem) -> None:
        if item.not_before is not None and item.parks:
            heapq.heappush(self._parked, (self.clock.now(), item.key, item))
        else:
            self._queue.appendleft(item)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_changed(self, timeout: float | None) -> None:
        await self._wait_event(self._changed, timeout)

    async def _wait_event(self, event: asyncio.Event, timeout: float | None) -> None:
        """Wait for ``event``, at most ``timeout`` seconds on the clock."""
        changed = asyncio.ensure_future(event.wait())
        if timeout is None:
            try:
                await changed
            finally:
                changed.cancel()
            return
        sleeper = asyncio.ensure_future(self.clock.sleep(timeout))
        try:
            await asyncio.wait({changed, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            sleeper.cancel()

    async def _idle(self) -> None:
        """Nothing to send now: wait for a parked item to fall due or for anything to change."""
        timeout = max(1e-3, self._parked[0][0] - self.clock.now()) if self._parked else None
        await self._wait_changed(timeout)

    # ------------------------------------------------------------ one item

    def _request(self, item: StoredItem) -> ChatRequest:
        model = self._remap.get(item.model, item.model) if item.model else None
        return ChatRequest(messages=tuple(json.loads(item.messages_json)), model=model,
                           max_tokens=item.max_tokens, temperature=item.temperature, item_id=item.id, job=self.job)

    async def _send(self, item: StoredItem) -> None:
        key = item.key
        self._active[key] = item
        self._attempt_base[item.id] = item.attempts
        self._started[key] = None
        self._dirty.set()
        self.sent += 1
        try:
            result = await self.client.chat(self._request(item))
        except asyncio.CancelledError:
            self._record(item, Outcome(key, st.PENDING, attempts=item.attempts, parks=item.parks,
                                       not_before=item.not_before, first_model=item.first_model), None)
            raise
        except RequestFailed as e:
            self._on_failed(item, e)
        except Exception as e:  # noqa: BLE001 - a client bug must fail one item, visibly, not the job
            log.exception("item %s: the client raised %s", item.id, type(e).__name__)
            kind = INTERNAL if not isinstance(e, CapmonError) else "error"
            self._record(item, Outcome(key, st.FAILED, attempts=item.attempts, parks=item.parks,
                                       first_model=item.first_model, error_kind=kind,
                                       error_message=_cap(f"{type(e).__name__}: {e}")), (False, None, kind))
        else:
            self._on_done(item, result)

    def _on_done(self, item: StoredItem, result: ChatResult) -> None:
        first = item.first_model or (result.attempts[0].model if result.attempts else result.model)
        attempts = item.attempts + len(result.attempts)
        size, content = _utf8_size(result.content or "")
        if size > self.max_response_bytes:
            self._refuse_oversized(item, result, size, attempts, first)
            return
        usage = result.usage if isinstance(result.usage, dict) else dict(result.usage or {})
        try:
            cap = self.client.config.model(result.model).max_tokens
            sent_max = min(item.max_tokens or cap, cap)
        except (AttributeError, KeyError):
            sent_max = item.max_tokens
        outcome = Outcome(
            item.key, st.DONE, attempts=attempts, parks=item.parks, first_model=first,
            model=result.model, endpoint=result.endpoint, content=content if result.content is not None else None,
            fell_back=result.fell_back or first != result.model, max_tokens=sent_max,
            prompt_tokens=_int(usage.get("prompt_tokens")), completion_tokens=_int(usage.get("completion_tokens")),
            latency=result.latency,
        )
        self._record(item, outcome, (True, result.model, None))

    def _refuse_oversized(self, item: StoredItem, result: ChatResult, size: int, attempts: int,
                          first: str | None) -> None:
        reason = (f"the answer from {result.model} is {size:,} bytes, over client.max_response_bytes "
                  f"({self.max_response_bytes:,}): not stored")
        last = result.attempts[-1] if result.attempts else None
        self._audit.decision(audit.REFUSE, job=self.job, item=item.id, attempt=attempts, model=result.model,
                             endpoint=result.endpoint, key_alias=last.key_alias if last else None,
                             status=last.status if last else None, kind=OVERSIZED, reason=reason)
        self._record(item, Outcome(item.key, st.FAILED, attempts=attempts, parks=item.parks, first_model=first,
                                   error_kind=OVERSIZED, error_message=reason), (False, None, OVERSIZED))

    def _on_failed(self, item: StoredItem, e: RequestFailed) -> None:
        kind = e.kind
        attempts = item.attempts + len(e.attempts)
        first = item.first_model or (e.attempts[0].model if e.attempts else None)
        if isinstance(e, DeadlineExceeded) or kind in PARK_KINDS:
            self._park(item, e, attempts, first)
        elif kind in HALT_KINDS:
            back = Outcome(item.key, st.PENDING, attempts=attempts, parks=item.parks, not_before=item.not_before,
                           first_model=first)
            self._record(item, back, None)
            self._stop_for(BatchError(_halt_message(self.job, kind, str(e))))
        else:
            self._record(item, Outcome(item.key, st.FAILED, attempts=attempts, parks=item.parks, first_model=first,
                                       error_kind=kind, error_message=_cap(str(e))), (False, None, kind))

    def _stop_for(self, error: BatchError) -> None:
        """Halt the job: start nothing more, and cancel what is in flight (it would only
        fail the same way, or wait for a key that will not come back soon); those items
        go back to pending."""
        if self._halt is not None:
            return
        self._halt = error
        self.bus.publish(ev.Notice(at=self.clock.now(), wall=self.clock.wall(), level="error", message=str(error)))
        self._unpaused.set()  # paused workers must see the halt too
        self._notify()
        me = asyncio.current_task()
        for w in self._workers:
            if w is not me:
                w.cancel()

    def _park(self, item: StoredItem, e: RequestFailed, attempts: int, first: str | None) -> None:
        parks = item.parks + 1
        delay = min(self.park_cap, self.park_base * 2 ** (parks - 1)) * self._rng.uniform(1.0, 1.5)
        hint = e.failure.retry_after
        if hint is not None and hint > delay:
            delay = hint
        last: Attempt | None = e.attempts[-1] if e.attempts else None
        kind = e.kind
        self._audit.park(job=self.job, item=item.id, attempt=attempts, model=last.model if last else None,
                         endpoint=last.endpoint if last else None, key_alias=last.key_alias if last else None,
                         status=e.failure.status, kind=kind, hint=hint, wait=delay,
                         reason=f"parked for {delay:.1f}s (park {parks}): {e}")
        due_wall = self.clock.wall() + delay
        parked = dataclasses.replace(item, attempts=attempts, parks=parks, not_before=due_wall, first_model=first)
        self._record(item, Outcome(item.key, st.PARKED, attempts=attempts, parks=parks, not_before=due_wall,
                                   first_model=first), None)
        heapq.heappush(self._parked, (self.clock.now() + delay, item.key, parked))
        self._notify()

    def _record(self, item: StoredItem, outcome: Outcome, finished: tuple[bool, str | None, str | None] | None) -> None:
        """Buffer an outcome; done / failed ones count once committed."""
        self._active.pop(item.key, None)
        self._attempt_base.pop(item.id, None)
        self._started.pop(item.key, None)  # never written as in flight: the outcome says it all
        self._outcomes.append(outcome)
        self._dirty.set()
        if finished is not None:
            self._finished_uncommitted += 1
            self._pending_events.append((item.id, *finished))
        if len(self._outcomes) >= self.flush_rows:
            self._flush_quietly()
        if not self._active:
            self._notify()

    # ------------------------------------------------------------ writing

    def _flush(self, force: bool = False) -> None:
        store, info = self._store, self._info
        if store is None or info is None:
            return
        wall = self.clock.wall()
        if not (self._outcomes or self._started or self._audit.pending or force
                or self.clock.now() - self._last_beat >= HEARTBEAT):
            return
        outcomes, self._outcomes = self._outcomes, []
        events, self._pending_events = self._pending_events, []
        started = list(self._started)
        self._started.clear()
        rows = self._audit.drain()
        done = failed = 0
        per_model: collections.Counter[str] = collections.Counter()
        for o in outcomes:
            if o.state == st.DONE:
                done += 1
                per_model[o.model or "?"] += 1
            elif o.state == st.FAILED:
                failed += 1
        # The counters written are the ones this commit makes true.
        self._done += done
        self._failed += failed
        self._per_model.update(per_model)
        self._finished_uncommitted -= done + failed
        p = self.progress()
        try:
            store.commit(info.id, started=started, outcomes=outcomes, audit_rows=rows, now=wall,
                         job_fields={"counters": self._counters(p), "heartbeat": wall, "state": p.state,
                                     "message": self._message})
        except BaseException:
            self._done -= done
            self._failed -= failed
            self._per_model.subtract(per_model)
            self._finished_uncommitted += done + failed
            self._outcomes[:0] = outcomes
            self._pending_events[:0] = events
            self._started.update(dict.fromkeys(started))
            self._audit.requeue(rows)
            raise
        self._last_beat = self.clock.now()
        at = self.clock.now()
        publish = self.bus.publish
        for item_id, ok, model, kind in events:
            publish(ev.BatchItemDone(at=at, wall=wall, job=self.job, item_id=item_id, ok=ok, model=model, kind=kind))

    def _flush_quietly(self) -> None:
        """Flush now; a failure pauses sending and is left to the writer, which retries
        (and halts the job if the database stays unwritable)."""
        if self._save_error is not None:
            return  # the writer is retrying already
        try:
            self._flush()
        except BatchError as e:
            self._save_failed(e)

    def _save_failed(self, e: BatchError) -> None:
        """A save failed: start nothing new until one succeeds (what is in flight finishes)."""
        first = self._save_error is None
        self._save_error = e
        if not first:
            return
        self._saveable.clear()
        self._write_failing_since = self.clock.now()
        self._message = (f"cannot save results: {e}; sending paused (the items in flight finish); the job halts "
                         f"if saving still fails in {self.write_give_up:g}s")
        self._note(self._message, "error")
        self._publish_progress()

    def _free_bytes(self) -> int | None:
        try:
            v = os.statvfs(self.db_path.parent)
        except (OSError, AttributeError):  # no statvfs (Windows), or the folder is gone: the next save says
            return None
        # root may write into the blocks a filesystem reserves for it, and SQLite would.
        blocks = v.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else v.f_bavail
        return int(blocks * v.f_frsize)

    def _disk_full(self) -> bool:
        """True, and sending paused as for a failed save, when the database's disk is (nearly) full."""
        free = self._free_bytes()
        if free is None or free >= LOW_DISK_BYTES:
            return False
        self._save_failed(BatchError(f"{self.db_path}: database or disk is full: {free:,} bytes free on the disk "
                                     f"that holds it (nothing is sent below {LOW_DISK_BYTES:,})"))
        return True

    def _saved(self) -> None:
        if self._save_error is None:
            return
        free = self._free_bytes()
        if free is not None and free < LOW_DISK_BYTES:
            return  # this save fitted, the next may not: stay paused
        self._save_error = None
        self._write_failing_since = None
        self._message = ""
        self._saveable.set()
        self._note(f"job {self.job!r}: results are saved again; sending goes on", "info")
        self._notify()

    async def _writer(self) -> None:
        while True:
            if not (self._outcomes or self._started or self._audit.pending or self._save_error):
                # Idle (paused, waiting for the window or a park): wake when something is sent, or to beat.
                await self._wait_event(self._dirty, HEARTBEAT)
            self._dirty.clear()
            await self.clock.sleep(self.flush_interval)  # let a batch of results gather
            try:
                self._flush(force=self._save_error is not None)
            except BatchError as e:
                self._save_failed(e)
            else:
                self._saved()
            e = self._save_error
            if e is not None and self._write_failing_since is not None \
                    and self.clock.now() - self._write_failing_since >= self.write_give_up:
                lost = self._finished_uncommitted
                self._stop_for(BatchError(
                    f"job {self.job!r} halted: results cannot be saved: {e}; nothing new was sent after the first "
                    f"failed save ({self.write_give_up:g}s ago), every result saved before it is kept"
                    + (f", {lost} answers received since could not be kept and will be sent again" if lost else "")
                    + f"; fix it, then run `capmon batch resume {self.job}`"))
                return

    async def _ticker(self) -> None:
        while True:
            await self.clock.sleep(self.progress_interval)
            self._sample()
            self._publish_progress()

    # ------------------------------------------------------------ opening

    async def _open(self) -> None:
        self._pending_events = []
        store = self._store = JobStore(self.db_path)
        info = store.job(self.job)
        wall = self.clock.wall()
        created = info is None
        if info is None:
            if self.input_path is None:
                raise BatchError(f"no job named {self.job!r} in {self.db_path}; start it with "
                                 f"`capmon batch run INPUT.jsonl --job {self.job}`")
            self._check_text(self.input_path)
            size, fp = self._fingerprint(self.input_path)
            info = store.create_job(self.job, input_path=str(self.input_path.resolve()), input_size=size,
                                    fingerprint=fp, settings=self._settings({}), now=wall)
        store.claim(info.id, self._owner, wall)
        try:
            free = self._free_bytes()
            if free is not None and free < LOW_DISK_BYTES:
                raise BatchError(f"{self.db_path}: database or disk is full: {free:,} bytes free on the disk that holds "
                                 f"it; nothing was sent; free space, then run `capmon batch resume {self.job}`")
            if created:
                pass  # fingerprinted a moment ago
            elif not info.ingested:
                info = self._check_unfinished_ingest(store, info)
            else:
                info = self._check_input(store, info)
        except BaseException:
            store.release(info.id, self._owner)  # refused: the job stays as it was
            raise
        self._info = info
        if not info.ingested:
            self._phase = "ingesting"
            info = self._info = await self._ingest(store, info)
        try:
            settings = self._check_models(store, info)
        except BaseException:
            self._info = None
            store.release(info.id, self._owner)
            raise
        store.requeue_in_flight(info.id)
        store.set_job(info.id, settings=settings, state="running", message="", updated=wall)
        counts = store.counts(info.id)
        self._total = info.total
        self._done, self._failed = counts[st.DONE], counts[st.FAILED]
        self._per_model = collections.Counter(store.served_by_model(info.id))
        now = self.clock.now()
        for item in store.parked(info.id):
            due = now + max(0.0, (item.not_before or wall) - wall)
            heapq.heappush(self._parked, (due, item.key, item))

    def _settings(self, saved: Mapping[str, Any]) -> dict[str, Any]:
        return {**saved, "concurrency": self.concurrency, "rate": self.rate,
                "window": str(self.window) if self.window else None, "max_response_bytes": self.max_response_bytes,
                "remap": self._remap}

    def _note(self, message: str, level: str = "warning") -> None:
        """A message for people: a Notice on the bus (`capmon batch` prints them, the
        dashboard shows them), and a log record for programs that keep logs."""
        log.info("%s", message)
        self.bus.publish(ev.Notice(at=self.clock.now(), wall=self.clock.wall(), level=level, message=message))

    # ------------------------------------------------------------ the input

    def _fingerprint(self, path: Path) -> tuple[int, str]:
        try:
            return fingerprint(path)
        except FileNotFoundError:
            raise BatchError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise BatchError(f"{path}: is a folder, expected a JSONL file") from None
        except OSError as e:
            raise BatchError(f"{path}: cannot read: {e.strerror or e}") from None

    def _check_text(self, path: Path) -> None:
        try:
            problem = sniff_file(path)
        except FileNotFoundError:
            raise BatchError(f"{path}: no such file") from None
        except IsADirectoryError:
            raise BatchError(f"{path}: is a folder, expected a JSONL file") from None
        except OSError as e:
            raise BatchError(f"{path}: cannot read: {e.strerror or e}") from None
        if problem:
            raise BatchError(f"{path}: {problem}")

    def _input_of(self, info: JobInfo) -> Path:
        """The file to check the job against: the one given (run), else the job's own (resume)."""
        return self.input_path.resolve() if self.input_path is not None else Path(info.input_path or "")

    def _input_changed(self, info: JobInfo, path: Path, difference: changes.Difference) -> BatchError:
        take = ("add --accept-changed-input (new lines are added, removed ones marked removed, changed ones sent "
                "again)")
        if str(path) == info.input_path:
            return BatchError(f"{path} changed since job {self.job!r} was created: {difference}; nothing was sent. "
                              f"To take the file as it is now, {take}; or put the old file back, or start a new job "
                              f"with --job NAME")
        return BatchError(f"job {self.job!r} already exists, started from {info.input_path} ({info.total} items), and "
                          f"{path} is a different file ({difference}); nothing was sent. Name a new job with --job NAME, "
                          f"or go on with `capmon batch resume {self.job}`, or to make it the job's input, {take}")

    def _check_unfinished_ingest(self, store: JobStore, info: JobInfo) -> JobInfo:
        """An ingest cut short goes on only against the very file it started reading."""
        path = self._input_of(info)
        self._check_text(path)
        size, fp = self._fingerprint(path)
        stored_fp = info.input_fingerprint or ""
        legacy = not stored_fp.startswith(FINGERPRINT_PREFIX)
        same = (_legacy_fingerprint(path) == (info.input_size, stored_fp)) if legacy else (size, fp) == (
            info.input_size, stored_fp)
        if same:
            if legacy:  # read by an older capmon: hashes from now on
                store.backfill_line_hashes(info.id, ((raw.line, raw.hash) for raw in itertools.takewhile(
                    lambda r: r.line <= info.ingest_line, read_lines(path))))
            if legacy or str(path) != info.input_path:
                store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
                return store.require(self.job)
            return info
        if not self.accept_changed_input:
            if legacy:
                difference = changes.Difference(None, "it was being read by an older capmon, which kept no line hashes")
            else:
                difference = changes.first_difference(store, info, path, upto=info.ingest_line)
            raise self._input_changed(info, path, difference)
        # Nothing was sent before the whole file was read: read the new one from the start.
        store.restart_ingest(info.id, input_path=str(path), input_size=size, fingerprint=fp, now=self.clock.wall())
        self._note(f"{path}: changed while job {self.job!r} was being read; reading it again from the start, as asked")
        return store.require(self.job)

    def _check_input(self, store: JobStore, info: JobInfo) -> JobInfo:
        """A job read whole: its input must be the file it read, unless asked to take the new one."""
        path = self._input_of(info)
        if self.input_path is None and not path.is_file():
            self._note(f"{path}: job {self.job!r}'s input is no longer there; going on with the {info.total} items "
                       f"stored from it")
            return info
        size, fp = self._fingerprint(path)
        stored_fp = info.input_fingerprint or ""
        if not stored_fp.startswith(FINGERPRINT_PREFIX):
            return self._check_legacy_input(store, info, path, size, fp)
        if (size, fp) == (info.input_size, stored_fp):
            if str(path) != info.input_path:  # the same bytes under another name
                store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
                return store.require(self.job)
            return info
        difference = changes.first_difference(store, info, path)
        if not self.accept_changed_input:
            raise self._input_changed(info, path, difference)
        self._check_text(path)
        models = self.client.model_names() if hasattr(self.client, "model_names") else None
        done = changes.reconcile(store, info, path, size=size, fingerprint=fp, models=models, now=self.clock.wall())
        self._note(f"{path}: changed since job {self.job!r} was created ({difference}); taken as asked: {done}")
        return store.require(self.job)

    def _check_legacy_input(self, store: JobStore, info: JobInfo, path: Path, size: int, fp: str) -> JobInfo:
        """A job made by a capmon that kept only a hash of the first 64 KiB and no line hashes."""
        if _legacy_fingerprint(path) != (info.input_size, info.input_fingerprint):
            raise BatchError(f"job {self.job!r} was started from {info.input_path} by an older capmon, and {path} "
                             f"differs from it; which lines changed cannot be told for such a job, so nothing was "
                             f"sent: put the old file back, or start a new job with --job NAME")
        # The best that can be known: take the file as the job's, with its line hashes, from now on.
        store.backfill_line_hashes(info.id, ((raw.line, raw.hash) for raw in read_lines(path)))
        store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
        return store.require(self.job)

    def _check_models(self, store: JobStore, info: JobInfo) -> dict[str, Any]:
        """Items not finished yet that name a model the config no longer has are refused
        (before anything is sent) unless --remap says where they go. Returns the settings
        to store (the remap is remembered)."""
        saved = dict(info.settings)
        remembered = {str(k): str(v) for k, v in (saved.get("remap") or {}).items()}
        self._remap = {**remembered, **self._remap_asked}
        names = self.client.model_names() if hasattr(self.client, "model_names") else None
        if names is None:
            return self._settings(saved)
        listed = ", ".join(names)
        for old, new in self._remap.items():
            if new not in names:
                how = "--remap" if old in self._remap_asked else "--remap (remembered from an earlier run)"
                raise BatchError(f"{how} {old}={new}: no model named {new!r} in the config (models: {listed})")
        missing = [(m, n, line) for m, n, line in store.unfinished_models(info.id)
                   if m not in names and m not in self._remap]
        if missing:
            what = "; ".join(f"{n} name {m!r} (first on line {line})" for m, n, line in missing)
            flags = " ".join(f"--remap {m}=MODEL" for m, _, _ in missing)
            raise BatchError(f"job {self.job!r}: items not sent yet name models the config no longer has: {what}; "
                             f"the config has {listed}; nothing was sent. Say where they go with {flags}, "
                             f"or put the model back in the config")
        return self._settings(saved)

    async def _ingest(self, store: JobStore, info: JobInfo) -> JobInfo:
        """Store the input's items, a chunk per transaction; an ingest cut short goes on
        from the last chunk stored. Nothing is sent before the whole file is checked: the
        bytes read are hashed as they are read, and must be the file fingerprinted when
        the job was created."""
        path = Path(info.input_path or "")
        if self.input_path is None or self.input_path.resolve() != path:
            self.input_path = path
        models = self.client.model_names() if hasattr(self.client, "model_names") else None
        rows: list[tuple[Any, ...]] = []
        offset, line = info.ingest_offset, info.ingest_line
        hasher = hashlib.sha256()
        try:
            with open(path, "rb") as f:  # what was read before this run: hashed again, not parsed
                left = info.ingest_offset
                while left > 0 and (block := f.read(min(left, 1 << 20))):
                    hasher.update(block)
                    left -= len(block)
            for raw in read_lines(path, info.ingest_offset, info.ingest_line + 1, hasher):
                parsed = parse_line(raw.line, raw.data, models)
                if isinstance(parsed, Item):
                    rows.append((raw.line, parsed.id, st.PENDING, parsed.messages_json, parsed.model,
                                 parsed.max_tokens, parsed.temperature, parsed.metadata_json, None, None, raw.hash))
                else:
                    rows.append((raw.line, parsed.id, st.FAILED, None, None, None, None, None, BAD_INPUT,
                                 parsed.message, raw.hash))
                offset, line = raw.end, raw.line
                if len(rows) >= INGEST_CHUNK:
                    store.ingest_chunk(info.id, rows, offset=offset, line=line, now=self.clock.wall())
                    rows = []
                    self._total = store.require(self.job).total
                    await self.clock.sleep(0)  # let the loop breathe (a dashboard in the same loop)
            if rows:
                store.ingest_chunk(info.id, rows, offset=offset, line=line, now=self.clock.wall())
        except OSError as e:
            raise BatchError(f"{path}: cannot read: {e.strerror or e}") from None
        if FINGERPRINT_PREFIX + hasher.hexdigest() != info.input_fingerprint:
            self._info = None
            store.delete_job(info.id)
            raise BatchError(f"{path} changed while job {self.job!r} was being read (an editor or a program writing "
                             f"it?); nothing was sent; run it again when the file is complete")
        info = store.require(self.job)
        if info.total == 0:
            self._info = None
            store.delete_job(info.id)
            raise BatchError(f"{path} is empty: no items to run (one JSON object per line)")
        dups = store.duplicate_ids(info.id)
        if dups:
            more = store.duplicate_count(info.id) - len(dups)
            listed = "; ".join(f"{i!r} on lines {', '.join(map(str, lines))}" for i, lines in dups)
            self._info = None
            store.delete_job(info.id)
            raise BatchError(f"{path}: duplicate ids: {listed}{f' (and {more} more)' if more > 0 else ''}; "
                             f"every id must be unique, so nothing was sent")
        store.set_job(info.id, state="ready")
        return store.require(self.job)


def _max_response_bytes(client: Any) -> int:
    try:
        value = int(client.config.client.max_response_bytes)
    except (AttributeError, TypeError, ValueError):
        return DEFAULT_MAX_RESPONSE_BYTES
    return value if value > 0 else DEFAULT_MAX_RESPONSE_BYTES


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _halt_message(job: str, kind: str, detail: str) -> str:
    if kind == "auth":
        what = ("the provider refused the key (401/403): that is the key, not capacity; fix the key "
                "(or the model's access)")
    else:
        what = ("a quota or spend limit is used up: that is billing, not capacity, and retrying will not help; "
                "raise the limit or wait for its reset")
    return f"job {job!r} halted: {what}, then run `capmon batch resume {job}`. Last error: {detail}"
