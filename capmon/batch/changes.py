"""A job's input file, compared with what the job stored from it.

Every job keeps the hash of its whole input file and of each line. When the file
changed since the job was created, :func:`first_difference` names the first line that
differs (``run`` and ``resume`` refuse with it), and :func:`reconcile` takes the new file
as the job's input when asked to (``--accept-changed-input``):

* a line whose item is new is added (pending);
* an item whose line is gone is marked ``removed``: kept, with any result it had, and
  never sent again;
* an item whose line changed is sent again; the result it had is kept in the audit
  (``replaced_results`` and a ``superseded`` row);
* an unchanged item that only moved keeps its result and takes its new line number.

Items are matched by their ``id``. An item without one has no identity but its line's
content (its stored id, ``line-12``, only names the line it was first read from): the
k-th line of the new file with a given content is the k-th such item of the job, in
input order, wherever it is now. Lines inserted or deleted above it only move it; a
line edited is a new item, and the item of its old content is removed. (Matching them
by line number made an insertion at the top re-send every line below it.) Jobs made
before this are read the same way: their ids were ``line-N`` labels already.

A removed item is kept where its line was: it takes the line number of the item that
followed it, and sorts before it (the export's order).

Everything is one transaction: a reconcile cut short changes nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capmon import audit
from capmon.batch.items import Item, is_line_label, line_id, parse_line, read_lines
from capmon.batch.sqlite import JobInfo, JobStore
from capmon.batch.states import BatchKind, ItemState
from capmon.batch.store import Store
from capmon.core.base.exceptions import BatchError

_CHUNK = 2000  # rows per executemany


@dataclass(frozen=True)
class Difference:
    line: int | None  # the first line that differs; None when no line does (line endings, blank lines at the end)
    what: str  # a phrase for a message: "line 17 differs"

    def __str__(self) -> str:
        return self.what


@dataclass(frozen=True)
class Reconciled:
    added: int
    removed: int
    edited: int
    moved: int

    def __str__(self) -> str:
        return f"{self.added} added, {self.removed} removed, {self.edited} edited (sent again), {self.moved} moved"


def first_difference(store: Store, info: JobInfo, path: Path, *, upto: int | None = None) -> Difference:
    """The first line where ``path`` and the job's stored lines part. ``upto``: only the
    first lines were stored (an unfinished ingest)."""
    stored = store.stored_lines(info.id)
    last_file = last_stored = 0
    try:
        for raw in read_lines(path):
            if upto is not None and raw.line > upto:
                return Difference(None, f"the lines after line {upto} (not read yet) changed")
            last_file = raw.line
            s = next(stored, None)
            if s is None:
                return Difference(raw.line, f"line {raw.line} is new (the job's input ended at line {last_stored})")
            line, h = s
            last_stored = line
            if line != raw.line or h != raw.hash:
                first = min(line, raw.line)
                return Difference(first, f"line {first} differs")
        s = next(stored, None)
        if s is not None:
            return Difference(s[0], f"line {s[0]} is gone (the file now ends at line {last_file})")
    finally:
        stored.close()
    return Difference(None, "no item's line differs, only line endings or blank lines")


def _apply(c: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    if rows:
        c.executemany(sql, rows)
        rows.clear()


_EDIT_SQL = (
    "UPDATE items SET line = ?, line_hash = ?, state = ?, messages = ?, req_model = ?, req_max_tokens = ?, "
    "temperature = ?, metadata = ?, error_kind = ?, error_message = ?, parks = 0, not_before = NULL, "
    "first_model = NULL, model = NULL, endpoint = NULL, content = NULL, fell_back = NULL, max_tokens = NULL, "
    "prompt_tokens = NULL, completion_tokens = NULL, latency = NULL, updated = ? WHERE key = ?"
)
_KEEP_SQL = (
    "INSERT INTO replaced_results (job, item, line, at, why, state, model, endpoint, content, fell_back, "
    "attempts, error_kind, error_message) SELECT ?, id, line, ?, ?, state, model, endpoint, content, fell_back, "
    "attempts, error_kind, error_message FROM items WHERE key = ?"
)


def _fields(parsed: Any) -> tuple[Any, ...]:
    """(state, messages, model, max_tokens, temperature, metadata, error_kind, error_message)."""
    if isinstance(parsed, Item):
        return (
            ItemState.PENDING,
            parsed.messages_json,
            parsed.model,
            parsed.max_tokens,
            parsed.temperature,
            parsed.metadata_json,
            None,
            None,
        )
    return (ItemState.FAILED, None, None, None, None, None, BatchKind.BAD_INPUT, parsed.message)


def reconcile(
    store: JobStore,
    info: JobInfo,
    path: Path,
    *,
    size: int,
    fingerprint: str,
    models: Collection[str] | None,
    now: float,
) -> Reconciled:
    """Make ``path`` the job's input (see the module docstring). Raises BatchError, and
    changes nothing, when the new file has duplicate ids."""
    conn = store.conn
    job = info.name
    # What the job has: a few fields per item (a 200,000-item job holds a few tens of MB here, once).
    by_id: dict[str, int] = {}
    rows: dict[int, tuple[str, int, str | None, str, int]] = {}  # key -> (id, line, hash, state, attempts)
    by_hash: dict[str | None, collections.deque[int]] = collections.defaultdict(collections.deque)
    for k, item_id, line, h, state, attempts in conn.execute(
        "SELECT key, id, line, line_hash, state, attempts FROM items WHERE job_id = ? ORDER BY key", (info.id,)
    ):
        by_id[item_id] = k
        rows[k] = (item_id, line, h, state, attempts)
        if is_line_label(item_id) and state != ItemState.REMOVED:
            by_hash[h].append(k)

    matched: set[int] = set()
    placed: dict[int, int] = {}  # key -> its line in the new file
    seen: dict[str, int] = {}  # id -> line in the new file
    dups: list[str] = []
    moves: list[tuple[Any, ...]] = []
    edits: list[tuple[Any, ...]] = []
    keeps: list[tuple[Any, ...]] = []
    inserts: list[tuple[Any, ...]] = []
    notes: list[audit.Row] = []
    added = edited = moved = 0
    last = 0

    def edit(key: int, raw: Any, parsed: Any, why: str) -> None:
        nonlocal edited
        item_id, line, _, state, attempts = rows[key]
        if state in (ItemState.DONE, ItemState.FAILED):
            keeps.append((job, now, why, key))
        edits.append((raw.line, raw.hash, *_fields(parsed), now, key))
        had = {
            ItemState.DONE.value: "its result is kept in the audit",
            ItemState.FAILED.value: "its failure is kept in the audit",
        }.get(state, "it had no result yet")
        notes.append(
            audit.decision_row(
                audit.RunnerDecision.SUPERSEDED,
                job=job,
                item=item_id,
                at=now,
                attempt=attempts,
                reason=f"line {line} changed since the job was created ({why}): sent again; {had}",
            )
        )
        edited += 1

    with store.transaction("taking the changed input") as c:
        for raw in read_lines(path):
            last = raw.line
            parsed = parse_line(raw.line, raw.data, models)
            key: int | None = None
            if parsed.id != line_id(raw.line):
                key = by_id.get(parsed.id)
                if parsed.id in seen:
                    dups.append(f"{parsed.id!r} on lines {seen[parsed.id]}, {raw.line}")
                    continue
                seen[parsed.id] = raw.line
                if key is not None:
                    matched.add(key)
                    _, line, h, state, _ = rows[key]
                    if h == raw.hash and state != ItemState.REMOVED:
                        if line != raw.line:
                            moves.append((raw.line, key))
                            moved += 1
                    else:
                        edit(key, raw, parsed, "edited" if state != ItemState.REMOVED else "back in the input")
                else:
                    inserts.append((info.id, raw.line, parsed.id, *_fields(parsed), raw.hash, now))
                    added += 1
            else:
                # No id of its own: the same content anywhere is the same item (the k-th line
                # with it is the k-th such item), and nothing else is.
                candidates = by_hash.get(raw.hash)
                if candidates:
                    key = candidates.popleft()
                    matched.add(key)
                    if rows[key][1] != raw.line:
                        moves.append((raw.line, key))
                        moved += 1
                    seen[rows[key][0]] = raw.line
                else:
                    item_id, n = parsed.id, 2
                    while item_id in by_id or item_id in seen:  # its line-N label is another item's
                        item_id = f"{parsed.id}.{n}"
                        n += 1
                    seen[item_id] = raw.line
                    inserts.append((info.id, raw.line, item_id, *_fields(parsed), raw.hash, now))
                    added += 1
            if key is not None:
                placed[key] = raw.line
            if len(moves) + len(edits) + len(inserts) >= _CHUNK:
                _flush(c, moves, edits, keeps, inserts, notes)
        if dups:
            more = f" (and {len(dups) - 5} more)" if len(dups) > 5 else ""
            raise BatchError(
                f"{path}: duplicate ids: {'; '.join(dups[:5])}{more}; every id must be unique, "
                f"so the changed input was not taken"
            )
        _flush(c, moves, edits, keeps, inserts, notes)
        gone = [k for k, r in rows.items() if k not in matched and r[3] != ItemState.REMOVED]
        _keep_removed_in_place(c, rows, placed, last + 1)
        for chunk in _chunks(gone):
            c.executemany(
                f"UPDATE items SET state = '{ItemState.REMOVED.value}', updated = {float(now)!r} WHERE key = ?",
                [(k,) for k in chunk],
            )
            audit.write_rows(
                c,
                [
                    audit.decision_row(
                        audit.RunnerDecision.REMOVED,
                        job=job,
                        item=rows[k][0],
                        at=now,
                        attempt=rows[k][4],
                        reason=f"line {rows[k][1]} left the input: kept as removed, not sent again",
                    )
                    for k in chunk
                ],
            )
        total = c.execute(
            f"SELECT count(*) FROM items WHERE job_id = ? AND state != '{ItemState.REMOVED.value}'", (info.id,)
        ).fetchone()[0]
        c.execute(
            "UPDATE jobs SET input_path = ?, input_size = ?, input_fingerprint = ?, ingest_offset = ?, "
            "ingest_line = ?, total = ?, updated = ? WHERE id = ?",
            (str(path), size, fingerprint, size, last, total, now, info.id),
        )
    return Reconciled(added=added, removed=len(gone), edited=edited, moved=moved)


def _keep_removed_in_place(
    c: Any, rows: dict[int, tuple[str, int, str | None, str, int]], placed: dict[int, int], end: int
) -> None:
    """Every item not in the new file (removed now or before) takes the line of the item
    that followed it in the old order (the export's: line, removed ones first, key)."""
    order = sorted(rows, key=lambda k: (rows[k][1], rows[k][3] != ItemState.REMOVED, k))
    after = end  # nothing follows the last ones: they go after the file's last line
    updates: list[tuple[int, int]] = []
    for k in reversed(order):
        if k in placed:
            after = placed[k]
        elif rows[k][1] != after:
            updates.append((after, k))
    for i in range(0, len(updates), _CHUNK):
        c.executemany("UPDATE items SET line = ? WHERE key = ?", updates[i : i + _CHUNK])


def _flush(
    c: Any,
    moves: list[tuple[Any, ...]],
    edits: list[tuple[Any, ...]],
    keeps: list[tuple[Any, ...]],
    inserts: list[tuple[Any, ...]],
    notes: list[audit.Row],
) -> None:
    _apply(c, "UPDATE items SET line = ? WHERE key = ?", moves)
    _apply(c, _KEEP_SQL, keeps)  # before the edit overwrites the row
    _apply(c, _EDIT_SQL, edits)
    _apply(
        c,
        "INSERT INTO items (job_id, line, id, state, messages, req_model, req_max_tokens, temperature, metadata, "
        "error_kind, error_message, line_hash, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        inserts,
    )
    if notes:
        audit.write_rows(c, notes)
        notes.clear()


def _chunks(keys: list[int]) -> Iterator[list[int]]:
    for i in range(0, len(keys), _CHUNK):
        yield keys[i : i + _CHUNK]
