"""What every peer shares: the items, the worker pool, the timing and the result file."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

KEY = "sk-capmon-sim-demo"


@dataclass(frozen=True)
class PeerContext:
    base_url: str  # the simulator's OpenAI base URL, ending in /v1
    models: tuple[str, ...]  # preference order: the first is the preferred model
    workers: int
    items: int
    api_key: str = KEY
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Item:
    index: int
    prompt: str

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


@dataclass
class ItemResult:
    index: int
    ok: bool
    latency: float  # from the moment a worker picked the item up to its answer or failure
    model: str | None
    error: str | None = None


class Peer(Protocol):
    async def __aenter__(self) -> Peer: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def call(self, item: Item) -> str:
        """Send one item; return the model that served it; raise if it could not."""

    def extra(self) -> dict[str, Any]:
        """Peer-specific diagnostics for the report (may be empty)."""


def helper_cpu(peer: Peer) -> float:
    """CPU seconds used so far by the processes that work for ``peer`` (a gateway it
    started): part of the client's cost. Peers that have none need not say so."""
    read = getattr(peer, "helper_cpu", None)
    return float(read()) if callable(read) else 0.0


def make_items(n: int) -> list[Item]:
    return [
        Item(i, f"Item {i}: summarise the quarterly report for region {i % 17} in three sentences.") for i in range(n)
    ]


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= 160 else text[:157] + "..."


async def run_peer(peer: Peer, ctx: PeerContext, time_limit: float) -> dict[str, Any]:
    """Run ``ctx.items`` items through ``peer`` with ``ctx.workers`` workers. Items not
    finished within ``time_limit`` seconds are cancelled and count as not completed."""
    items = make_items(ctx.items)
    queue: asyncio.Queue[Item] = asyncio.Queue()
    for it in items:
        queue.put_nowait(it)
    results: dict[int, ItemResult] = {}
    picked: dict[int, float] = {}

    async def worker() -> None:
        while True:
            try:
                item = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            picked[item.index] = t0
            try:
                model = await peer.call(item)
                results[item.index] = ItemResult(item.index, True, time.perf_counter() - t0, model)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the item failed: that is a result, not a crash
                results[item.index] = ItemResult(item.index, False, time.perf_counter() - t0, None, _short(e))

    cpu0, helpers0 = time.process_time(), helper_cpu(peer)
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(ctx.workers)]
    done, pending = await asyncio.wait(tasks, timeout=time_limit)
    timed_out = bool(pending)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    helpers = helper_cpu(peer) - helpers0
    now = time.perf_counter()
    for it in items:
        if it.index not in results:
            started = picked.get(it.index)
            results[it.index] = ItemResult(
                it.index, False, (now - started) if started else 0.0, None, "not finished within the time limit"
            )
    # The wall time that matters is when the last item was settled (answered, or given up
    # by the peer), not when this loop noticed.
    last = max((picked[r.index] + r.latency - t0 for r in results.values() if r.index in picked), default=wall)
    return {
        "wall": last if not timed_out else wall,
        "wall_total": wall,
        "timed_out": timed_out,
        "cpu": cpu + helpers,  # the client's CPU: this process and its helpers (a gateway)
        "cpu_own": cpu,
        "cpu_helpers": helpers,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "pid": os.getpid(),
        "items": [asdict(results[i]) for i in sorted(results)],
        "extra": peer.extra() if hasattr(peer, "extra") else {},
    }


def write_json(path: str, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
