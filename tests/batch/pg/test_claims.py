"""The PostgreSQL store's sharing rules, worker by worker, against the real server: claims
that never overlap, leases that give items back, results written once, a connection cut
in the middle of a write. Leases are tenths of a second: the server's clock runs them."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from capmon.audit import COLUMNS
from capmon.batch.pg import PgStore
from capmon.batch.sqlite import Outcome
from capmon.batch.states import ItemState
from capmon.batch.store import PgLocation
from capmon.core.base.exceptions import BatchError

TTL = 0.2


def make_job(db: PgLocation, n: int) -> tuple[PgStore, int]:
    store = PgStore(db, lease_ttl=TTL)
    info = store.create_job("j", input_path="/in.jsonl", input_size=1, fingerprint="sha256:x", settings={}, now=1.0)
    messages = '[{"role":"user","content":"x"}]'
    rows = [(i, f"it-{i}", ItemState.PENDING, messages, None, None, None, None, None, None) for i in range(1, n + 1)]
    store.ingest_chunk(info.id, rows, offset=n, line=n, now=1.0)
    return store, info.id


def worker(db: PgLocation, job_id: int, name: str, ttl: float = TTL) -> PgStore:
    store = PgStore(db, lease_ttl=ttl)
    store.claim(job_id, f"host-{name}:1:{name}", 1.0)
    return store


def done(key: int, content: str) -> Outcome:
    return Outcome(key, ItemState.DONE, attempts=1, model="m", content=content)


def audit_row(item: str) -> tuple[Any, ...]:
    return ("j", item, 1.0, 1, "m", "ep", "a", 200, None, None, 0.0, 0.1, "ok", "", "openai", None, "m", 5, 0, 7, 0.001)


def commit(store: PgStore, job_id: int, outcomes: list[Outcome], rows: list[tuple[Any, ...]] = []) -> list[int]:  # noqa: B006
    return list(store.commit(job_id, started=[], outcomes=outcomes, audit_rows=rows, job_fields={}, now=2.0))


def test_two_workers_claims_never_overlap_and_the_job_ends_when_all_is_done(pg_db: PgLocation) -> None:
    owner, job_id = make_job(pg_db, 30)
    a, b = worker(pg_db, job_id, "a"), worker(pg_db, job_id, "b")
    got_a, got_b = [], []
    for _ in range(3):
        got_a += a.take(job_id, 0, 6) or []
        got_b += b.take(job_id, 0, 4) or []
    keys_a, keys_b = {i.key for i in got_a}, {i.key for i in got_b}
    assert len(keys_a) == 18 and len(keys_b) == 12 and not keys_a & keys_b
    assert [i.key for i in got_a[:6]] == sorted(i.key for i in got_a[:6])  # input order within a claim
    # Everything is held: nothing to take now, but the job is not over.
    assert a.take(job_id, 0, 6) is None
    assert commit(a, job_id, [done(i.key, "a") for i in got_a]) == []
    assert commit(b, job_id, [done(i.key, "b") for i in got_b]) == []
    assert a.take(job_id, 0, 6) == [] and b.take(job_id, 0, 6) == []
    assert owner.counts(job_id)[ItemState.DONE] == 30
    shares = dict(owner.progress("j").workers)
    assert shares == {"host-a:1": 18, "host-b:1": 12}
    for s in (owner, a, b):
        s.close()


def test_a_lease_that_expires_gives_the_items_back_and_renewal_keeps_them(pg_db: PgLocation) -> None:
    owner, job_id = make_job(pg_db, 6)
    a, b = worker(pg_db, job_id, "a"), worker(pg_db, job_id, "b")
    mine = a.take(job_id, 0, 3) or []
    kept = [mine[0].key]
    deadline = time.monotonic() + TTL * 2.5
    while time.monotonic() < deadline:  # a renews one of its three, and lets the others lapse
        a.renew(job_id, kept)
        time.sleep(TTL / 4)
    theirs = b.take(job_id, 0, 10) or []
    every = {r.key for r in owner.results(job_id)}
    assert {i.key for i in theirs} == every - set(kept)
    for s in (owner, a, b):
        s.close()


def test_a_late_duplicate_is_discarded_and_the_result_is_stored_once(pg_db: PgLocation) -> None:
    owner, job_id = make_job(pg_db, 2)
    a, b = worker(pg_db, job_id, "a"), worker(pg_db, job_id, "b")
    [first, _] = a.take(job_id, 0, 2) or []
    time.sleep(TTL * 1.5)  # a is stuck; its leases lapse
    taken = b.take(job_id, 0, 1) or []
    assert [i.key for i in taken] == [first.key]
    assert commit(b, job_id, [done(first.key, "from b")], [audit_row(first.id)]) == []
    assert commit(a, job_id, [done(first.key, "from a")], [audit_row(first.id)]) == [first.key]
    [record] = [r for r in owner.results(job_id) if r.key == first.key]
    assert (record.state, record.content) == (ItemState.DONE, "from b")
    assert owner.counts(job_id)[ItemState.DONE] == 1
    for s in (owner, a, b):
        s.close()


def _backend_pid(store: PgStore) -> int:
    c = store._connection()
    return int(c.info.backend_pid)


def test_a_connection_cut_mid_write_loses_and_doubles_nothing(pg_db: PgLocation, pg_url: str) -> None:
    owner, job_id = make_job(pg_db, 4)
    a = worker(pg_db, job_id, "a")
    items = a.take(job_id, 0, 4) or []
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (_backend_pid(a),))
    batch = [done(i.key, f"answer {i.id}") for i in items[:2]]
    rows = [audit_row(i.id) for i in items[:2]]
    with pytest.raises(BatchError, match="connection was lost"):
        commit(a, job_id, batch, rows)
    # The writer sends the same batch again (and what came since): it is written once.
    assert commit(a, job_id, [*batch, done(items[2].key, "late")], [*rows, audit_row(items[2].id)]) == []
    # A commit that landed but whose answer was lost is found again by its token.
    token = owner._one("t", "SELECT last_commit FROM workers WHERE owner = %s", ("host-a:1:a",))
    assert token is not None
    a._unsure = (token[0], 3, 3, 0, 0)
    assert (
        commit(
            a, job_id, [*batch, done(items[2].key, "late"), done(items[3].key, "last")], [*rows, audit_row(items[2].id)]
        )
        == []
    )
    counts = owner.counts(job_id)
    assert (counts[ItemState.DONE], counts[ItemState.IN_FLIGHT]) == (4, 0)
    attempts = owner._rows("a", f"SELECT {', '.join(COLUMNS[:2])} FROM attempts ORDER BY seq")
    assert [r[1] for r in attempts] == [items[0].id, items[1].id, items[2].id]
    for s in (owner, a):
        s.close()


def test_a_claim_cut_after_its_commit_comes_back_when_the_lease_expires(pg_db: PgLocation) -> None:
    owner, job_id = make_job(pg_db, 3)
    a, b = worker(pg_db, job_id, "a"), worker(pg_db, job_id, "b")
    assert len(a.take(job_id, 0, 3) or []) == 3  # its answer never reaches the runner: a forgets them
    for _ in range(3):
        a.renew(job_id, [])  # a lives on, renewing only what it knows it holds
        time.sleep(TTL / 2)
    assert len(b.take(job_id, 0, 3) or []) == 3
    for s in (owner, a, b):
        s.close()


def test_a_store_from_before_the_deployment_column_reads_it_null_and_is_migrated_when_written(
    pg_db: PgLocation,
) -> None:
    owner, job_id = make_job(pg_db, 2)
    commit(owner, job_id, [], [audit_row("it-1")])
    owner.close()
    with psycopg.connect(pg_db.url, autocommit=True, options=f"-c search_path={pg_db.schema}") as c:
        c.execute("ALTER TABLE attempts DROP COLUMN deployment")  # as a capmon before it made the table
    reader = PgStore(pg_db, readonly=True)  # never migrated: the column reads NULL
    assert [(r.item, r.model, r.deployment) for r in reader.attempts("j")] == [("it-1", "m", None)]
    reader.close()
    writer = PgStore(pg_db)  # opened for writing: the column is added, the old row keeps NULL
    commit(writer, job_id, [], [audit_row("it-2")])
    assert [(r.item, r.deployment) for r in writer.attempts("j")] == [("it-1", None), ("it-2", "m")]
    writer.close()
