"""Run one peer in this process: ``python -m benchmarks.peers PEER --base-url URL ...``.

The runner (``python -m benchmarks.run``) starts one of these per peer and scenario and
reads the JSON it writes; it is also handy alone, against a simulator you started.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys

from benchmarks.peers import PEERS
from benchmarks.peers.base import PeerContext, run_peer, write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers")
    p.add_argument("peer", choices=list(PEERS))
    p.add_argument("--base-url", required=True)
    p.add_argument("--models", required=True, help="comma-separated, preferred first")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--items", type=int, default=400)
    p.add_argument("--time-limit", type=float, default=120.0)
    p.add_argument("--options", default="{}", help="JSON object of peer options")
    p.add_argument("--out", required=True)
    p.add_argument("--wait-for-go", action="store_true", help="print READY, then wait for GO on stdin")
    args = p.parse_args(argv)
    ctx = PeerContext(
        base_url=args.base_url,
        models=tuple(args.models.split(",")),
        workers=args.workers,
        items=args.items,
        options=json.loads(args.options),
    )
    module = importlib.import_module(f"benchmarks.peers.{PEERS[args.peer]}")

    async def go() -> dict:
        async with module.make(ctx) as peer:
            if args.wait_for_go:
                # Imports and setup are done (LiteLLM's take seconds): tell the runner, which
                # now starts the simulator, so every peer meets the scenario at t = 0.
                print("READY", flush=True)
                if sys.stdin.readline().strip() != "GO":
                    raise SystemExit("runner went away before GO")
            return await run_peer(peer, ctx, args.time_limit)

    result = asyncio.run(go())
    result["peer"] = args.peer
    write_json(args.out, result)
    if args.wait_for_go:
        print("DONE", flush=True)  # the runner reads the simulator's counters now
    return 0


if __name__ == "__main__":
    sys.exit(main())
