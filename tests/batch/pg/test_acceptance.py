"""Many `capmon batch run` processes on one job in PostgreSQL, with faults (slow: run with
``pytest -m slow tests/batch/pg``).

* Four workers in four processes on one job of 2,000 items; two of them SIGKILLed at random
  moments and started again with the same command: every item exactly once in the export,
  in input order, and each result written once.
* The PostgreSQL server (one of the test's own) restarted while two workers run: they pause,
  say so, connect again and finish; nothing lost, nothing doubled.

The simulator runs in the test's process on a loopback port, as in tests/batch/test_crash.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from capmon.batch.export import export_job
from capmon.batch.pg import PgStore
from capmon.batch.states import ItemState
from capmon.batch.store import PgLocation, pg_location, read_progress
from capmon.core.base.exceptions import BatchError
from capmon.sim.scenario import parse_scenario
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.batch.pg import server
from tests.batch.pg.conftest import drop_schema
from tests.batch.test_crash import write_config
from tests.support.scripted import free_port

pytestmark = pytest.mark.slow

SCENARIO_TEXT = """
name = "pg-workers"
keys = ["*"]
seed = 7
[[models]]
name = "sim-flagship"
slots = 256
base_latency = {latency}
per_token = 0.0
noise = 0.5
answer_tokens = 8
[[models]]
name = "sim-medium"
slots = 256
base_latency = {latency}
per_token = 0.0
noise = 0.5
answer_tokens = 8
"""
# Answers slow enough that 2,000 items take seconds of sending: the kills land mid-run.
SLOW = parse_scenario(SCENARIO_TEXT.format(latency=0.2))
FAST = parse_scenario(SCENARIO_TEXT.format(latency=0.03))

URL_ENV = "CAPMON_TEST_JOBS_URL"


async def worker(argv: list[str], url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "capmon.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, URL_ENV: url},
    )


def argv_for(src: Path, cfg: Path, ttl: float, concurrency: int = 16) -> list[str]:
    return [
        "batch",
        "run",
        str(src),
        "--config",
        str(cfg),
        "--db-url-env",
        URL_ENV,
        "--job",
        "shared",
        "--concurrency",
        str(concurrency),
        "--lease-ttl",
        str(ttl),
        "--no-progress",
    ]


async def done_by(db: PgLocation, pid: int, timeout: float = 30.0) -> int:
    """Until the worker of process ``pid`` has results saved; how many."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            p = await asyncio.to_thread(read_progress, db, "shared")
        except BatchError:
            p = None
        mine = [n for label, n in (p.workers if p else ()) if label.endswith(f":{pid}")]
        if mine and mine[0] > 0:
            return mine[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"the worker of pid {pid} saved nothing in {timeout:g}s")


def check_export(db: PgLocation, tmp_path: Path, n: int) -> dict[str, Any]:
    out = tmp_path / "out.jsonl"
    summary = export_job(db, "shared", out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"it-{i:04d}" for i in range(1, n + 1)]  # once each, in input order
    assert summary.done == n and all(r["content"] for r in records)
    store = PgStore(db)
    try:
        info = store.require("shared")
        assert store.counts(info.id)[ItemState.DONE] == n
        oks = store._rows("t", "SELECT item, count(*) FROM attempts WHERE decision = 'ok' GROUP BY item")
        progress = store.progress("shared")
    finally:
        store.close()
    return {
        "answered twice (a late answer discarded)": sum(1 for _, c in oks if c > 1),
        "shares": progress.workers,
        "state": progress.state,
    }


async def test_four_workers_two_killed_and_restarted_every_item_once_in_order(tmp_path: Path, pg_url: str) -> None:
    n, ttl, rng = 2000, 2.0, random.Random(20261202)
    schema = f"t_accept_{os.getpid()}"
    url = f"{pg_url}?schema={schema}"
    db = pg_location(url, from_env=True)
    src = write_items(tmp_path / "in.jsonl", n)
    t0 = time.monotonic()
    try:
        async with running_simulator(SLOW) as sim:
            cfg = write_config(tmp_path / "config.toml", sim.base_url)
            argv = argv_for(src, cfg, ttl)
            procs = [await worker(argv, url) for _ in range(4)]
            kills: list[tuple[int, float, int]] = []  # (worker, seconds in, its results saved)
            for victim in rng.sample(range(4), 2):
                # Once the victim has results of its own saved, at a random moment after.
                await done_by(db, procs[victim].pid)
                await asyncio.sleep(rng.uniform(0.0, 1.5))
                if procs[victim].returncode is None:
                    procs[victim].send_signal(signal.SIGKILL)
                    await procs[victim].wait()
                    kills.append((victim, round(time.monotonic() - t0, 2), await done_by(db, procs[victim].pid)))
                    procs[victim] = await worker(argv, url)  # the same command again
            results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 180)
            for p, (_, err) in zip(procs, results, strict=True):
                assert p.returncode == 0, err.decode()[-2000:]
        figures = check_export(db, tmp_path, n)
        assert figures["state"] == "finished"
        print(f"\n4 workers, {n} items, killed {kills}: {time.monotonic() - t0:.1f}s; {figures}")
        assert len(kills) == 2
    finally:
        drop_schema(pg_url, schema)


async def test_the_server_restarted_mid_run_the_workers_pause_reconnect_and_finish(tmp_path: Path) -> None:
    why = server.available()
    if why:
        pytest.skip(why)
    pg = server.PgServer("127.0.0.1", free_port())
    pg.start()
    n = 1500
    url = f"{pg.url}?schema=capmon"
    db = pg_location(url, from_env=True)
    src = write_items(tmp_path / "in.jsonl", n)
    try:
        async with running_simulator(FAST) as sim:
            cfg = write_config(tmp_path / "config.toml", sim.base_url)
            argv = argv_for(src, cfg, 3.0, concurrency=8)
            procs = [await worker(argv, url) for _ in range(2)]
            while True:  # both workers in the job and sending
                await asyncio.sleep(0.1)
                try:
                    p = await asyncio.to_thread(read_progress, db, "shared")
                except BatchError:
                    continue
                if len(p.workers) == 2 and p.done >= 100:
                    break
                assert all(w.returncode is None for w in procs)
            await asyncio.to_thread(pg.stop)
            await asyncio.sleep(2.0)  # down for two seconds
            await asyncio.to_thread(pg.start)
            results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 180)
        errs = [err.decode() for _, err in results]
        for p, err in zip(procs, errs, strict=True):
            assert p.returncode == 0, err[-2000:]
        assert any("sending paused" in e for e in errs), errs
        assert any("saved again" in e for e in errs), errs
        figures = check_export(db, tmp_path, n)
        print(f"\nserver restarted under 2 workers: {figures}; a worker said:\n{errs[0][:1500]}")
    finally:
        pg.remove()
