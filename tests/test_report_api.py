"""`capmon report` says which provider API served each item: a real batch run through
the simulator, the OpenAI-wire flagship out and claude on Anthropic's wire taking its
work; and an audit trail from before the api column still reads (and is migrated when
opened for writing)."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from capmon import audit
from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.batch.sqlite import JobStore
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import SIMULATOR_DEMO_KEY, parse_config
from capmon.report import OutputFormat, ReportOptions, run_report
from tests.batch.helpers import write_items
from tests.gateway.helpers import scenario, spec, two_wires
from tests.gateway.test_metrics_api import PROVIDER_KEY
from tests.support.configs import two_deployments, two_providers
from tests.support.simulated import StartSim, deployments_scenario


def report(db: Path, fmt: OutputFormat = OutputFormat.TEXT, **kw: Any) -> str:
    out = io.StringIO()
    assert run_report(ReportOptions(job="j", db=db, format=fmt, **kw), out) == 0
    return out.getvalue()


@pytest.mark.looptime
async def test_the_report_names_the_api_of_each_model_and_of_each_attempt(tmp_path: Path, start_sim: StartSim) -> None:
    sim = await start_sim(scenario(spec("flagship", slots=0), spec("claude", api="anthropic"), keys=(PROVIDER_KEY,)))
    db = tmp_path / "db"
    cfg = parse_config(two_providers(sim.base_url, sim.base_url.removesuffix("/v1")), "report-api.toml")
    async with FallbackClient(cfg, environ={"PROVIDER_KEY": PROVIDER_KEY}) as client:
        await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 6), concurrency=1)
        ).run()

    text = report(db)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(("claude", "flagship"))}
    assert rows["claude"][:3] == ["claude", "anthropic", "6"]  # served all six
    assert rows["flagship"][:3] == ["flagship", "openai", "0"]

    data = json.loads(report(db, OutputFormat.JSON))
    assert {m["model"]: m["apis"] for m in data["models"]} == {"claude": ["anthropic"], "flagship": ["openai"]}
    table = list(csv.DictReader(io.StringIO(report(db, OutputFormat.CSV))))
    assert {r["model"]: r["api"] for r in table} == {"claude": "anthropic", "flagship": "openai"}

    # it-0001 tried the flagship first (before its breaker tripped), then claude answered.
    item = report(db, item="it-0001")
    lines = [line.split() for line in item.splitlines() if line[:1].isdigit()]
    assert (lines[-1][2], lines[-1][4]) == ("claude", "anthropic") and "ok" in lines[-1]
    assert ("flagship", "openai") in [(ln[2], ln[4]) for ln in lines]
    attempts = json.loads(report(db, OutputFormat.JSON, item="it-0001"))["attempts"]
    assert [a["api"] for a in attempts][-1] == "anthropic"
    assert "api" in next(csv.reader(io.StringIO(report(db, OutputFormat.CSV, item="it-0001"))))


OLD_ATTEMPTS = """
CREATE TABLE attempts (
    job TEXT, item TEXT, at REAL NOT NULL, attempt INTEGER NOT NULL, model TEXT, endpoint TEXT,
    key_alias TEXT, status INTEGER, kind TEXT, hint REAL, wait REAL, latency REAL,
    decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT ''
);
"""


def test_an_audit_trail_from_before_the_api_column_reads_and_is_migrated(tmp_path: Path) -> None:
    db = tmp_path / "db"
    JobStore(db).close()  # today's schema, then the attempts table as an older capmon made it
    with sqlite3.connect(db) as c:
        c.execute("DROP TABLE attempts")
        c.executescript(OLD_ATTEMPTS)
        c.execute(
            "INSERT INTO attempts VALUES ('j', 'i1', 1e9, 1, 'flagship', 'ep', 'k', 200, NULL, NULL, 0, 0.2, 'ok', '')"
        )
    c.close()
    with JobStore(db, readonly=True) as store:  # read-only: never migrated, the api reads as unknown
        [row] = store.attempts("j")
        assert row.model == "flagship" and row.api is None and row.deployment is None
        assert store.attempt_apis("j") == {}
    assert "flagship  -" in report(db)
    with JobStore(db) as store:  # opened for writing: the column is added, old rows keep NULL
        have = {r[1] for r in store.conn.execute("PRAGMA table_info(attempts)")}
        assert {"api", "deployment", "tokens_in", "tokens_cached", "tokens_out", "cost_usd"} <= have
        [row] = store.attempts("j")
        assert row.api is None and row.deployment is None and row.decision == "ok"
        audit.write_rows(
            store.conn,
            [
                (
                    "j",
                    "i2",
                    1e9 + 1,
                    1,
                    "claude",
                    "ant",
                    "k",
                    200,
                    None,
                    None,
                    0,
                    0.1,
                    "ok",
                    "",
                    "anthropic",
                    None,
                    "claude-x",
                    None,
                    None,
                    None,
                    None,
                )
            ],
        )
        assert store.attempt_apis("j") == {"claude": ("anthropic",)}
        assert [r.deployment for r in store.attempts("j")] == [None, "claude-x"]


@pytest.mark.looptime
async def test_the_item_report_shows_each_skip_with_why_and_what_the_fallback_fell_back_from(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = await start_sim(two_wires(keys=(PROVIDER_KEY,)))
    db = tmp_path / "db"
    text = two_providers(sim.base_url, sim.base_url.removesuffix("/v1"), first="claude")
    # A temperature Anthropic does not take: claude, first in the order, cannot carry it.
    items = write_items(tmp_path / "in.jsonl", 2, temperature=1.5)
    async with FallbackClient(parse_config(text, "skips.toml"), environ={"PROVIDER_KEY": PROVIDER_KEY}) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=items, concurrency=1)).run()
    item = report(db, item="it-0001")
    head = item.splitlines()[0]
    assert "served by flagship, fell back from claude" in head, head
    rows = [line.split() for line in item.splitlines() if line[:1].isdigit()]
    assert "claude" in rows[0] and "skip" in rows[0] and "flagship" in rows[1] and "ok" in rows[1]
    assert "passed over claude (ant) (incapable: temperature = 1.5 (Anthropic takes 0 to 1))." in item
    attempts = json.loads(report(db, OutputFormat.JSON, item="it-0001"))["attempts"]
    assert [(a["model"], a["decision"]) for a in attempts] == [("claude", "skip"), ("flagship", "ok")]
    assert attempts[0]["reason"].startswith("incapable: temperature = 1.5")
    summary = json.loads(report(db, OutputFormat.JSON))
    assert {m["model"]: m["attempts"] for m in summary["models"]}.get("claude", 0) == 0  # a skip is no attempt


@pytest.mark.looptime
async def test_an_items_report_names_the_deployment_it_moved_to_and_the_audit_trail_its_id(
    tmp_path: Path, start_sim: StartSim
) -> None:
    sim = await start_sim(deployments_scenario(east=0))  # east refuses everything for capacity
    db = tmp_path / "db"
    items = write_items(tmp_path / "in.jsonl", 1)
    async with FallbackClient(two_deployments(sim.base_url), environ={"KEY": SIMULATOR_DEMO_KEY}) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=items, concurrency=1)).run()
    item = report(db, item="it-0001")
    assert "attempt 1 on m at east as sim-m-east: 503 capacity" in item, item
    assert ": retried the same model at west as sim-m-west after 0.0s." in item
    assert "answered by m at west as sim-m-west in" in item
    attempts = json.loads(report(db, OutputFormat.JSON, item="it-0001"))["attempts"]
    assert [(a["endpoint"], a["deployment"]) for a in attempts] == [("east", "sim-m-east"), ("west", "sim-m-west")]
    rows = list(csv.DictReader(io.StringIO(report(db, OutputFormat.CSV, item="it-0001"))))
    assert [r["deployment"] for r in rows] == ["sim-m-east", "sim-m-west"]
    summary = json.loads(report(db, OutputFormat.JSON))
    assert summary["fell_back_items"] == 0  # a move between deployments is no fallback
