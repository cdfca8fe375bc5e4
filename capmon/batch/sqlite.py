"""The job database: SQLite in WAL mode, one file for every job and its audit trail.

Durability: results are written in transactions of a few hundred rows (every
~100 ms), each committed before the item is counted as done. WAL with
``synchronous=NORMAL`` makes a commit survive the process being killed at any moment
(the WAL is written before COMMIT returns; only the fsync is deferred to checkpoints),
which is what a batch job must survive; only an OS crash or power cut can roll back the
last few commits, and then those items are simply sent again on resume. ``FULL`` would
fsync on every commit (10-100x the cost on most disks) to protect against that.

Memory stays flat: inserts and updates are ``executemany`` over chunks, pending items
are read a page at a time, and exports stream from a cursor.

A failed write (a full disk, a database locked by someone else) rolls its whole
transaction back and raises BatchError naming the file and SQLite's own words for the
cause (``database or disk is full``); nothing committed before it is touched.

Schema 2 added ``items.line_hash`` (each input line's fingerprint) and the ``removed``
item state; a schema-1 database is upgraded in place when it is opened for writing.

A store opened for writing checks before every transaction that its path still leads
to the file it opened (the same device and inode): a database deleted or replaced while
a job runs would otherwise take every later commit into a file nobody can open again
(SQLite writes on into the open, unlinked file). That raises :class:`DatabaseGone`, which
no retry can mend; :meth:`JobStore.rescue` copies the open file out before it closes.

Every query of the database is here, the report's too (``capmon report`` reads the
audit trail through :class:`JobStore`), so the schema has one owner.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capmon import audit
from capmon.batch import lease
from capmon.batch.states import UNFINISHED, ItemState, JobState
from capmon.core.base.clock import default_clock
from capmon.core.base.exceptions import BatchError
from capmon.core.types.events import BatchProgress
from capmon.core.types.result import Decision

SCHEMA_VERSION = 2
BUSY_TIMEOUT = 5.0  # seconds to wait for another writer before saying the database is locked
# What a job that stored no client.max_response_bytes (an older capmon's) is exported with: the config's default.
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

_DONE, _FAILED, _PENDING = (f"'{s.value}'" for s in (ItemState.DONE, ItemState.FAILED, ItemState.PENDING))
_UNFINISHED = ", ".join(f"'{s.value}'" for s in UNFINISHED)
# The runner's own decisions are not attempts of the client, nor a target skipped as
# unable to carry the request (nothing was sent): left out of attempt counts.
_NOT_ATTEMPTS = "(" + ", ".join(f"'{d.value}'" for d in (*audit.RunnerDecision, Decision.SKIP)) + ")"

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    input_path TEXT,
    input_size INTEGER,
    input_fingerprint TEXT,   -- "sha256:<hex>" of the whole file (schema 1: a hash of its first 64 KiB)
    ingest_offset INTEGER NOT NULL DEFAULT 0,  -- bytes of the input already stored
    ingest_line INTEGER NOT NULL DEFAULT 0,    -- last line number already stored
    total INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,   -- ingesting | ready | running | paused | waiting-window | stopped | halted | finished
    message TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',  -- concurrency, rate, window of the last run (JSON)
    counters TEXT NOT NULL DEFAULT '{}',  -- progress, written in the same transaction as the items it counts
    owner TEXT,            -- host:pid:token of the runner holding the job, NULL when none
    heartbeat REAL         -- wall time of the owner's last commit
);
CREATE TABLE IF NOT EXISTS items (
    key INTEGER PRIMARY KEY,  -- increases in input order within a job
    job_id INTEGER NOT NULL,
    line INTEGER NOT NULL,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    messages TEXT,            -- JSON
    req_model TEXT,
    req_max_tokens INTEGER,
    temperature REAL,
    metadata TEXT,            -- JSON, NULL when none
    attempts INTEGER NOT NULL DEFAULT 0,
    parks INTEGER NOT NULL DEFAULT 0,
    not_before REAL,          -- wall time a parked item comes back
    first_model TEXT,         -- the model the item counted on first (its first attempt's, or the one passed over)
    model TEXT,               -- the model that served it
    endpoint TEXT,
    content TEXT,
    fell_back INTEGER,
    max_tokens INTEGER,       -- max_tokens sent to the model that served it
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency REAL,
    error_kind TEXT,
    error_message TEXT,
    updated REAL,
    line_hash TEXT            -- items.line_hash of the input line it came from
);
-- capmon batch compare: the preferred model's answer to an item a fallback served
-- (added without a schema version: an older capmon leaves the table alone)
CREATE TABLE IF NOT EXISTS comparisons (
    job_id INTEGER NOT NULL,
    key INTEGER NOT NULL,     -- items.key
    model TEXT NOT NULL,      -- the model asked (the item's preferred one)
    content TEXT,             -- its answer; NULL when it gave none
    error TEXT,               -- why it gave none
    updated REAL NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE INDEX IF NOT EXISTS items_by_state ON items(job_id, state);
CREATE INDEX IF NOT EXISTS items_by_id ON items(job_id, id);
"""


class StoreRefuses(BatchError):
    """The job store refuses what the job needs for a reason that waiting cannot fix (a
    table dropped, a grant revoked, the database file gone): the job halts at once instead
    of pausing for a server to come back (capmon/batch/writer.py)."""


class DatabaseGone(StoreRefuses):
    """The job database's path no longer leads to the file the store opened: deleted, or
    another file put there. Saving again cannot help (the file saved to is gone for good)."""


_SIDECARS = ("", "-wal", "-shm")  # the database file, its WAL and the WAL's index


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def default_db_path(environ: Mapping[str, str] | None = None) -> Path:
    """$CAPMON_DB, else $XDG_DATA_HOME/capmon/jobs.db (~/.local/share/capmon/jobs.db)."""
    env = os.environ if environ is None else environ
    if env.get("CAPMON_DB"):
        return Path(env["CAPMON_DB"]).expanduser()
    base = env.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "capmon" / "jobs.db"


# ---------------------------------------------------------------- rows


@dataclass(frozen=True)
class JobInfo:
    id: int
    name: str
    created: float
    updated: float
    input_path: str | None
    input_size: int | None
    input_fingerprint: str | None
    ingest_offset: int
    ingest_line: int
    total: int
    state: JobState
    message: str
    settings: dict[str, Any] = field(compare=False)
    counters: dict[str, Any] = field(compare=False)
    owner: str | None
    heartbeat: float | None

    _COLUMNS = (
        "id, name, created, updated, input_path, input_size, input_fingerprint, ingest_offset, ingest_line, "
        "total, state, message, settings, counters, owner, heartbeat"
    )

    @staticmethod
    def of(row: Sequence[Any]) -> JobInfo:
        values = list(row)
        values[10] = JobState(values[10])
        values[12] = _loads(values[12])
        values[13] = _loads(values[13])
        return JobInfo(*values)

    @property
    def ingested(self) -> bool:
        return self.state is not JobState.INGESTING


@dataclass(frozen=True, slots=True)
class StoredItem:
    """An item as the runner needs it to send."""

    key: int
    line: int
    id: str
    messages_json: str
    model: str | None
    max_tokens: int | None
    temperature: float | None
    attempts: int
    parks: int
    not_before: float | None
    first_model: str | None

    COLUMNS = (
        "key, line, id, messages, req_model, req_max_tokens, temperature, attempts, parks, not_before, first_model"
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of an item: written in one UPDATE."""

    key: int
    state: ItemState  # done | failed | parked | pending
    attempts: int
    parks: int = 0
    not_before: float | None = None
    first_model: str | None = None
    model: str | None = None
    endpoint: str | None = None
    content: str | None = None
    fell_back: bool | None = None
    max_tokens: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency: float | None = None
    error_kind: str | None = None
    error_message: str | None = None


_OUTCOME_SQL = (
    "UPDATE items SET state=?, attempts=?, parks=?, not_before=?, first_model=?, model=?, endpoint=?, "
    "content=?, fell_back=?, max_tokens=?, prompt_tokens=?, completion_tokens=?, latency=?, error_kind=?, "
    "error_message=?, updated=? WHERE key=?"
)


def _outcome_args(o: Outcome, now: float) -> tuple[Any, ...]:
    return (
        o.state,
        o.attempts,
        o.parks,
        o.not_before,
        o.first_model,
        o.model,
        o.endpoint,
        o.content,
        None if o.fell_back is None else int(o.fell_back),
        o.max_tokens,
        o.prompt_tokens,
        o.completion_tokens,
        o.latency,
        o.error_kind,
        o.error_message,
        now,
        o.key,
    )


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """One item as exported."""

    key: int
    line: int
    id: str
    state: ItemState
    metadata_json: str | None
    attempts: int
    model: str | None
    content: str | None
    fell_back: bool
    error_kind: str | None
    error_message: str | None


@dataclass(frozen=True)
class FallbackItem:
    """A done item a fallback served, as ``capmon batch compare`` sends it again."""

    key: int
    id: str
    messages_json: str
    max_tokens: int | None
    temperature: float | None
    preferred: str | None  # the model it counted on first (else the one it asked for)
    model: str  # the model that served it
    content: str | None


@dataclass(frozen=True)
class Comparison:
    """The preferred model's answer to an item a fallback served (``capmon batch compare``)."""

    model: str
    content: str | None
    error: str | None


# capmon batch compare's statements, SQLite's and PostgreSQL's alike (the placeholder in {p}):
# the done items a fallback served, in input order; a comparison saved (a later one of the same
# item replaces it); a job's comparisons.
FALLBACK_ITEMS_SQL = (
    "SELECT key, id, messages, req_max_tokens, temperature, coalesce(first_model, req_model), model, content"
    f" FROM items WHERE job_id = {{p}} AND state = {_DONE} AND fell_back ORDER BY key"
)
SAVE_COMPARISON_SQL = (
    "INSERT INTO comparisons (job_id, key, model, content, error, updated) VALUES ({p}, {p}, {p}, {p}, {p}, {p})"
    " ON CONFLICT (job_id, key) DO UPDATE SET model = excluded.model, content = excluded.content,"
    " error = excluded.error, updated = excluded.updated"
)
COMPARISONS_SQL = "SELECT key, model, content, error FROM comparisons WHERE job_id = {p}"


def required(job: JobInfo | None, name: str, where: object, jobs: Callable[[], list[JobInfo]]) -> JobInfo:
    """``job``, or the error that names the jobs ``where`` has instead (both stores')."""
    if job is None:
        known = [j.name for j in jobs()]
        hint = f"; jobs: {', '.join(known[:10])}" if known else ""
        raise BatchError(f"no job named {name!r} in {where}{hint}")
    return job


def _loads(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


# ---------------------------------------------------------------- the store


class JobStore:
    """One connection to the job database. Not thread-safe: use it from one thread
    (the event loop's)."""

    def __init__(self, path: Path | str, *, readonly: bool = False, timeout: float | None = None) -> None:
        self.path = Path(path)
        self.readonly = readonly
        wait = BUSY_TIMEOUT if timeout is None else timeout
        with self._errors("open"):
            if readonly:
                if not self.path.exists():
                    raise BatchError(f"{self.path}: no job database here (run `capmon batch run` first, or pass --db)")
                self.conn = sqlite3.connect(
                    self.path.absolute().as_uri() + "?mode=ro", uri=True, timeout=wait, isolation_level=None
                )
                self._check_version()
            else:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise BatchError(
                        f"{self.path}: cannot create the job database's folder: {e.strerror or e}"
                    ) from None
                self.conn = sqlite3.connect(self.path, timeout=wait, isolation_level=None)
                mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise BatchError(f"{self.path}: cannot switch the job database to WAL mode (got {mode})")
                self.conn.execute("PRAGMA synchronous=NORMAL")
                self._check_version()
                self.conn.executescript(SCHEMA)
                self._upgrade()
                audit.ensure_schema(self.conn)
                self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        # The files this connection has open (they exist now: the schema was written), by suffix.
        self._opened = {} if readonly else {sfx: _identity(self._sidecar(sfx)) for sfx in _SIDECARS}
        self._checking = not readonly

    # One runner at a time (the job's lease), its file on this machine's disk.
    shared = False

    @property
    def where(self) -> str:
        return str(self.path)

    def free_bytes(self) -> int | None:
        try:
            v = os.statvfs(self.path.absolute().parent)
        except (OSError, AttributeError):  # no statvfs (Windows), or the folder is gone: the next save says
            return None
        # root may write into the blocks a filesystem reserves for it, and SQLite would.
        blocks = v.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else v.f_bavail
        return int(blocks * v.f_frsize)

    # ------------------------------------------------------------ errors

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as e:
            text = str(e)
            if "locked" in text or "busy" in text:
                raise BatchError(
                    f"{self.path}: the job database is locked by another process "
                    f"(another capmon batch run, or a tool holding it open); try again when it is done"
                ) from None
            if "readonly" in text or "read-only" in text:
                raise BatchError(
                    f"{self.path}: the job database is read-only ({text}); pass --db to use another"
                ) from None
            if "unable to open" in text:
                folder = self.path.absolute().parent
                if not self.readonly and folder.is_dir() and not os.access(folder, os.W_OK):
                    # SQLite makes the database, its WAL and the WAL's index there.
                    raise BatchError(
                        f"{self.path}: the folder {folder} is not writable (read-only, or not yours), "
                        f"so the job database cannot be written there; pass --db to use another"
                    ) from None
                raise BatchError(f"{self.path}: cannot open the job database ({text})") from None
            if "disk is full" in text:
                raise BatchError(
                    f"{self.path}: {doing} failed: database or disk is full "
                    f"(free space on the disk that holds {self.path.parent})"
                ) from None
            raise BatchError(f"{self.path}: {doing} failed: {text}") from None
        except sqlite3.DatabaseError as e:
            raise BatchError(
                f"{self.path}: not a capmon job database, or it is corrupt ({e}); "
                f"move it away or pass --db to use another"
            ) from None

    def _check_version(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise BatchError(f"{self.path}: made by a newer capmon (schema {version}, this one reads {SCHEMA_VERSION})")
        if version == 0:
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and not {"jobs", "items"} <= tables:
                raise BatchError(
                    f"{self.path}: not a capmon job database (it has tables {', '.join(sorted(tables))}); "
                    f"pass --db to use another file"
                )

    def _upgrade(self) -> None:
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(items)")}
        if "line_hash" not in columns:  # schema 1
            self.conn.execute("ALTER TABLE items ADD COLUMN line_hash TEXT")

    def close(self) -> None:
        moved = self.gone() is not None
        self.conn.close()
        if moved:
            # SQLite leaves the WAL and its index of a file that moved at the path; the next
            # database opened there would read them as its own. Only the ones this store had.
            for sfx in _SIDECARS[1:]:
                if self._opened[sfx] is not None and _identity(self._sidecar(sfx)) == self._opened[sfx]:
                    with contextlib.suppress(OSError):
                        os.unlink(self._sidecar(sfx))

    def __enter__(self) -> JobStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def gone(self) -> DatabaseGone | None:
        """Why the path no longer leads to the file opened for writing, or None while it does."""
        if not self._opened:
            return None
        now = _identity(self.path)
        if now == self._opened[""]:
            return None
        what = "deleted" if now is None else "replaced by another file"
        return DatabaseGone(
            f"job database {self.path.absolute()} was {what} while the job ran "
            f"(results saved now would go to a file nobody can open again)"
        )

    def keep_open_file(self) -> None:
        """Write on into the file as opened, wherever its path leads now: only this connection
        sees it, and :meth:`rescue` copies it out."""
        self._checking = False

    def _sidecar(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def rescue(self) -> Path:
        """Copy the database as this connection sees it into a new file beside the path
        (``jobs.db.rescued``, then ``-2``, ...); raises BatchError when it cannot."""
        n = 1
        while (dest := self.path.with_name(f"{self.path.name}.rescued" + (f"-{n}" if n > 1 else ""))).exists():
            n += 1
        try:
            target = sqlite3.connect(dest)
            try:
                self.conn.backup(target)
            finally:
                target.close()
        except (sqlite3.Error, OSError) as e:
            raise BatchError(f"{dest}: cannot write a copy of the job database there ({e})") from None
        return dest

    @contextlib.contextmanager
    def transaction(self, doing: str = "write") -> Iterator[sqlite3.Connection]:
        if self._checking and (gone := self.gone()) is not None:
            raise gone
        with self._errors(doing):
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise

    def _rollback(self) -> None:
        # SQLite rolls some failures back on its own (SQLITE_FULL may): a ROLLBACK then
        # fails with "no transaction is active", and must not hide the real cause.
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    # ------------------------------------------------------------ jobs

    def job(self, name: str) -> JobInfo | None:
        with self._errors("reading the job"):
            row = self.conn.execute(f"SELECT {JobInfo._COLUMNS} FROM jobs WHERE name = ?", (name,)).fetchone()
        return JobInfo.of(row) if row else None

    def require(self, name: str) -> JobInfo:
        return required(self.job(name), name, self.path, self.jobs)

    def jobs(self) -> list[JobInfo]:
        with self._errors("listing jobs"):
            rows = self.conn.execute(f"SELECT {JobInfo._COLUMNS} FROM jobs ORDER BY created, id").fetchall()
        return [JobInfo.of(r) for r in rows]

    def create_job(
        self, name: str, *, input_path: str, input_size: int, fingerprint: str, settings: Mapping[str, Any], now: float
    ) -> JobInfo:
        with self.transaction("creating the job") as c:
            c.execute(
                "INSERT INTO jobs (name, created, updated, input_path, input_size, input_fingerprint, state, "
                "settings) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (name, now, now, input_path, input_size, fingerprint, JobState.INGESTING, _dumps(dict(settings))),
            )
        return self.require(name)

    def delete_job(self, job_id: int) -> None:
        with self.transaction("deleting the job") as c:
            name = c.execute("SELECT name FROM jobs WHERE id = ?", (job_id,)).fetchone()
            c.execute("DELETE FROM items WHERE job_id = ?", (job_id,))
            c.execute("DELETE FROM comparisons WHERE job_id = ?", (job_id,))  # a later job may take its id
            c.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            if name:
                c.execute("DELETE FROM attempts WHERE job = ?", (name[0],))
                c.execute("DELETE FROM replaced_results WHERE job = ?", (name[0],))

    def restart_ingest(self, job_id: int, *, input_path: str, input_size: int, fingerprint: str, now: float) -> None:
        """Forget what an unfinished ingest stored (nothing was sent) and read ``input_path`` from the start."""
        with self.transaction("restarting the ingest") as c:
            c.execute("DELETE FROM items WHERE job_id = ?", (job_id,))
            c.execute(
                "UPDATE jobs SET input_path = ?, input_size = ?, input_fingerprint = ?, ingest_offset = 0, "
                "ingest_line = 0, total = 0, state = ?, updated = ? WHERE id = ?",
                (input_path, input_size, fingerprint, JobState.INGESTING, now, job_id),
            )

    def set_input(self, job_id: int, *, input_path: str, input_size: int, fingerprint: str) -> None:
        """The job's input is this file now (the same items, or after a reconcile)."""
        with self.transaction("updating the job's input") as c:
            c.execute(
                "UPDATE jobs SET input_path = ?, input_size = ?, input_fingerprint = ? WHERE id = ?",
                (input_path, input_size, fingerprint, job_id),
            )

    def stored_lines(self, job_id: int) -> Generator[tuple[int, str | None], None, None]:
        """(line, line_hash) of every item still in the input, in file order, streamed."""
        with self._errors("reading items"):
            cur = self.conn.execute(
                f"SELECT line, line_hash FROM items WHERE job_id = ? AND state != '{ItemState.REMOVED.value}' "
                "ORDER BY line, key",
                (job_id,),
            )
            yield from cur

    def backfill_line_hashes(self, job_id: int, hashes: Iterator[tuple[int, str]]) -> None:
        """Schema-1 jobs kept no line hashes: take them from a file known to be the job's input."""
        with self.transaction("storing line hashes") as c:
            c.executemany(
                f"UPDATE items SET line_hash = ? WHERE job_id = {int(job_id)} AND line = ?",
                ((h, line) for line, h in hashes),
            )

    def unfinished_models(self, job_id: int) -> list[tuple[str, int, int]]:
        """(model, items, first line) of the models named by items not finished yet."""
        with self._errors("reading items"):
            return [
                (str(r[0]), int(r[1]), int(r[2]))
                for r in self.conn.execute(
                    "SELECT req_model, count(*), min(line) FROM items WHERE job_id = ? AND req_model IS NOT NULL "
                    f"AND state IN ({_UNFINISHED}) GROUP BY req_model ORDER BY min(line)",
                    (job_id,),
                )
            ]

    def ingest_chunk(self, job_id: int, rows: Sequence[tuple[Any, ...]], *, offset: int, line: int, now: float) -> None:
        """Store a chunk of items and how far the input has been read, atomically, so an
        ingest cut short goes on from exactly there. ``rows``: (line, id, state, messages,
        model, max_tokens, temperature, metadata, error_kind, error_message[, line_hash])."""
        with self.transaction("storing items") as c:
            c.executemany(
                "INSERT INTO items (job_id, line, id, state, messages, req_model, req_max_tokens, temperature, "
                "metadata, error_kind, error_message, line_hash, updated) "
                f"VALUES ({int(job_id)}, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {float(now)!r})",
                [r if len(r) == 11 else (*r, None) for r in rows],
            )
            c.execute(
                "UPDATE jobs SET ingest_offset = ?, ingest_line = ?, total = total + ?, updated = ? WHERE id = ?",
                (offset, line, len(rows), now, job_id),
            )

    def duplicate_ids(self, job_id: int, limit: int = 5) -> list[tuple[str, list[int]]]:
        with self._errors("checking ids"):
            rows = self.conn.execute(
                "SELECT id, group_concat(line) FROM (SELECT id, line FROM items WHERE job_id = ? AND id IN "
                "(SELECT id FROM items WHERE job_id = ? GROUP BY id HAVING count(*) > 1) ORDER BY key) "
                "GROUP BY id ORDER BY min(line) LIMIT ?",
                (job_id, job_id, limit),
            ).fetchall()
        return [(r[0], [int(x) for x in str(r[1]).split(",")]) for r in rows]

    def duplicate_count(self, job_id: int) -> int:
        with self._errors("checking ids"):
            return int(
                self.conn.execute(
                    "SELECT count(*) FROM (SELECT id FROM items WHERE job_id = ? GROUP BY id HAVING count(*) > 1)",
                    (job_id,),
                ).fetchone()[0]
            )

    def set_job(self, job_id: int, **fields: Any) -> None:
        allowed = {"state", "message", "settings", "counters", "owner", "heartbeat", "updated"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown job fields {bad}")
        values = [(_dumps(v) if k in ("settings", "counters") else v) for k, v in fields.items()]
        with self.transaction("updating the job") as c:
            c.execute(f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in fields)} WHERE id = ?", (*values, job_id))

    def claim(self, job_id: int, owner: str, now: float) -> None:
        """Take the job's lease, or raise BatchError when a live runner holds it."""
        with self.transaction("claiming the job") as c:
            held, beat, name = c.execute("SELECT owner, heartbeat, name FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if held and held != owner and lease.owner_alive(held, beat, now):
                raise BatchError(
                    f"job {name!r} is being run by another process ({lease.describe(held)}); "
                    f"stop it first, or use another --job name"
                )
            c.execute("UPDATE jobs SET owner = ?, heartbeat = ? WHERE id = ?", (owner, now, job_id))
        lease.hold(owner)

    def release(self, job_id: int, owner: str, **fields: Any) -> None:
        lease.forget_owner(owner)
        self.set_job(job_id, owner=None, **fields)

    def lock_ingest(self, name: str) -> bool:
        return True  # the job's lease keeps every other runner out

    def unlock_ingest(self, name: str) -> None:
        pass

    def state_of(self, job: JobInfo) -> JobState:
        return job_state(job, default_clock().wall())

    def progress(self, name: str) -> BatchProgress:
        clock = default_clock()
        return progress_of(self.require(name), clock.now(), clock.wall())

    # ------------------------------------------------------------ items

    def requeue_in_flight(self, job_id: int) -> int:
        """Items a crashed runner left in flight were never answered (or their answer was
        never committed): they go back to pending."""
        with self.transaction("requeueing items") as c:
            return c.execute(
                "UPDATE items SET state = ? WHERE job_id = ? AND state = ?",
                (ItemState.PENDING, job_id, ItemState.IN_FLIGHT),
            ).rowcount

    def counts(self, job_id: int) -> dict[ItemState, int]:
        with self._errors("counting items"):
            rows = self.conn.execute("SELECT state, count(*) FROM items WHERE job_id = ? GROUP BY state", (job_id,))
            out = {s: 0 for s in ItemState}
            out.update({ItemState(r[0]): int(r[1]) for r in rows})
        return out

    def served_by_model(self, job_id: int) -> dict[str, int]:
        with self._errors("counting items"):
            rows = self.conn.execute(
                f"SELECT model, count(*) FROM items WHERE job_id = ? AND state = {_DONE} "
                "GROUP BY model ORDER BY count(*) DESC",
                (job_id,),
            )
            return {str(r[0]): int(r[1]) for r in rows}

    def failure_kinds(self, job_id: int) -> dict[str, int]:
        with self._errors("counting failures"):
            rows = self.conn.execute(
                f"SELECT error_kind, count(*) FROM items WHERE job_id = ? AND state = {_FAILED} "
                "GROUP BY error_kind ORDER BY count(*) DESC",
                (job_id,),
            )
            return {str(r[0]): int(r[1]) for r in rows}

    def failed_items(self, job_id: int, limit: int = 10) -> list[tuple[int, str, str, str]]:
        """(line, id, kind, message) of the first failed items, in input order."""
        with self._errors("reading failures"):
            return [
                tuple(r)
                for r in self.conn.execute(
                    f"SELECT line, id, error_kind, error_message FROM items WHERE job_id = ? AND state = {_FAILED} "
                    "ORDER BY key LIMIT ?",
                    (job_id, limit),
                )
            ]

    def take(self, job_id: int, after_key: int, limit: int) -> list[StoredItem]:
        """The next page of pending items: the runner holds the whole job."""
        return self.pending_page(job_id, after_key, limit)

    def renew(self, job_id: int, keys: Sequence[int]) -> None:
        pass  # the job's lease is renewed by every commit

    def pending_page(self, job_id: int, after_key: int, limit: int) -> list[StoredItem]:
        with self._errors("reading items"):
            rows = self.conn.execute(
                f"SELECT {StoredItem.COLUMNS} FROM items WHERE job_id = ? AND state = {_PENDING} AND key > ? "
                "ORDER BY key LIMIT ?",
                (job_id, after_key, limit),
            ).fetchall()
        return [StoredItem(*r) for r in rows]

    def parked(self, job_id: int) -> list[StoredItem]:
        with self._errors("reading items"):
            rows = self.conn.execute(
                f"SELECT {StoredItem.COLUMNS} FROM items WHERE job_id = ? AND state = ? ORDER BY key",
                (job_id, ItemState.PARKED),
            ).fetchall()
        return [StoredItem(*r) for r in rows]

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
        """One transaction: items now in flight, outcomes, their audit rows, and the job's
        counters (so another process always reads counters that match the items). Nothing
        is discarded: the job is this runner's alone."""
        values = [(_dumps(v) if k in ("settings", "counters") else v) for k, v in job_fields.items()]
        with self.transaction("saving results") as c:
            if started:
                c.executemany(
                    f"UPDATE items SET state = '{ItemState.IN_FLIGHT.value}', updated = {float(now)!r} WHERE key = ?",
                    [(k,) for k in started],
                )
            if outcomes:
                c.executemany(_OUTCOME_SQL, [_outcome_args(o, now) for o in outcomes])
            if audit_rows:
                audit.write_rows(c, audit_rows)
            if job_fields:
                c.execute(
                    f"UPDATE jobs SET {', '.join(f'{k} = ?' for k in job_fields)}, updated = ? WHERE id = ?",
                    (*values, now, job_id),
                )
        return ()

    def results(self, job_id: int) -> Iterator[ResultRecord]:
        """Every item in input order, streamed (an item removed from the input stays where its line was)."""
        with self._errors("reading results"):
            cur = self.conn.execute(
                "SELECT key, line, id, state, metadata, attempts, model, content, fell_back, error_kind, error_message "
                f"FROM items WHERE job_id = ? ORDER BY line, state != '{ItemState.REMOVED.value}', key",
                (job_id,),
            )
            for r in cur:
                yield ResultRecord(r[0], r[1], r[2], ItemState(r[3]), r[4], r[5], r[6], r[7], bool(r[8]), r[9], r[10])

    def item(self, job_id: int, item_id: str) -> dict[str, Any] | None:
        with self._errors("reading the item"):
            cur = self.conn.execute(
                "SELECT * FROM items WHERE job_id = ? AND id = ? ORDER BY key LIMIT 1", (job_id, item_id)
            )
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=False))

    # ------------------------------------------------------------ the audit trail, for reports

    def has_attempts(self, job: str) -> bool:
        with self._errors("reading the audit trail"):
            return self.conn.execute("SELECT 1 FROM attempts WHERE job = ? LIMIT 1", (job,)).fetchone() is not None

    def attempt_groups(
        self, job: str
    ) -> list[tuple[str | None, int | None, str | None, str, str | None, str | None, int]]:
        """(model, status, kind, decision, key_alias, endpoint, count) over a job's audit rows."""
        with self._errors("reading the audit trail"):
            return self.conn.execute(
                "SELECT model, status, kind, decision, key_alias, endpoint, count(*) FROM attempts WHERE job = ? "
                "GROUP BY 1, 2, 3, 4, 5, 6",
                (job,),
            ).fetchall()

    def continued_items(self, job: str) -> int:
        with self._errors("reading the audit trail"):
            row = self.conn.execute(
                "SELECT count(DISTINCT item) FROM attempts WHERE job = ? AND decision = ?", (job, Decision.CONTINUE)
            ).fetchone()
        return int(row[0]) if row else 0

    def spend(self, job: str) -> list[audit.SpendRow]:
        """A job's spend per model (:data:`capmon.audit.SPEND_SQL`)."""
        with self._errors("reading the audit trail"):
            if not audit.has_spend(self.conn):
                return []
            return self.conn.execute(audit.SPEND_SQL.format(p="?"), (job, Decision.OK)).fetchall()

    def ok_latencies(self, job: str) -> list[tuple[str | None, float]]:
        """(model, latency) of every successful attempt."""
        with self._errors("reading the audit trail"):
            return self.conn.execute(
                "SELECT model, latency FROM attempts WHERE job = ? AND decision = ? AND latency IS NOT NULL",
                (job, Decision.OK),
            ).fetchall()

    def attempt_models(self, job: str) -> Iterator[tuple[str | None, str | None]]:
        """(item, model) of the client's attempts, item by item in the order they were made, streamed."""
        with self._errors("reading the audit trail"):
            yield from self.conn.execute(
                f"SELECT item, model FROM attempts WHERE job = ? AND decision NOT IN "
                f"{_NOT_ATTEMPTS} ORDER BY item, rowid",
                (job,),
            )

    def attempt_span(self, job: str) -> tuple[float | None, float | None, int]:
        """(first, last) wall time of the client's attempts, and the seconds in which at least one started."""
        with self._errors("reading the audit trail"):
            first, last, active = self.conn.execute(
                "SELECT min(at), max(at), count(DISTINCT CAST(at AS INTEGER)) FROM attempts WHERE job = ? "
                f"AND decision NOT IN {_NOT_ATTEMPTS}",
                (job,),
            ).fetchone()
        return first, last, int(active or 0)

    def answered_items(self, job: str) -> dict[str, int]:
        """Items answered per model, from the audit alone (attempts of a job that has no job row:
        a program that set Request.job itself)."""
        with self._errors("reading the audit trail"):
            return {
                str(m): int(n)
                for m, n in self.conn.execute(
                    "SELECT model, count(DISTINCT item) FROM attempts WHERE job = ? AND decision = ? GROUP BY model",
                    (job, Decision.OK),
                )
            }

    def attempt_apis(self, job: str) -> dict[str, tuple[str, ...]]:
        """Per model, the provider APIs the job's attempts went to."""
        with self._errors("reading the audit trail"):
            return audit.model_apis(self.conn, job)

    def attempts(self, job: str, item: str | None = None) -> list[audit.AuditRow]:
        with self._errors("reading the audit trail"):
            return audit.read_attempts(self.conn, job, item)

    def replaced_results(self, job: str, item_id: str) -> tuple[dict[str, Any], ...]:
        """Earlier results of an item whose line changed, oldest first."""
        try:
            cur = self.conn.execute(
                "SELECT line, at, why, state, model, content, error_kind, error_message FROM "
                "replaced_results WHERE job = ? AND item = ? ORDER BY rowid",
                (job, item_id),
            )
        except sqlite3.OperationalError:  # a database from before the table existed
            return ()
        return tuple(dict(zip([d[0] for d in cur.description], r, strict=False)) for r in cur)

    def served_items(self, job_id: int, per_model: int) -> list[tuple[str, str]]:
        """(model, id) of the first ``per_model`` items each model served, in input order."""
        with self._errors("reading items"):
            return self.conn.execute(
                "SELECT model, id FROM (SELECT model, id, row_number() OVER (PARTITION BY model ORDER BY key) AS n "
                f"FROM items WHERE job_id = ? AND state = {_DONE}) WHERE n <= ?",
                (job_id, per_model),
            ).fetchall()

    def fell_back_count(self, job_id: int) -> int:
        with self._errors("reading items"):
            return int(
                self.conn.execute(
                    f"SELECT count(*) FROM items WHERE job_id = ? AND state = {_DONE} AND fell_back = 1", (job_id,)
                ).fetchone()[0]
            )

    # ------------------------------------------------------------ capmon batch compare

    def fallback_items(self, job_id: int) -> list[FallbackItem]:
        """Every done item a fallback served, in input order."""
        with self._errors("reading items"):
            rows = self.conn.execute(FALLBACK_ITEMS_SQL.format(p="?"), (job_id,)).fetchall()
        return [FallbackItem(*r) for r in rows]

    def save_comparison(
        self, job_id: int, key: int, *, model: str, content: str | None, error: str | None, now: float
    ) -> None:
        with self._errors("saving a comparison"):
            self.conn.execute(SAVE_COMPARISON_SQL.format(p="?"), (job_id, key, model, content, error, now))

    def comparisons(self, job_id: int) -> dict[int, Comparison]:
        """The comparison answers by item key ({} in a database made before compare existed)."""
        with self._errors("reading comparisons"):
            if self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'comparisons'").fetchone() is None:
                return {}
            rows = self.conn.execute(COMPARISONS_SQL.format(p="?"), (job_id,)).fetchall()
        return {r[0]: Comparison(r[1], r[2], r[3]) for r in rows}

    def token_use(self, job_id: int) -> list[tuple[int, int]]:
        """(max_tokens sent, completion_tokens used) of every done item that has both."""
        with self._errors("reading items"):
            return [
                (int(a), int(b))
                for a, b in self.conn.execute(
                    f"SELECT max_tokens, completion_tokens FROM items WHERE job_id = ? AND state = {_DONE} "
                    "AND max_tokens IS NOT NULL AND completion_tokens IS NOT NULL",
                    (job_id,),
                )
            ]


# ---------------------------------------------------------------- progress from outside


def job_state(job: JobInfo, now_wall: float) -> JobState:
    """The state to show: a job whose runner is gone is ``stopped``, whatever it last wrote."""
    if job.state.live and not lease.owner_alive(job.owner, job.heartbeat, now_wall):
        return JobState.STOPPED
    return job.state


def progress_of(job: JobInfo, now: float, now_wall: float) -> BatchProgress:
    c = job.counters
    state = job_state(job, now_wall)
    live = state.live
    return BatchProgress(
        at=now,
        wall=now_wall,
        job=job.name,
        total=job.total if job.ingested else None,
        done=int(c.get("done", 0)),
        failed=int(c.get("failed", 0)),
        parked=int(c.get("parked", 0)),
        pending=int(c.get("pending", max(0, job.total - int(c.get("done", 0)) - int(c.get("failed", 0))))),
        in_flight=int(c.get("in_flight", 0)) if live else 0,
        per_model=tuple((str(k), int(v)) for k, v in (c.get("per_model") or {}).items()),
        rate=float(c.get("rate", 0.0)) if live else 0.0,
        eta=c.get("eta") if live else None,
        state=state,
        opens_at=c.get("opens_at") if state is JobState.WAITING_WINDOW else None,
        message=job.message,
    )
