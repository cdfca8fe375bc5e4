"""Every attempt, persisted: which model and key answered (or refused) what, and why
the client did what it did next.

The client calls an observer after every attempt (``client.add_observer``). The
observer only appends a tuple to a buffer, so the client never waits on SQLite; the
batch writer (:mod:`capmon.batch.writer`) drains the buffer into the same transaction
as the results it belongs with (:func:`write_rows`), so an attempt is stored exactly
when its outcome is.

Keys are never stored, only their alias; anything in a provider's message that looks
like a key is masked before it is kept.

Besides the client's attempts, a batch runner records its own decisions about an item
(:data:`RUNNER_DECISIONS`): parked for later, an answer refused as too large, a line
that changed or left the input. The result an edited line replaced is kept in
``replaced_results``.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from capmon.core.base.clock import Clock
from capmon.core.base.secrets import redact
from capmon.core.types.failure import Kind
from capmon.core.types.result import Attempt, Decision, Request

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempts (
    job TEXT,              -- Request.job, NULL for requests outside a job
    item TEXT,             -- Request.item_id
    at REAL NOT NULL,      -- wall time the attempt started
    attempt INTEGER NOT NULL,  -- 1, 2, ... counted over the item's whole life (parks included)
    model TEXT,
    endpoint TEXT,
    key_alias TEXT,        -- never the key
    status INTEGER,        -- HTTP status, NULL when no response came (timeout, reset)
    kind TEXT,             -- failure kind, NULL when the attempt succeeded
    hint REAL,             -- the server's retry hint, seconds
    wait REAL,             -- how long the client (or the runner, for a park) waited after it
    latency REAL,
    decision TEXT NOT NULL,  -- ok | retry | fallback | fail | skip (not sent: the model cannot carry
                             -- the request, the reason says why) | continue (a stream broke after
                             -- output; the next attempt's reason says from which character it went
                             -- on), or one of RUNNER_DECISIONS
    reason TEXT NOT NULL DEFAULT '',
    api TEXT,              -- the endpoint's provider API: openai | anthropic | azure (NULL: a runner's
                           -- decision, or a row written before capmon recorded it)
    request_id TEXT,       -- the caller's id for the request (Request.request_id: a gateway's
                           -- x-request-id); NULL when it gave none, for a runner's decision, or an older row
    deployment TEXT,       -- the id the endpoint knows the model by (its deployment's: the model's name,
                           -- or its api_model, unless the deployment names another); NULL as api
    tokens_in INTEGER,     -- decision ok: the answer's input tokens (cached ones included); NULL: not told
    tokens_cached INTEGER, -- the part of tokens_in read from the provider's cache
    tokens_out INTEGER,    -- its output tokens (reasoning included)
    cost_usd REAL          -- what they cost at the target's prices; NULL: no price known, or no usage told
);
CREATE INDEX IF NOT EXISTS attempts_by_item ON attempts(job, item);
CREATE TABLE IF NOT EXISTS replaced_results (
    job TEXT NOT NULL,
    item TEXT NOT NULL,
    line INTEGER,          -- the line the result answered
    at REAL NOT NULL,      -- wall time it was replaced
    why TEXT NOT NULL,     -- what replaced it
    state TEXT,            -- done | failed | pending | parked
    model TEXT,
    endpoint TEXT,
    content TEXT,
    fell_back INTEGER,
    attempts INTEGER,
    error_kind TEXT,
    error_message TEXT
);
CREATE INDEX IF NOT EXISTS replaced_by_item ON replaced_results(job, item);
"""


class RunnerDecision(enum.StrEnum):
    """The runner's own decisions about an item, beside the client's :class:`Decision`
    in the same column: not attempts of the client."""

    PARK = Decision.PARK.value  # no model could take it now: it comes back after ``wait``
    REFUSE = "refuse"  # an answer refused as too large to store
    SUPERSEDED = "superseded"  # its line changed: the item is sent again
    REMOVED = "removed"  # its line left the input


RUNNER_DECISIONS = frozenset(RunnerDecision)  # for membership of a decision read back as text
MAX_REASON = 2000  # characters of a reason kept: a provider's message is never a result

COLUMNS = (
    "job",
    "item",
    "at",
    "attempt",
    "model",
    "endpoint",
    "key_alias",
    "status",
    "kind",
    "hint",
    "wait",
    "latency",
    "decision",
    "reason",
    "api",
    "request_id",
    "deployment",
    "tokens_in",
    "tokens_cached",
    "tokens_out",
    "cost_usd",
)
# The columns added since the first schema, each with its SQLite type.
ADDED = (
    ("api", "TEXT"),
    ("request_id", "TEXT"),
    ("deployment", "TEXT"),
    ("tokens_in", "INTEGER"),
    ("tokens_cached", "INTEGER"),
    ("tokens_out", "INTEGER"),
    ("cost_usd", "REAL"),
)
INSERT = f"INSERT INTO attempts ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"

# A buffer that is never written (a database gone read-only) must not grow without
# bound: past this many rows the oldest are dropped and counted.
MAX_BUFFER = 200_000

Row = tuple[Any, ...]
# A runner's decision has none of the columns after its reason (api ... cost_usd).
_NO_ATTEMPT: Row = (None,) * (len(COLUMNS) - COLUMNS.index("reason") - 1)


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)
    have = _columns(conn)
    for column, kind in ADDED:  # a database from before the column: add it, rows keep NULL
        if column not in have:
            conn.execute(f"ALTER TABLE attempts ADD COLUMN {column} {kind}")


def _columns(conn: sqlite3.Connection) -> set[str]:
    return {r[1] for r in conn.execute("PRAGMA table_info(attempts)")}


def has_spend(conn: sqlite3.Connection) -> bool:
    """Whether the attempts table holds answers' tokens and cost (a database opened read-only
    from before them does not)."""
    return "cost_usd" in _columns(conn)


# A job's spend, per model, over its answers that told their usage (decision ok): (model,
# answers, priced, cost, tokens_in, tokens_cached, tokens_out), the tokens those of the priced
# answers (what the report prices again at the preferred model's prices). SQLite's and
# PostgreSQL's placeholder in {p}.
SPEND_SQL = (
    "SELECT model, count(*), count(cost_usd), coalesce(sum(cost_usd), 0),"
    " coalesce(sum(CASE WHEN cost_usd IS NULL THEN 0 ELSE tokens_in END), 0),"
    " coalesce(sum(CASE WHEN cost_usd IS NULL THEN 0 ELSE tokens_cached END), 0),"
    " coalesce(sum(CASE WHEN cost_usd IS NULL THEN 0 ELSE tokens_out END), 0)"
    " FROM attempts WHERE job = {p} AND decision = {p} AND tokens_in IS NOT NULL GROUP BY model ORDER BY model"
)

SpendRow = tuple[str | None, int, int, float, int, int, int]


def _reason(text: str) -> str:
    text = redact(text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One attempt as stored (what ``capmon report`` reads back)."""

    job: str | None
    item: str | None
    at: float
    attempt: int
    model: str | None
    endpoint: str | None
    key_alias: str | None
    status: int | None
    kind: str | None
    hint: float | None
    wait: float | None
    latency: float | None
    decision: str
    reason: str
    api: str | None = None  # openai | anthropic | azure; None for a runner's decision or an older row
    request_id: str | None = None  # the caller's id for the request (Request.request_id)
    deployment: str | None = None  # the id the endpoint knows the model by; None as api
    tokens_in: int | None = None  # an answer's (decision ok): its input tokens, the cached ones included
    tokens_cached: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None  # None: no price known, no usage told, or not an answer

    @staticmethod
    def of(row: Sequence[Any]) -> AuditRow:
        return AuditRow(*row)


def _continued(attempt: Attempt) -> str:
    """The reason of an attempt that continued a broken answer: its `continued` record."""
    return "" if attempt.continues is None else f"continued the answer from character {attempt.continues}"


def attempt_row(request: Request, attempt: Attempt, number: int | None = None) -> Row:
    return (
        request.job,
        request.item_id,
        attempt.started,
        attempt.number if number is None else number,
        attempt.model,
        attempt.endpoint,
        attempt.key_alias,
        attempt.status,
        attempt.kind.value if attempt.kind is not None else None,
        attempt.hint,
        attempt.wait,
        attempt.latency,
        attempt.decision,
        _reason(attempt.reason or _continued(attempt)),
        attempt.api.value,
        request.request_id,
        attempt.deployment or None,
        *_spent(attempt),
    )


def _spent(attempt: Attempt) -> tuple[int | None, int | None, int | None, float | None]:
    t = attempt.tokens
    if t is None:
        return None, None, None, attempt.cost
    return t.input, t.cached, t.output, attempt.cost


class AuditLog:
    """A buffer of attempt rows: the client's, through :meth:`observe`, and the runner's
    own decisions. Its owner writes :meth:`drain`'s rows with :func:`write_rows` (and
    :meth:`requeue` s them when that write fails)."""

    def __init__(
        self,
        *,
        clock: Clock,
        numbering: Callable[[Request, Attempt], int | None] | None = None,
        accept: Callable[[Request], bool] | None = None,
    ) -> None:
        self.clock = clock
        self._numbering = numbering
        self._accept = accept
        self._rows: list[Row] = []
        self.dropped = 0

    def observe(self, request: Request, attempt: Attempt) -> None:
        """The client observer: cheap, never raises into the client's path on bad data."""
        if self._accept is not None and not self._accept(request):
            return
        number = self._numbering(request, attempt) if self._numbering is not None else None
        self.add(attempt_row(request, attempt, number))

    def add(self, row: Row) -> None:
        self._rows.append(row)
        if len(self._rows) > MAX_BUFFER:
            drop = len(self._rows) - MAX_BUFFER
            del self._rows[:drop]
            self.dropped += drop

    def decision(
        self,
        decision: RunnerDecision,
        *,
        job: str,
        item: str,
        attempt: int,
        reason: str,
        model: str | None = None,
        endpoint: str | None = None,
        key_alias: str | None = None,
        status: int | None = None,
        kind: Kind | None = None,
        hint: float | None = None,
        wait: float | None = None,
    ) -> None:
        """A row for one of the runner's own decisions (a park comes back after ``wait``)."""
        self.add(
            (
                job,
                item,
                self.clock.wall(),
                attempt,
                model,
                endpoint,
                key_alias,
                status,
                kind,
                hint,
                wait,
                None,
                RunnerDecision(decision),
                _reason(reason),
                *_NO_ATTEMPT,
            )
        )

    @property
    def pending(self) -> int:
        return len(self._rows)

    def drain(self) -> list[Row]:
        rows, self._rows = self._rows, []
        return rows

    def requeue(self, rows: list[Row]) -> None:
        """Put back rows a failed write did not store (they go first, in order)."""
        self._rows[:0] = rows


def write_rows(conn: sqlite3.Connection, rows: Iterable[Row]) -> None:
    conn.executemany(INSERT, rows)


def decision_row(decision: RunnerDecision, *, job: str, item: str, at: float, attempt: int, reason: str) -> Row:
    """A runner decision written outside a buffer (in the transaction that makes it true)."""
    return (
        job,
        item,
        at,
        attempt,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        RunnerDecision(decision),
        _reason(reason),
        *_NO_ATTEMPT,
    )


def read_attempts(conn: sqlite3.Connection, job: str, item: str | None = None) -> list[AuditRow]:
    """Attempts of a job (or of one of its items) in the order they were written."""
    # A database opened read-only is never migrated: one from before a column reads it NULL.
    have = _columns(conn)
    sql = f"SELECT {', '.join(c if c in have else f'NULL AS {c}' for c in COLUMNS)} FROM attempts WHERE job = ?"
    args: tuple[Any, ...] = (job,)
    if item is not None:
        sql += " AND item = ?"
        args += (item,)
    return [AuditRow.of(r) for r in conn.execute(sql + " ORDER BY rowid", args)]


def model_apis(conn: sqlite3.Connection, job: str) -> dict[str, tuple[str, ...]]:
    """Per model, the provider APIs a job's attempts went to (rows without one left out)."""
    if "api" not in _columns(conn):
        return {}
    out: dict[str, list[str]] = {}
    rows = conn.execute(
        "SELECT model, api FROM attempts WHERE job = ? AND model IS NOT NULL AND api IS NOT NULL "
        "GROUP BY model, api ORDER BY model, api",
        (job,),
    )
    for model, api in rows:
        out.setdefault(model, []).append(api)
    return {m: tuple(a) for m, a in out.items()}
