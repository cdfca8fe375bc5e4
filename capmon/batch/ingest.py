"""A job's input: checked against what the job stored from it, then read into the store.

Nothing is sent before the whole file is checked:

* a new job fingerprints its file (size and a hash of every byte) when it is created,
  and the ingest hashes the bytes again as it reads them: a file that changed while it
  was read is refused, and the job is deleted again as if it never started;
* an ingest cut short (a crash, Ctrl+C) goes on from the last chunk stored, against
  the very file it started reading;
* a job read whole checks its file on every run: a file that changed is refused
  naming the first line that differs, unless the run says to take it (see
  :mod:`capmon.batch.changes`);
* items not finished yet that name a model the config no longer has are refused unless
  a remap says where they go.

Jobs made by schema-1 capmon kept only a hash of the first 64 KiB and no line hashes;
they are checked the same way as far as that allows, and get line hashes from the
first file known to be theirs.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from capmon.batch import changes
from capmon.batch.items import Item, parse_line, read_lines, sniff_file
from capmon.batch.options import OptionError
from capmon.batch.sqlite import JobInfo, JobStore
from capmon.batch.states import BatchKind, ItemState, JobState
from capmon.batch.store import Store
from capmon.core.base.clock import Clock
from capmon.core.base.exceptions import BatchError

INGEST_CHUNK = 2000  # lines per ingest transaction
FINGERPRINT_PREFIX = "sha256:"


class Refused(BatchError):
    """The input was refused after its job was created: the job is deleted again (fix
    the file and run the same command)."""


def fingerprint(path: Path) -> tuple[int, str]:
    """(size, "sha256:" + hash of the whole file), read in blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
            size += len(block)
    return size, FINGERPRINT_PREFIX + h.hexdigest()


def legacy_fingerprint(path: Path) -> tuple[int, str]:
    """What schema-1 jobs stored: (size, hash of the first 64 KiB)."""
    with open(path, "rb") as f:
        head = f.read(1 << 16)
        size = f.seek(0, 2)
    return size, hashlib.sha256(head).hexdigest()[:32]


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, with the reasons a file cannot be read said as BatchError."""
    try:
        return read(path)
    except FileNotFoundError:
        raise BatchError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BatchError(f"{path}: is a folder, expected a JSONL file") from None
    except OSError as e:
        raise BatchError(f"{path}: cannot read: {e.strerror or e}") from None


def file_fingerprint(path: Path) -> tuple[int, str]:
    return _read(path, fingerprint)  # type: ignore[no-any-return]


def check_text(path: Path) -> None:
    """Refuse a whole file that cannot be UTF-8 JSONL (UTF-16, compressed, binary)."""
    problem = _read(path, sniff_file)
    if problem:
        raise BatchError(f"{path}: {problem}")


class Ingest:
    """One job's input, checked and read on behalf of a runner.

    ``input_path`` is the file the run names (None for a resume: the job's own);
    ``models`` the names items may ask for; ``note`` tells people what was taken as
    asked (a changed input)."""

    def __init__(
        self,
        store: Store,
        job: str,
        input_path: Path | None,
        *,
        models: Sequence[str],
        clock: Clock,
        accept_changed_input: bool = False,
        note: Callable[[str], None] = lambda message: None,
    ) -> None:
        self.store = store
        self.job = job
        self.input_path = input_path
        self.models = list(models)
        self.clock = clock
        self.accept_changed_input = accept_changed_input
        self._note = note

    # ------------------------------------------------------------ a new job

    def create(self, settings: Mapping[str, Any]) -> JobInfo:
        """Create the job from the run's file, fingerprinted before anything else."""
        if self.input_path is None:
            raise BatchError(
                f"no job named {self.job!r} in {self.store.where}; start it with "
                f"`capmon batch run INPUT.jsonl --job {self.job}`"
            )
        check_text(self.input_path)
        size, fp = file_fingerprint(self.input_path)
        return self.store.create_job(
            self.job,
            input_path=str(self.input_path.resolve()),
            input_size=size,
            fingerprint=fp,
            settings=settings,
            now=self.clock.wall(),
        )

    # ------------------------------------------------------------ an existing job

    def check(self, info: JobInfo) -> JobInfo:
        """The job's input is the file it was made from, or is taken as asked; returns the job as it is now."""
        return self._check_unfinished(info) if not info.ingested else self._check_whole(info)

    def _input_of(self, info: JobInfo) -> Path:
        """The file to check the job against: the one given (run), else the job's own (resume)."""
        return self.input_path.resolve() if self.input_path is not None else Path(info.input_path or "")

    def _changed(self, info: JobInfo, path: Path, difference: changes.Difference) -> BatchError:
        take = "add --accept-changed-input (new lines are added, removed ones marked removed, changed ones sent again)"
        if str(path) == info.input_path:
            return BatchError(
                f"{path} changed since job {self.job!r} was created: {difference}; nothing was sent. "
                f"To take the file as it is now, {take}; or put the old file back, or start a new job "
                f"with --job NAME"
            )
        return BatchError(
            f"job {self.job!r} already exists, started from {info.input_path} ({info.total} items), and "
            f"{path} is a different file ({difference}); nothing was sent. Name a new job with --job NAME, "
            f"or go on with `capmon batch resume {self.job}`, or to make it the job's input, {take}"
        )

    def _check_unfinished(self, info: JobInfo) -> JobInfo:
        """An ingest cut short goes on only against the very file it started reading."""
        store, path = self.store, self._input_of(info)
        check_text(path)
        size, fp = file_fingerprint(path)
        stored_fp = info.input_fingerprint or ""
        legacy = not stored_fp.startswith(FINGERPRINT_PREFIX)
        same = (
            (legacy_fingerprint(path) == (info.input_size, stored_fp))
            if legacy
            else (size, fp) == (info.input_size, stored_fp)
        )
        if same:
            if legacy:  # read by an older capmon: hashes from now on
                store.backfill_line_hashes(
                    info.id,
                    (
                        (raw.line, raw.hash)
                        for raw in itertools.takewhile(lambda r: r.line <= info.ingest_line, read_lines(path))
                    ),
                )
            if legacy or str(path) != info.input_path:
                store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
                return store.require(self.job)
            return info
        if not self.accept_changed_input:
            if legacy:
                difference = changes.Difference(None, "it was being read by an older capmon, which kept no line hashes")
            else:
                difference = changes.first_difference(store, info, path, upto=info.ingest_line)
            raise self._changed(info, path, difference)
        # Nothing was sent before the whole file was read: read the new one from the start.
        store.restart_ingest(info.id, input_path=str(path), input_size=size, fingerprint=fp, now=self.clock.wall())
        self._note(f"{path}: changed while job {self.job!r} was being read; reading it again from the start, as asked")
        return store.require(self.job)

    def _check_whole(self, info: JobInfo) -> JobInfo:
        """A job read whole: its input must be the file it read, unless asked to take the new one."""
        store, path = self.store, self._input_of(info)
        if self.input_path is None and not path.is_file():
            self._note(
                f"{path}: job {self.job!r}'s input is no longer there; going on with the {info.total} items "
                f"stored from it"
            )
            return info
        size, fp = file_fingerprint(path)
        stored_fp = info.input_fingerprint or ""
        if not stored_fp.startswith(FINGERPRINT_PREFIX):
            return self._check_legacy(info, path, size, fp)
        if (size, fp) == (info.input_size, stored_fp):
            if str(path) != info.input_path:  # the same bytes under another name
                store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
                return store.require(self.job)
            return info
        difference = changes.first_difference(store, info, path)
        if not self.accept_changed_input:
            raise self._changed(info, path, difference)
        check_text(path)
        if not isinstance(store, JobStore):
            raise BatchError(
                f"{path} changed since job {self.job!r} was created ({difference}); taking a changed input "
                f"(--accept-changed-input) is done in a SQLite job store only, not in {store.where}; nothing "
                f"was sent: put the old file back, or start a new job with --job NAME"
            )
        done = changes.reconcile(
            store, info, path, size=size, fingerprint=fp, models=self.models, now=self.clock.wall()
        )
        self._note(f"{path}: changed since job {self.job!r} was created ({difference}); taken as asked: {done}")
        return store.require(self.job)

    def _check_legacy(self, info: JobInfo, path: Path, size: int, fp: str) -> JobInfo:
        """A job made by a capmon that kept only a hash of the first 64 KiB and no line hashes."""
        if legacy_fingerprint(path) != (info.input_size, info.input_fingerprint):
            raise BatchError(
                f"job {self.job!r} was started from {info.input_path} by an older capmon, and {path} "
                f"differs from it; which lines changed cannot be told for such a job, so nothing was "
                f"sent: put the old file back, or start a new job with --job NAME"
            )
        # The best that can be known: take the file as the job's, with its line hashes, from now on.
        self.store.backfill_line_hashes(info.id, ((raw.line, raw.hash) for raw in read_lines(path)))
        self.store.set_input(info.id, input_path=str(path), input_size=size, fingerprint=fp)
        return self.store.require(self.job)

    # ------------------------------------------------------------ reading

    async def read(self, info: JobInfo, stored: Callable[[int], None] = lambda total: None) -> JobInfo:
        """Store the input's items, a chunk per transaction (``stored(total)`` after each);
        an ingest cut short goes on from the last chunk stored. The bytes read are hashed
        as they are read and must be the file fingerprinted when the job was created.
        Raises :class:`Refused` (the job deleted) for a file that changed while it was
        read, an empty one, or one with duplicate ids."""
        store = self.store
        path = Path(info.input_path or "")
        rows: list[tuple[Any, ...]] = []
        offset, line = info.ingest_offset, info.ingest_line
        hasher = hashlib.sha256()
        try:
            with open(path, "rb") as f:  # what was read before this run: hashed again, not parsed
                left = info.ingest_offset
                while left > 0 and (block := f.read(min(left, 1 << 20))):
                    hasher.update(block)
                    left -= len(block)
            for raw in read_lines(path, info.ingest_offset, info.ingest_line + 1, hasher):
                parsed = parse_line(raw.line, raw.data, self.models)
                if isinstance(parsed, Item):
                    rows.append(
                        (
                            raw.line,
                            parsed.id,
                            ItemState.PENDING,
                            parsed.messages_json,
                            parsed.model,
                            parsed.max_tokens,
                            parsed.temperature,
                            parsed.metadata_json,
                            None,
                            None,
                            raw.hash,
                        )
                    )
                else:
                    rows.append(
                        (
                            raw.line,
                            parsed.id,
                            ItemState.FAILED,
                            None,
                            None,
                            None,
                            None,
                            None,
                            BatchKind.BAD_INPUT,
                            parsed.message,
                            raw.hash,
                        )
                    )
                offset, line = raw.end, raw.line
                if len(rows) >= INGEST_CHUNK:
                    store.ingest_chunk(info.id, rows, offset=offset, line=line, now=self.clock.wall())
                    rows = []
                    stored(store.require(self.job).total)
                    await self.clock.sleep(0)  # let the loop breathe (a dashboard in the same loop)
            if rows:
                store.ingest_chunk(info.id, rows, offset=offset, line=line, now=self.clock.wall())
        except OSError as e:
            raise BatchError(f"{path}: cannot read: {e.strerror or e}") from None
        if FINGERPRINT_PREFIX + hasher.hexdigest() != info.input_fingerprint:
            raise self._refuse(
                info,
                f"{path} changed while job {self.job!r} was being read (an editor or a program "
                f"writing it?); nothing was sent; run it again when the file is complete",
            )
        info = store.require(self.job)
        if info.total == 0:
            raise self._refuse(info, f"{path} is empty: no items to run (one JSON object per line)")
        dups = store.duplicate_ids(info.id)
        if dups:
            more = store.duplicate_count(info.id) - len(dups)
            listed = "; ".join(f"{i!r} on lines {', '.join(map(str, lines))}" for i, lines in dups)
            raise self._refuse(
                info,
                f"{path}: duplicate ids: {listed}{f' (and {more} more)' if more > 0 else ''}; "
                f"every id must be unique, so nothing was sent",
            )
        store.set_job(info.id, state=JobState.READY)
        return store.require(self.job)

    def _refuse(self, info: JobInfo, message: str) -> Refused:
        try:
            self.store.delete_job(info.id)
        except BatchError as e:  # the job is not deleted, but it is refused all the same: nothing was sent
            return Refused(str(e))
        return Refused(message)

    # ------------------------------------------------------------ models

    def remap(self, info: JobInfo, asked: Mapping[str, str]) -> dict[str, str]:
        """Where items naming a model the config no longer has go: what the job remembers,
        overridden by ``asked``. Items not finished yet that name such a model are refused
        (before anything is sent) unless the remap says where they go."""
        remembered = {str(k): str(v) for k, v in (info.settings.get("remap") or {}).items()}
        remap = {**remembered, **asked}
        names = self.models
        listed = ", ".join(names)
        for old, new in remap.items():
            if new not in names:
                raise OptionError(
                    "remap",
                    f"no model named {new!r} in the config (models: {listed})",
                    value=f"{old}={new}" + ("" if old in asked else " (remembered from an earlier run)"),
                )
        missing = [
            (m, n, line) for m, n, line in self.store.unfinished_models(info.id) if m not in names and m not in remap
        ]
        if missing:
            what = "; ".join(f"{n} name {m!r} (first on line {line})" for m, n, line in missing)
            flags = " ".join(f"--remap {m}=MODEL" for m, _, _ in missing)
            raise BatchError(
                f"job {self.job!r}: items not sent yet name models the config no longer has: {what}; "
                f"the config has {listed}; nothing was sent. Say where they go with {flags}, "
                f"or put the model back in the config"
            )
        return remap
