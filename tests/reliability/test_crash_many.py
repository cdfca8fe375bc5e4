"""A real `capmon batch run` process SIGKILLed at random moments, again and again, then
run to completion with the same command.

The simulator runs in this test's process on a loopback port (as in
tests/batch/test_crash.py). Each run is killed after a seeded random delay from the
moment it is seen holding the job (the first one from the moment it was spawned, so it
may die while starting up or ingesting). After every kill, the items the database says
are done are remembered with their content; at the end:

  * the export holds every item exactly once, in input order;
  * nothing committed as done was lost or changed, and none of it was sent again: the
    audit trail has exactly one successful attempt per item (an ``ok`` row is written in
    the same transaction as the result it belongs with);
  * the job's stored counts and counters agree with the items.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sqlite3
from pathlib import Path

import pytest

from capmon.batch import read_progress
from capmon.core.base.exceptions import BatchError
from capmon.sim.scenario import parse_scenario
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.batch.test_crash import capmon, ok_attempts, write_config

SCENARIO = parse_scenario("""
name = "crash-many"
keys = ["*"]
seed = 3
[[models]]
name = "sim-flagship"
slots = 64
base_latency = 0.02
per_token = 0.0
noise = 0.5
answer_tokens = 8
[[models]]
name = "sim-medium"
slots = 64
base_latency = 0.02
per_token = 0.0
noise = 0.5
answer_tokens = 8
""")


def _done_items(db: Path) -> dict[str, tuple[str, str]]:
    conn = sqlite3.connect(db)
    try:
        return {i: (m, c) for i, m, c in conn.execute("SELECT id, model, content FROM items WHERE state = 'done'")}
    finally:
        conn.close()


def _item_states(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT state, count(*) FROM items GROUP BY state").fetchall())
    finally:
        conn.close()


async def _job_visible(db: Path, job: str, proc: asyncio.subprocess.Process, timeout: float = 20.0) -> bool:
    """Until the process holds the job (running) or has exited; True when it holds it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if proc.returncode is not None:
            return False
        try:
            if read_progress(db, job).state == "running":
                return True
        except (BatchError, sqlite3.Error):  # not created yet, or busy
            pass
        await asyncio.sleep(0.01)
    raise AssertionError("the batch process never started the job")


async def crash_many(tmp_path: Path, *, n: int, kills: int, seed: int, max_delay: float) -> dict[str, int]:
    rng = random.Random(seed)
    src = write_items(tmp_path / "in.jsonl", n)
    db, out = tmp_path / "jobs.db", tmp_path / "out.jsonl"
    committed: dict[str, tuple[str, str]] = {}  # item -> (model, content) seen done after some kill
    stats = {"kills": 0, "mid_run": 0, "finished_early": 0, "killed_after_finish": 0}
    async with running_simulator(SCENARIO) as sim:
        cfg = write_config(tmp_path / "config.toml", sim.base_url)
        argv = (
            "batch",
            "run",
            str(src),
            "--config",
            str(cfg),
            "--db",
            str(db),
            "--job",
            "m",
            "--concurrency",
            "16",
            "--no-progress",
            "--out",
            str(out),
        )
        for k in range(kills):
            proc = await capmon(*argv)
            if k == 0:
                await asyncio.sleep(rng.uniform(0.0, 1.0))  # any moment: start-up, ingest, sending
            elif await _job_visible(db, "m", proc):
                await asyncio.sleep(rng.uniform(0.0, max_delay))
            if proc.returncode is None:
                proc.kill()  # SIGKILL: no cleanup of any kind
            _, err = await proc.communicate()
            # It finished before the kill landed (the kill may even meet it while it exits,
            # once the job and its export are done): the final run checks the output.
            finished = db.exists() and out.exists() and read_progress(db, "m").state == "finished"
            if proc.returncode == 0 or finished:
                stats["finished_early"] += 1
                break
            assert proc.returncode == -signal.SIGKILL, (proc.returncode, err.decode()[-2000:])
            stats["kills"] += 1
            if not db.exists():
                assert not out.exists()
                continue
            if read_progress(db, "m").state == "finished":  # killed after the job ended, maybe mid-export:
                if out.exists():  # the export is renamed into place, so it is whole or absent
                    assert len(out.read_text().splitlines()) == n
                stats["killed_after_finish"] += 1
                break
            assert not out.exists()  # only a finished job is exported
            done_now = _done_items(db)
            lost = {i for i in committed if i not in done_now or done_now[i] != committed[i]}
            assert not lost, f"kill {k}: committed results lost or changed: {sorted(lost)[:10]}"
            if committed.keys() < done_now.keys() and len(done_now) < n:
                stats["mid_run"] += 1
            committed = done_now
            p = read_progress(db, "m")
            assert p.state in ("stopped", "ingesting", "ready") and p.in_flight == 0, p
            if p.total is not None:
                assert p.done == len(done_now), (p, len(done_now))  # the counters agree with the items

        proc = await capmon(*argv)  # the same command, left to finish
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]

    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [f"it-{i:04d}" for i in range(1, n + 1)]
    assert [r["id"] for r in records] == ids  # every item exactly once, in input order
    assert all(r["model"] in ("flagship", "medium") and r["content"] for r in records)
    final = _done_items(db)
    assert all(final[i] == committed[i] for i in committed)  # no committed result lost or rewritten
    oks = ok_attempts(db)
    assert set(oks) == set(ids)
    twice = {i: c for i, c in oks.items() if c != 1}
    assert not twice, f"items with more than one successful attempt: {twice}"
    assert _item_states(db) == {"done": n}
    p = read_progress(db, "m")
    assert (p.state, p.total, p.done, p.failed, p.parked, p.pending) == ("finished", n, n, 0, 0, 0), p
    assert sum(c for _, c in p.per_model) == n, p.per_model
    return stats


async def test_killed_four_times_at_random_moments_loses_and_repeats_nothing(tmp_path: Path) -> None:
    stats = await crash_many(tmp_path, n=300, kills=4, seed=20261129, max_delay=0.35)
    assert stats["kills"] >= 2 and stats["mid_run"] >= 1, stats


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_killed_twenty_five_times_loses_and_repeats_nothing(tmp_path: Path, seed: int) -> None:
    stats = await crash_many(tmp_path, n=1500, kills=25, seed=seed, max_delay=0.3)
    assert stats["kills"] >= 10 and stats["mid_run"] >= 5, stats
