"""The audit buffer on its own: the client's attempts buffered, written with the results
they belong with, no keys."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from capmon import audit
from capmon.audit import AuditLog, RunnerDecision, read_attempts
from capmon.batch.sqlite import JobStore
from capmon.core.base.secrets import redact as mask_secrets
from capmon.core.types.result import Request
from tests.batch.helpers import client_for
from tests.support.clocks import ManualClock
from tests.support.scripted import OVERLOADED, Script, build_app

pytestmark = pytest.mark.looptime


def _row(attempt: int) -> audit.Row:
    return ("j", "i", float(attempt), attempt, "m", "e", "k", 200, None, None, 0.0, 0.1, "ok", "")


async def test_the_observer_only_buffers_and_its_rows_are_written_in_the_owners_transaction(tmp_path: Path) -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    db = tmp_path / "audit.db"
    async with client_for(build_app(script)) as client:
        log = AuditLog(clock=client.clock)
        client.add_observer(log.observe)
        await client.chat(Request.of("hi", job="adhoc", item_id="q1"))
        assert log.pending == 2 and not db.exists()  # nothing touched SQLite in the client's path
    with JobStore(db) as store, store.transaction() as c:
        audit.write_rows(c, log.drain())
    assert log.pending == 0
    conn = sqlite3.connect(db)
    got = read_attempts(conn, "adhoc")
    assert [(a.item, a.attempt, a.model, a.status, a.decision, a.key_alias) for a in got] == [
        ("q1", 1, "flagship", 503, "fallback", "a"),
        ("q1", 2, "medium", 200, "ok", "a"),
    ]
    assert "sk-test" not in repr(conn.execute("SELECT * FROM attempts").fetchall())
    conn.close()


def test_rows_a_failed_write_did_not_store_go_first_again_in_order() -> None:
    log = AuditLog(clock=ManualClock())
    log.add(_row(1))
    log.add(_row(2))
    drained = log.drain()
    log.add(_row(3))  # recorded while the write was failing
    log.requeue(drained)
    assert [r[3] for r in log.drain()] == [1, 2, 3]


def test_the_runners_own_decisions_are_rows_of_their_own_kind() -> None:
    clock = ManualClock()
    log = AuditLog(clock=clock)
    log.decision(
        RunnerDecision.PARK, job="j", item="i", attempt=3, reason="parked: sk-proj-abcdefghijklmnopqrstuvwx", wait=7.5
    )
    [row] = log.drain()
    assert row[12] == "park" and row[10] == 7.5 and row[2] == clock.wall() and "abcdefghijklmnop" not in row[13]
    with pytest.raises(ValueError):
        log.decision("retry", job="j", item="i", attempt=1, reason="")  # type: ignore[arg-type]  # the client's


def test_key_like_strings_in_provider_messages_are_masked() -> None:
    text = "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwx. See AIzaSyA1234567890abcdefghijklmnop."
    masked = mask_secrets(text)
    assert "abcdefghijklmnop" not in masked and "sk-pro****" in masked and "1234567890abcdef" not in masked
    assert mask_secrets("Selected model is at capacity.") == "Selected model is at capacity."
