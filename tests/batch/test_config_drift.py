"""Resume against a config that changed: items naming a model the config no longer has
are refused before anything is sent, unless ``remap`` says where they go; other changes
(endpoints, keys) are fine. In-process simulator, fast-forwarded time."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from capmon.batch import BatchRunner
from capmon.batch.options import RunnerOptions
from capmon.core.base.exceptions import BatchError
from capmon.report import ReportOptions, run_report
from tests.batch.helpers import Recorder, client_for, config, item, rows, scenario_app, write_jsonl
from tests.support.configs import three_models

pytestmark = pytest.mark.looptime


def without_small() -> object:
    cfg = config()
    return type(cfg)(**{**cfg.__dict__, "models": tuple(m for m in cfg.models if m.name != "small")})


async def _stopped_job(tmp_path: Path, rec: Recorder) -> Path:
    """A job of 40 items, 20 naming `small`, stopped after a few are done."""
    src = write_jsonl(tmp_path / "in.jsonl", [item(i, **({"model": "small"} if i % 2 else {})) for i in range(1, 41)])
    async with client_for(rec) as client:
        runner = BatchRunner(client, tmp_path / "jobs.db", "j", RunnerOptions(input_path=src, concurrency=2))
        task = asyncio.create_task(runner.run())
        while runner.progress().done < 6:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    return src


async def test_items_naming_a_model_the_config_lost_are_refused_before_anything_is_sent(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.5))
    await _stopped_job(tmp_path, rec)
    sent = len(rec.seen)
    async with client_for(rec, config=without_small()) as client:
        with pytest.raises(BatchError) as e:
            await BatchRunner(client, tmp_path / "jobs.db", "j").run()
    message = str(e.value)
    assert "'small'" in message and "--remap small=" in message and "\n" not in message
    assert "flagship, medium" in message  # what the config has
    assert len(rec.seen) == sent


async def test_remap_sends_them_to_the_model_it_names_and_is_remembered(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.5))
    await _stopped_job(tmp_path, rec)
    left = {
        r[0] for r in rows(tmp_path / "jobs.db", "SELECT id FROM items WHERE state != 'done' AND req_model = 'small'")
    }
    assert left
    sent = len(rec.seen)
    async with client_for(rec, config=without_small()) as client:
        with pytest.raises(BatchError, match="^remap small=tiny: no model named 'tiny'"):
            await BatchRunner(client, tmp_path / "jobs.db", "j", RunnerOptions(remap={"small": "tiny"})).run()
        summary = await BatchRunner(client, tmp_path / "jobs.db", "j", RunnerOptions(remap={"small": "medium"})).run()
        assert summary.done == 40
        # Remembered: a later resume needs no --remap.
        assert (await BatchRunner(client, tmp_path / "jobs.db", "j").run()).sent == 0
    served = dict(rows(tmp_path / "jobs.db", "SELECT id, model FROM items"))
    assert {served[i] for i in left} == {"medium"}
    assert {m for _, m, c in rec.seen[sent:] if c in left} == {"medium"}  # asked of medium, not a silent stand-in
    # The text report names the remap too, as `batch show` and `report --json` do (it did not).
    out = io.StringIO()
    run_report(ReportOptions(job="j", db=tmp_path / "jobs.db"), out)
    assert "settings: concurrency 16, rate -/s, window -, remap small=medium;" in out.getvalue()


async def test_a_new_endpoint_or_key_is_fine(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.5))
    await _stopped_job(tmp_path, rec)
    moved = three_models("http://elsewhere.test/v1", keys='[{ env = "TEST_KEY_B", alias = "b" }]')
    async with client_for(rec, config=moved) as client:
        summary = await BatchRunner(client, tmp_path / "jobs.db", "j").run()
    assert (summary.done, summary.failed) == (40, 0)
