"""The job database deleted or replaced while a job runs: the run halts at its next save,
names the cause, never says "finished", and copies the job out of the file it still has
open, so nothing saved is lost.

It used to go on sending into the unlinked file for the whole run, print `job 'del'
finished: 3000 items, 3000 done`, then `no job database here`, and lose every result."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capmon.batch import BatchRunner, read_progress
from capmon.batch.options import RunnerOptions
from capmon.cli import main
from capmon.core.base.exceptions import BatchError
from capmon.core.routing.client import FallbackClient
from capmon.core.types.events import EventBus
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.reliability.helpers import ENV, cli_config, read_only_query, scenario, sim_config

N = 600


def _wait_done(db: Path, job: str, at_least: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"capmon exited early with {proc.returncode}"
        try:
            if read_progress(db, job).done >= at_least:
                return
        except (BatchError, sqlite3.Error):
            pass
        time.sleep(0.02)
    raise AssertionError("the job never got going")


def test_database_deleted_mid_run_halts_names_the_cause_and_rescues_the_job(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", N)
    cfg = cli_config(tmp_path, 0.02)
    db, out = tmp_path / "jobs.db", tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "capmon.cli", "batch", "run", str(src), "--config", str(cfg), "--db", str(db)]
        + ["--job", "del", "--concurrency", "4", "--no-progress", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _wait_done(db, "del", 50, proc)
    for suffix in ("", "-wal", "-shm"):  # rm jobs.db jobs.db-wal jobs.db-shm
        os.unlink(f"{db}{suffix}")
    _, raw = proc.communicate(timeout=30)
    err = raw.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err and "finished" not in err, err
    assert f"job database {db} was deleted while the job ran" in err, err
    assert err.count("halted") == 1, err  # one line, once
    assert not out.exists()  # no export of a job that did not finish

    # The job as it stood was copied out of the still-open file: every result saved is there.
    rescued = tmp_path / "jobs.db.rescued"
    assert f"copied from the still-open file to {rescued}" in err, err
    states = dict(read_only_query(rescued, "SELECT state, count(*) FROM items GROUP BY state"))
    assert states["done"] >= 50 and states["done"] < N, states  # it stopped: it did not send the rest
    assert sum(states.values()) == N, states
    assert read_only_query(rescued, "SELECT state, owner FROM jobs") == [("halted", None)]
    done_before = {r[0] for r in read_only_query(rescued, "SELECT id FROM items WHERE state = 'done'")}

    # ... and the job goes on from it: only what was not done is sent.
    code = main(["batch", "resume", "del", "--db", str(rescued), "--config", str(cfg), "--no-progress"])
    assert code == 0
    assert dict(read_only_query(rescued, "SELECT state, count(*) FROM items GROUP BY state")) == {"done": N}
    ok = dict(read_only_query(rescued, "SELECT item, count(*) FROM attempts WHERE decision = 'ok' GROUP BY item"))
    assert len(ok) == N and set(ok.values()) == {1}, "an item was sent twice"
    assert done_before <= set(ok)
    print(f"\ndeleted database: {states['done']} results rescued, {states.get('pending', 0)} sent on resume")


@pytest.mark.looptime
async def test_database_replaced_mid_run_halts_and_leaves_the_new_file_alone(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", 400)
    db = tmp_path / "jobs.db"
    async with running_simulator(scenario(base_latency=0.05)) as sim:
        async with FallbackClient(sim_config(sim.base_url), environ=ENV, bus=EventBus()) as client:
            runner = BatchRunner(client, db, "swap", RunnerOptions(input_path=src, concurrency=16))
            task = asyncio.create_task(runner.run())
            while runner.progress().done < 100:
                await asyncio.sleep(0.01)
            other = tmp_path / "other.db"
            conn = sqlite3.connect(other)
            conn.execute("CREATE TABLE mine (x)")
            conn.execute("INSERT INTO mine VALUES (42)")
            conn.commit()
            conn.close()
            os.replace(other, db)  # someone put another file where the job's database was
            replaced_at = asyncio.get_running_loop().time()
            with pytest.raises(BatchError) as halted:
                await task
            took = asyncio.get_running_loop().time() - replaced_at
    error = str(halted.value)
    assert not (tmp_path / "jobs.db-wal").exists()  # the old WAL left at the path would be read as the new file's
    assert f"job database {db} was replaced by another file while the job ran" in error, error
    assert took <= 0.5, took  # at the next save, not after the 30 s a full disk is given
    assert read_only_query(db, "SELECT x FROM mine") == [(42,)]  # the file put there is untouched
    rescued = dict(read_only_query(tmp_path / "jobs.db.rescued", "SELECT state, count(*) FROM items GROUP BY state"))
    assert rescued["done"] >= 100 and sum(rescued.values()) == 400, rescued
