"""Helpers for batch tests: input files, an ASGI recorder, clients on in-process apps."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config
from capmon.core.types.events import Event, EventBus
from capmon.sim.app import create_app
from capmon.sim.scenario import parse_scenario
from tests.support.configs import ENV, build_config, three_models

FAST_SCENARIO = """
name = "fast"
keys = ["*"]
seed = 5
[[models]]
name = "flagship"
slots = {flagship_slots}
base_latency = {latency}
per_token = 0.0
noise = 0.0
answer_tokens = 12
[[models]]
name = "medium"
slots = 64
base_latency = {latency}
per_token = 0.0
noise = 0.0
answer_tokens = 12
[[models]]
name = "small"
slots = 64
base_latency = {latency}
per_token = 0.0
noise = 0.0
answer_tokens = 12
"""


def scenario_app(latency: float = 0.05, flagship_slots: int = 64) -> Any:
    return create_app(parse_scenario(FAST_SCENARIO.format(latency=latency, flagship_slots=flagship_slots)))


def item(i: int | str, **extra: Any) -> dict[str, Any]:
    """An item whose user message is its id, so the server can tell which item it got."""
    item_id = i if isinstance(i, str) else f"it-{i:04d}"
    return {"id": item_id, "messages": [{"role": "user", "content": item_id}], **extra}


def write_jsonl(path: Path, rows: Iterable[Any]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def write_items(path: Path, n: int, **extra: Any) -> Path:
    return write_jsonl(path, (item(i, **extra) for i in range(1, n + 1)))


class Recorder:
    """ASGI middleware: which item each request carried, when, and how many ran at once."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.current = 0
        self.peak = 0
        self.seen: list[tuple[float, str, str]] = []  # (loop time, model, user content)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    body = json.loads(b"".join(chunks))
                    content = body["messages"][-1]["content"]
                    self.seen.append((asyncio.get_running_loop().time(), body.get("model", ""), str(content)))
            return message

        self.current += 1
        self.peak = max(self.peak, self.current)
        try:
            await self.app(scope, recording_receive, send)
        finally:
            self.current -= 1

    def items(self) -> list[str]:
        return [content for _, _, content in self.seen]


def client_for(
    app: Any, config: Config | None = None, *, extra: str = "", bus: EventBus | None = None, **kw: Any
) -> FallbackClient:
    cfg = config or three_models("http://sim.test/v1", extra=extra, **kw)
    return FallbackClient(cfg, environ=ENV, transport=httpx.ASGITransport(app=app), bus=bus)


def config(extra: str = "", **kw: Any) -> Config:
    return three_models("http://sim.test/v1", extra=extra, **kw)


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def collect(bus: EventBus, kind: type[Event]) -> list[Any]:
    got: list[Any] = []
    bus.subscribe(lambda e: got.append(e) if isinstance(e, kind) else None)
    return got


def single_config(base_url: str, extra: str = "") -> Config:
    return build_config(base_url, models=["flagship"], extra=extra, file="single.toml")
