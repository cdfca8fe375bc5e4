"""The PostgreSQL job store's schema and its two hot statements: the claim and the commit
(:mod:`capmon.batch.pg` says what they guarantee)."""

from __future__ import annotations

from capmon import audit
from capmon.batch.sqlite import StoredItem
from capmon.batch.states import JobState
from capmon.core.types.result import Decision

SCHEMA_VERSION = 1
NOW = "extract(epoch FROM clock_timestamp())"  # the server's clock: leases never compare two machines'
OPEN = "('pending', 'in_flight', 'parked')"
HELD = "('in_flight', 'parked')"
LIVE = tuple(s.value for s in (JobState.RUNNING, JobState.PAUSED, JobState.WAITING_WINDOW))
NOT_ATTEMPTS = tuple(d.value for d in (*audit.RunnerDecision, Decision.SKIP))
INGEST_LOCK = 0x63617063  # advisory lock class of capmon's ingests ("capc")

DDL = """
CREATE TABLE IF NOT EXISTS meta (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    created DOUBLE PRECISION NOT NULL,
    updated DOUBLE PRECISION NOT NULL,
    input_path TEXT,
    input_size BIGINT,
    input_fingerprint TEXT,
    ingest_offset BIGINT NOT NULL DEFAULT 0,
    ingest_line BIGINT NOT NULL DEFAULT 0,
    total BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',
    counters TEXT NOT NULL DEFAULT '{}',
    owner TEXT,
    heartbeat DOUBLE PRECISION
);
CREATE TABLE IF NOT EXISTS items (
    key BIGSERIAL PRIMARY KEY,  -- increases in input order within a job (one ingest at a time)
    job_id BIGINT NOT NULL,
    line BIGINT NOT NULL,
    id TEXT NOT NULL,
    state TEXT NOT NULL,
    messages TEXT,
    req_model TEXT,
    req_max_tokens INTEGER,
    temperature DOUBLE PRECISION,
    metadata TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    parks INTEGER NOT NULL DEFAULT 0,
    not_before DOUBLE PRECISION,
    first_model TEXT,
    model TEXT,
    endpoint TEXT,
    content TEXT,
    fell_back BOOLEAN,
    max_tokens INTEGER,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    latency DOUBLE PRECISION,
    error_kind TEXT,
    error_message TEXT,
    updated DOUBLE PRECISION,
    line_hash TEXT,
    lease_owner TEXT,                 -- the worker holding it (in flight, parked), or that finished it
    lease_expires DOUBLE PRECISION    -- the server's epoch seconds the lease lasts until
);
CREATE INDEX IF NOT EXISTS items_by_state ON items(job_id, state);
CREATE INDEX IF NOT EXISTS items_by_id ON items(job_id, id);
CREATE INDEX IF NOT EXISTS items_open ON items(job_id, key) WHERE state IN ('pending', 'in_flight', 'parked');
CREATE TABLE IF NOT EXISTS workers (
    job_id BIGINT NOT NULL,
    owner TEXT NOT NULL,              -- host:pid:token, as lease_owner
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started DOUBLE PRECISION NOT NULL,
    beat DOUBLE PRECISION NOT NULL,   -- the server's clock at its last commit or renewal
    ttl DOUBLE PRECISION NOT NULL,    -- its lease_ttl: gone once beat is older than this
    state TEXT NOT NULL,
    message TEXT NOT NULL DEFAULT '',
    counters TEXT NOT NULL DEFAULT '{}',
    last_commit TEXT,                 -- the token of its last commit (a lost answer is found again)
    PRIMARY KEY (job_id, owner)
);
CREATE TABLE IF NOT EXISTS attempts (
    seq BIGSERIAL PRIMARY KEY,
    job TEXT, item TEXT, at DOUBLE PRECISION NOT NULL, attempt INTEGER NOT NULL, model TEXT, endpoint TEXT,
    key_alias TEXT, status INTEGER, kind TEXT, hint DOUBLE PRECISION, wait DOUBLE PRECISION,
    latency DOUBLE PRECISION, decision TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', api TEXT, request_id TEXT,
    deployment TEXT, tokens_in INTEGER, tokens_cached INTEGER, tokens_out INTEGER, cost_usd DOUBLE PRECISION
);
-- a store from before the columns: add them, its rows keep NULL
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS deployment TEXT;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS tokens_in INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS tokens_cached INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS tokens_out INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS cost_usd DOUBLE PRECISION;
CREATE INDEX IF NOT EXISTS attempts_by_item ON attempts(job, item);
-- capmon batch compare: the preferred model's answer to an item a fallback served (added
-- without a schema version, as SQLite's: a store from before gets it at its next writable open)
CREATE TABLE IF NOT EXISTS comparisons (
    job_id BIGINT NOT NULL,
    key BIGINT NOT NULL,      -- items.key
    model TEXT NOT NULL,      -- the model asked (the item's preferred one)
    content TEXT,             -- its answer; NULL when it gave none
    error TEXT,               -- why it gave none
    updated DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (job_id, key)
);
CREATE TABLE IF NOT EXISTS replaced_results (
    seq BIGSERIAL PRIMARY KEY,
    job TEXT NOT NULL, item TEXT NOT NULL, line INTEGER, at DOUBLE PRECISION NOT NULL, why TEXT NOT NULL,
    state TEXT, model TEXT, endpoint TEXT, content TEXT, fell_back BOOLEAN, attempts INTEGER,
    error_kind TEXT, error_message TEXT
);
"""

# One commit is one statement (one round trip, atomic as any statement): the outcomes of items
# still under this worker's lease, the audit rows, and the worker's row with its counters and
# the commit's token. The keys it returns are the outcomes applied.
COMMIT_SQL = f"""
WITH o AS (
    UPDATE items AS i SET state = v.state, attempts = v.attempts, parks = v.parks, not_before = v.not_before,
        first_model = v.first_model, model = v.model, endpoint = v.endpoint, content = v.content,
        fell_back = v.fell_back, max_tokens = v.max_tokens, prompt_tokens = v.prompt_tokens,
        completion_tokens = v.completion_tokens, latency = v.latency, error_kind = v.error_kind,
        error_message = v.error_message, updated = %(now)s,
        lease_owner = CASE WHEN v.state = 'pending' THEN NULL ELSE i.lease_owner END,
        lease_expires = CASE WHEN v.state = 'parked' THEN i.lease_expires ELSE NULL END
    FROM unnest(%(key)s::bigint[], %(state)s::text[], %(attempts)s::int[], %(parks)s::int[],
        %(not_before)s::float8[], %(first_model)s::text[], %(model)s::text[], %(endpoint)s::text[],
        %(content)s::text[], %(fell_back)s::bool[], %(max_tokens)s::int[], %(prompt_tokens)s::int[],
        %(completion_tokens)s::int[], %(latency)s::float8[], %(error_kind)s::text[], %(error_message)s::text[])
        AS v(key, state, attempts, parks, not_before, first_model, model, endpoint, content, fell_back, max_tokens,
             prompt_tokens, completion_tokens, latency, error_kind, error_message)
    WHERE i.key = v.key AND i.job_id = %(job)s AND i.lease_owner = %(me)s AND i.state IN {HELD}
    RETURNING i.key
), a AS (
    INSERT INTO attempts ({", ".join(audit.COLUMNS)})
    SELECT * FROM unnest(%(a_job)s::text[], %(a_item)s::text[], %(a_at)s::float8[], %(a_attempt)s::int[],
        %(a_model)s::text[], %(a_endpoint)s::text[], %(a_key_alias)s::text[], %(a_status)s::int[],
        %(a_kind)s::text[], %(a_hint)s::float8[], %(a_wait)s::float8[], %(a_latency)s::float8[],
        %(a_decision)s::text[], %(a_reason)s::text[], %(a_api)s::text[], %(a_request_id)s::text[],
        %(a_deployment)s::text[], %(a_tokens_in)s::int[], %(a_tokens_cached)s::int[], %(a_tokens_out)s::int[],
        %(a_cost_usd)s::float8[])
), w AS (
    UPDATE workers SET counters = %(counters)s, state = %(wstate)s, message = %(message)s, beat = {NOW},
        last_commit = %(token)s
    WHERE job_id = %(job)s AND owner = %(me)s
)
SELECT key FROM o
"""

OUTCOME_FIELDS = (
    "state",
    "attempts",
    "parks",
    "not_before",
    "first_model",
    "model",
    "endpoint",
    "content",
    "fell_back",
    "max_tokens",
    "prompt_tokens",
    "completion_tokens",
    "latency",
    "error_kind",
    "error_message",
)

CLAIM_SQL = f"""
WITH c AS (
    SELECT key FROM items
    WHERE job_id = %(job)s AND state IN {OPEN}
      AND (state = 'pending' OR lease_expires IS NULL OR lease_expires < {NOW})
    ORDER BY key LIMIT %(n)s FOR UPDATE SKIP LOCKED
)
UPDATE items AS i SET state = 'in_flight', lease_owner = %(me)s, lease_expires = {NOW} + %(ttl)s
FROM c WHERE i.key = c.key
RETURNING i.{", i.".join(c.strip() for c in StoredItem.COLUMNS.split(","))}
"""
