"""Durable batch jobs: a JSONL file in, every item sent through the shared client,
every result and attempt kept in SQLite, resumable after any crash.

Importable without the dashboard (no Textual, no Rich).
"""

from capmon.batch.demo import write_demo_input
from capmon.batch.runner import BatchRunner, JobSummary
from capmon.batch.store import JobStore, default_db_path, read_progress

__all__ = ["BatchRunner", "JobStore", "JobSummary", "default_db_path", "read_progress", "write_demo_input"]
