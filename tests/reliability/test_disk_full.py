"""A job whose database fills up: the first failed save stops new sends, the error names
the cause and the file, nothing saved is lost, and a resume after space is freed finishes.

Two real ways to fill it: SQLite's own page limit (``PRAGMA max_page_count`` on the
runner's connection, so SQLite itself answers SQLITE_FULL), and a real 3 MiB tmpfs filled
to the last byte (skipped where mounting is not allowed), which capmon sees before its
next save fails. The simulator runs on a
loopback port; time is fast-forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capmon.batch import BatchRunner, read_progress
from capmon.batch.options import RunnerOptions
from capmon.core.base.exceptions import BatchError
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.events import EventBus
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.reliability.helpers import ENV, read_only_query, scenario, sim_config

pytestmark = pytest.mark.looptime

N = 400


class Sends:
    """Which items the client started, and when (loop time), from the bus."""

    def __init__(self, bus: EventBus) -> None:
        self.first_attempts: list[tuple[float, str]] = []
        self.notices: list[ev.Notice] = []
        bus.subscribe(self)

    def __call__(self, e: ev.Event) -> None:
        if isinstance(e, ev.AttemptStarted) and e.attempt == 1 and e.item_id:
            self.first_attempts.append((e.at, e.item_id))
        elif isinstance(e, ev.Notice):
            self.notices.append(e)

    def after(self, t: float) -> list[str]:
        return [i for at, i in self.first_attempts if at > t]


async def _fill_and_resume(
    tmp_path: Path, db: Path, fill: Callable[[BatchRunner], None], free: Callable[[], None]
) -> dict[str, Any]:
    src = write_items(tmp_path / "in.jsonl", N)
    loop = asyncio.get_running_loop()
    async with running_simulator(scenario(base_latency=0.05)) as sim:
        bus = EventBus(history=100)
        sends = Sends(bus)
        async with FallbackClient(sim_config(sim.base_url), environ=ENV, bus=bus) as client:
            runner = BatchRunner(client, db, "full", RunnerOptions(input_path=src, concurrency=16))
            task = asyncio.create_task(runner.run())
            while runner.progress().done < 100:
                await asyncio.sleep(0.01)
            saved_before = {r[0] for r in read_only_query(db, "SELECT id FROM items WHERE state = 'done'")}
            fill(runner)
            filled_at = loop.time()
            with pytest.raises(BatchError) as halted:
                await task
        error = str(halted.value)
        failed_save = [n for n in sends.notices if "cannot save" in n.message]
        assert failed_save, [n.message for n in sends.notices]
        first_failure = failed_save[0].at
        figures = {
            "sent_after_fill": len(sends.after(filled_at)),
            "sent_after_first_failed_save": len(sends.after(first_failure)),
            "fill_to_failure": first_failure - filled_at,
        }

        # Everything saved before the disk filled is still there, and the job says why it stopped.
        still = {r[0] for r in read_only_query(db, "SELECT id FROM items WHERE state = 'done'")}
        assert saved_before <= still
        assert read_progress(db, "full").state == "stopped"

        free()
        bus2 = EventBus(history=100)
        async with FallbackClient(sim_config(sim.base_url), environ=ENV, bus=bus2) as client:
            summary = await BatchRunner(client, db, "full", RunnerOptions(concurrency=16)).run()
    assert (summary.done, summary.failed, summary.state) == (N, 0, "finished")
    ok = dict(read_only_query(db, "SELECT item, count(*) FROM attempts WHERE decision = 'ok' GROUP BY item"))
    assert len(ok) == N and set(ok.values()) == {1}  # every item once in the store, none lost
    figures["error"] = error
    return figures


def _check(figures: dict[str, Any], db: Path) -> None:
    error = figures["error"]
    assert "database or disk is full" in error and str(db) in error, error
    assert "cannot rollback" not in error and "\n" not in error
    assert "capmon batch resume full" in error
    # Nothing new is sent once a save has failed; before it, at most one flush interval's worth.
    assert figures["sent_after_first_failed_save"] == 0, figures
    assert figures["fill_to_failure"] <= 0.25, figures
    print(
        f"\ndisk full: {figures['sent_after_fill']} items started after the fill, "
        f"{figures['sent_after_first_failed_save']} after the first failed save "
        f"({figures['fill_to_failure']:.3f}s later)"
    )


async def test_sqlite_full_pauses_sends_at_the_first_failed_save_and_resume_loses_nothing(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"

    def fill(runner: BatchRunner) -> None:
        # The test's one look inside the runner: its own connection, so SQLite itself
        # refuses to grow the file (SQLITE_FULL), exactly as on a full disk.
        conn = runner._store.conn  # type: ignore[union-attr]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")

    figures = await _fill_and_resume(tmp_path, db, fill, lambda: None)  # a new connection has no page limit
    _check(figures, db)


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if read_only else ""), "tmpfs", str(path)],
            check=True,
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        pytest.skip(f"cannot mount a tmpfs here (needs root): {detail.decode(errors='replace').strip() or e}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=10)


async def test_a_full_tmpfs_pauses_sends_at_the_first_failed_save_and_resume_loses_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "3m") as disk:
        db = disk / "jobs.db"
        ballast = disk / "ballast"

        def fill(runner: BatchRunner) -> None:
            with open(ballast, "wb", buffering=0) as f:
                with contextlib.suppress(OSError):  # ENOSPC: the disk is full now
                    while True:
                        f.write(b"\0" * 4096)
            assert os.statvfs(disk).f_bavail == 0

        figures = await _fill_and_resume(tmp_path, db, fill, ballast.unlink)
        _check(figures, db)


async def test_space_freed_while_paused_lets_the_job_go_on_with_nothing_sent_twice(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    src = write_items(tmp_path / "in.jsonl", N)
    async with running_simulator(scenario(base_latency=0.05)) as sim:
        bus = EventBus(history=100)
        sends = Sends(bus)
        async with FallbackClient(sim_config(sim.base_url), environ=ENV, bus=bus) as client:
            runner = BatchRunner(client, db, "full", RunnerOptions(input_path=src, concurrency=16))
            task = asyncio.create_task(runner.run())
            while runner.progress().done < 100:
                await asyncio.sleep(0.01)
            conn = runner._store.conn  # type: ignore[union-attr]
            conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
            while not sends.notices and not task.done():
                await asyncio.sleep(0.01)
            assert not task.done()
            await asyncio.sleep(5.0)  # paused, retrying: the items in flight have finished
            assert runner.progress().state == "paused" and "database or disk is full" in runner.progress().message
            paused_sends = len(sends.first_attempts)
            await asyncio.sleep(5.0)
            assert len(sends.first_attempts) == paused_sends  # nothing new while it cannot save
            conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
            summary = await task
    assert (summary.done, summary.state) == (N, "finished")
    assert sorted(i for _, i in sends.first_attempts) == sorted({i for _, i in sends.first_attempts})  # each once
    assert len(sends.first_attempts) == N
    assert any("saved again" in n.message for n in sends.notices)
