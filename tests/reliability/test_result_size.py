"""No result in the job store, the export or the report is larger than
``client.max_response_bytes``: an answer over it fails as its own kind, and its audit
trail says why. A real scripted server on loopback; fast-forwarded time."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from capmon.advice import advise
from capmon.batch import BatchRunner
from capmon.batch.export import export_job
from capmon.batch.options import RunnerOptions
from capmon.batch.sqlite import JobStore
from capmon.core.routing.client import FallbackClient
from capmon.report import build_item_report, build_report, format_item, format_report
from tests.batch.helpers import single_config, write_items
from tests.support.configs import ENV
from tests.support.scripted import Reply, Script, ok, serve

pytestmark = pytest.mark.looptime

CAP = 2048


def _rows(db: Path, sql: str, *args: object) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


async def test_an_answer_over_max_response_bytes_is_never_stored_and_the_audit_says_why(tmp_path: Path) -> None:
    script = Script()
    # it-0002's answer is 3,000 bytes in 1,000 characters: a cap counted in characters would let it through.
    # it-0003's holds a lone surrogate (JSON "\\ud800"), which SQLite cannot store as it is.
    answers = {"it-0002": "€" * 1000, "it-0003": "half \ud800 a pair"}

    def reply(n: int, body: dict) -> Reply:
        answer = ok("flagship", answers.get(body["messages"][-1]["content"], "short answer"))
        return Reply(
            200, json.dumps(answer.body), {"content-type": "application/json"}
        )  # escaped, as providers send it

    script.set("flagship", reply)
    db = tmp_path / "jobs.db"
    async with serve(script) as url:
        cfg = single_config(url, extra=f"[client]\nmax_response_bytes = {CAP}")
        async with FallbackClient(cfg, environ=ENV) as client:
            summary = await BatchRunner(
                client, db, "big", RunnerOptions(input_path=write_items(tmp_path / "in.jsonl", 3))
            ).run()
    assert (summary.done, summary.failed) == (2, 1)

    # The store: nothing over the cap, for any item.
    assert max(len((c or "").encode()) for (c,) in _rows(db, "SELECT content FROM items")) <= CAP
    [(state, content, kind, message)] = _rows(
        db, "SELECT state, content, error_kind, error_message FROM items WHERE id = 'it-0002'"
    )
    # Its own kind (the core's name for an answer over the cap, when the core refuses it first).
    assert (state, content, kind) == ("failed", None, "oversized")
    assert "max_response_bytes" in message
    # The audit trail of that item ends with a row that says what happened to the answer.
    audit = _rows(db, "SELECT kind, decision, reason FROM attempts WHERE item = 'it-0002' ORDER BY rowid")
    assert audit[-1][0] == "oversized" and audit[-1][1] in ("refuse", "fail")
    assert "max_response_bytes" in audit[-1][2]

    # The export and the report: never more than the cap per result either.
    out = tmp_path / "out.jsonl"
    export_job(db, "big", out)
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["it-0001", "it-0002", "it-0003"]
    assert all(len((r["content"] or "").encode()) <= CAP for r in records)
    assert records[1]["error"]["kind"] == kind and records[1]["content"] is None
    assert records[2]["content"] == "half \ufffd a pair"
    with JobStore(db, readonly=True) as store:
        report = build_report(store, "big")
        text = format_report(report) + format_item(build_item_report(store, "big", "it-0002"))
    # Refused by the runner (store side) or, when the client caps the body first, by the client: either way, said.
    assert "€€€" not in text and "oversized 1" in text and "max_response_bytes" in text.split("why:")[-1]
    assert any("client.max_response_bytes" in a.text for a in advise(report))


def test_an_oversized_result_left_by_an_older_capmon_is_not_exported(tmp_path: Path) -> None:
    """A store written before the cap existed may hold a huge result: the export holds back its content."""
    db = tmp_path / "jobs.db"
    with JobStore(db) as store:
        info = store.create_job(
            "old",
            input_path=str(tmp_path / "in.jsonl"),
            input_size=10,
            fingerprint="x",
            settings={"max_response_bytes": CAP},
            now=1.0,
        )
        store.ingest_chunk(
            info.id,
            [
                (1, "a", "done", "[]", None, None, None, None, None, None),
                (2, "b", "done", "[]", None, None, None, None, None, None),
            ],
            offset=10,
            line=2,
            now=1.0,
        )
        store.conn.execute("UPDATE items SET content = ?, model = 'm' WHERE id = 'a'", ("x" * (CAP + 1),))
        store.conn.execute("UPDATE items SET content = 'fine', model = 'm' WHERE id = 'b'")
    out = tmp_path / "out.jsonl"
    summary = export_job(db, "old", out)
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert max(len(line.encode()) for line in out.read_text().splitlines()) < CAP
    assert records[0]["content"] is None and records[0]["error"]["kind"] == "oversized"
    assert "max_response_bytes" in records[0]["error"]["message"]
    assert records[1]["content"] == "fine"
    assert (summary.done, summary.failed) == (1, 1)
