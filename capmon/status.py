"""`capmon status`: the client's snapshot as text or JSON, without the dashboard."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TextIO

from capmon.core.snapshot import EngineSnapshot, TargetSnapshot
from capmon.runtime import load, open_engine


def _fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _state(t: TargetSnapshot, now: float) -> str:
    text = t.state
    if t.state == "ramp" and t.ramp_share is not None:
        text += f" {t.ramp_share:.0%}"
    if t.cooldown_until is not None and t.cooldown_until > now:
        text += f" ({t.cooldown_until - now:.0f}s)"
    if t.manual:
        text += " [manual]"
    if t.key_state != "ok":
        text += f" key {t.key_state}"
    return text


def format_snapshot(snap: EngineSnapshot) -> str:
    header = ("model", "target", "state", "limit", "in-flight", "req/s", "429/min", "503/min", "err%", "p50", "p99", "last")
    rows = [header]
    for t in snap.targets:
        w60 = t.window(60)
        pin = "*" if snap.pinned == t.model else ""
        rows.append((
            pin + t.model, t.target, _state(t, snap.now), f"{t.limit:.1f}", str(t.in_flight), f"{w60.per_second:.2f}",
            f"{w60.per_minute(w60.rate_limited):.0f}", f"{w60.per_minute(w60.capacity):.0f}", f"{w60.error_share:.0%}",
            _fmt_ms(w60.p50), _fmt_ms(w60.p99), str(t.last_status or "-"),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines.append("")
    lines.append(f"pinned: {snap.pinned or 'automatic'}   in flight: {snap.in_flight}   queued: {snap.queued}   "
                 f"waiting retries: {len(snap.waiting)}   requests: {snap.requests} ({snap.succeeded} ok, {snap.failed} failed)")
    return "\n".join(lines)


async def _collect(args: argparse.Namespace) -> EngineSnapshot:
    config = load(getattr(args, "config", None))
    async with open_engine(config) as engine:
        if getattr(args, "probe", False):
            await asyncio.gather(*(engine.client.probe(t.id) for t in engine.client.targets))
        return engine.client.snapshot()


def run_status(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    snap = asyncio.run(_collect(args))
    if getattr(args, "json", False):
        json.dump(snap.to_dict(), out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(format_snapshot(snap) + "\n")
    return 0
