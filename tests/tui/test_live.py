"""The real app on a real engine: the simulator in-process on a free loopback port,
the real client, probe workers and a real demo batch job. A smoke test: a few
seconds of real time on a tiny, fast scenario."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from capmon.core.types.config import load_config
from capmon.tui.app import CapmonApp
from capmon.tui.source import LiveSource
from tests.support.configs import SIMULATED_MODELS, write_config
from tests.support.scripted import free_port
from tests.tui.conftest import SIZE
from tests.tui.screen_text import screen_text

SCENARIO = """
name = "tiny"
seed = 1

[[models]]
name = "sim-flagship"
slots = 2
base_latency = 0.05
per_token = 0.0
answer_tokens = 8
dialect = "openai-503"

[[models]]
name = "sim-medium"
slots = 4
base_latency = 0.04
per_token = 0.0
answer_tokens = 8
dialect = "openai-429"

[[models]]
name = "sim-small"
slots = 8
base_latency = 0.03
per_token = 0.0
answer_tokens = 8
dialect = "gemini-503"
"""


def write_live_config(path: Path, port: int) -> Path:
    """The embedded simulator on ``port`` serving the scenario in tiny.toml beside ``path``."""
    return write_config(
        path,
        f"http://127.0.0.1:{port}/v1",
        endpoint="sim",
        simulated=True,
        keys=[("CAPMON_SIM_API_KEY", "sim-key")],
        models=SIMULATED_MODELS,
        simulator={"enabled": True, "listen": f"127.0.0.1:{port}", "scenario": "tiny.toml"},
        breaker={"cooldown": 2.0, "ramp_duration": 1.0},
        dashboard={"refresh": 0.1, "probe_interval": 0.5, "demo_items": 300},
    )


def nothing_listens_on(port: int) -> bool:
    with socket.socket() as s:
        # SO_REUSEADDR: connections left in TIME_WAIT do not count, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_the_dashboard_runs_a_real_engine_and_shows_models_and_progress(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "tiny.toml").write_text(SCENARIO)
    write_live_config(tmp_path / "capmon.toml", port)
    config = load_config(tmp_path / "capmon.toml")
    source = LiveSource(config, environ={})
    app = CapmonApp(source, refresh=0.1)
    async with app.run_test(size=SIZE) as pilot:
        deadline = time.monotonic() + 8.0  # on an idle machine about one second
        while True:
            await pilot.pause(0.1)
            batch = source.batch()
            probed = app.snap is not None and all(t.probe_latency is not None for t in app.snap.targets)
            if batch is not None and batch.done > 0 and probed or time.monotonic() > deadline:
                break
        assert app.table.row_count == 3, screen_text(app)
        assert [t.model for t in app.snap.targets] == ["flagship", "medium", "small"]
        assert batch is not None and batch.done > 0, batch
        assert probed, app.snap  # every target was probed: latency shown
        text = screen_text(app)
        assert "Batch: demo" in text and "● closed" in text
        assert len(app.workers) >= 4  # three probes and the traffic worker
        await pilot.press("q")
        await pilot.pause()
    assert nothing_listens_on(port)  # the embedded simulator stopped with the app
