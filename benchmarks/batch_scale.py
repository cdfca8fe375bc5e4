"""One batch job on 1, 2 and 4 workers: PostgreSQL's shared store against SQLite's.

    python -m benchmarks.batch_scale [--items 2000] [--concurrency 8] [--latency 0.1]
                                     [--pg postgresql://postgres@127.0.0.1:5432/test] [--json FILE]

Each worker is a process of its own running a `BatchRunner` on the job, through a client
whose simulator answers every request after ``--latency`` seconds with room for all (an
in-process simulator per worker: the provider is never the bottleneck, the store may be).
The job is made fresh for every run (a schema of its own in PostgreSQL, a new file for
SQLite); the first worker ingests it, the others join. SQLite holds one runner per job, so
it runs with 1 worker only.

Printed side by side, per store and number of workers:

* items/s: the job's items over the time from the first worker sending to the last one
  done (start-up and ingest left out), and the speed-up over one worker (goal: 4 workers
  >= 3x);
* the store's time per item: what claiming it and writing its result cost, each call's
  time shared among the items it carried, p50 / p99 / mean (goal for PostgreSQL: p99 < 2 ms);
* the slowest claim and commit calls (p99 of the calls).

Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

SCENARIO = """
name = "room-for-all"
keys = ["*"]
[[models]]
name = "sim-flagship"
slots = 100000
base_latency = {latency}
per_token = 0.0
noise = 0.0
answer_tokens = 16
"""

CONFIG = """
[simulator]
enabled = false
[[endpoints]]
name = "sim"
base_url = "http://sim.local/v1"
simulated = true
keys = [{{ env = "CAPMON_BENCH_KEY", alias = "bench" }}]
[[models]]
name = "flagship"
api_model = "sim-flagship"
endpoints = ["sim"]
max_tokens = 64
[limiter]
initial = {concurrency}
max = {concurrency}
"""


class Timed:
    """A store whose claims (``take``) and commits are timed, the time shared among their items."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.per_item: defaultdict[int, float] = defaultdict(float)
        self.calls: dict[str, list[float]] = {"take": [], "commit": []}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def take(self, job_id: int, after_key: int, limit: int) -> Any:
        t = time.perf_counter()
        items = self._store.take(job_id, after_key, limit)
        d = time.perf_counter() - t
        self.calls["take"].append(d)
        for i in items or ():
            self.per_item[i.key] += d / len(items)
        return items

    def commit(self, job_id: int, **kw: Any) -> Any:
        t = time.perf_counter()
        out = self._store.commit(job_id, **kw)
        d = time.perf_counter() - t
        self.calls["commit"].append(d)
        outcomes = kw["outcomes"]
        for o in outcomes:
            self.per_item[o.key] += d / len(outcomes)
        return out


async def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from capmon.batch import runner as runner_module
    from capmon.batch.options import RunnerOptions
    from capmon.batch.store import locate, open_store
    from capmon.core.routing.client import FallbackClient
    from capmon.core.types.config import parse_config
    from capmon.core.types.events import BatchProgress
    from capmon.sim.app import create_app
    from capmon.sim.scenario import parse_scenario

    timed: list[Timed] = []

    def timed_store(db: Any, **kw: Any) -> Any:
        timed.append(Timed(open_store(db, **kw)))
        return timed[-1]

    runner_module.open_store = timed_store  # type: ignore[assignment]
    config = parse_config(CONFIG.format(concurrency=args.concurrency), "bench.toml")
    app = create_app(parse_scenario(SCENARIO.format(latency=args.latency)))
    client = FallbackClient(config, environ={}, transport=httpx.ASGITransport(app=app))
    started: list[float] = []

    def on_event(e: Any) -> None:
        if isinstance(e, BatchProgress) and e.state == "running" and not started:
            started.append(time.time())

    client.bus.subscribe(on_event)
    db = locate(args.db)
    runner = runner_module.BatchRunner(
        client, db, "scale", RunnerOptions(input_path=Path(args.input), concurrency=args.concurrency, lease_ttl=10.0)
    )
    summary = await runner.run()
    ended = time.time()
    await client.aclose()
    t = timed[0]
    return {
        "sent": summary.sent,
        "started": started[0] if started else ended,
        "ended": ended,
        "per_item": list(t.per_item.values()),
        "take": t.calls["take"],
        "commit": t.calls["commit"],
    }


def percentile(values: list[float], q: float) -> float:
    from capmon.core.base.text import percentile as p

    return p(sorted(values), q) or 0.0


def write_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"it-{i:05d}", "messages": [{"role": "user", "content": f"item {i}"}]}) + "\n")


def run(store: str, workers: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    src = workdir / "in.jsonl"
    if not src.exists():
        write_input(src, args.items)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    db = f"{args.pg}?schema={schema}" if store == "postgresql" else str(workdir / f"{uuid.uuid4().hex[:8]}.db")
    outs = [workdir / f"w{i}-{uuid.uuid4().hex[:6]}.json" for i in range(workers)]
    base = [sys.executable, "-m", "benchmarks.batch_scale", "--worker", "--input", str(src), "--db", db]
    base += ["--concurrency", str(args.concurrency), "--latency", str(args.latency)]
    procs = [subprocess.Popen([*base, "--out", str(o)], env={**os.environ, "CAPMON_BENCH_KEY": "k"}) for o in outs]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"a worker failed ({store}, {workers} workers)")
    if store == "postgresql":
        import psycopg

        with psycopg.connect(args.pg, autocommit=True) as c:
            c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    results = [json.loads(o.read_text()) for o in outs]
    per_item = [x for r in results for x in r["per_item"]]
    span = max(r["ended"] for r in results) - min(r["started"] for r in results)
    return {
        "store": store,
        "workers": workers,
        "items": args.items,
        "sent": sum(r["sent"] for r in results),
        "seconds": span,
        "items_per_s": args.items / span,
        "store_ms_p50": percentile(per_item, 0.5) * 1000,
        "store_ms_p99": percentile(per_item, 0.99) * 1000,
        "store_ms_mean": sum(per_item) / max(1, len(per_item)) * 1000,
        "claim_call_ms_p99": percentile([x for r in results for x in r["take"]], 0.99) * 1000,
        "commit_call_ms_p99": percentile([x for r in results for x in r["commit"]], 0.99) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=8, help="items in flight per worker")
    ap.add_argument("--latency", type=float, default=0.1, help="seconds the simulator takes per answer")
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--input", help=argparse.SUPPRESS)
    ap.add_argument("--db", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        Path(args.out).write_text(json.dumps(asyncio.run(run_worker(args))))
        return
    from capmon.core.base.text import table

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="capmon-scale-") as tmp:
        for store, counts in (("sqlite", (1,)), ("postgresql", (1, 2, 4))):
            for w in counts:
                r = run(store, w, args, Path(tmp))
                rows.append(r)
                print(f"{store} x{w}: {r['items_per_s']:.0f} items/s", file=sys.stderr, flush=True)
    one = {r["store"]: r["items_per_s"] for r in rows if r["workers"] == 1}
    lines = [("store", "workers", "items/s", "speed-up", "store ms/item p50", "p99", "mean", "claim p99", "commit p99")]
    for r in rows:
        lines.append(
            (
                r["store"],
                str(r["workers"]),
                f"{r['items_per_s']:.0f}",
                f"{r['items_per_s'] / one[r['store']]:.2f}x",
                f"{r['store_ms_p50']:.3f}",
                f"{r['store_ms_p99']:.3f}",
                f"{r['store_ms_mean']:.3f}",
                f"{r['claim_call_ms_p99']:.2f}",
                f"{r['commit_call_ms_p99']:.2f}",
            )
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{args.items} items, {args.concurrency} in flight per worker, answers after {args.latency:g}s "
        f"(a simulator with room for all); {os.cpu_count()} cores, load average {load:.1f} at the end "
        f"(the p99s are mostly the wait for a core when it is high)"
    )
    print("\n".join(table(lines, numbers_right=True)))
    four = next((r for r in rows if r["store"] == "postgresql" and r["workers"] == 4), None)
    if four:
        print(
            f"goals: 4 workers {four['items_per_s'] / one['postgresql']:.2f}x one worker (>= 3x); "
            f"PostgreSQL store time per item p99 {four['store_ms_p99']:.3f} ms (< 2 ms)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
