"""The job database's failure modes, and exports."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from capmon.batch import JobStore, default_db_path, read_progress
from capmon.batch import sqlite as store_mod
from capmon.batch.export import check_writable, export_job
from capmon.batch.options import RunnerOptions
from capmon.batch.runner import BatchRunner
from capmon.core.base.exceptions import BatchError
from tests.batch.helpers import client_for, item, rows, write_jsonl
from tests.support.scripted import Reply, Script, build_app, ok


def test_the_default_database_follows_the_environment(tmp_path: Path) -> None:
    assert default_db_path({"CAPMON_DB": str(tmp_path / "x.db")}) == tmp_path / "x.db"
    assert default_db_path({"XDG_DATA_HOME": str(tmp_path)}) == tmp_path / "capmon" / "jobs.db"
    assert default_db_path({}).parts[-4:] == (".local", "share", "capmon", "jobs.db")


def test_the_database_is_in_wal_mode_with_normal_sync(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "db")
    try:
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    finally:
        store.close()


def test_a_corrupt_database_gets_a_clear_message(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    db.write_bytes(b"this is not a database at all, just some bytes " * 200)
    with pytest.raises(BatchError, match="not a capmon job database, or it is corrupt"):
        JobStore(db)


def test_someone_elses_sqlite_file_is_not_taken_over(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(BatchError, match="not a capmon job database.*customers"):
        JobStore(db)


def test_a_locked_database_gets_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT", 0.05)
    db = tmp_path / "jobs.db"
    JobStore(db).close()
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(BatchError, match="locked by another process"):
            JobStore(db)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_reading_progress_of_a_missing_job_or_database_says_so(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="no job database here"):
        read_progress(tmp_path / "none.db", "j")
    JobStore(tmp_path / "db").close()
    with pytest.raises(BatchError, match="no job named 'j'"):
        read_progress(tmp_path / "db", "j")


def test_an_unwritable_output_is_reported(tmp_path: Path) -> None:
    with pytest.raises(BatchError, match="does not exist"):
        check_writable(tmp_path / "missing" / "out.jsonl")
    with pytest.raises(BatchError, match="is a folder"):
        check_writable(tmp_path)
    with pytest.raises(BatchError, match="cannot write"):
        check_writable("/proc/capmon-out.jsonl")  # refused even to root
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root ignores permissions
            with pytest.raises(BatchError, match="cannot write"):
                check_writable(locked / "out.jsonl")
    finally:
        locked.chmod(0o700)
    check_writable(tmp_path / "fine.jsonl")
    assert list(tmp_path.glob(".fine*")) == []  # the probe leaves nothing behind


@pytest.mark.looptime
async def test_export_is_in_input_order_with_errors_and_leaves_unfinished_items_out(tmp_path: Path) -> None:
    script = Script()

    def reply(n: int, body: dict) -> Reply:
        if body["messages"][-1]["content"] == "c":
            return Reply(400, {"error": {"message": "bad content", "code": "invalid_value"}})
        return ok(body["model"], text=f"answer to {body['messages'][-1]['content']}")

    script.set("flagship", reply)
    src = write_jsonl(tmp_path / "in.jsonl", [item("b", metadata={"n": 1}), "{broken", item("c"), item("a")])
    db = tmp_path / "db"
    async with client_for(build_app(script)) as client:
        await BatchRunner(client, db, "j", RunnerOptions(input_path=src)).run()
    out = tmp_path / "out.jsonl"
    result = export_job(db, "j", out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in records] == ["b", "line-2", "c", "a"]
    assert records[0] == {
        "id": "b",
        "model": "flagship",
        "content": "answer to b",
        "metadata": {"n": 1},
        "attempts": 1,
        "fell_back": False,
    }
    assert records[1]["error"]["kind"] == "bad_input" and records[1]["error"]["line"] == 2
    assert records[2]["error"]["kind"] == "bad_request" and "bad content" in records[2]["error"]["message"]
    assert records[2]["model"] is None and records[2]["content"] is None
    assert (result.written, result.done, result.failed, result.unfinished) == (4, 2, 2, 0)

    conn = sqlite3.connect(db)
    conn.execute("UPDATE items SET state = 'pending' WHERE id = 'a'")
    conn.commit()
    conn.close()
    result = export_job(db, "j", out)
    assert result.unfinished == 1 and [json.loads(x)["id"] for x in out.read_text().splitlines()] == [
        "b",
        "line-2",
        "c",
    ]
    assert rows(db, "SELECT count(*) FROM items") == [(4,)]
