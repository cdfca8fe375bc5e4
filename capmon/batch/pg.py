"""The PostgreSQL job store: one job, many workers on many machines.

The same jobs, items, states and audit rows as the SQLite store (:mod:`capmon.batch.sqlite`),
in a schema of their own (``?schema=NAME`` on the URL, default ``capmon``), and what sharing
a job needs on top:

* **Claims.** A worker takes a few items at a time: ``SELECT ... FOR UPDATE SKIP LOCKED``
  picks pending ones (and ones whose lease expired) that no other claim is taking, and the
  same statement marks them in flight under its lease (``lease_owner``, ``lease_expires``).
  A claim is one statement: a connection cut before its COMMIT claimed nothing; one cut
  after it leaves items under a lease nobody renews, free again when it expires.
* **Leases.** A worker renews the leases of the items it holds (only those it knows of) every
  third of ``lease_ttl``; a worker that dies stops renewing, and its items go to the others
  when their leases expire. Every time here is the server's clock, so machines' clocks never
  have to agree.
* **Results once.** An outcome is written only while the item is still in flight (or parked)
  under this worker's lease: a late answer for an item another worker took is discarded
  (:meth:`PgStore.commit` returns its key), never stored twice. A commit whose answer was
  lost with its connection is found again by its token on the worker's row: the retry
  writes only what did not land.
* **Ingest once**, by whichever worker starts the job: an advisory lock on the job's name
  while it is created and read, and each chunk is stored only after the last line stored.
* **Reconnects.** A lost connection raises BatchError at once (the runner pauses sending and
  says so); the next call connects again, no sooner than a backoff that doubles from 0.2 s
  to 5 s while the server stays unreachable.
* **Permanent errors.** An error that no retry fixes as things stand (:data:`PERMANENT`: the
  store's table or schema dropped, a grant revoked, a statement the server refuses) raises
  :class:`~capmon.batch.sqlite.StoreRefuses`, naming its SQLSTATE: the job halts at once
  rather than pausing as for a server that restarts.

The driver is psycopg 3 (its synchronous connection): the store's interface is synchronous,
as SQLite's is, and every call is one round trip (claims and results in batches).
The password is never shown: messages name the URL without it, and the driver's words are
passed through the redactor.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from capmon import audit
from capmon.batch import lease
from capmon.batch.defaults import DEFAULT_LEASE_TTL
from capmon.batch.pg_schema import (
    CLAIM_SQL,
    COMMIT_SQL,
    DDL,
    HELD,
    INGEST_LOCK,
    LIVE,
    NOT_ATTEMPTS,
    NOW,
    OPEN,
    OUTCOME_FIELDS,
    SCHEMA_VERSION,
)
from capmon.batch.sqlite import (
    COMPARISONS_SQL,
    FALLBACK_ITEMS_SQL,
    SAVE_COMPARISON_SQL,
    Comparison,
    DatabaseGone,
    FallbackItem,
    JobInfo,
    Outcome,
    ResultRecord,
    StoredItem,
    StoreRefuses,
    required,
)
from capmon.batch.states import UNFINISHED, ItemState, JobState
from capmon.batch.store import PgLocation
from capmon.core.base import secrets
from capmon.core.base.clock import default_clock
from capmon.core.base.exceptions import BatchError
from capmon.core.types.events import BatchProgress
from capmon.core.types.result import Decision

CONNECT_TIMEOUT = 5  # seconds to reach the server (libpq's connect_timeout)
# Errors a retry meets again until someone changes the database, by psycopg's classes of
# SQLSTATE: ProgrammingError is class 42 (an undefined table, column or function, permission
# denied, a syntax error) and 3D / 3F (no such database or schema); DataError (22) and
# IntegrityError (23) are a statement the server refuses for what it carries; NotSupportedError
# (0A). Everything else, a lost connection, a shutdown (57P01), a serialization failure or a
# deadlock (40), a timeout, a full disk, a read-only server mid-failover, is waited out.
PERMANENT: tuple[type[psycopg.Error], ...] = (
    psycopg.ProgrammingError,
    psycopg.DataError,
    psycopg.IntegrityError,
    psycopg.NotSupportedError,
)
BACKOFF_FIRST, BACKOFF_MAX = 0.2, 5.0  # seconds between reconnects while the server is unreachable


def _text(value: str | None) -> str | None:
    """PostgreSQL's text holds no NUL: one in an answer is kept as U+FFFD."""
    return value.replace("\x00", "\ufffd") if value and "\x00" in value else value


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _loads(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _why(e: BaseException) -> str:
    """The driver's words, one line, without a password."""
    text = " ".join(str(e).split()) or type(e).__name__
    return secrets.redact(text)[:300]


class PgStore:
    """One connection to a PostgreSQL job store. Like SQLite's, use it from one thread."""

    shared = True

    def __init__(self, location: PgLocation, *, readonly: bool = False, lease_ttl: float = DEFAULT_LEASE_TTL) -> None:
        self.location = location
        self.readonly = readonly
        self.lease_ttl = lease_ttl
        self._clock = default_clock()
        self._conn: psycopg.Connection[Any] | None = None
        self._owner: str | None = None
        self._delay = BACKOFF_FIRST
        self._next_try = 0.0
        self._last_why = ""
        self._audit_select: str | None = None  # _audit_columns(), once read
        # The last commit whose answer was lost: (token, outcomes, audit rows it carried,
        # outcomes and rows of its batch known to have landed before it).
        self._unsure: tuple[str, int, int, int, int] | None = None
        try:
            self._conn = self._connect()
        except psycopg.Error as e:
            raise BatchError(f"{self.where}: cannot connect to PostgreSQL: {_why(e)}") from None
        with self._errors("opening the job store"):
            if readonly:
                self._check_readable()
            else:
                self._create()

    @property
    def where(self) -> str:
        return self.location.shown

    # ------------------------------------------------------------ the connection

    def _connect(self) -> psycopg.Connection[Any]:
        schema = self.location.schema
        return psycopg.connect(
            self.location.url,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=f"capmon-batch {schema}"[:63],  # which job store, in pg_stat_activity
            # synchronous_commit off: a commit waits for no disk flush, the durability of the SQLite
            # store's synchronous=NORMAL (a crash of the server's machine may roll back the last
            # commits: those items are sent again), at a fraction of the time per item.
            options=f"-c search_path={schema} -c statement_timeout=30000 -c lock_timeout=10000 "
            "-c synchronous_commit=off",
            keepalives=1,
            keepalives_idle=5,
            keepalives_interval=2,
            keepalives_count=3,
            tcp_user_timeout=10000,
        )

    def _connection(self) -> psycopg.Connection[Any]:
        """The live connection, or a new one (no sooner than the backoff allows)."""
        c = self._conn
        if c is not None and not c.closed and not c.broken:
            return c
        now = self._clock.now()
        if now < self._next_try:
            raise BatchError(
                f"{self.where}: PostgreSQL is unreachable ({self._last_why}); "
                f"connecting again in {self._next_try - now:.1f}s"
            )
        try:
            self._conn = self._connect()
        except psycopg.Error as e:
            self._last_why = _why(e)
            self._next_try = self._clock.now() + self._delay
            self._delay = min(BACKOFF_MAX, self._delay * 2)
            raise BatchError(f"{self.where}: PostgreSQL is unreachable ({self._last_why})") from None
        self._delay = BACKOFF_FIRST
        return self._conn

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except PERMANENT as e:
            code = f"SQLSTATE {e.sqlstate}, " if e.sqlstate else ""
            raise StoreRefuses(f"{self.where}: {doing} failed: {_why(e)} ({code}{type(e).__name__})") from None
        except psycopg.OperationalError as e:
            c = self._conn
            if c is not None and (c.broken or c.closed):
                self._last_why = _why(e)
                self._conn = None
                raise BatchError(f"{self.where}: {doing} failed: the connection was lost ({_why(e)})") from None
            raise BatchError(f"{self.where}: {doing} failed: {_why(e)}") from None
        except psycopg.Error as e:
            raise BatchError(f"{self.where}: {doing} failed: {_why(e)}") from None

    def _create(self) -> None:
        c = self._connection()
        with c.transaction():
            # Workers starting together must not race to create the same tables.
            c.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (INGEST_LOCK, "schema"))
            c.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.location.schema)))
            c.execute(DDL)
            row = c.execute("SELECT version FROM meta").fetchone()
            if row is None:
                c.execute("INSERT INTO meta (version) VALUES (%s)", (SCHEMA_VERSION,))
            elif row[0] > SCHEMA_VERSION:
                raise BatchError(
                    f"{self.where}: made by a newer capmon (schema {row[0]}, this one reads {SCHEMA_VERSION})"
                )

    def _check_readable(self) -> None:
        c = self._connection()
        row = c.execute("SELECT to_regclass('meta'), to_regclass('jobs')").fetchone()
        if row is None or row[1] is None:
            raise BatchError(
                f"{self.where}: no capmon job store here (schema {self.location.schema}); "
                f"run `capmon batch run` first, or pass --db"
            )

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def __enter__(self) -> PgStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ SQLite's file concerns: none here

    def gone(self) -> DatabaseGone | None:
        return None

    def keep_open_file(self) -> None:
        pass

    def rescue(self) -> Path:
        raise BatchError(f"{self.where}: a PostgreSQL job store is not a file to copy")

    def free_bytes(self) -> int | None:
        return None  # the server's disk: its own errors say when it is full

    # ------------------------------------------------------------ helpers

    def _rows(self, doing: str, query: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> list[tuple[Any, ...]]:
        with self._errors(doing):
            return self._connection().execute(query, args).fetchall()

    def _one(self, doing: str, query: str, args: Sequence[Any] | Mapping[str, Any] = ()) -> tuple[Any, ...] | None:
        with self._errors(doing):
            return self._connection().execute(query, args).fetchone()

    def _stream(self, doing: str, query: str, args: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
        """Rows from a server-side cursor: memory stays flat however large the job."""
        with self._errors(doing):
            c = self._connection()
            with c.transaction(), c.cursor(name=f"capmon_{uuid.uuid4().hex[:8]}") as cur:
                cur.execute(query, args)
                while rows := cur.fetchmany(2000):
                    yield from rows

    # ------------------------------------------------------------ jobs

    _JOB_COLUMNS = JobInfo._COLUMNS

    def job(self, name: str) -> JobInfo | None:
        row = self._one("reading the job", f"SELECT {self._JOB_COLUMNS} FROM jobs WHERE name = %s", (name,))
        return JobInfo.of(row) if row else None

    def require(self, name: str) -> JobInfo:
        return required(self.job(name), name, self.where, self.jobs)

    def jobs(self) -> list[JobInfo]:
        rows = self._rows("listing jobs", f"SELECT {self._JOB_COLUMNS} FROM jobs ORDER BY created, id")
        return [JobInfo.of(r) for r in rows]

    def _live_workers(self, job_id: int) -> list[tuple[str, str, int, str, dict[str, Any]]]:
        """(owner, host, pid, state, counters) of the workers still beating."""
        rows = self._rows(
            "reading the workers",
            f"SELECT owner, host, pid, state, counters FROM workers WHERE job_id = %s AND state = ANY(%s) "
            f"AND beat > {NOW} - ttl ORDER BY started",
            (job_id, list(LIVE)),
        )
        return [(r[0], r[1], int(r[2]), r[3], _loads(r[4])) for r in rows]

    def state_of(self, job: JobInfo) -> JobState:
        live = self._live_workers(job.id)
        if live:
            states = {JobState(w[3]) for w in live}
            return JobState.RUNNING if JobState.RUNNING in states else sorted(states)[0]
        return JobState.STOPPED if job.state.live else job.state

    def progress(self, name: str) -> BatchProgress:
        info = self.require(name)
        counts = self.counts(info.id)
        live = self._live_workers(info.id)
        state = self.state_of(info)
        hosts = {w[0]: f"{w[1]}:{w[2]}" for w in live}
        shares = self._rows(
            "reading the workers",
            "SELECT lease_owner, count(*) FROM items WHERE job_id = %s AND state = 'done' GROUP BY lease_owner "
            "ORDER BY min(key)",
            (info.id,),
        )
        workers = tuple((hosts.get(o) or _label(o), int(n)) for o, n in shares)
        workers += tuple((label, 0) for owner, label in hosts.items() if owner not in {o for o, _ in shares})
        rate = sum(float(w[4].get("rate") or 0.0) for w in live)
        done, failed = counts[ItemState.DONE], counts[ItemState.FAILED]
        total = info.total if info.ingested else None
        remaining = (info.total - done - failed) if total is not None else None
        clock = self._clock
        return BatchProgress(
            at=clock.now(),
            wall=clock.wall(),
            job=info.name,
            total=total,
            done=done,
            failed=failed,
            parked=counts[ItemState.PARKED],
            pending=counts[ItemState.PENDING],
            in_flight=counts[ItemState.IN_FLIGHT],
            per_model=tuple(self.served_by_model(info.id).items()),
            rate=rate,
            eta=remaining / rate if rate > 0 and remaining is not None else None,
            state=state,
            message=info.message,
            workers=workers,
        )

    def create_job(
        self, name: str, *, input_path: str, input_size: int, fingerprint: str, settings: Mapping[str, Any], now: float
    ) -> JobInfo:
        with self._errors("creating the job"):
            self._connection().execute(
                "INSERT INTO jobs (name, created, updated, input_path, input_size, input_fingerprint, state, settings) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                (name, now, now, input_path, input_size, fingerprint, JobState.INGESTING, _dumps(dict(settings))),
            )
        return self.require(name)

    def delete_job(self, job_id: int) -> None:
        with self._errors("deleting the job"):
            c = self._connection()
            with c.transaction():
                row = c.execute("SELECT name FROM jobs WHERE id = %s", (job_id,)).fetchone()
                c.execute("DELETE FROM items WHERE job_id = %s", (job_id,))
                c.execute("DELETE FROM workers WHERE job_id = %s", (job_id,))
                c.execute("DELETE FROM comparisons WHERE job_id = %s", (job_id,))
                c.execute("DELETE FROM jobs WHERE id = %s", (job_id,))
                if row:
                    c.execute("DELETE FROM attempts WHERE job = %s", (row[0],))
                    c.execute("DELETE FROM replaced_results WHERE job = %s", (row[0],))

    def lock_ingest(self, name: str) -> bool:
        row = self._one(
            "locking the job", "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (INGEST_LOCK, self._lock_name(name))
        )
        return bool(row and row[0])

    def unlock_ingest(self, name: str) -> None:
        with contextlib.suppress(BatchError):  # a lost connection let go of the lock already
            self._one(
                "unlocking the job",
                "SELECT pg_advisory_unlock(%s, hashtext(%s))",
                (INGEST_LOCK, self._lock_name(name)),
            )

    def _lock_name(self, name: str) -> str:
        return f"{self.location.schema}:{name}"

    def restart_ingest(self, job_id: int, *, input_path: str, input_size: int, fingerprint: str, now: float) -> None:
        with self._errors("restarting the ingest"):
            c = self._connection()
            with c.transaction():
                c.execute("DELETE FROM items WHERE job_id = %s", (job_id,))
                c.execute(
                    "UPDATE jobs SET input_path = %s, input_size = %s, input_fingerprint = %s, ingest_offset = 0, "
                    "ingest_line = 0, total = 0, state = %s, updated = %s WHERE id = %s",
                    (input_path, input_size, fingerprint, JobState.INGESTING, now, job_id),
                )

    def set_input(self, job_id: int, *, input_path: str, input_size: int, fingerprint: str) -> None:
        with self._errors("updating the job's input"):
            self._connection().execute(
                "UPDATE jobs SET input_path = %s, input_size = %s, input_fingerprint = %s WHERE id = %s",
                (input_path, input_size, fingerprint, job_id),
            )

    def stored_lines(self, job_id: int) -> Generator[tuple[int, str | None], None, None]:
        for line, h in self._stream(
            "reading items",
            "SELECT line, line_hash FROM items WHERE job_id = %s AND state <> 'removed' ORDER BY line, key",
            (job_id,),
        ):
            yield int(line), h

    def backfill_line_hashes(self, job_id: int, hashes: Iterator[tuple[int, str]]) -> None:
        with self._errors("storing line hashes"):
            c = self._connection()
            with c.transaction(), c.cursor() as cur:
                cur.executemany(
                    "UPDATE items SET line_hash = %s WHERE job_id = %s AND line = %s",
                    ((h, job_id, line) for line, h in hashes),
                )

    def unfinished_models(self, job_id: int) -> list[tuple[str, int, int]]:
        rows = self._rows(
            "reading items",
            "SELECT req_model, count(*), min(line) FROM items WHERE job_id = %s AND req_model IS NOT NULL "
            "AND state = ANY(%s) GROUP BY req_model ORDER BY min(line)",
            (job_id, [s.value for s in UNFINISHED]),
        )
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]

    def ingest_chunk(self, job_id: int, rows: Sequence[tuple[Any, ...]], *, offset: int, line: int, now: float) -> None:
        if not rows:
            return
        with self._errors("storing items"):
            c = self._connection()
            with c.transaction():
                (stored,) = c.execute(
                    "SELECT ingest_line FROM jobs WHERE id = %s FOR UPDATE", (job_id,)
                ).fetchone() or (0,)
                if stored >= rows[0][0]:
                    raise BatchError(
                        f"{self.where}: lines {rows[0][0]}-{line} of the job's input were stored by another "
                        f"worker already (two ingests at once); run the job again"
                    )
                with c.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO items (job_id, line, id, state, messages, req_model, req_max_tokens, temperature, "
                        "metadata, error_kind, error_message, line_hash, updated) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [
                            (
                                job_id,
                                *(_text(v) if isinstance(v, str) else v for v in (r if len(r) == 11 else (*r, None))),
                                now,
                            )
                            for r in rows
                        ],
                    )
                c.execute(
                    "UPDATE jobs SET ingest_offset = %s, ingest_line = %s, total = total + %s, updated = %s "
                    "WHERE id = %s",
                    (offset, line, len(rows), now, job_id),
                )

    def duplicate_ids(self, job_id: int, limit: int = 5) -> list[tuple[str, list[int]]]:
        rows = self._rows(
            "checking ids",
            "SELECT id, string_agg(line::text, ',' ORDER BY key) FROM items WHERE job_id = %s AND id IN "
            "(SELECT id FROM items WHERE job_id = %s GROUP BY id HAVING count(*) > 1) "
            "GROUP BY id ORDER BY min(line) LIMIT %s",
            (job_id, job_id, limit),
        )
        return [(r[0], [int(x) for x in str(r[1]).split(",")]) for r in rows]

    def duplicate_count(self, job_id: int) -> int:
        row = self._one(
            "checking ids",
            "SELECT count(*) FROM (SELECT id FROM items WHERE job_id = %s GROUP BY id HAVING count(*) > 1) AS d",
            (job_id,),
        )
        return int(row[0]) if row else 0

    def set_job(self, job_id: int, **fields: Any) -> None:
        allowed = {"state", "message", "settings", "counters", "owner", "heartbeat", "updated"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown job fields {bad}")
        if not fields:
            return
        values = [(_dumps(v) if k in ("settings", "counters") else v) for k, v in fields.items()]
        with self._errors("updating the job"):
            self._connection().execute(
                f"UPDATE jobs SET {', '.join(f'{k} = %s' for k in fields)} WHERE id = %s", (*values, job_id)
            )

    def claim(self, job_id: int, owner: str, now: float) -> None:
        """Join the job as one of its workers (many may run it at once)."""
        host, _, rest = owner.partition(":")
        with self._errors("joining the job"):
            self._connection().execute(
                f"INSERT INTO workers (job_id, owner, host, pid, started, beat, ttl, state) "
                f"VALUES (%s, %s, %s, %s, {NOW}, {NOW}, %s, %s) "
                f"ON CONFLICT (job_id, owner) DO UPDATE SET beat = EXCLUDED.beat, state = EXCLUDED.state",
                (job_id, owner, host, int(rest.partition(":")[0] or 0), self.lease_ttl, JobState.STARTING),
            )
        self._owner = owner
        lease.hold(owner)

    def release(self, job_id: int, owner: str, **fields: Any) -> None:
        """Leave the job: items in flight go back to pending, parked ones to the other workers, and
        the job's state is this worker's last word only when no other worker still runs it."""
        lease.forget_owner(owner)
        state = fields.get("state")
        with self._errors("leaving the job"):
            c = self._connection()
            with c.transaction():
                c.execute(
                    "UPDATE items SET state = 'pending', lease_owner = NULL, lease_expires = NULL "
                    "WHERE job_id = %s AND lease_owner = %s AND state = 'in_flight'",
                    (job_id, owner),
                )
                c.execute(
                    f"UPDATE items SET lease_expires = {NOW} "
                    "WHERE job_id = %s AND lease_owner = %s AND state = 'parked'",
                    (job_id, owner),
                )
                c.execute(
                    "UPDATE workers SET state = %s, message = %s, counters = %s WHERE job_id = %s AND owner = %s",
                    (
                        state or JobState.STOPPED,
                        fields.get("message", ""),
                        _dumps(fields.get("counters") or {}),
                        job_id,
                        owner,
                    ),
                )
                if state is None:
                    return
                others = c.execute(
                    f"SELECT count(*) FROM workers WHERE job_id = %s AND owner <> %s AND state = ANY(%s) "
                    f"AND beat > {NOW} - ttl",
                    (job_id, owner, list(LIVE)),
                ).fetchone()
                left = c.execute(
                    f"SELECT count(*) FROM items WHERE job_id = %s AND state IN {OPEN}", (job_id,)
                ).fetchone()
                if state is JobState.FINISHED and left and left[0]:
                    state = JobState.STOPPED
                if others and others[0] and state in (JobState.STOPPED, JobState.FINISHED):
                    return  # the others run on: the job is theirs to end
                c.execute(
                    "UPDATE jobs SET state = %s, message = %s, counters = %s, updated = %s WHERE id = %s",
                    (
                        state,
                        fields.get("message", ""),
                        _dumps(fields.get("counters") or {}),
                        fields.get("updated") or self._clock.wall(),
                        job_id,
                    ),
                )

    # ------------------------------------------------------------ items

    def requeue_in_flight(self, job_id: int) -> int:
        return 0  # an item in flight is another live worker's, or its lease expires and it is taken again

    def take(self, job_id: int, after_key: int, limit: int) -> list[StoredItem] | None:
        """Claim up to ``limit`` items; [] when every item is finished, None when none can be claimed now."""
        me = self._owner
        with self._errors("claiming items"):
            c = self._connection()
            rows = c.execute(CLAIM_SQL, {"job": job_id, "n": limit, "me": me, "ttl": self.lease_ttl}).fetchall()
            if rows:
                return sorted((StoredItem(*r) for r in rows), key=lambda i: i.key)
            # Any item not finished, ours too: one whose claim's answer we lost comes back to us
            # when its lease expires, so the job is over only when every item is finished.
            row = c.execute(
                f"SELECT EXISTS (SELECT 1 FROM items WHERE job_id = %s AND state IN {OPEN})", (job_id,)
            ).fetchone()
        return None if row and row[0] else []

    def renew(self, job_id: int, keys: Sequence[int]) -> None:
        with self._errors("renewing leases"):
            c = self._connection()
            with c.transaction():
                if keys:
                    c.execute(
                        f"UPDATE items SET lease_expires = {NOW} + %s WHERE key = ANY(%s) AND lease_owner = %s "
                        f"AND state IN {HELD}",
                        (self.lease_ttl, list(keys), self._owner),
                    )
                c.execute(f"UPDATE workers SET beat = {NOW} WHERE job_id = %s AND owner = %s", (job_id, self._owner))

    def counts(self, job_id: int) -> dict[ItemState, int]:
        rows = self._rows(
            "counting items", "SELECT state, count(*) FROM items WHERE job_id = %s GROUP BY state", (job_id,)
        )
        out = {s: 0 for s in ItemState}
        out.update({ItemState(r[0]): int(r[1]) for r in rows})
        return out

    def served_by_model(self, job_id: int) -> dict[str, int]:
        rows = self._rows(
            "counting items",
            "SELECT model, count(*) FROM items WHERE job_id = %s AND state = 'done' "
            "GROUP BY model ORDER BY count(*) DESC",
            (job_id,),
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def failure_kinds(self, job_id: int) -> dict[str, int]:
        rows = self._rows(
            "counting failures",
            "SELECT error_kind, count(*) FROM items WHERE job_id = %s AND state = 'failed' "
            "GROUP BY error_kind ORDER BY count(*) DESC",
            (job_id,),
        )
        return {str(r[0]): int(r[1]) for r in rows}

    def failed_items(self, job_id: int, limit: int = 10) -> list[tuple[int, str, str, str]]:
        rows = self._rows(
            "reading failures",
            "SELECT line, id, error_kind, error_message FROM items WHERE job_id = %s AND state = 'failed' "
            "ORDER BY key LIMIT %s",
            (job_id, limit),
        )
        return [(int(r[0]), r[1], r[2], r[3]) for r in rows]

    def parked(self, job_id: int) -> list[StoredItem]:
        return []  # a parked item is its worker's; a gone worker's come back through claims

    def commit(
        self,
        job_id: int,
        *,
        started: Sequence[int],
        outcomes: Sequence[Outcome],
        audit_rows: Sequence[audit.Row],
        job_fields: Mapping[str, Any],
        now: float,
    ) -> Sequence[int]:
        """Outcomes (only of items still under this worker's lease), their audit rows and the
        worker's counters, in one transaction. ``started`` is nothing to write: a claim marks
        its items in flight. Returns the keys of the outcomes discarded."""
        me = self._owner
        with self._errors("saving results"):
            c = self._connection()
            skip_o = skip_a = 0
            if self._unsure is not None:
                token, n_o, n_a, prev_o, prev_a = self._unsure
                row = c.execute(
                    "SELECT last_commit FROM workers WHERE job_id = %s AND owner = %s", (job_id, me)
                ).fetchone()
                skip_o, skip_a = (n_o, n_a) if row is not None and row[0] == token else (prev_o, prev_a)
            token = uuid.uuid4().hex
            self._unsure = (token, len(outcomes), len(audit_rows), skip_o, skip_a)
            latest = {o.key: o for o in outcomes[skip_o:]}  # an item parked, then done: the last one wins
            params: dict[str, Any] = {f: [] for f in ("key", *OUTCOME_FIELDS)}
            for o in latest.values():
                params["key"].append(o.key)
                for f in OUTCOME_FIELDS:
                    v = getattr(o, f)
                    params[f].append(_text(v) if isinstance(v, str) else v)
            rows = audit_rows[skip_a:]
            for n, column in enumerate(audit.COLUMNS):
                params[f"a_{column}"] = [_text(r[n]) if isinstance(r[n], str) else r[n] for r in rows]
            params.update(
                now=now,
                job=job_id,
                me=me,
                token=token,
                counters=_dumps(job_fields.get("counters") or {}),
                wstate=job_fields.get("state") or JobState.RUNNING,
                message=job_fields.get("message") or "",
            )
            applied = {r[0] for r in c.execute(COMMIT_SQL, params)}
            discarded = [k for k in latest if k not in applied]
        self._unsure = None
        return discarded

    def results(self, job_id: int) -> Iterator[ResultRecord]:
        for r in self._stream(
            "reading results",
            "SELECT key, line, id, state, metadata, attempts, model, content, fell_back, error_kind, error_message "
            "FROM items WHERE job_id = %s ORDER BY line, state <> 'removed', key",
            (job_id,),
        ):
            yield ResultRecord(r[0], r[1], r[2], ItemState(r[3]), r[4], r[5], r[6], r[7], bool(r[8]), r[9], r[10])

    def item(self, job_id: int, item_id: str) -> dict[str, Any] | None:
        with self._errors("reading the item"):
            cur = self._connection().execute(
                "SELECT * FROM items WHERE job_id = %s AND id = %s ORDER BY key LIMIT 1", (job_id, item_id)
            )
            row = cur.fetchone()
            names = [d.name for d in cur.description or ()]
        if row is None:
            return None
        out = dict(zip(names, row, strict=False))
        out.pop("lease_expires", None)
        if out.get("fell_back") is not None:
            out["fell_back"] = int(out["fell_back"])
        return out

    # ------------------------------------------------------------ the audit trail, for reports

    def has_attempts(self, job: str) -> bool:
        return self._one("reading the audit trail", "SELECT 1 FROM attempts WHERE job = %s LIMIT 1", (job,)) is not None

    def attempt_groups(
        self, job: str
    ) -> list[tuple[str | None, int | None, str | None, str, str | None, str | None, int]]:
        rows = self._rows(
            "reading the audit trail",
            "SELECT model, status, kind, decision, key_alias, endpoint, count(*) FROM attempts WHERE job = %s "
            "GROUP BY 1, 2, 3, 4, 5, 6",
            (job,),
        )
        return [(r[0], r[1], r[2], r[3], r[4], r[5], int(r[6])) for r in rows]

    def continued_items(self, job: str) -> int:
        row = self._one(
            "reading the audit trail",
            "SELECT count(DISTINCT item) FROM attempts WHERE job = %s AND decision = %s",
            (job, Decision.CONTINUE),
        )
        return int(row[0]) if row else 0

    def spend(self, job: str) -> list[audit.SpendRow]:
        if "NULL AS cost_usd" in self._audit_columns():  # a store from before the column, read only
            return []
        rows = self._rows("reading the audit trail", audit.SPEND_SQL.format(p="%s"), (job, Decision.OK))
        return [(r[0], int(r[1]), int(r[2]), float(r[3]), int(r[4]), int(r[5]), int(r[6])) for r in rows]

    def ok_latencies(self, job: str) -> list[tuple[str | None, float]]:
        rows = self._rows(
            "reading the audit trail",
            "SELECT model, latency FROM attempts WHERE job = %s AND decision = %s AND latency IS NOT NULL",
            (job, Decision.OK),
        )
        return [(r[0], float(r[1])) for r in rows]

    def attempt_models(self, job: str) -> Iterator[tuple[str | None, str | None]]:
        yield from self._stream(
            "reading the audit trail",
            "SELECT item, model FROM attempts WHERE job = %s AND decision <> ALL(%s) ORDER BY item, seq",
            (job, list(NOT_ATTEMPTS)),
        )

    def attempt_span(self, job: str) -> tuple[float | None, float | None, int]:
        row = self._one(
            "reading the audit trail",
            "SELECT min(at), max(at), count(DISTINCT floor(at)) FROM attempts WHERE job = %s AND decision <> ALL(%s)",
            (job, list(NOT_ATTEMPTS)),
        )
        if row is None:
            return None, None, 0
        return row[0], row[1], int(row[2] or 0)

    def answered_items(self, job: str) -> dict[str, int]:
        rows = self._rows(
            "reading the audit trail",
            "SELECT model, count(DISTINCT item) FROM attempts WHERE job = %s AND decision = %s GROUP BY model",
            (job, Decision.OK),
        )
        return {str(m): int(n) for m, n in rows}

    def attempt_apis(self, job: str) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for model, api in self._rows(
            "reading the audit trail",
            "SELECT model, api FROM attempts WHERE job = %s AND model IS NOT NULL AND api IS NOT NULL "
            "GROUP BY model, api ORDER BY model, api",
            (job,),
        ):
            out.setdefault(model, []).append(api)
        return {m: tuple(a) for m, a in out.items()}

    def _audit_columns(self) -> str:
        """audit.COLUMNS as this store has them: a store read without being written is never
        migrated, and one from before a column reads it NULL (asked once per store)."""
        if self._audit_select is None:
            have = {
                r[0]
                for r in self._rows(
                    "reading the audit trail",
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = 'attempts'",
                )
            }
            self._audit_select = ", ".join(c if c in have else f"NULL AS {c}" for c in audit.COLUMNS)
        return self._audit_select

    def attempts(self, job: str, item: str | None = None) -> list[audit.AuditRow]:
        query = f"SELECT {self._audit_columns()} FROM attempts WHERE job = %s"
        args: tuple[Any, ...] = (job,)
        if item is not None:
            query += " AND item = %s"
            args += (item,)
        return [audit.AuditRow.of(r) for r in self._rows("reading the audit trail", query + " ORDER BY seq", args)]

    def replaced_results(self, job: str, item_id: str) -> tuple[dict[str, Any], ...]:
        names = ("line", "at", "why", "state", "model", "content", "error_kind", "error_message")
        rows = self._rows(
            "reading the audit trail",
            f"SELECT {', '.join(names)} FROM replaced_results WHERE job = %s AND item = %s ORDER BY seq",
            (job, item_id),
        )
        return tuple(dict(zip(names, r, strict=True)) for r in rows)

    def served_items(self, job_id: int, per_model: int) -> list[tuple[str, str]]:
        rows = self._rows(
            "reading items",
            "SELECT model, id FROM (SELECT model, id, key, row_number() OVER (PARTITION BY model ORDER BY key) AS n "
            "FROM items WHERE job_id = %s AND state = 'done') AS s WHERE n <= %s ORDER BY key",
            (job_id, per_model),
        )
        return [(r[0], r[1]) for r in rows]

    def fell_back_count(self, job_id: int) -> int:
        row = self._one(
            "reading items",
            "SELECT count(*) FROM items WHERE job_id = %s AND state = 'done' AND fell_back",
            (job_id,),
        )
        return int(row[0]) if row else 0

    # ------------------------------------------------------------ capmon batch compare

    def fallback_items(self, job_id: int) -> list[FallbackItem]:
        rows = self._rows("reading items", FALLBACK_ITEMS_SQL.format(p="%s"), (job_id,))
        return [FallbackItem(*r) for r in rows]

    def save_comparison(
        self, job_id: int, key: int, *, model: str, content: str | None, error: str | None, now: float
    ) -> None:
        with self._errors("saving a comparison"):
            self._connection().execute(
                SAVE_COMPARISON_SQL.format(p="%s"), (job_id, key, model, _text(content), _text(error), now)
            )

    def comparisons(self, job_id: int) -> dict[int, Comparison]:
        """The comparison answers by item key ({} in a store made before compare existed, read only)."""
        row = self._one("reading comparisons", "SELECT to_regclass('comparisons')")
        if row is None or row[0] is None:
            return {}
        rows = self._rows("reading comparisons", COMPARISONS_SQL.format(p="%s"), (job_id,))
        return {int(r[0]): Comparison(r[1], r[2], r[3]) for r in rows}

    def token_use(self, job_id: int) -> list[tuple[int, int]]:
        rows = self._rows(
            "reading items",
            "SELECT max_tokens, completion_tokens FROM items WHERE job_id = %s AND state = 'done' "
            "AND max_tokens IS NOT NULL AND completion_tokens IS NOT NULL",
            (job_id,),
        )
        return [(int(a), int(b)) for a, b in rows]


def _label(owner: str | None) -> str:
    """``host:pid`` of a worker's lease."""
    if not owner:
        return "?"
    host, _, rest = owner.partition(":")
    return f"{host}:{rest.partition(':')[0]}"
