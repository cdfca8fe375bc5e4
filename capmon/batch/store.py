"""The job store's interface, and which store a ``--db`` names.

Two stores keep the same jobs, items, states, audit rows and guarantees behind
:class:`Store`: :class:`~capmon.batch.sqlite.JobStore` (SQLite, one file, one runner
at a time: the embedded default) and :class:`~capmon.batch.pg.PgStore` (PostgreSQL:
many workers on many machines share one job, claiming items under leases). Where they
differ the interface says it in one method, so the runner, the commands and the report
never ask which one they hold:

* ``claim`` / ``release``: SQLite takes the job's one lease; PostgreSQL registers a
  worker beside the others.
* ``take``: SQLite reads the next page of pending items; PostgreSQL claims a few with
  ``FOR UPDATE SKIP LOCKED`` under a lease, and says "nothing now, ask again" (None)
  while other workers hold the rest.
* ``commit`` returns the outcomes it discarded: a late answer for an item whose lease
  had expired and which another worker took (never in SQLite).

``--db`` (or ``$CAPMON_DB``) is a file path, or a ``postgresql://`` URL. A URL's password
never comes from the command line: from the environment (``$CAPMON_DB``, the variable
``--db-url-env`` names, or libpq's own ``PGPASSWORD`` / ``~/.pgpass``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from capmon import audit
from capmon.batch.defaults import DEFAULT_LEASE_TTL
from capmon.batch.options import OptionError
from capmon.batch.sqlite import (
    Comparison,
    DatabaseGone,
    FallbackItem,
    JobInfo,
    Outcome,
    ResultRecord,
    StoredItem,
    default_db_path,
)
from capmon.batch.states import ItemState, JobState
from capmon.core.base import secrets
from capmon.core.base.extras import Extra, require
from capmon.core.types.events import BatchProgress

PG_SCHEMES = ("postgresql", "postgres")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class PgLocation:
    """A PostgreSQL job store: ``url`` as libpq takes it (it may hold a password: never shown),
    ``schema`` the one capmon's tables live in (``?schema=NAME``; default ``capmon``)."""

    url: str = field(repr=False)
    shown: str
    schema: str = "capmon"
    # How a command line names it again: ``--db URL`` (no password), ``--db-url-env NAME``, or
    # nothing for ``$CAPMON_DB``, which the next command reads as this one did.
    flag: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.shown


Db = Path | PgLocation


def show_pg_url(url: str) -> str:
    """A URL without its password: ``postgresql://user@host:5432/db``."""
    try:
        p = urlsplit(url)
        host = p.hostname or ""
        port = f":{p.port}" if p.port else ""
    except ValueError:
        return "postgresql://***"
    user = f"{p.username}@" if p.username else ""
    query = "".join(f"?{k}={v}" for k, v in parse_qsl(p.query) if k == "schema")[:80]
    return f"{p.scheme}://{user}{host}{port}{p.path}{query}"


def is_pg_url(text: str) -> bool:
    return text.split("://", 1)[0].lower() in PG_SCHEMES and "://" in text


def pg_location(url: str, *, from_env: bool, what: str = "db") -> PgLocation:
    """Parse a PostgreSQL URL; a password is allowed only when the URL came from the environment."""
    try:
        p = urlsplit(url)
        p.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise OptionError(what, "expected a URL such as postgresql://user@host:5432/dbname") from None
    if p.password:
        secrets.register(p.password)
        secrets.register(url)
        if not from_env:
            raise OptionError(
                what,
                "the URL holds a password, and a command line is seen by every user of the machine: "
                "put the URL in an environment variable ($CAPMON_DB, or one named by --db-url-env), "
                "or the password in $PGPASSWORD or ~/.pgpass",
            )
    query = parse_qsl(p.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), "capmon")
    if not _SCHEMA.fullmatch(schema):
        raise OptionError(what, f"schema: expected lower-case letters, digits and _, got {schema!r}")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    libpq = urlunsplit((p.scheme, p.netloc, p.path, rest, ""))
    return PgLocation(libpq, show_pg_url(url), schema)


def locate(db: str | Path | None = None, *, url_env: str | None = None, environ: Mapping[str, str] | None = None) -> Db:
    """The store a command names: ``--db`` (a path or a URL without a password), else the URL
    in the variable ``url_env`` names, else ``$CAPMON_DB``, else the user data dir's jobs.db."""
    env = os.environ if environ is None else environ
    if db is not None and url_env:
        raise OptionError("db_url_env", "give --db or --db-url-env, not both")
    if url_env:
        value = env.get(url_env, "")
        if not value:
            raise OptionError("db_url_env", f"environment variable {url_env} is not set", value=url_env)
        if not is_pg_url(value):
            raise OptionError("db_url_env", f"${url_env} is not a postgresql:// URL", value=url_env)
        return dataclasses.replace(pg_location(value, from_env=True, what="db_url_env"), flag=f"--db-url-env {url_env}")
    if db is not None:
        text = str(db)
        if is_pg_url(text):
            loc = pg_location(text, from_env=False)
            return dataclasses.replace(loc, flag=f"--db {loc.shown}")
        return Path(text).expanduser()
    value = env.get("CAPMON_DB", "")
    if value and is_pg_url(value):
        return pg_location(value, from_env=True, what="CAPMON_DB")
    return default_db_path(env)


def open_store(db: Db, *, readonly: bool = False, lease_ttl: float | None = None) -> Store:
    """The store at ``db``; raises BatchError (one line, no password) when it cannot be opened,
    MissingExtra for PostgreSQL without the postgres extra.
    ``lease_ttl``: a shared store's item leases, for the runner that claims them."""
    if isinstance(db, PgLocation):
        require(Extra.POSTGRES, db.flag or f"the job store {db}")  # psycopg: imported only for PostgreSQL
        from capmon.batch.pg import PgStore

        return PgStore(db, readonly=readonly, lease_ttl=lease_ttl or DEFAULT_LEASE_TTL)
    from capmon.batch.sqlite import JobStore

    return JobStore(db, readonly=readonly)


class Store(Protocol):
    """What the batch layer needs of a job store (the SQLite one is the reference)."""

    readonly: bool

    @property
    def where(self) -> str:
        """The store as messages name it (a path, or a URL without its password)."""
        ...

    @property
    def shared(self) -> bool:
        """Many workers may run one job at once (items are claimed under leases)."""
        ...

    def close(self) -> None: ...

    # ------------------------------------------------------------ the file under the job (SQLite)

    def gone(self) -> DatabaseGone | None: ...

    def keep_open_file(self) -> None: ...

    def rescue(self) -> Path: ...

    def free_bytes(self) -> int | None:
        """Free space where the store writes, when that is this machine's disk."""
        ...

    # ------------------------------------------------------------ jobs

    def job(self, name: str) -> JobInfo | None: ...

    def require(self, name: str) -> JobInfo: ...

    def jobs(self) -> list[JobInfo]: ...

    def state_of(self, job: JobInfo) -> JobState:
        """The state to show: a job nobody runs any more is ``stopped``, whatever it last wrote."""
        ...

    def progress(self, name: str) -> BatchProgress:
        """A job's progress as another process sees it (the dashboard's ``--attach``)."""
        ...

    def create_job(
        self, name: str, *, input_path: str, input_size: int, fingerprint: str, settings: Mapping[str, Any], now: float
    ) -> JobInfo: ...

    def delete_job(self, job_id: int) -> None: ...

    def lock_ingest(self, name: str) -> bool:
        """Take the right to create and read job ``name``'s input, when nobody else holds it."""
        ...

    def unlock_ingest(self, name: str) -> None: ...

    def restart_ingest(
        self, job_id: int, *, input_path: str, input_size: int, fingerprint: str, now: float
    ) -> None: ...

    def set_input(self, job_id: int, *, input_path: str, input_size: int, fingerprint: str) -> None: ...

    def stored_lines(self, job_id: int) -> Generator[tuple[int, str | None], None, None]: ...

    def backfill_line_hashes(self, job_id: int, hashes: Iterator[tuple[int, str]]) -> None: ...

    def unfinished_models(self, job_id: int) -> list[tuple[str, int, int]]: ...

    def ingest_chunk(
        self, job_id: int, rows: Sequence[tuple[Any, ...]], *, offset: int, line: int, now: float
    ) -> None: ...

    def duplicate_ids(self, job_id: int, limit: int = 5) -> list[tuple[str, list[int]]]: ...

    def duplicate_count(self, job_id: int) -> int: ...

    def set_job(self, job_id: int, **fields: Any) -> None: ...

    def claim(self, job_id: int, owner: str, now: float) -> None:
        """Run the job as ``owner``: SQLite's one lease (BatchError while a live runner holds
        it); PostgreSQL's worker, one of many."""
        ...

    def release(self, job_id: int, owner: str, **fields: Any) -> None: ...

    # ------------------------------------------------------------ items

    def requeue_in_flight(self, job_id: int) -> int:
        """Items left in flight by a runner that is gone go back to pending."""
        ...

    def take(self, job_id: int, after_key: int, limit: int) -> list[StoredItem] | None:
        """Up to ``limit`` items to send, in input order; [] when none is left to send, None
        when none can be taken now but others still hold some (ask again later)."""
        ...

    def renew(self, job_id: int, keys: Sequence[int]) -> None:
        """Keep the leases on these items (a shared store's; SQLite's are the job's)."""
        ...

    def counts(self, job_id: int) -> dict[ItemState, int]: ...

    def served_by_model(self, job_id: int) -> dict[str, int]: ...

    def failure_kinds(self, job_id: int) -> dict[str, int]: ...

    def failed_items(self, job_id: int, limit: int = 10) -> list[tuple[int, str, str, str]]: ...

    def parked(self, job_id: int) -> list[StoredItem]:
        """Parked items this runner takes over when it opens the job."""
        ...

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
        """One transaction: items now in flight, outcomes, their audit rows and the runner's
        counters. Returns the keys of outcomes discarded (their item is another worker's now)."""
        ...

    def results(self, job_id: int) -> Iterator[ResultRecord]: ...

    def item(self, job_id: int, item_id: str) -> dict[str, Any] | None: ...

    # ------------------------------------------------------------ the audit trail, for reports

    def has_attempts(self, job: str) -> bool: ...

    def attempt_groups(
        self, job: str
    ) -> list[tuple[str | None, int | None, str | None, str, str | None, str | None, int]]: ...

    def ok_latencies(self, job: str) -> list[tuple[str | None, float]]: ...

    def spend(self, job: str) -> list[audit.SpendRow]: ...

    def attempt_models(self, job: str) -> Iterator[tuple[str | None, str | None]]: ...

    def attempt_span(self, job: str) -> tuple[float | None, float | None, int]: ...

    def answered_items(self, job: str) -> dict[str, int]: ...

    def attempt_apis(self, job: str) -> dict[str, tuple[str, ...]]: ...

    def attempts(self, job: str, item: str | None = None) -> list[audit.AuditRow]: ...

    def replaced_results(self, job: str, item_id: str) -> tuple[dict[str, Any], ...]: ...

    def served_items(self, job_id: int, per_model: int) -> list[tuple[str, str]]: ...

    def fell_back_count(self, job_id: int) -> int: ...

    def continued_items(self, job: str) -> int:
        """Items whose streamed answer broke and was continued (an audit row with decision continue)."""
        ...

    def token_use(self, job_id: int) -> list[tuple[int, int]]: ...

    # ------------------------------------------------------------ capmon batch compare

    def fallback_items(self, job_id: int) -> list[FallbackItem]: ...

    def save_comparison(
        self, job_id: int, key: int, *, model: str, content: str | None, error: str | None, now: float
    ) -> None: ...

    def comparisons(self, job_id: int) -> dict[int, Comparison]: ...


def read_progress(db: Db, job: str) -> BatchProgress:
    """A job's progress, read-only, from any process (the dashboard's ``--attach``)."""
    store = open_store(db, readonly=True)
    try:
        return store.progress(job)
    finally:
        store.close()
