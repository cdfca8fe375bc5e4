"""`capmon batch compare`: the preferred model's answers beside a fallback's, on the simulator's
classify labels (capmon/sim/labels.py), whose disagreement share is known item by item."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from capmon.batch.compare import agrees, compare_job, sample
from capmon.batch.export import export_job
from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.batch.sqlite import FallbackItem
from capmon.batch.states import JobState
from capmon.batch.store import Db, open_store
from capmon.core.base.exceptions import BatchError
from capmon.core.routing.client import FallbackClient
from capmon.report import OutputFormat, ReportOptions, run_report
from capmon.sim.app import create_app
from capmon.sim.labels import disagrees, label_for
from capmon.sim.scenario import parse_scenario
from tests.batch.helpers import client_for, write_jsonl

LABELS = '["positive", "negative", "neutral"]'
SCENARIO = f"""
name = "labels"
keys = ["*"]
[[models]]
name = "flagship"
slots = 0
base_latency = 0.05
noise = 0.0
labels = {LABELS}
[[models]]
name = "medium"
slots = 64
base_latency = 0.05
noise = 0.0
labels = {LABELS}
disagree = 0.25
[[models]]
name = "small"
slots = 64
base_latency = 0.05
noise = 0.0
labels = {LABELS}
disagree = 0.25
"""
N = 80


def prompt(i: int) -> str:
    return f"Classify: review number {i} of the product"


async def run_job(client: FallbackClient, tmp_path: Path, db: Db, n: int, width: int = 0) -> None:
    """Job ``j`` of ``n`` prompts (ids ``it-<i>``, zero-padded to ``width``), run to its end."""
    rows = [{"id": f"it-{i:0{width}d}", "messages": [{"role": "user", "content": prompt(i)}]} for i in range(n)]
    await BatchRunner(client, db, "j", RunnerOptions(input_path=write_jsonl(tmp_path / "in.jsonl", rows))).run()


def report(db: Db, fmt: OutputFormat) -> str:
    out = io.StringIO()
    assert run_report(ReportOptions(job="j", db=db, format=fmt), out) == 0
    return out.getvalue()


def test_short_answers_match_exactly_and_long_ones_by_similarity() -> None:
    assert agrees(" Positive\n", "positive")
    assert not agrees("positive", "negative")
    assert not agrees("very positive", "positive")  # labels: every word counts
    long = "the parcel came late but the product itself works well"
    assert agrees(long, long.replace("well", "fine"))  # 9 of 10 words the same: 0.9
    assert not agrees(long, "nothing about this product works at all sadly")
    assert agrees(None, "x") is None


def test_the_sample_is_seeded_and_in_input_order() -> None:
    items = [FallbackItem(k, f"it-{k}", "[]", None, None, "flagship", "medium", "x") for k in range(50)]
    one, again = sample(items, 10, seed=3), sample(items, 10, seed=3)
    assert one == again and [i.key for i in one] == sorted(i.key for i in one) and len(one) == 10
    assert sample(items, 10, seed=4) != one
    assert sample(items, 500, seed=3) == items


def test_a_model_with_disagree_p_differs_on_the_hashed_share() -> None:
    labels = ("positive", "negative", "neutral")
    prompts = [prompt(i) for i in range(2000)]
    differ = sum(label_for(labels, 0.25, p) != label_for(labels, 0.0, p) for p in prompts)
    assert differ == sum(disagrees(p, 0.25) for p in prompts)
    assert 0.22 < differ / len(prompts) < 0.28
    assert label_for(labels, 0.25, "not a classify prompt") is None


@pytest.mark.looptime
async def test_compare_reports_the_share_the_fallback_changed(tmp_path: Path) -> None:
    await compare_reports_the_share_the_fallback_changed(tmp_path, tmp_path / "db")


async def compare_reports_the_share_the_fallback_changed(tmp_path: Path, db: Db) -> None:
    """The acceptance test, on either job store (tests/batch/pg/test_compare.py runs it on PostgreSQL)."""
    app = create_app(parse_scenario(SCENARIO))
    async with client_for(app) as client:  # flagship full: every item falls back to medium
        await run_job(client, tmp_path, db, N, width=3)
    app.state.simulator.configure("flagship", slots=64)  # room again, for the comparison
    async with client_for(app) as client:
        result = await compare_job(client, db, "j", n=N, seed=1)

    differ = sum(disagrees(prompt(i), 0.25) for i in range(N))  # the items medium labels otherwise
    assert 0 < differ < N
    assert (result.compared, result.missing) == (N, 0)
    assert result.agreed == N - differ and result.rate == pytest.approx(1 - differ / N)

    out = tmp_path / "out.jsonl"
    export_job(db, "j", out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # every item fell back (to medium or small, both with disagree = 0.25), each compared with flagship
    assert {r["model"] for r in records} <= {"medium", "small"} and {r["compare_model"] for r in records} == {
        "flagship"
    }
    for r, i in zip(records, range(N), strict=True):
        assert r["compare_answer"] == label_for(("positive", "negative", "neutral"), 0.0, prompt(i))
        assert r["agrees"] is (not disagrees(prompt(i), 0.25))

    assert f"agreement: {1 - differ / N:.0%} ({N - differ} of {N} items compared" in report(db, OutputFormat.TEXT)
    data = json.loads(report(db, OutputFormat.JSON))
    assert data["agreement"] == {"compared": N, "agreed": N - differ, "missing": 0, "rate": (N - differ) / N}
    table = list(csv.DictReader(io.StringIO(report(db, OutputFormat.CSV))))
    assert sum(int(r["compared"] or 0) for r in table) == N and sum(int(r["agreed"] or 0) for r in table) == N - differ


@pytest.mark.looptime
async def test_a_comparison_is_pinned_to_the_preferred_model(tmp_path: Path) -> None:
    """The preferred model still full: no answer from another model is taken for its own."""
    app = create_app(parse_scenario(SCENARIO))
    db = tmp_path / "db"
    async with client_for(app) as client:
        await run_job(client, tmp_path, db, 5)
        result = await compare_job(client, db, "j", n=3, seed=0)
    assert (result.compared, result.missing) == (0, 3)
    out = tmp_path / "out.jsonl"
    export_job(db, "j", out)
    compared = [r for r in map(json.loads, out.read_text().splitlines()) if "compare_model" in r]
    assert len(compared) == 3
    assert all(r["compare_answer"] is None and r["agrees"] is None and r["compare_error"] for r in compared)


@pytest.mark.looptime
async def test_a_job_still_running_is_not_compared_beside_its_own_work(tmp_path: Path) -> None:
    app = create_app(parse_scenario(SCENARIO))
    db = tmp_path / "db"
    async with client_for(app) as client:
        await run_job(client, tmp_path, db, 3)
        store = open_store(db)
        try:  # a runner holds it again: its lease is fresh
            info = store.require("j")
            store.claim(info.id, "another-runner", client.clock.wall())
            store.set_job(info.id, state=JobState.RUNNING)
        finally:
            store.close()
        with pytest.raises(BatchError, match="is running: compare it once it has finished"):
            await compare_job(client, db, "j", n=3, seed=0)
