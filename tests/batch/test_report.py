"""`capmon report` and `--advice`, from real runs and from hand-made audit trails."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from capmon.advice import advise
from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.batch.sqlite import JobStore, Outcome
from capmon.batch.states import ItemState
from capmon.core.base.exceptions import BatchError
from capmon.report import OutputFormat, ReportOptions, build_report, run_report
from tests.batch.helpers import client_for, write_items
from tests.support.scripted import OVERLOADED, Script, build_app, ok


def args(db: Path, job: str = "j", **kw: Any) -> ReportOptions:
    fmt = (
        OutputFormat.JSON if kw.pop("json", False) else OutputFormat.CSV if kw.pop("csv", False) else OutputFormat.TEXT
    )
    return ReportOptions(job=job, db=db, format=fmt, **kw)


def report_text(db: Path, **kw: Any) -> str:
    out = io.StringIO()
    assert run_report(args(db, **kw), out) == 0
    return out.getvalue()


@pytest.mark.looptime
async def test_a_report_shows_models_statuses_fallbacks_latency_and_items(tmp_path: Path) -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    slow = ok("medium")
    slow.delay = 0.25
    script.always("medium", slow)
    db = tmp_path / "db"
    async with client_for(build_app(script)) as client:
        await BatchRunner(
            client, db, "j", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 30), concurrency=1)
        ).run()
    text = report_text(db)
    assert "job j: 30 items, 30 done, 0 failed" in text
    medium = next(line for line in text.splitlines() if line.startswith("medium"))
    flagship = next(line for line in text.splitlines() if line.startswith("flagship"))
    assert medium.split()[:5] == ["medium", "openai", "30", "100%", "30"]
    assert flagship.split()[:7] == ["flagship", "openai", "0", "0%", "3", "0", "3"]  # tripped after three 503s
    assert "errors by status: 503 x3" in text
    # all 30 served by medium instead of flagship: 3 after trying it, 27 while its breaker was open
    assert "fallbacks: 30 items" in text and "flagship -> medium 3" in text
    assert "medium: it-0001, it-0002" in text and "... and 20 more" in text  # long lists are cut

    data = json.loads(report_text(db, json=True))
    m = {r["model"]: r for r in data["models"]}
    assert m["medium"]["served"] == 30
    assert m["medium"]["mean_latency"] == pytest.approx(0.25, abs=0.01) and m["medium"]["p99_latency"] == pytest.approx(
        0.25, abs=0.01
    )
    assert m["flagship"]["status_503"] == 3 and m["flagship"]["fallbacks_from"] == 3
    assert data["fallback_pairs"] == [{"from": "flagship", "to": "medium", "count": 3}]

    table = list(csv.DictReader(io.StringIO(report_text(db, csv=True))))
    assert {r["model"]: int(r["served"]) for r in table} == {"medium": 30, "flagship": 0}

    one = report_text(db, item="it-0002")
    assert "item it-0002 (line 2) of job j: done, served by medium, fell back" in one
    assert "fell back to medium, which had room" in one and "answered by medium" in one
    rows = list(csv.DictReader(io.StringIO(report_text(db, item="it-0002", csv=True))))
    assert [(r["model"], r["status"], r["decision"]) for r in rows] == [
        ("flagship", "503", "fallback"),
        ("medium", "200", "ok"),
    ]
    assert json.loads(report_text(db, item="it-0002", json=True))["why"][0].startswith("attempt 1 on flagship: 503")


def test_a_report_for_an_unknown_job_or_item_says_so(tmp_path: Path) -> None:
    JobStore(tmp_path / "db").close()
    with pytest.raises(BatchError, match="no job named 'nope'"):
        run_report(args(tmp_path / "db", job="nope"), io.StringIO())


# ---------------------------------------------------------------- hand-made trails


class Trail:
    """Writes a job with items and attempts straight into a store."""

    def __init__(self, db: Path, concurrency: int = 16) -> None:
        self.store = JobStore(db)
        self.info = self.store.create_job(
            "j",
            input_path="in.jsonl",
            input_size=1,
            fingerprint="f",
            settings={"concurrency": concurrency, "rate": None, "window": None},
            now=1e9,
        )
        self.n = 0
        self.t = 1e9

    def attempts(
        self, model: str, count: int, status: int | None, kind: str | None, decision: str, key: str = "a"
    ) -> None:
        rows = []
        for _ in range(count):
            self.t += 0.1
            rows.append(
                (
                    "j",
                    f"i{self.n}",
                    self.t,
                    1,
                    model,
                    "ep",
                    key,
                    status,
                    kind,
                    None,
                    0.0,
                    0.2,
                    decision,
                    "",
                    "openai",
                    None,
                    model,
                    None,
                    None,
                    None,
                    None,
                )
            )
            self.n += 1
        self.store.commit(self.info.id, started=[], outcomes=[], audit_rows=rows, job_fields={}, now=self.t)

    def items(self, count: int, model: str = "flagship", max_tokens: int = 1024, used: range = range(50, 101)) -> None:
        base = self.store.require("j").total
        self.store.ingest_chunk(
            self.info.id,
            [
                (base + i + 1, f"d{base + i}", ItemState.PENDING, "[]", None, None, None, None, None, None)
                for i in range(count)
            ],
            offset=0,
            line=base + count,
            now=1e9,
        )
        keys = [r[0] for r in self.store.conn.execute("SELECT key FROM items WHERE state = 'pending'")]
        used_values = list(used)
        self.store.commit(
            self.info.id,
            started=[],
            now=1e9,
            audit_rows=[],
            job_fields={},
            outcomes=[
                Outcome(
                    k,
                    ItemState.DONE,
                    attempts=1,
                    model=model,
                    content="x",
                    fell_back=False,
                    max_tokens=max_tokens,
                    completion_tokens=used_values[i % len(used_values)],
                )
                for i, k in enumerate(keys)
            ],
        )

    def advice(self) -> list[Any]:
        self.store.set_job(self.info.id, state="finished")
        return advise(build_report(self.store, "j"))


def test_advice_is_in_the_order_a_person_checks_and_backed_by_figures(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db", concurrency=32)
    t.attempts("flagship", 40, 200, None, "ok")
    t.attempts("medium", 6, 429, "rate_limited", "retry")
    t.attempts("flagship", 12, 503, "capacity", "fallback")
    t.attempts("small", 2, 429, "quota", "fallback", key="b")
    t.attempts("small", 3, 401, "auth", "fallback", key="c")
    topics = [a.topic for a in t.advice()]
    assert topics[:4] == ["auth", "quota", "capacity", "rate_limited"]
    auth = t.advice()[0]
    assert "3 attempts were refused with 401/403" in auth.text and "that is the key, not capacity" in auth.text
    assert auth.figures == {"attempts": 3, "keys": {"c": 3}}
    quota = t.advice()[1]
    assert "billing, not load" in quota.text and quota.figures["attempts"] == 2


def test_capacity_on_one_model_means_the_breaker_and_fallbacks_work(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    t.attempts("flagship", 20, 503, "capacity", "fallback")
    t.attempts("medium", 2, 529, "capacity", "retry")
    t.attempts("medium", 40, 200, "ok" and None, "ok")
    [a] = [a for a in t.advice() if a.topic == "capacity"]
    assert "concentrated on flagship: 20 of 22 (91%)" in a.text and "doing their work" in a.text
    assert a.figures["by_model"] == {"flagship": 20, "medium": 2}


def test_capacity_with_parked_items_means_a_tier_is_missing(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    t.attempts("flagship", 20, 503, "capacity", "fallback")
    t.attempts("flagship", 4, 503, "capacity", "park")
    [a] = [a for a in t.advice() if a.topic == "capacity"]
    assert "4 times no model had room" in a.text and "a tier is missing" in a.text


def test_capacity_spread_over_every_model_means_the_provider_is_short(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    for m in ("flagship", "medium", "small"):
        t.attempts(m, 10, 503, "capacity", "retry")
    [a] = [a for a in t.advice() if a.topic == "capacity"]
    assert "spread over the models" in a.text and "Lower --concurrency" in a.text


def test_rate_limits_at_high_concurrency_mean_lower_it_and_at_low_set_a_rate(tmp_path: Path) -> None:
    t = Trail(tmp_path / "a.db", concurrency=32)
    t.attempts("flagship", 60, 200, None, "ok")
    t.attempts("flagship", 20, 429, "rate_limited", "retry")
    [a] = [a for a in t.advice() if a.topic == "rate_limited"]
    assert "20 of 80 attempts (25%) were 429 rate_limited at --concurrency 32: lower it to 16" in a.text
    assert a.figures["suggested_concurrency"] == 16 and a.figures["suggested_rate"] > 0

    t = Trail(tmp_path / "b.db", concurrency=2)
    t.attempts("flagship", 60, 200, None, "ok")
    t.attempts("flagship", 20, 429, "rate_limited", "retry")
    [a] = [a for a in t.advice() if a.topic == "rate_limited"]
    assert "set --rate" in a.text and "lower it" not in a.text


def test_max_tokens_far_above_what_answers_use_means_lower_it(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    t.items(40, max_tokens=1024, used=range(50, 101))
    [a] = [a for a in t.advice() if a.topic == "max_tokens"]
    assert "max_tokens 1024 (median of 40)" in a.text and "max 89" in a.text and "about 128" in a.text
    assert a.figures["suggested"] == 128

    t2 = Trail(tmp_path / "db2")
    t2.items(40, max_tokens=128, used=range(60, 120))
    assert not [a for a in t2.advice() if a.topic == "max_tokens"]


def test_a_clean_job_gets_nothing_to_change(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    t.items(20, max_tokens=128, used=range(90, 120))
    t.attempts("flagship", 20, 200, None, "ok")
    [a] = t.advice()
    assert a.topic == "ok" and "nothing to change: 20 of 20 items done" in a.text


def test_advice_appears_in_text_and_json(tmp_path: Path) -> None:
    t = Trail(tmp_path / "db")
    t.attempts("flagship", 3, 401, "auth", "fail")
    t.store.close()
    text = report_text(tmp_path / "db", advice=True)
    assert "advice:\n  1. 3 attempts were refused with 401/403" in text
    data = json.loads(report_text(tmp_path / "db", advice=True, json=True))
    assert data["advice"][0]["topic"] == "auth" and data["advice"][0]["figures"]["attempts"] == 3
