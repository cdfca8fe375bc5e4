"""Durable batch jobs: a JSONL file in, every item sent through the shared client,
every result and attempt kept in SQLite, resumable after any crash.

Importable without the dashboard (no Textual, no Rich). The names below load their
modules when first used, so a light module of this package (``defaults``,
``states``) can be imported by the CLI and the dashboard without the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from capmon.lazy import lazy_exports

if TYPE_CHECKING:
    from capmon.batch.demo import write_demo_input
    from capmon.batch.runner import BatchRunner, JobSummary
    from capmon.batch.sqlite import JobStore, default_db_path
    from capmon.batch.states import ItemState, JobState
    from capmon.batch.store import read_progress

_WHERE = {
    "write_demo_input": "demo",
    "BatchRunner": "runner",
    "JobSummary": "runner",
    "ItemState": "states",
    "JobState": "states",
    "JobStore": "sqlite",
    "default_db_path": "sqlite",
    "read_progress": "store",
}

__all__ = [
    "BatchRunner",
    "ItemState",
    "JobState",
    "JobStore",
    "JobSummary",
    "default_db_path",
    "read_progress",
    "write_demo_input",
]


__getattr__ = lazy_exports(__name__, _WHERE)
