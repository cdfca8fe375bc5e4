"""`capmon batch compare` on a PostgreSQL job store: the same acceptance test as SQLite's
(tests/batch/test_compare.py), the same agreement rate reported, and a repeat replacing."""

from __future__ import annotations

from pathlib import Path

import pytest

from capmon.batch.pg import PgStore
from capmon.batch.sqlite import Comparison
from capmon.batch.store import PgLocation
from tests.batch.test_compare import compare_reports_the_share_the_fallback_changed


@pytest.mark.looptime
async def test_compare_reports_the_share_the_fallback_changed_on_postgresql(tmp_path: Path, pg_db: PgLocation) -> None:
    await compare_reports_the_share_the_fallback_changed(tmp_path, pg_db)


def test_a_repeated_comparison_replaces_the_first_and_a_deleted_job_takes_its_own(pg_db: PgLocation) -> None:
    with PgStore(pg_db) as store:
        job = store.create_job("j", input_path="in", input_size=0, fingerprint="f", settings={}, now=1.0)
        store.save_comparison(job.id, 7, model="flagship", content=None, error="full", now=1.0)
        store.save_comparison(job.id, 7, model="flagship", content="pos\x00itive", error=None, now=2.0)
        assert store.comparisons(job.id) == {7: Comparison("flagship", "pos\ufffditive", None)}
        store.delete_job(job.id)
        assert store.comparisons(job.id) == {}
