"""The audit log on its own: buffered, written in batches, no keys."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from capmon.audit import AuditLog, read_attempts
from capmon.core.secrets import redact as mask_secrets
from capmon.core.result import ChatRequest
from tests.batch.helpers import client_for
from tests.support.scripted import OVERLOADED, Script, build_app

pytestmark = pytest.mark.looptime


async def test_the_observer_only_buffers_and_flush_writes_every_attempt(tmp_path: Path) -> None:
    script = Script()
    script.always("flagship", OVERLOADED)
    db = tmp_path / "audit.db"
    log = AuditLog(db)
    async with client_for(build_app(script)) as client:
        log.attach(client)
        await client.chat(ChatRequest.of("hi", job="adhoc", item_id="q1"))
        assert log.pending == 2 and not db.exists()  # nothing touched SQLite in the client's path
        assert log.flush() == 2
    conn = sqlite3.connect(db)
    got = read_attempts(conn, "adhoc")
    assert [(a.item, a.attempt, a.model, a.status, a.decision, a.key_alias) for a in got] == [
        ("q1", 1, "flagship", 503, "fallback", "a"), ("q1", 2, "medium", 200, "ok", "a")]
    assert "sk-test" not in repr(conn.execute("SELECT * FROM attempts").fetchall())
    log.close()


async def test_run_flushes_periodically_and_once_more_when_stopped(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.db")
    task = asyncio.create_task(log.run(interval=1.0))
    log.add(("j", "i", 1.0, 1, "m", "e", "k", 200, None, None, 0.0, 0.1, "ok", ""))
    await asyncio.sleep(1.5)
    assert log.written == 1
    log.add(("j", "i", 2.0, 2, "m", "e", "k", 200, None, None, 0.0, 0.1, "ok", ""))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log.written == 2
    log.close()


def test_key_like_strings_in_provider_messages_are_masked() -> None:
    text = "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwx. See AIzaSyA1234567890abcdefghijklmnop."
    masked = mask_secrets(text)
    assert "abcdefghijklmnop" not in masked and "sk-pro****" in masked and "1234567890abcdef" not in masked
    assert mask_secrets("Selected model is at capacity.") == "Selected model is at capacity."
