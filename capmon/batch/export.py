"""A job's results as JSONL, in input order.

Each finished item is one record: ``id``, the ``model`` that served it, ``content``,
the item's ``metadata``, ``attempts`` (over its whole life, parks included) and
``fell_back`` (and, for an item ``capmon batch compare`` sent again, ``compare_model``,
``compare_answer`` and ``agrees``: null when either answer is missing); a failed item
has ``model`` and ``content`` null and ``error: {kind, message, line}``. Items not
finished yet (pending, parked) are left out and counted, so a partial export is never
mistaken for a whole one. An item whose line left the input (``--accept-changed-input``) stays where its line was, with
``"removed": true`` and whatever result it had.

No record carries more than ``client.max_response_bytes`` of content (the runner
never stores more; a result left by an older capmon over the cap is written as an
``oversized`` failure without its content).

The file is written next to its destination and renamed into place, so a reader
never sees half an export, and an export that fails leaves the old file alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from capmon.batch.compare import agrees
from capmon.batch.options import OptionError
from capmon.batch.sqlite import DEFAULT_MAX_RESPONSE_BYTES, Comparison, ResultRecord
from capmon.batch.states import ItemState
from capmon.batch.store import Db, Store, open_store
from capmon.core.types.failure import Kind

STDOUT = "-"


@dataclass(frozen=True)
class ExportSummary:
    path: str
    written: int
    done: int
    failed: int
    unfinished: int
    removed: int = 0


def check_writable(out: Path | str) -> None:
    """Raise OptionError now, before anything is sent, if ``out`` cannot be written."""
    if str(out) == STDOUT:
        return
    path = Path(out)
    if path.is_dir():
        raise OptionError("out", "is a folder, expected a file name", value=str(path))
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OptionError("out", f"the folder {parent} does not exist", value=str(path))
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as e:
        raise OptionError("out", f"cannot write in {parent}: {e.strerror or e}", value=str(path)) from None
    if path.exists() and not os.access(path, os.W_OK):
        raise OptionError("out", "the file is not writable", value=str(path))


def _oversized(r: ResultRecord, max_bytes: int) -> ResultRecord:
    """A result over the cap (stored by a capmon before it had one), as the runner stores it now."""
    if r.content is None or len(r.content) * 4 <= max_bytes:
        return r
    size = len(r.content.encode("utf-8", "replace"))
    if size <= max_bytes:
        return r
    return dataclasses.replace(
        r,
        state=ItemState.FAILED if r.state is ItemState.DONE else r.state,
        content=None,
        error_kind=Kind.OVERSIZED,
        error_message=f"the answer from {r.model} is {size:,} bytes, over "
        f"client.max_response_bytes ({max_bytes:,}): not exported",
    )


def record(r: ResultRecord, removed: bool = False, compared: Comparison | None = None) -> dict[str, Any]:
    metadata = json.loads(r.metadata_json) if r.metadata_json is not None else None
    shown = r.state is ItemState.DONE or (removed and r.content is not None)
    out: dict[str, Any] = {
        "id": r.id,
        "model": r.model if shown else None,
        "content": r.content if shown else None,
        "metadata": metadata,
        "attempts": r.attempts,
        "fell_back": r.fell_back,
    }
    if r.state is ItemState.FAILED or (removed and r.error_kind is not None and not shown):
        out["error"] = {"kind": r.error_kind, "message": r.error_message, "line": r.line}
    if removed:
        out["removed"] = True
    if compared is not None:  # capmon batch compare's answer, beside the fallback's
        out["compare_model"] = compared.model
        out["compare_answer"] = compared.content
        out["agrees"] = agrees(r.content, compared.content)
        if compared.error is not None:
            out["compare_error"] = compared.error
    return out


def write_records(
    store: Store, job_id: int, f: TextIO, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
) -> tuple[int, int, int, int]:
    """(done, failed, unfinished, removed)."""
    done = failed = unfinished = removed = 0
    dumps = json.dumps
    compared = store.comparisons(job_id)
    for r in store.results(job_id):
        r = _oversized(r, max_bytes)
        if r.state is ItemState.DONE:
            done += 1
        elif r.state is ItemState.FAILED:
            failed += 1
        elif r.state is ItemState.REMOVED:
            removed += 1
            f.write(dumps(record(r, removed=True), ensure_ascii=False))
            f.write("\n")
            continue
        else:
            unfinished += 1
            continue
        f.write(dumps(record(r, compared=compared.get(r.key)), ensure_ascii=False))
        f.write("\n")
    return done, failed, unfinished, removed


def _max_bytes(settings: dict[str, Any]) -> int:
    value = settings.get("max_response_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_MAX_RESPONSE_BYTES


def export_job(db_path: Db, job: str, out: Path | str) -> ExportSummary:
    check_writable(out)
    store = open_store(db_path, readonly=True)
    try:
        info = store.require(job)
        max_bytes = _max_bytes(info.settings)
        if str(out) == STDOUT:
            done, failed, unfinished, removed = write_records(store, info.id, sys.stdout, max_bytes)
            sys.stdout.flush()
            return ExportSummary(STDOUT, done + failed + removed, done, failed, unfinished, removed)
        path = Path(out)
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                done, failed, unfinished, removed = write_records(store, info.id, f, max_bytes)
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
        raise OptionError("out", f"cannot write: {e.strerror or e}", value=str(out)) from None
    finally:
        store.close()
    return ExportSummary(str(path), done + failed + removed, done, failed, unfinished, removed)
