"""`capmon status`: the client's snapshot as text or JSON, without the dashboard; with
``--connect URL``, the snapshot of the client inside a running gateway (``capmon serve``)."""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from typing import TextIO

from capmon.connect import ConnectOptions, GatewayClient, resolve
from capmon.core.base import text
from capmon.core.base.exceptions import CapmonError
from capmon.core.control.breaker import State
from capmon.core.control.seam import KeyState
from capmon.core.types.snapshot import EngineSnapshot, LinkState, SharedStatus, TargetSnapshot
from capmon.exitcodes import EXIT_OK, EXIT_UNREACHABLE
from capmon.runtime import load, open_engine


@dataclass(frozen=True)
class StatusOptions:
    config: str | None = None  # a config path; None: the usual search (capmon/core/types/config.py find_config)
    json: bool = False  # the snapshot as JSON instead of a table
    probe: bool = False  # probe every target once first, so latency and last status are fresh
    connect: ConnectOptions | None = None  # a gateway's snapshot instead of a client started here

    def __post_init__(self) -> None:
        if self.connect is not None and self.probe:
            raise CapmonError("--probe does not go with --connect: the gateway probes its own models")
        if self.connect is not None and self.config is not None:
            raise CapmonError("--config does not go with --connect: the gateway runs on its own config")


def _state(t: TargetSnapshot, now: float) -> str:
    words = str(t.state)
    if t.state == State.RAMP and t.ramp_share is not None:
        words += f" {t.ramp_share:.0%}"
    if t.cooldown_until is not None and t.cooldown_until > now:
        words += f" ({t.cooldown_until - now:.0f}s)"
    if t.manual:
        words += " [manual]"
    if t.key_state != KeyState.OK:
        words += f" key {t.key_state}"
    if t.unreachable_reason:
        words += " unreachable"
    return words


def unreachable(snap: EngineSnapshot) -> list[str]:
    """One line per endpoint that could not be connected to at its last attempt, naming the cause."""
    return [f"unreachable: {why}" for why in dict.fromkeys(t.unreachable_reason for t in snap.targets) if why]


def learned(snap: EngineSnapshot) -> list[str]:
    """One line per deployment and feature its provider said it lacks (requests that need it skip it)."""
    seen: dict[str, str] = {}
    for t in snap.targets:
        for feature, why in t.lacks.items():
            seen.setdefault(f"learned: {t.model}@{t.endpoint} has no {feature}", text.shorten(why, 100) if why else "")
    return [f"{line} ({why})" if why else line for line, why in seen.items()]


def _shared(shared: SharedStatus) -> list[str]:
    if shared.state is LinkState.OFF:
        return []
    head = f"{shared.label} ({shared.url} {shared.namespace})"
    if shared.state is LinkState.DEGRADED and shared.message:
        head += f": {shared.message}"
    return [head] + [
        f"  {'*' if p.this else ' '} {p.role:<9} {p.host}:{p.pid}  {p.in_flight} in flight"
        + ("  degraded" if p.degraded else "")
        for p in shared.processes
    ]


def format_snapshot(snap: EngineSnapshot) -> str:
    rows = [
        (
            "model",
            "api",
            "target",
            "state",
            "limit",
            "in-flight",
            "req/s",
            "429/min",
            "503/min",
            "err%",
            "p50",
            "p99",
            "last",
        )
    ]
    for t in snap.targets:
        w60 = t.window(60)
        pin = "*" if t.pinned_by(snap.pinned) else ""
        rows.append(
            (
                pin + t.model,
                t.api,
                t.target,
                _state(t, snap.now),
                f"{t.limit:.1f}",
                str(t.in_flight),
                f"{w60.per_second:.2f}",
                f"{w60.per_minute(w60.rate_limited):.0f}",
                f"{w60.per_minute(w60.capacity):.0f}",
                f"{w60.error_share:.0%}",
                text.latency(w60.p50),
                text.latency(w60.p99),
                str(t.last_status or "-"),
            )
        )
    lines = text.table(rows)
    lines.append("")
    lines.append(
        f"pinned: {snap.pinned or 'automatic'}   in flight: {snap.in_flight}   queued: {snap.queued}   "
        f"waiting retries: {len(snap.waiting)}   requests: {snap.requests} ({snap.succeeded} ok, {snap.failed} failed, "
        f"{snap.cancelled} cancelled, {snap.in_progress} in progress)"
    )
    lines.extend(unreachable(snap))
    lines.extend(learned(snap))
    lines.extend(_shared(snap.shared))
    return "\n".join(lines)


async def collect(options: StatusOptions) -> EngineSnapshot:
    """Start the engine the config describes (and its simulator), take one snapshot, stop."""
    config = load(options.config)
    async with open_engine(config, role="library") as engine:
        if options.probe:
            await asyncio.gather(*(engine.client.probe(t.id) for t in engine.client.targets))
        return engine.client.snapshot()


async def collect_remote(options: ConnectOptions) -> EngineSnapshot:
    """The snapshot of a running gateway. Raises CapmonError (one line) when the address
    is wrong or unreachable, or the key refused."""
    async with GatewayClient(resolve(options)) as http:
        return await http.snapshot()


def run_status(options: StatusOptions, out: TextIO | None = None) -> int:
    """Print one snapshot, whatever state the models are in (that is what it is for). With
    ``--probe`` it is a health check too: an endpoint that could not be connected to exits
    with EXIT_UNREACHABLE, its cause printed."""
    out = out or sys.stdout
    if options.connect is not None:
        snap = asyncio.run(collect_remote(options.connect))
    else:
        snap = asyncio.run(collect(options))
    if options.json:
        json.dump(snap.to_dict(), out, indent=2, default=str)
        out.write("\n")
    else:
        out.write(format_snapshot(snap) + "\n")
    if options.probe and unreachable(snap):
        return EXIT_UNREACHABLE
    return EXIT_OK
