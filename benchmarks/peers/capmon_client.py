"""Peer (e): capmon's FallbackClient, with ``benchmarks/capmon-bench.toml``.

``ctx.options["capmon_set"]`` (from ``--capmon-set section.key=value``) overrides config
values, for trying limiter and breaker settings without editing the file. Besides the
answer it records what capmon's event bus says: failed attempts per model and kind,
fallbacks, retries, breaker transitions, and each limiter's final limit.
"""

from __future__ import annotations

import collections
import dataclasses
from pathlib import Path
from typing import Any

from benchmarks.peers.base import Item, PeerContext
from capmon.core.routing.client import FallbackClient
from capmon.core.types import events as ev
from capmon.core.types.config import Config, parse_config
from capmon.core.types.result import Request

CONFIG = Path(__file__).resolve().parent.parent / "capmon-bench.toml"


def _coerce(old: Any, raw: str) -> Any:
    if isinstance(old, bool):
        return raw.lower() in ("1", "true", "yes")
    if isinstance(old, int):
        return int(raw)
    if isinstance(old, float):
        return float(raw)
    return raw


def bench_config(base_url: str, overrides: list[str] | tuple[str, ...] = (), *, head: str | None = None) -> Config:
    """``capmon-bench.toml`` on ``base_url``, with ``overrides``; ``head``: other endpoints
    and models in place of the file's (its [client], [backoff]... sections kept)."""
    text = CONFIG.read_text(encoding="utf-8").replace("http://SIMULATOR/v1", base_url)
    if head is not None:
        text = head + "\n" + text[text.index("[client]") :]
    cfg = parse_config(text, str(CONFIG))
    for o in overrides:
        key, _, raw = o.partition("=")
        section, _, name = key.strip().partition(".")
        sub = getattr(cfg, section)
        sub = dataclasses.replace(sub, **{name: _coerce(getattr(sub, name), raw.strip())})
        cfg = dataclasses.replace(cfg, **{section: sub})
    return cfg


def apply_whatif(paths: list[str]) -> None:
    """Run each file (``benchmarks/whatif/*.py``): it monkeypatches capmon's core in this
    process only, to measure a proposed core change without editing capmon/."""
    for path in paths:
        code = Path(path).read_text(encoding="utf-8")
        exec(compile(code, path, "exec"), {"__name__": "whatif", "__file__": path})  # noqa: S102


class CapmonPeer:
    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.whatif = [str(Path(p).resolve()) for p in ctx.options.get("capmon_whatif", [])]
        apply_whatif(self.whatif)
        self.overrides = list(ctx.options.get("capmon_set", []))
        self.config = bench_config(ctx.base_url, self.overrides)
        self.bus = ev.EventBus(history=10)
        self.failed: collections.Counter[str] = collections.Counter()
        self.breaker: list[str] = []
        self.fellback = 0
        self.retries = 0
        self.bus.subscribe(self._on_event)
        self.client = FallbackClient(self.config, environ={}, bus=self.bus)

    def _on_event(self, e: ev.Event) -> None:
        if isinstance(e, ev.AttemptFailed):
            self.failed[f"{e.model}:{e.kind}:{e.status}"] += 1
        elif isinstance(e, ev.BreakerChanged):
            self.breaker.append(f"{e.at:.2f} {e.model} {e.old}->{e.new} ({e.reason})")
        elif isinstance(e, ev.FellBack):
            self.fellback += 1
        elif isinstance(e, ev.RetryScheduled):
            self.retries += 1

    async def __aenter__(self) -> CapmonPeer:
        self.t0: float | None = None  # set by the first call: the run starts after READY / GO
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def call(self, item: Item) -> str:
        if self.t0 is None:
            self.t0 = self.client.clock.now()
        r = await self.client.chat(Request.of(item.messages, item_id=str(item.index)))
        return r.model

    def extra(self) -> dict[str, Any]:
        limits = {}
        for t in self.client.targets:
            v = t.state.view()
            limits[t.model.name] = {
                "limit": round(v.limiter.limit, 2),
                "capacity": v.limiter.capacity,
                "breaker": v.breaker.state.value,
            }
        return {
            "config_overrides": self.overrides,
            "whatif": [Path(p).stem for p in self.whatif],
            "attempts_failed": dict(sorted(self.failed.items())),
            "fell_back": self.fellback,
            "retry_waits": self.retries,
            "breaker": [
                f"t+{float(s.split(' ', 1)[0]) - (self.t0 or 0.0):.2f}s {s.split(' ', 1)[1]}" for s in self.breaker
            ],
            "limiters": limits,
        }


def make(ctx: PeerContext) -> CapmonPeer:
    return CapmonPeer(ctx)
