"""What a job cost: a simulator job whose preferred model holds nothing, so every item falls
back to a cheaper one. The audit keeps each answer's tokens and cost; ``capmon report``
gives the cost per model, equal to the sum over the audit's rows, and beside it what the
same answers would have cost on the preferred model at its prices (the fallbacks saved the
gap), in text, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest

from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.batch.states import JobState
from capmon.report import OutputFormat, ReportOptions, run_report
from tests.batch.helpers import client_for, scenario_app, write_items
from tests.support.configs import build_config, write_config

FLAGSHIP = {"input": 10.0, "output": 30.0}
MEDIUM = {"input": 1.0, "output": 2.0}
MODELS = {
    "flagship": {"prices": FLAGSHIP},
    "medium": {"prices": MEDIUM},
    "small": {},  # no price: its answers have no cost
}


def report(db: Path, config: Path, fmt: OutputFormat) -> str:
    out = io.StringIO()
    assert run_report(ReportOptions(job="j", db=db, format=fmt, config=str(config)), out) == 0
    return out.getvalue()


@pytest.mark.looptime
async def test_a_jobs_cost_per_model_is_the_audits_sum_beside_the_preferred_models(tmp_path: Path) -> None:
    db = tmp_path / "db"
    config = write_config(tmp_path / "config.toml", "http://sim.test/v1", models=MODELS)
    cfg = build_config("http://sim.test/v1", models=MODELS)
    async with client_for(scenario_app(flagship_slots=0), cfg) as client:
        await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 20), concurrency=2)
        ).run()
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT model, tokens_in, tokens_cached, tokens_out, cost_usd FROM attempts WHERE job = 'j' AND decision = 'ok'"
    ).fetchall()
    conn.close()
    assert len(rows) == 20 and {r[0] for r in rows} == {"medium"}
    assert all(r[1] > 0 and r[2] == 0 and r[3] > 0 for r in rows)
    for _, tokens_in, _, tokens_out, cost in rows:  # each answer at medium's prices
        assert cost == pytest.approx((tokens_in * MEDIUM["input"] + tokens_out * MEDIUM["output"]) / 1e6)
    spent = sum(r[4] for r in rows)
    on_flagship = sum(r[1] * FLAGSHIP["input"] + r[3] * FLAGSHIP["output"] for r in rows) / 1e6

    data = json.loads(report(db, config, OutputFormat.JSON))["cost"]
    assert data["preferred"] == "flagship" and data["unpriced"] == 0
    [medium] = data["models"]
    assert (medium["model"], medium["answers"], medium["priced"]) == ("medium", 20, 20)
    assert medium["cost"] == pytest.approx(spent) and data["cost"] == pytest.approx(spent)
    assert data["on_preferred"] == pytest.approx(on_flagship)
    assert data["gap"] == pytest.approx(spent - on_flagship) and data["gap"] < 0  # the fallbacks saved it

    text = report(db, config, OutputFormat.TEXT)
    head = next(line for line in text.splitlines() if line.startswith("cost: "))
    assert "for 20 answers" in head and "on flagship, the preferred model" in head
    assert "the fallbacks saved" in head
    table = text.splitlines()[text.splitlines().index(head) + 1 :][:2]
    assert table[0].split() == ["model", "answers", "priced", "cost", "on", "flagship"]
    assert table[1].split()[:3] == ["medium", "20", "20"]

    [row] = [r for r in csv.DictReader(io.StringIO(report(db, config, OutputFormat.CSV))) if r["model"] == "medium"]
    assert float(row["cost_usd"]) == pytest.approx(spent)
    assert float(row["on_preferred_usd"]) == pytest.approx(on_flagship)


@pytest.mark.looptime
async def test_answers_without_a_price_are_counted_apart_and_never_as_free(tmp_path: Path) -> None:
    db = tmp_path / "db"
    models = {"small": {}, "medium": {"prices": MEDIUM}}  # the preferred model has no price
    config = write_config(tmp_path / "config.toml", "http://sim.test/v1", models=models)
    async with client_for(scenario_app(), build_config("http://sim.test/v1", models=models)) as client:
        await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 5), concurrency=1)
        ).run()
    data = json.loads(report(db, config, OutputFormat.JSON))["cost"]
    assert (data["cost"], data["unpriced"], data["on_preferred"], data["gap"]) == (0.0, 5, None, None)
    text = report(db, config, OutputFormat.TEXT)
    assert "cost: $0 for 0 answers (5 more without a price: set [[models]] prices)" in text
    assert "small, the preferred model, has no price to compare with" in text


@pytest.mark.looptime
async def test_max_cost_pauses_the_job_at_the_cap_and_a_raised_cap_finishes_it_with_nothing_lost_or_doubled(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db"
    models = {"flagship": {"prices": {"input": 1000.0, "output": 1000.0}}, "medium": {}, "small": {}}
    cfg = build_config("http://sim.test/v1", models=models)
    items = write_items(tmp_path / "in.jsonl", 20)
    async with client_for(scenario_app(), cfg) as client:
        first = await BatchRunner(client, db, "j", RunnerOptions(input_path=items, concurrency=2, max_cost=0.1)).run()
    assert first.state is JobState.PAUSED
    # the cap is met at the 6th answer; the one other item in flight then is answered and kept
    assert 6 <= first.done <= 7 and first.done < 20
    conn = sqlite3.connect(db)
    ((message,),) = conn.execute("SELECT message FROM jobs WHERE name = 'j'").fetchall()
    assert "reached --max-cost $0.1000: paused" in message and "capmon batch resume j --max-cost" in message
    spent = conn.execute(
        "SELECT sum(cost_usd), count(*), sum(tokens_in + tokens_out) FROM attempts WHERE decision = 'ok'"
    ).fetchone()
    conn.close()
    assert spent[1] == first.done and spent[0] == pytest.approx(spent[2] * 1000.0 / 1e6)
    assert spent[0] >= 0.1 > spent[0] * (first.done - 2) / first.done  # reached, and not long before the end

    async with client_for(scenario_app(), cfg) as client:
        # the same cap again: reached already, nothing is sent
        again = await BatchRunner(client, db, "j", RunnerOptions(concurrency=2, max_cost=0.1)).run()
        assert (again.state, again.sent, again.done) == (JobState.PAUSED, 0, first.done)
        raised = await BatchRunner(client, db, "j", RunnerOptions(concurrency=2, max_cost=1.0)).run()
    assert raised.state is JobState.FINISHED and raised.done == 20 and raised.sent == 20 - first.done
    conn = sqlite3.connect(db)
    ok = conn.execute("SELECT item, count(*) FROM attempts WHERE decision = 'ok' GROUP BY item").fetchall()
    states = conn.execute("SELECT state, count(*) FROM items GROUP BY state").fetchall()
    conn.close()
    assert len(ok) == 20 and all(n == 1 for _, n in ok)  # every item answered once: none lost, none doubled
    assert states == [("done", 20)]
