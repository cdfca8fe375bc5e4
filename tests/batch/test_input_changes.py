"""An input file that changed since its job was created: refused with the first line that
differs, or taken with ``accept_changed_input`` (new items added, removed ones marked,
edited ones sent again with their old results kept in the audit). In-process simulator,
fast-forwarded time."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from capmon.batch import BatchRunner, JobStore
from capmon.batch import ingest as ingest_mod
from capmon.batch.export import export_job
from capmon.batch.options import RunnerOptions
from capmon.core.base.exceptions import BatchError
from capmon.report import build_item_report, format_item
from tests.batch.helpers import Recorder, client_for, rows, scenario_app, write_jsonl

pytestmark = pytest.mark.looptime

PAD = "p" * 60  # long lines: 1,200 of them make ~110 KiB, well past the first 64 KiB


def padded(i: int, text: str | None = None) -> dict[str, Any]:
    item_id = f"it-{i:05d}"
    return {"id": item_id, "messages": [{"role": "user", "content": text or item_id}], "metadata": {"pad": PAD}}


def lines_of(n: int) -> list[str]:
    return [json.dumps(padded(i)) for i in range(1, n + 1)]


async def finish(tmp_path: Path, src: Path, rec: Recorder, **kw: Any) -> Any:
    async with client_for(rec) as client:
        return await BatchRunner(
            client, tmp_path / "jobs.db", "j", RunnerOptions(input_path=src, concurrency=32, **kw)
        ).run()


async def test_a_same_size_edit_past_the_first_64_kib_is_refused_naming_the_line(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1200)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    size = src.stat().st_size
    lines[1099] = lines[1099].replace('it-01100"}', 'it-0110X"}')  # the prompt, same length
    write_jsonl(src, lines)
    assert src.stat().st_size == size
    sent = len(rec.seen)
    with pytest.raises(BatchError) as e:
        await finish(tmp_path, src, rec)
    message = str(e.value)
    assert "line 1100" in message and "--accept-changed-input" in message and "\n" not in message
    assert len(rec.seen) == sent  # nothing sent


async def test_a_reordering_past_the_first_64_kib_is_refused_naming_the_first_moved_line(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1200)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    lines[1000], lines[1001] = lines[1001], lines[1000]
    write_jsonl(src, lines)
    with pytest.raises(BatchError, match=r"line 1001\b"):
        await finish(tmp_path, src, rec)
    with pytest.raises(BatchError, match=r"line 1001\b"):  # resume checks the input too
        async with client_for(rec) as client:
            await BatchRunner(client, tmp_path / "jobs.db", "j").run()


async def test_accepting_a_changed_input_adds_removes_and_resends_what_changed(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1200)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    old_answer = rows(tmp_path / "jobs.db", "SELECT content FROM items WHERE id = 'it-00700'")[0][0]
    lines[699] = json.dumps(padded(700, "a new prompt for 700"))  # edited
    del lines[899]  # it-00900 removed
    lines.insert(10, json.dumps(padded(5000)))  # a new item near the top
    lines.append(json.dumps(padded(5001)))  # and one at the end
    write_jsonl(src, lines)
    sent = len(rec.seen)
    summary = await finish(tmp_path, src, rec, accept_changed_input=True)
    resent = rec.items()[sent:]
    assert sorted(resent) == ["a new prompt for 700", "it-05000", "it-05001"]  # nothing unchanged went again
    assert (summary.total, summary.done, summary.failed) == (1201, 1201, 0)

    db = tmp_path / "jobs.db"
    # Removed, kept where its line was: it takes the line of the item that followed it (it-00901, now 901).
    assert rows(db, "SELECT state, line FROM items WHERE id = 'it-00900'") == [("removed", 901)]
    assert rows(db, "SELECT line FROM items WHERE id = 'it-05000'") == [(11,)]
    assert rows(db, "SELECT line FROM items WHERE id = 'it-00800'") == [(801,)]  # moved down by one
    # The edited item's earlier result is kept in the audit, and its report says so.
    with JobStore(db, readonly=True) as store:
        report = build_item_report(store, "j", "it-00700")
    assert any(a.decision == "superseded" for a in report.attempts)
    assert "line 700 changed" in format_item(report)
    assert rows(db, "SELECT content FROM replaced_results WHERE job = 'j' AND item = 'it-00700'") == [(old_answer,)]

    out = tmp_path / "out.jsonl"
    result = export_job(db, "j", out)
    records = [json.loads(x) for x in out.read_text().splitlines()]
    ids = [r["id"] for r in records]
    assert ids[10] == "it-05000" and ids[-1] == "it-05001" and len(ids) == 1202
    removed = [r for r in records if r.get("removed")]
    assert [r["id"] for r in removed] == ["it-00900"] and ids.index("it-00900") == ids.index("it-00901") - 1
    assert result.removed == 1
    # The next run with the same file is a plain resume again.
    assert (await finish(tmp_path, src, rec)).sent == 0


async def test_an_interrupted_ingest_resumes_only_against_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest_mod, "INGEST_CHUNK", 200)
    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1500)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    db = tmp_path / "jobs.db"
    async with client_for(rec) as client:
        runner = BatchRunner(client, db, "j", RunnerOptions(input_path=src, concurrency=32))
        task = asyncio.create_task(runner.run())
        while (runner.progress().total or 0) < 1200:
            await asyncio.sleep(0)
        task.cancel()  # killed at line 1,200 of the ingest
        with pytest.raises(asyncio.CancelledError):
            await task
    assert rows(db, "SELECT state, total FROM jobs") == [("ingesting", 1200)] and not rec.seen
    # Line 1,000 deleted and a line of the same length appended: same size, same first 64 KiB.
    size = src.stat().st_size
    del lines[999]
    lines.append(json.dumps(padded(9999)))
    write_jsonl(src, lines)
    assert src.stat().st_size == size
    with pytest.raises(BatchError, match=r"line 1000\b.*--accept-changed-input"):
        await finish(tmp_path, src, rec)
    assert not rec.seen
    summary = await finish(tmp_path, src, rec, accept_changed_input=True)
    stored = [r[0] for r in rows(db, "SELECT id FROM items WHERE state != 'removed' ORDER BY line")]
    assert stored == [json.loads(x)["id"] for x in lines]  # the new file, whole
    assert "it-01000" not in stored and summary.done == 1500
    assert sorted(rec.items()) == sorted(stored)


async def test_a_file_changed_while_it_is_read_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest_mod, "INGEST_CHUNK", 200)
    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1000)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    real = ingest_mod.read_lines

    def edit_midway(path: Path, offset: int = 0, first_line: int = 1, hasher=None):  # type: ignore[no-untyped-def]
        for raw in real(path, offset, first_line, hasher):
            if raw.line == 300:  # an editor saves in place while line 300 is being read
                lines[899] = lines[899].replace('it-00900"}', 'it-0090X"}')
                with open(path, "r+b") as f:
                    f.write("\n".join(lines).encode() + b"\n")
            yield raw

    monkeypatch.setattr(ingest_mod, "read_lines", edit_midway)
    with pytest.raises(BatchError, match="changed while"):
        await finish(tmp_path, src, rec)
    assert not rec.seen


async def test_a_job_from_before_line_hashes_is_upgraded_and_checked_from_then_on(tmp_path: Path) -> None:
    import sqlite3

    from capmon.batch.export import export_job
    from capmon.report import build_report

    rec = Recorder(scenario_app(latency=0.01))
    lines = lines_of(1200)
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    db = tmp_path / "jobs.db"
    # What a schema-1 capmon left: no line hashes, a fingerprint of the first 64 KiB only.
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE items DROP COLUMN line_hash")
    conn.execute("DROP TABLE replaced_results")
    conn.execute("UPDATE jobs SET input_fingerprint = ?", (ingest_mod.legacy_fingerprint(src)[1],))
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with JobStore(db, readonly=True) as store:  # readers need nothing new
        assert build_report(store, "j").done == 1200
        assert build_item_report(store, "j", "it-00001").replaced == ()
    assert export_job(db, "j", tmp_path / "out.jsonl").done == 1200

    assert (await finish(tmp_path, src, rec)).sent == 0  # the same file: upgraded, nothing sent
    assert rows(db, "SELECT count(*) FROM items WHERE line_hash IS NULL") == [(0,)]
    assert rows(db, "SELECT input_fingerprint LIKE 'sha256:%' FROM jobs") == [(1,)]
    lines[1149] = lines[1149].replace('it-01150"}', 'it-0115X"}')
    write_jsonl(src, lines)
    with pytest.raises(BatchError, match=r"line 1150 differs"):
        await finish(tmp_path, src, rec)


def anonymous(text: str) -> str:
    """A line without an id: the job knows it only by its content."""
    return json.dumps({"messages": [{"role": "user", "content": text}]})


async def _finish_noting(tmp_path: Path, src: Path, rec: Recorder, **kw: Any) -> tuple[Any, list[str]]:
    from capmon.core.types.events import EventBus, Notice

    bus = EventBus()
    notes: list[str] = []
    bus.subscribe(lambda e: notes.append(e.message) if isinstance(e, Notice) else None)
    async with client_for(rec, bus=bus) as client:
        runner = BatchRunner(client, tmp_path / "jobs.db", "j", RunnerOptions(input_path=src, concurrency=32, **kw))
        return await runner.run(), notes


async def test_a_line_inserted_above_lines_without_ids_sends_only_that_line(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = [anonymous(f"prompt {i}") for i in range(1, 51)]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    sent = len(rec.seen)
    write_jsonl(src, [anonymous("a new first line"), *lines])
    summary, notes = await _finish_noting(tmp_path, src, rec, accept_changed_input=True)
    # It was "1 added, 50 edited (sent again)" and 51 requests: they were matched by line number.
    assert rec.items()[sent:] == ["a new first line"]
    assert any("1 added, 0 removed, 0 edited (sent again), 50 moved" in n for n in notes), notes
    assert (summary.total, summary.done) == (51, 51)
    db = tmp_path / "jobs.db"
    assert rows(db, "SELECT line FROM items WHERE id = 'line-1'") == [(2,)]  # the label stays; the line moved
    assert rows(db, "SELECT id FROM items WHERE line = 1") == [("line-1.2",)]


async def test_3000_lines_without_ids_3_inserted_1_deleted_send_3_and_mark_1_removed(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = [anonymous(f"prompt {i}") for i in range(1, 3001)]
    lines[1000] = lines[2000] = anonymous("the same prompt twice")  # duplicates keep their own results
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    sent = len(rec.seen)
    new = list(lines)
    del new[1500]  # "prompt 1501"
    new.insert(2500, anonymous("new C"))
    new.insert(700, anonymous("new B"))
    new.insert(0, anonymous("new A"))
    write_jsonl(src, new)
    summary, notes = await _finish_noting(tmp_path, src, rec, accept_changed_input=True)
    # It re-sent 3,004 and did not mark the deleted line removed.
    assert sorted(rec.items()[sent:]) == ["new A", "new B", "new C"]
    assert any("3 added, 1 removed, 0 edited (sent again)" in n for n in notes), notes
    assert (summary.total, summary.done) == (3002, 3002)
    db = tmp_path / "jobs.db"
    assert rows(db, "SELECT id, state FROM items WHERE state = 'removed'") == [("line-1501", "removed")]
    # The export keeps the removed line where it was: after prompt 1500, before prompt 1502.
    out = tmp_path / "out.jsonl"
    export_job(db, "j", out)
    ids = [json.loads(x)["id"] for x in out.read_text().splitlines()]
    assert ids[ids.index("line-1501") - 1 : ids.index("line-1501") + 2] == ["line-1500", "line-1501", "line-1502"]
    assert len(ids) == 3003


async def test_a_removed_item_is_exported_in_its_place_when_lines_around_it_go_too(tmp_path: Path) -> None:
    rec = Recorder(scenario_app(latency=0.01))
    lines = [json.dumps({"id": c, "messages": [{"role": "user", "content": c}]}) for c in "abcdef"]
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    await finish(tmp_path, src, rec)
    write_jsonl(src, [lines[0], lines[3], lines[4], lines[5]])  # b and c removed
    await finish(tmp_path, src, rec, accept_changed_input=True)
    write_jsonl(src, [lines[0], lines[4], lines[5]])  # then d too: it was exported after e
    await finish(tmp_path, src, rec, accept_changed_input=True)
    out = tmp_path / "out.jsonl"
    export_job(tmp_path / "jobs.db", "j", out)
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["id"], bool(r.get("removed"))) for r in records] == [
        ("a", False),
        ("b", True),
        ("c", True),
        ("d", True),
        ("e", False),
        ("f", False),
    ]
