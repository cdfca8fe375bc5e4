"""The shipped demo, as a new user starts it (`capmon`): within its first simulated
minute the dashboard's event log shows a fallback across providers, the flagship on
OpenAI's wire to claude on Anthropic's API or Vertex AI (whichever of claude's deployments
has the most room then: ``spread = "room"``). The real config.toml, the embedded simulator
with the bundled demo scenario, the dashboard's own source and workers (probes and the
demo batch job); the loop's clock fast-forwarded (looptime), so a minute takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from capmon.core.types import events as ev
from capmon.core.types.config import EndpointApi, load_config
from capmon.tui.digest import EventDigester
from capmon.tui.source import LiveSource
from tests.support.configs import shipped_config

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.looptime


async def test_the_demo_shows_a_fallback_across_providers_in_its_first_minute(tmp_path: Path) -> None:
    config = load_config(shipped_config(tmp_path)[0])
    assert config.simulator.scenario == "demo"
    source = LiveSource(config, environ={})
    crossed: list[ev.FellBack] = []
    seen = asyncio.Event()

    def watch(e: ev.Event) -> None:
        if isinstance(e, ev.FellBack) and e.crosses_providers:
            crossed.append(e)
            if (e.from_model, e.to_model) == ("flagship", "claude"):
                seen.set()

    source.bus.subscribe(watch)
    await source.start()
    try:
        t0 = source.clock.now()
        workers = [asyncio.create_task(w.run()) for w in source.workers()]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(seen.wait(), 60.0)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        apis = {t.target: t.api for t in source.snapshot().targets}
    finally:
        await source.stop()

    assert apis == {
        "flagship@sim/sim-key": EndpointApi.OPENAI,
        "claude@sim-anthropic/sim-key": EndpointApi.ANTHROPIC,
        "claude@sim-vertex/sim-key": EndpointApi.VERTEX,
        "medium@sim/sim-key": EndpointApi.OPENAI,
        "gemini-flash@sim-gemini/sim-key": EndpointApi.GEMINI,
        "gemini-flash@sim-vertex/sim-key": EndpointApi.VERTEX,
        "small@sim/sim-key": EndpointApi.OPENAI,
    }
    assert seen.is_set(), f"no fallback flagship -> claude in the demo's first simulated minute: {crossed}"
    first = next(e for e in crossed if e.from_model == "flagship")
    assert first.at - t0 < 60.0
    assert (first.from_api, first.to_model) == ("openai", "claude") and first.to_api in ("anthropic", "vertex")
    # As the dashboard's event log writes it.
    lines = [line.plain for _, line in EventDigester().digest(list(crossed)).lines]
    assert any(f"flagship (openai) → claude ({first.to_api})" in line for line in lines), lines
