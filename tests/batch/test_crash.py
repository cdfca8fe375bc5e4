"""A real `capmon batch run` process, killed with SIGKILL, stopped with Ctrl+C, paused with SIGUSR1.

The simulator runs in this test's process on a loopback port; the batch process reaches
it over real sockets. These are the only batch tests that take real time (a few seconds).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
from pathlib import Path

from capmon.batch import read_progress
from capmon.core.base.exceptions import BatchError
from capmon.sim.scenario import parse_scenario
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.support import configs

N = 300

SCENARIO = parse_scenario("""
name = "crash"
keys = ["*"]
[[models]]
name = "sim-flagship"
slots = 64
base_latency = 0.02
per_token = 0.0
noise = 0.2
answer_tokens = 8
[[models]]
name = "sim-medium"
slots = 64
base_latency = 0.02
per_token = 0.0
answer_tokens = 8
""")


def write_config(path: Path, base_url: str) -> Path:
    return configs.write_config(
        path,
        base_url,
        endpoint="sim",
        simulated=True,
        keys=[("CAPMON_TEST_UNSET_KEY", "sim-key")],
        models={m: configs.SIMULATED_MODELS[m] for m in ("flagship", "medium")},
    )


async def capmon(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "capmon.cli", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def wait_for(db: Path, job: str, test, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            p = read_progress(db, job)
            if test(p):
                return p
        except (BatchError, sqlite3.Error):
            pass
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting on job {job}")


def ok_attempts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT item, count(*) FROM attempts WHERE decision = 'ok' GROUP BY item").fetchall())
    finally:
        conn.close()


async def test_kill_9_mid_run_loses_nothing_and_the_same_command_finishes_the_job(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", N)
    db, out = tmp_path / "jobs.db", tmp_path / "out.jsonl"
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
            "k",
            "--concurrency",
            "16",
            "--out",
            str(out),
        )
        proc = await capmon(*argv)
        await wait_for(db, "k", lambda p: p.done >= N // 4)
        proc.kill()  # SIGKILL: no cleanup of any kind
        await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not out.exists()

        after_kill = read_progress(db, "k")
        assert after_kill.state == "stopped" and N // 4 <= after_kill.done < N  # its runner is gone
        conn = sqlite3.connect(db)
        done_before = {r[0] for r in conn.execute("SELECT id FROM items WHERE state = 'done'")}
        conn.close()
        assert len(done_before) == after_kill.done

        proc = await capmon(*argv)  # the same command again
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-2000:]

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == [f"it-{i:04d}" for i in range(1, N + 1)]  # every item exactly once, in order
    assert all(r["model"] in ("flagship", "medium") and r["content"] for r in records)
    oks = ok_attempts(db)
    assert all(oks[i] == 1 for i in done_before)  # nothing already done was sent again
    assert set(oks) == {r["id"] for r in records}


async def test_sigusr1_pauses_and_ctrl_c_stops_cleanly_for_resume(tmp_path: Path) -> None:
    src = write_items(tmp_path / "in.jsonl", N)
    db = tmp_path / "jobs.db"
    async with running_simulator(SCENARIO) as sim:
        cfg = write_config(tmp_path / "config.toml", sim.base_url)
        proc = await capmon(
            "batch", "run", str(src), "--config", str(cfg), "--db", str(db), "--job", "s", "--concurrency", "4"
        )
        await wait_for(db, "s", lambda p: p.done >= 20)
        proc.send_signal(signal.SIGUSR1)
        paused = await wait_for(db, "s", lambda p: p.state == "paused" and p.in_flight == 0)
        await asyncio.sleep(0.4)
        assert read_progress(db, "s").done == paused.done  # nothing new started
        proc.send_signal(signal.SIGUSR1)
        await wait_for(db, "s", lambda p: p.state == "running" and p.done > paused.done)
        proc.send_signal(signal.SIGINT)
        _, err = await proc.communicate()
        assert proc.returncode == 130, err.decode()[-2000:]
        assert "stopped by Ctrl+C" in err.decode() and "capmon batch resume s" in err.decode()
        conn = sqlite3.connect(db)
        states = dict(conn.execute("SELECT state, count(*) FROM items GROUP BY state").fetchall())
        conn.close()
        assert "in_flight" not in states and states["done"] < N
        assert read_progress(db, "s").state == "stopped"

        proc = await capmon("batch", "resume", "s", "--config", str(cfg), "--db", str(db), "--concurrency", "16")
        _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-2000:]
    assert read_progress(db, "s").done == N
    assert all(n == 1 for n in ok_attempts(db).values())
