"""A job's results as JSONL, in input order.

Each finished item is one record: ``id``, the ``model`` that served it, ``content``,
the item's ``metadata``, ``attempts`` (over its whole life, parks included) and
``fell_back``; a failed item has ``model`` and ``content`` null and
``error: {kind, message, line}``. Items not finished yet (pending, parked) are left
out and counted, so a partial export is never mistaken for a whole one.

The file is written next to its destination and renamed into place, so a reader
never sees half an export, and an export that fails leaves the old file alone.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from capmon.batch import store as st
from capmon.batch.store import JobStore, ResultRecord
from capmon.core.exceptions import BatchError

STDOUT = "-"


@dataclass(frozen=True)
class ExportSummary:
    path: str
    written: int
    done: int
    failed: int
    unfinished: int


def check_writable(out: Path | str) -> None:
    """Raise BatchError now, before anything is sent, if ``out`` cannot be written."""
    if str(out) == STDOUT:
        return
    path = Path(out)
    if path.is_dir():
        raise BatchError(f"--out {path}: is a folder, expected a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise BatchError(f"--out {path}: the folder {parent} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as e:
        raise BatchError(f"--out {path}: cannot write in {parent}: {e.strerror or e}") from None
    if path.exists() and not os.access(path, os.W_OK):
        raise BatchError(f"--out {path}: the file is not writable")


def record(r: ResultRecord) -> dict[str, Any]:
    metadata = json.loads(r.metadata_json) if r.metadata_json is not None else None
    out: dict[str, Any] = {"id": r.id, "model": r.model if r.state == st.DONE else None,
                           "content": r.content if r.state == st.DONE else None, "metadata": metadata,
                           "attempts": r.attempts, "fell_back": r.fell_back}
    if r.state == st.FAILED:
        out["error"] = {"kind": r.error_kind, "message": r.error_message, "line": r.line}
    return out


def write_records(store: JobStore, job_id: int, f: TextIO) -> tuple[int, int, int]:
    done = failed = unfinished = 0
    dumps = json.dumps
    for r in store.results(job_id):
        if r.state == st.DONE:
            done += 1
        elif r.state == st.FAILED:
            failed += 1
        else:
            unfinished += 1
            continue
        f.write(dumps(record(r), ensure_ascii=False))
        f.write("\n")
    return done, failed, unfinished


def export_job(db_path: Path, job: str, out: Path | str) -> ExportSummary:
    check_writable(out)
    store = JobStore(db_path, readonly=True)
    try:
        info = store.require(job)
        if str(out) == STDOUT:
            done, failed, unfinished = write_records(store, info.id, sys.stdout)
            sys.stdout.flush()
            return ExportSummary(STDOUT, done + failed, done, failed, unfinished)
        path = Path(out)
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                done, failed, unfinished = write_records(store, info.id, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise BatchError(f"--out {out}: cannot write: {e.strerror or e}") from None
    finally:
        store.close()
    return ExportSummary(str(path), done + failed, done, failed, unfinished)
