"""A borrowed simulator (a reported bug): two capmon engines share one config; the second
borrows the first's simulator. When the first exits, the second must say so at once and
take over the address, so its work goes on. Two engines in this process, real HTTP."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from capmon.core.types.config import load_config
from capmon.core.types.events import Event, Notice
from capmon.core.types.result import Request
from capmon.runtime import open_engine
from capmon.sim.server import probe
from tests.support.configs import shipped_config
from tests.support.scripted import free_port

ROOT = Path(__file__).resolve().parents[2]
FAST_SCENARIO = """
name = "fast"
[[models]]
name = "sim-flagship"
base_latency = 0.001
per_token = 0.0
noise = 0.0
answer_tokens = 5
[[models]]
name = "sim-medium"
base_latency = 0.001
per_token = 0.0
answer_tokens = 5
[[models]]
name = "sim-small"
base_latency = 0.001
per_token = 0.0
answer_tokens = 5
"""


async def test_the_borrower_reports_the_loss_and_takes_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    config = load_config(str(shipped_config(tmp_path, FAST_SCENARIO, port=port)[0]))
    notices: list[tuple[float, Notice]] = []

    def on_event(event: Event) -> None:
        if isinstance(event, Notice):
            notices.append((time.monotonic(), event))

    owner = open_engine(config, environ={})
    first = await owner.__aenter__()
    owner_open = True
    try:
        assert first.simulator_started
        async with open_engine(config, environ={}) as second:
            assert not second.simulator_started  # it borrowed the first one's simulator
            second.bus.subscribe(on_event)
            assert (await second.client.chat(Request.of("hello", max_tokens=5))).content
            await asyncio.sleep(1.3)
            assert notices == []  # a borrowed simulator that is still there is no news

            caplog.set_level(logging.WARNING, logger="capmon.runtime")
            await owner.__aexit__(None, None, None)  # the owner exits
            owner_open = False
            gone = time.monotonic()
            for _ in range(100):
                if any(n.level == "info" for _, n in notices):
                    break
                await asyncio.sleep(0.05)
            levels = [n.level for _, n in notices]
            assert levels[:1] == ["warning"] and "info" in levels, notices
            warned_at, warning = notices[0]
            assert warned_at - gone < 5.0  # at once: the watch looks every ~1 s (5 s: a loaded machine)
            assert f"127.0.0.1:{port}" in warning.message and "gone away" in warning.message
            assert any(r.levelno == logging.WARNING and "gone away" in r.getMessage() for r in caplog.records)
            assert second.simulator_started  # it serves the address itself now
            assert await probe("127.0.0.1", port) is True
            assert (await second.client.chat(Request.of("still there?", max_tokens=5))).content
        assert await probe("127.0.0.1", port) is None  # and it stopped what it started
    finally:
        if owner_open:
            await owner.__aexit__(None, None, None)
