"""Fixtures for the PostgreSQL job store's tests, against a real server, never a mock.

* ``pg_url``: the project's PostgreSQL (``CAPMON_TEST_PG_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``). Unreachable: the test is skipped and says
  why; ``CAPMON_REQUIRE_PG=1`` (set by .ci/run) turns that skip into a failure.
* ``pg_db``: a job store in a schema of the test's own (``?schema=t_...``), dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra is not installed")

from capmon.batch.store import PgLocation, pg_location  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _unavailable(why: str) -> None:
    if os.environ.get("CAPMON_REQUIRE_PG") == "1":
        pytest.fail(f"{why} (CAPMON_REQUIRE_PG=1)")
    pytest.skip(why)


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = os.environ.get("CAPMON_TEST_PG_URL", DEFAULT_URL)
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error as e:
        _unavailable(f"no PostgreSQL at {url} for the job store tests ({e}); set CAPMON_TEST_PG_URL")
    return url


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def pg_db(pg_url: str) -> Iterator[PgLocation]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield pg_location(f"{pg_url}?schema={schema}", from_env=True)
    drop_schema(pg_url, schema)
