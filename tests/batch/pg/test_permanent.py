"""A PostgreSQL error that no retry can fix (the job's table dropped, a grant revoked) halts a
shared job at once, naming the cause, instead of pausing for the ten minutes a restarting
server is given; a lost connection still pauses and reconnects (tests/batch/pg/test_workers.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from capmon.batch.options import RunnerOptions
from capmon.batch.runner import SHARED_WRITE_GIVE_UP, BatchRunner
from capmon.batch.store import PgLocation, pg_location
from capmon.core.base.exceptions import BatchError
from capmon.core.types.events import Notice
from tests.batch.helpers import Recorder, client_for, scenario_app, write_items

# Far below the ten minutes a failing save is given before the job halts, and far above what a
# halt at once takes on a loaded machine.
PROMPTLY = 30.0


@contextlib.contextmanager
def database_acl(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A transaction that may change the database's grants: one at a time (tests running at
    once would update its one catalog row together: "tuple concurrently updated")."""
    with psycopg.connect(pg_url, autocommit=True) as admin, admin.transaction():
        admin.execute("SELECT pg_advisory_xact_lock(hashtext('capmon-tests: database grants'))")
        yield admin


@pytest.fixture
def role(pg_url: str) -> Iterator[str]:
    name = f"r_{uuid.uuid4().hex[:12]}"
    with database_acl(pg_url) as admin:
        admin.execute(f"CREATE ROLE {name} LOGIN")
        (database,) = admin.execute("SELECT current_database()").fetchone() or ("",)
        admin.execute(f"GRANT CREATE ON DATABASE {database} TO {name}")  # to make its job store's schema
    yield name
    with database_acl(pg_url) as admin:
        admin.execute(f"DROP OWNED BY {name}")
        admin.execute(f"DROP ROLE {name}")


def as_role(pg_url: str, role: str, schema: str) -> PgLocation:
    url = urlsplit(pg_url)
    host = url.netloc.rpartition("@")[2]
    return pg_location(url._replace(netloc=f"{role}@{host}").geturl() + f"?schema={schema}", from_env=True)


@pytest.mark.parametrize("break_it", ["drop the items table", "revoke the role's grants"])
async def test_a_permanent_error_halts_the_job_at_once_naming_it(
    tmp_path: Path, pg_url: str, pg_db: PgLocation, role: str, break_it: str
) -> None:
    assert SHARED_WRITE_GIVE_UP >= 20 * PROMPTLY  # what the job would otherwise wait
    schema = pg_db.schema  # the worker runs as a role of the test's own, which makes the job store
    src = write_items(tmp_path / "in.jsonl", 400)
    rec = Recorder(scenario_app(latency=0.02))

    async def break_the_store_mid_run() -> None:
        while len(rec.seen) < 20:  # the job is under way: items sent, results saved
            await asyncio.sleep(0.02)
        with psycopg.connect(pg_url, autocommit=True) as admin:
            if break_it == "drop the items table":
                admin.execute(f"DROP TABLE {schema}.items CASCADE")
            else:
                admin.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}")

    async with client_for(rec) as client:
        notes: list[str] = []
        client.bus.subscribe(lambda e: notes.append(e.message) if isinstance(e, Notice) else None)
        runner = BatchRunner(
            client, as_role(pg_url, role, schema), "j", RunnerOptions(input_path=src, concurrency=4, rate=40.0)
        )
        breaker = asyncio.create_task(break_the_store_mid_run())
        with pytest.raises(BatchError) as halted:
            await asyncio.wait_for(runner.run(), PROMPTLY)
        await breaker
    message = str(halted.value)
    assert "halted" in message and "resume" in message, message
    cause = 'relation "items" does not exist' if break_it.startswith("drop") else "permission denied"
    sqlstate = "42P01" if break_it.startswith("drop") else "42501"
    assert cause in message and sqlstate in message, message
    assert "600s" not in message  # it did not wait out the ten minutes
    assert any(cause in m for m in notes), notes  # the dashboard and the log were told why
    assert len(rec.seen) < 400  # nothing like the whole job was sent after the store broke
