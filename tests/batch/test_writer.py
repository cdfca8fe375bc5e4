"""The writer alone, on a real job database: what a commit makes true, a failed commit
rolled back whole and retried, giving up, the heartbeat. Fast-forwarded time."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from capmon.audit import AuditLog
from capmon.batch import writer as writer_mod
from capmon.batch.sqlite import JobStore, Outcome
from capmon.batch.states import ItemState
from capmon.batch.writer import ResultWriter
from capmon.core.base.clock import LoopClock
from capmon.core.base.exceptions import BatchError
from capmon.core.types import events as ev

pytestmark = pytest.mark.looptime


class Job:
    """A job of ``n`` pending items and a writer bound to it; what the callbacks saw."""

    def __init__(self, tmp_path: Path, n: int = 10, **kw: Any) -> None:
        self.db = tmp_path / "jobs.db"
        self.store = JobStore(self.db)
        self.info = self.store.create_job(
            "j", input_path="in.jsonl", input_size=1, fingerprint="f", settings={}, now=1.0
        )
        self.store.ingest_chunk(
            self.info.id,
            [(i, f"it-{i}", ItemState.PENDING, "[]", None, None, None, None, None, None) for i in range(1, n + 1)],
            offset=0,
            line=n,
            now=1.0,
        )
        self.keys = [k for (k,) in self.store.conn.execute("SELECT key FROM items ORDER BY key")]
        self.bus = ev.EventBus()
        self.done_events: list[ev.BatchItemDone] = []
        self.bus.subscribe(lambda e: self.done_events.append(e) if isinstance(e, ev.BatchItemDone) else None)
        self.clock = LoopClock()
        self.audit = AuditLog(clock=self.clock)
        self.failing: list[BatchError] = []
        self.saved = 0
        self.gave_up: list[BatchError] = []
        self.writer = ResultWriter(
            "j",
            self.db,
            self.clock,
            self.bus,
            self.audit,
            job_fields=lambda: {"counters": {"done": self.writer.done}, "state": "running", "message": ""},
            on_failing=self.failing.append,
            on_saved=self._saved,
            on_give_up=self.gave_up.append,
            **kw,
        )
        self.writer.bind(self.store, self.info.id)

    def _saved(self) -> None:
        self.saved += 1

    def done(self, i: int) -> None:
        key = self.keys[i]
        self.writer.started(key)
        self.audit.add(
            (
                "j",
                f"it-{i + 1}",
                1.0,
                1,
                "m",
                "ep",
                "a",
                200,
                None,
                None,
                0.0,
                0.1,
                "ok",
                "",
                "openai",
                None,
                "m",
                5,
                0,
                7,
                0.0001,
            )
        )
        self.writer.record(
            Outcome(key, ItemState.DONE, attempts=1, model="m", content="x"), (f"it-{i + 1}", True, "m", None)
        )

    def states(self) -> dict[str, int]:
        conn = sqlite3.connect(self.db)
        try:
            return dict(conn.execute("SELECT state, count(*) FROM items GROUP BY state").fetchall())
        finally:
            conn.close()

    def audited(self) -> int:
        conn = sqlite3.connect(self.db)
        try:
            return int(conn.execute("SELECT count(*) FROM attempts").fetchone()[0])
        finally:
            conn.close()

    def fill_disk(self) -> None:
        # SQLite itself refuses to grow the file (SQLITE_FULL), exactly as on a full disk.
        pages = self.store.conn.execute("PRAGMA page_count").fetchone()[0]
        self.store.conn.execute(f"PRAGMA max_page_count = {pages}")

    def free_disk(self) -> None:
        self.store.conn.execute("PRAGMA max_page_count = 1073741823")


async def test_a_commit_writes_outcomes_audit_rows_and_counters_together_and_only_then_counts(tmp_path: Path) -> None:
    job = Job(tmp_path)
    for i in range(3):
        job.done(i)
    job.writer.started(job.keys[3])
    assert (job.writer.done, job.writer.finished_uncommitted) == (0, 3) and job.states() == {"pending": 10}
    assert not job.done_events
    job.writer.flush()
    assert job.states() == {"done": 3, "in_flight": 1, "pending": 6} and job.audited() == 3
    assert (job.writer.done, job.writer.finished_uncommitted, dict(job.writer.per_model)) == (3, 0, {"m": 3})
    assert [e.item_id for e in job.done_events] == ["it-1", "it-2", "it-3"]
    assert job.store.require("j").counters == {"done": 3}  # written by the same commit
    assert not job.writer.waiting


async def test_flush_rows_outcomes_commit_at_once(tmp_path: Path) -> None:
    job = Job(tmp_path, flush_rows=4)
    for i in range(3):
        job.done(i)
    assert job.states() == {"pending": 10}
    job.done(3)
    assert job.states() == {"done": 4, "pending": 6}


async def test_a_failed_commit_is_rolled_back_whole_and_the_next_one_writes_it_all(tmp_path: Path) -> None:
    job = Job(tmp_path, n=400)
    job.fill_disk()
    for i in range(400):
        job.done(i)
    with pytest.raises(BatchError, match="database or disk is full"):
        job.writer.flush()
    assert (job.writer.done, job.writer.finished_uncommitted) == (0, 400)  # the counters went back
    assert job.writer.waiting and job.audit.pending == 400 and not job.done_events
    job.writer.flush_quietly()
    assert len(job.failing) == 1 and job.writer.save_error is not None
    job.writer.flush_quietly()  # already failing: left to run(), no second report
    assert len(job.failing) == 1
    task = asyncio.create_task(job.writer.run())
    await asyncio.sleep(1.0)
    assert job.states() == {"pending": 400} and job.saved == 0
    job.free_disk()
    await asyncio.sleep(1.0)
    assert job.states() == {"done": 400} and job.audited() == 400 and len(job.done_events) == 400
    assert job.saved == 1 and job.writer.save_error is None and job.writer.done == 400
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_saving_that_still_fails_after_give_up_seconds_gives_up_with_the_cause(tmp_path: Path) -> None:
    job = Job(tmp_path, n=400, give_up=10.0)
    job.fill_disk()
    for i in range(400):
        job.done(i)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await job.writer.run()  # returns once it gives up
    assert 10.0 <= loop.time() - t0 <= 10.5 and len(job.failing) == 1 and job.saved == 0
    [error] = job.gave_up
    assert "halted: results cannot be saved" in str(error) and "database or disk is full" in str(error)
    assert "400 answers received since could not be kept" in str(error) and "capmon batch resume j" in str(error)


async def test_with_nothing_to_write_the_job_row_still_beats(tmp_path: Path) -> None:
    job = Job(tmp_path)
    task = asyncio.create_task(job.writer.run())
    beats = []
    await asyncio.sleep(writer_mod.HEARTBEAT / 2)
    for _ in range(4):
        await asyncio.sleep(writer_mod.HEARTBEAT + job.writer.flush_interval)
        beats.append(job.store.require("j").heartbeat)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert None not in beats
    gaps = [b - a for a, b in itertools.pairwise(beats)]  # type: ignore[operator]
    assert all(g == pytest.approx(writer_mod.HEARTBEAT + job.writer.flush_interval, abs=0.05) for g in gaps), gaps


async def test_a_disk_nearly_full_counts_as_a_failing_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = Job(tmp_path)
    assert not job.writer.disk_full()
    monkeypatch.setattr(writer_mod, "LOW_DISK_BYTES", 1 << 62)  # more than any disk has free
    assert job.writer.disk_full()
    [error] = job.failing
    assert str(job.db) in str(error) and "bytes free on the disk" in str(error)
