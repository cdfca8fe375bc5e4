"""Client overhead: CPU per request of capmon's FallbackClient against raw httpx.

    python -m benchmarks.overhead [--requests 5000] [--concurrency 32] [--reps 5] [--profile FILE]

An instant OpenAI-style endpoint (a bare ASGI app under uvicorn that answers every
POST with the same small chat completion, no sleep) runs in its own process. Each
measurement runs in a fresh client process: a warm-up of 300 requests, then
``--requests`` requests with ``--concurrency`` tasks, and the process's CPU time
(``time.process_time()``: user + system of the client process only) over the measured
requests is divided by their number. Kinds alternate (httpx, capmon, httpx, capmon, ...)
so drift on a shared machine hits both alike; the report gives the median of each and
the ratio of the medians (goal: capmon <= 1.25 x raw httpx).

What each client does per request:

* ``httpx``: ``AsyncClient.post(json=body)``, check the status, ``json.loads`` the body,
  read ``choices[0].message.content`` - the least a correct client does;
* ``capmon``: ``FallbackClient.chat(text)`` with three models (the benchmark config's
  shape) on the instant endpoint: choose a target (breaker, limiter, buckets), send,
  classify, update breaker / limiter / stats, publish events on a bus with no
  subscriber, build the ChatResult.

``--profile FILE`` also runs capmon once under cProfile and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ANSWER = json.dumps({
    "id": "chatcmpl-instant", "object": "chat.completion", "created": 1767225600, "model": "instant",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()
KEY = "sk-capmon-sim-demo"
WARMUP = 300


# ---------------------------------------------------------------- the instant endpoint


async def instant_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]})
    await send({"type": "http.response.body", "body": ANSWER})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(instant_app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off", timeout_keep_alive=30)


# ---------------------------------------------------------------- one measurement


def _config(base_url: str, concurrency: int):
    from benchmarks.peers.capmon_client import bench_config

    # Room for the whole concurrency on the first model from the start, so the measured
    # part is routing, not queueing behind a limiter still slow-starting.
    return bench_config(base_url, [f"limiter.initial={concurrency}", f"limiter.max={max(64, concurrency)}",
                                   f"client.max_connections={concurrency}"])


async def _drive(call: Any, n: int, concurrency: int) -> None:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    await asyncio.gather(*[worker() for _ in range(concurrency)])


async def measure(kind: str, base_url: str, n: int, concurrency: int) -> dict[str, float]:
    import httpx

    body = {"model": "sim-flagship", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 512, "n": 1}
    if kind == "httpx":
        client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0),
                                   limits=httpx.Limits(max_connections=concurrency,
                                                       max_keepalive_connections=concurrency))
        url = base_url + "/chat/completions"
        headers = {"Authorization": f"Bearer {KEY}"}

        async def call() -> None:
            r = await client.post(url, json=body, headers=headers)
            if r.status_code != 200:
                raise RuntimeError(f"status {r.status_code}")
            data = json.loads(r.content)
            if not isinstance(data["choices"][0]["message"]["content"], str):
                raise RuntimeError("no content")

        close = client.aclose
    elif kind == "capmon":
        from capmon.core.router import FallbackClient

        fc = FallbackClient(_config(base_url, concurrency), environ={})

        async def call() -> None:
            r = await fc.chat("Say ok.")
            if not isinstance(r.content, str):
                raise RuntimeError("no content")

        close = fc.aclose
    else:
        raise ValueError(kind)
    try:
        await _drive(call, WARMUP, concurrency)
        cpu0, t0 = time.process_time(), time.perf_counter()
        await _drive(call, n, concurrency)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    finally:
        await close()
    return {"cpu": cpu, "wall": wall, "cpu_per_request_us": cpu / n * 1e6, "requests_per_s": n / wall}


# ---------------------------------------------------------------- orchestration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("the instant endpoint did not start")


def _run_worker(kind: str, base_url: str, n: int, concurrency: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--worker", kind, "--url", base_url,
                          "--requests", str(n), "--concurrency", str(concurrency)],
                         capture_output=True, text=True, cwd=HERE.parent, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def profile(base_url: str, n: int, concurrency: int, path: str, top: int = 30) -> str:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    asyncio.run(measure("capmon", base_url, n, concurrency))
    prof.disable()
    prof.dump_stats(path)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--profile", metavar="FILE", help="also profile capmon with cProfile; stats to FILE")
    ap.add_argument("--worker", choices=["httpx", "capmon"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.worker:
        print(json.dumps(asyncio.run(measure(args.worker, args.url, args.requests, args.concurrency))))
        return 0

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.overhead", "--serve", str(port)], cwd=HERE.parent)
    try:
        _wait_port(port)
        base_url = f"http://127.0.0.1:{port}/v1"
        print(f"<!-- python -m benchmarks.overhead {' '.join(argv if argv is not None else sys.argv[1:])} -->")
        print(f"machine: {os.cpu_count()} cores; {args.requests} requests x {args.reps} reps per client, "
              f"concurrency {args.concurrency}, after {WARMUP} warm-up requests; each run in a fresh process\n")
        runs: dict[str, list[dict[str, float]]] = {"httpx": [], "capmon": []}
        for rep in range(args.reps):
            order = ["httpx", "capmon"] if rep % 2 == 0 else ["capmon", "httpx"]
            for kind in order:
                runs[kind].append(_run_worker(kind, base_url, args.requests, args.concurrency))
        print("| client | CPU us / request (median) | runs (us / request) | requests / s (median) |")
        print("|---|---|---|---|")
        med: dict[str, float] = {}
        for kind, rs in runs.items():
            per = [r["cpu_per_request_us"] for r in rs]
            med[kind] = statistics.median(per)
            rps = statistics.median(r["requests_per_s"] for r in rs)
            print(f"| {kind} | {med[kind]:.0f} | {', '.join(f'{p:.0f}' for p in per)} | {rps:.0f} |")
        pairs = [c["cpu_per_request_us"] / h["cpu_per_request_us"] for h, c in zip(runs["httpx"], runs["capmon"])]
        print(f"\nratio capmon / httpx (medians): **{med['capmon'] / med['httpx']:.2f}x** "
              f"(per repetition: {', '.join(f'{p:.2f}' for p in pairs)}; goal <= 1.25x)")
        if args.profile:
            print("\ncProfile of capmon (one run, sorted by own time):\n```")
            print(profile(base_url, args.requests, args.concurrency, args.profile))
            print("```")
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
