"""A batch job streamed (``--stream``) whose items break mid-answer finishes with whole answers,
and ``capmon report`` counts the continued items (issue 29, item 4). Real HTTP against the simulator."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY
from capmon.report import ReportOptions, run_report
from capmon.sim.scenario import ModelSpec, Scenario
from capmon.sim.streams import _WORDS
from tests.batch.helpers import rows, write_items
from tests.support.configs import build_config, sim_models
from tests.support.simulated import StartSim

pytestmark = pytest.mark.looptime

WORDS = 60


def whole(text: str) -> bool:
    """``text`` is one of the simulator's unbroken answers of WORDS words: nothing repeated, nothing missing."""
    said, n = text.split(), len(_WORDS)
    return len(said) == WORDS and any(all(_WORDS[(s + i) % n] == w for i, w in enumerate(said)) for s in range(n))


async def test_a_streamed_job_whose_items_break_mid_answer_finishes_whole(tmp_path: Path, start_sim: StartSim) -> None:
    models = tuple(
        ModelSpec(name=f"sim-{m}", base_latency=0.1, per_token=0.0, noise=0.0, answer_tokens=WORDS)
        for m in ("flagship", "medium")
    )
    sim = await start_sim(Scenario(name="continued", models=models))
    async with httpx.AsyncClient(trust_env=False) as http:
        r = await http.post(f"{sim.admin_url}/faults", json={"mode": "stream_cut", "after": 10, "count": 3})
        assert r.status_code == 200
    cfg = build_config(sim.base_url, models=sim_models(["flagship", "medium"]), keys=[("SIM_KEY", "sim")])
    db = tmp_path / "jobs.db"
    async with FallbackClient(cfg, environ={"SIM_KEY": SIMULATOR_DEMO_KEY}) as client:
        runner = BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 5), concurrency=1, stream=True)
        )
        summary = await runner.run()
    assert (summary.done, summary.failed) == (5, 0)
    answers = [c for (c,) in rows(db, "SELECT content FROM items ORDER BY line")]
    assert all(whole(a) for a in answers), answers
    # The cut takes any stream, a continuation's too (which then runs whole: it is shorter than the cut).
    continued = len(rows(db, "SELECT DISTINCT item FROM attempts WHERE decision = 'continue'"))
    assert continued >= 2
    out = io.StringIO()
    assert run_report(ReportOptions(job="j", db=db), out) == 0
    assert (
        f"continued: {continued} items whose answer broke mid-stream were finished by a continuation" in out.getvalue()
    )
