"""What the batch layer costs on top of the client: time and memory.

Runs N items (default 100,000) against an in-process simulator that answers at once
(no latency, no capacity limit), twice, each in a fresh process so peak RSS is its own:

  client  N requests through the FallbackClient alone, by a pool of --concurrency tasks
  batch   the same N items through `BatchRunner` (ingest from JSONL, SQLite state,
          audit rows, progress events), same concurrency, same config

and prints time, items per second, peak RSS and RSS during the run side by side, and
the ratio batch / client (goal: <= 1.2x). Export is timed separately.

    python benchmarks/batch_overhead.py                 # 100,000 items
    python benchmarks/batch_overhead.py --items 20000 --repeat 3   # best of three, alternating

On a shared machine, use --repeat: phases alternate (client, batch, client, ...) and the
best time of each is compared, so load from elsewhere hits both sides alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from capmon.batch.options import RunnerOptions

INSTANT = """
name = "instant"
keys = ["*"]
[[models]]
name = "sim-flagship"
slots = 1000000
base_latency = 0.0
per_token = 0.0
noise = 0.0
answer_tokens = 24
[[models]]
name = "sim-medium"
slots = 1000000
base_latency = 0.0
per_token = 0.0
noise = 0.0
answer_tokens = 24
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
max_tokens = 256

[[models]]
name = "medium"
api_model = "sim-medium"
endpoints = ["sim"]
max_tokens = 256

[limiter]
initial = {concurrency}
max = {limit_max}
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def messages(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": "You are terse."},
        {
            "role": "user",
            "content": f"Item {i}: summarise the following ticket in one line. The parcel arrived late "
            f"and the box was damaged; the customer asks for a partial refund.",
        },
    ]


def write_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps({"id": f"it-{i:07d}", "messages": messages(i), "max_tokens": 64, "metadata": {"n": i}})
                + "\n"
            )


def make_client(concurrency: int) -> Any:
    import httpx

    from capmon.core.routing.client import FallbackClient
    from capmon.core.types.config import parse_config
    from capmon.sim.app import create_app
    from capmon.sim.scenario import parse_scenario

    config = parse_config(CONFIG.format(concurrency=concurrency, limit_max=max(64, concurrency * 2)), "bench.toml")
    app = create_app(parse_scenario(INSTANT))
    return FallbackClient(config, environ={}, transport=httpx.ASGITransport(app=app))


class Sampler:
    """RSS every second while the run goes, to show it stays flat."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            self.samples.append(round(rss_mb(), 1))
            await asyncio.sleep(1.0)


async def phase_client(n: int, concurrency: int) -> dict[str, Any]:
    from capmon.core.types.result import Request

    client = make_client(concurrency)
    base = rss_mb()
    sampler = Sampler()
    counter = iter(range(n))
    done = 0

    async def worker() -> None:
        nonlocal done
        for i in counter:
            await client.chat(Request(messages=tuple(messages(i)), max_tokens=64, item_id=f"it-{i:07d}"))
            done += 1

    t0 = time.perf_counter()
    sampling = asyncio.create_task(sampler.run())
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - t0
    sampling.cancel()
    await client.aclose()
    assert done == n
    return {
        "seconds": seconds,
        "items_per_s": n / seconds,
        "base_rss_mb": base,
        "peak_rss_mb": peak_rss_mb(),
        "rss_samples": sampler.samples,
    }


async def phase_batch(n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    from capmon.batch import BatchRunner
    from capmon.batch.export import export_job

    input_path = workdir / "input.jsonl"
    t = time.perf_counter()
    write_input(input_path, n)
    write_seconds = time.perf_counter() - t
    db = workdir / "jobs.db"
    client = make_client(concurrency)
    base = rss_mb()
    sampler = Sampler()
    runner = BatchRunner(client, db, "bench", RunnerOptions(input_path=input_path, concurrency=concurrency))
    t0 = time.perf_counter()
    sampling = asyncio.create_task(sampler.run())
    summary = await runner.run()
    seconds = time.perf_counter() - t0
    sampling.cancel()
    await client.aclose()
    assert summary.done == n, summary
    t = time.perf_counter()
    exported = export_job(db, "bench", workdir / "out.jsonl")
    export_seconds = time.perf_counter() - t
    assert exported.written == n
    return {
        "seconds": seconds,
        "items_per_s": n / seconds,
        "base_rss_mb": base,
        "peak_rss_mb": peak_rss_mb(),
        "rss_samples": sampler.samples,
        "export_seconds": export_seconds,
        "write_input_seconds": write_seconds,
        "db_mb": sum(p.stat().st_size for p in workdir.glob("jobs.db*")) / 2**20,
    }


def run_phase(phase: str, n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--phase",
            phase,
            "--items",
            str(n),
            "--concurrency",
            str(concurrency),
            "--workdir",
            str(workdir),
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{phase} phase failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=100_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--repeat", type=int, default=1, help="run each phase this many times, alternating; keep the best")
    p.add_argument("--phase", choices=("client", "batch"), help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase == "client":
        print(json.dumps(asyncio.run(phase_client(args.items, args.concurrency))))
        return
    if args.phase == "batch":
        print(json.dumps(asyncio.run(phase_batch(args.items, args.concurrency, Path(args.workdir)))))
        return

    print(
        f"{args.items:,} items, concurrency {args.concurrency}, instant in-process simulator"
        + (f", best of {args.repeat}" if args.repeat > 1 else ""),
        flush=True,
    )
    clients, batches = [], []
    for _ in range(max(1, args.repeat)):
        with tempfile.TemporaryDirectory(prefix="capmon-bench-") as tmp:
            clients.append(run_phase("client", args.items, args.concurrency, Path(tmp)))
            batches.append(run_phase("batch", args.items, args.concurrency, Path(tmp)))
    client = min(clients, key=lambda r: r["seconds"])
    batch = min(batches, key=lambda r: r["seconds"])
    if args.repeat > 1:
        print(
            "times: client "
            + ", ".join(f"{r['seconds']:.1f}s" for r in clients)
            + "; batch "
            + ", ".join(f"{r['seconds']:.1f}s" for r in batches)
        )

    def samples(r: dict[str, Any]) -> str:
        s = r["rss_samples"]
        picks = [s[int(i * (len(s) - 1) / 4)] for i in range(5)] if len(s) >= 5 else s
        return " ".join(f"{x:.0f}" for x in picks)

    rows = [
        ("", "client alone", "batch layer"),
        ("time", f"{client['seconds']:.1f}s", f"{batch['seconds']:.1f}s (ingest included)"),
        ("items/s", f"{client['items_per_s']:,.0f}", f"{batch['items_per_s']:,.0f}"),
        ("RSS at start", f"{client['base_rss_mb']:.0f} MB", f"{batch['base_rss_mb']:.0f} MB"),
        ("peak RSS", f"{client['peak_rss_mb']:.0f} MB", f"{batch['peak_rss_mb']:.0f} MB"),
        ("RSS over the run", samples(client) + " MB", samples(batch) + " MB"),
    ]
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join(c.ljust(width[i]) for i, c in enumerate(r)))
    print(
        f"export: {batch['export_seconds']:.1f}s; database {batch['db_mb']:.0f} MB; "
        f"writing the input (not timed): {batch['write_input_seconds']:.1f}s"
    )
    ratio = batch["seconds"] / client["seconds"]
    print(f"ratio batch / client: {ratio:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()
