"""200 MB answers, valid and broken, to a real batch job at concurrency 16.

Before ``client.max_response_bytes``, one valid 200 MB answer took 642 MB of memory and
a broken one was retried and parked again and again (2 GB for one request). Now each
is read only up to the cap (8 MiB by default), fails as ``oversized`` (never retried on
that target) and the item falls back; the job's peak RSS stays bounded by the cap times
the concurrency, not by the size of the bodies. The job runs in its own process, so its
peak RSS is its own (the kernel's ``ru_maxrss`` of a wrapper's only child)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from pathlib import Path

from capmon.sim.scenario import parse_scenario
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.batch.test_cli import SCENARIO
from tests.reliability.helpers import set_faults
from tests.support.configs import ENV, SIMULATED_MODELS, write_config

HUGE = 200_000_000
N = 32  # 16 meet a valid huge answer on the flagship, then 16 a broken one on medium
PEAK_BOUND_MIB = 250  # measured 50 MiB; 16 bodies read to the 8 MiB cap at once would add 128 at most

# Runs its arguments as its only child and prints that child's peak RSS (KiB) last.
WRAPPER = (
    "import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)"
)


async def test_200_mb_answers_valid_and_broken_at_concurrency_16_keep_rss_bounded_and_lose_no_item(
    tmp_path: Path,
) -> None:
    src = write_items(tmp_path / "in.jsonl", N)
    db = tmp_path / "jobs.db"
    async with running_simulator(parse_scenario(SCENARIO)) as sim:
        await set_faults(
            sim,
            [
                {"mode": "huge", "bytes": HUGE, "valid": True, "count": 16, "model": "sim-flagship"},
                {"mode": "huge", "bytes": HUGE, "valid": False, "count": 16, "model": "sim-medium"},
            ],
        )
        cfg = write_config(tmp_path / "config.toml", sim.base_url, models=SIMULATED_MODELS)
        argv = ("batch", "run", str(src), "--config", str(cfg), "--db", str(db), "--job", "huge", "--concurrency", "16")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRAPPER,
            sys.executable,
            "-m",
            "capmon.cli",
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **ENV},
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, (out.decode()[-1000:], err.decode()[-2000:])
    peak_mib = int(out.decode().split()[-1]) / 1024
    conn = sqlite3.connect(db)
    try:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM items GROUP BY state").fetchall())
        oversized = conn.execute("SELECT COUNT(*) FROM attempts WHERE kind = 'oversized'").fetchone()[0]
        twice = conn.execute(
            "SELECT item, model, COUNT(*) FROM attempts WHERE kind = 'oversized' "
            "GROUP BY item, model HAVING COUNT(*) > 1"
        ).fetchall()
        longest = conn.execute("SELECT MAX(LENGTH(content)) FROM items").fetchone()[0]
    finally:
        conn.close()
    print(f"32 items, 32 answers of 200 MB (16 valid, 16 broken) at concurrency 16: peak RSS {peak_mib:.0f} MiB")
    assert states == {"done": N}, states  # nothing lost: every item fell back and was answered
    # Each huge answer is cut once and never asked for again on its model; a probe of a
    # model the cuts tripped may take one of the 32 huge answers instead of an item.
    assert 16 <= oversized <= 32 and twice == [], (oversized, twice)
    assert longest < 1000  # what is stored is the small fallback answers
    assert peak_mib < PEAK_BOUND_MIB, f"peak RSS {peak_mib:.0f} MiB"
