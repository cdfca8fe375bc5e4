"""`capmon batch run | resume | export | list | show`.

Stopping and pausing a running job from the terminal:
  * Ctrl+C (SIGINT) or SIGTERM stops cleanly: items in flight go back to pending,
    every result received so far is saved, and `capmon batch resume JOB` (or the same
    `capmon batch run` again) goes on from there. Exit code 130, whenever the signal
    comes and however signals combine: a second one only waits for the clean stop; a
    third exits at once (what was in flight is sent again on resume).
  * SIGUSR1 pauses and resumes (`kill -USR1 PID`): nothing new starts while paused,
    items in flight finish.

Whole-job problems (bad input file, locked database, a refused key) raise BatchError,
which the CLI turns into a message and exit code 2 (an OptionError names the option,
and the CLI its flag).

Each command is a function of typed options (:class:`RunOptions`, :class:`ResumeOptions`)
or plain values, returning the exit code (:mod:`capmon.exitcodes`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from capmon.batch.compare import Agreement, compare_job
from capmon.batch.defaults import DEFAULT_CONCURRENCY
from capmon.batch.export import check_writable, export_job
from capmon.batch.figures import settings_text, shown
from capmon.batch.options import OptionError, RunnerOptions
from capmon.batch.pacing import Pacing
from capmon.batch.progress import ProgressLine
from capmon.batch.runner import BatchRunner, JobSummary
from capmon.batch.states import ItemState, JobState
from capmon.batch.store import Db, PgLocation, locate, open_store
from capmon.core.base import text
from capmon.core.base.exceptions import BatchError
from capmon.core.types.config import Config
from capmon.core.types.events import BatchProgress, Event, Notice
from capmon.exitcodes import EXIT_FAILED_ITEMS, EXIT_INTERRUPTED, EXIT_OK


@dataclass(frozen=True, kw_only=True)
class StartOptions:
    """What `capmon batch run` and `capmon batch resume` share. A pacing value left
    None is the default for run, and what the job last ran with for resume."""

    out: str | None = None  # write the results here ("-": stdout) when the job finishes
    concurrency: int | None = None
    rate: float | None = None  # items started per second, at most
    window: str | None = None  # HH:MM-HH:MM, local time
    db: Db | None = None  # the job store (a path or a PostgreSQL location); None: $CAPMON_DB or the user data dir
    config: str | None = None  # the config file; None: found as capmon.core.types.config.find_config finds it
    show_progress: bool = True  # a progress line, when stderr is a terminal
    accept_changed_input: bool = False
    remap: Mapping[str, str] = field(default_factory=dict)  # OLD model -> NEW, for items naming a model gone
    lease_ttl: float | None = None  # a shared job's item leases (seconds); None: the default
    stream: bool = False  # send items as streams: a break mid-answer is continued (RunnerOptions.stream)
    max_cost: float | None = None  # USD the job may spend (RunnerOptions.max_cost); None: resume keeps the job's


@dataclass(frozen=True, kw_only=True)
class RunOptions(StartOptions):
    input: Path
    job: str | None = None  # None: the input file's stem


@dataclass(frozen=True, kw_only=True)
class ResumeOptions(StartOptions):
    job: str


def resolve_db(db: Db | str | None) -> Db:
    return db if isinstance(db, PgLocation) else locate(db)


def _db_flag(db: Db) -> str:
    """`` --db ...`` (or ``--db-url-env NAME``) for a command to copy, when the store is not
    the default one."""
    if isinstance(db, PgLocation):
        return f" {db.flag}" if db.flag else ""
    return f" --db {db}" if db != locate() else ""


def _say(text: str, err: TextIO | None = None) -> None:
    print(text, file=err or sys.stderr, flush=True)


class Interrupts:
    """SIGINT, SIGTERM and SIGUSR1 for the whole of a batch command.

    Python-level handlers, installed before anything starts and kept until the command
    returns (and, once a signal has stopped it, until the process exits): the event
    loop's own handlers are dropped when the loop closes, and a SIGTERM that came then
    met the default action (death, exit 143) instead of the clean stop. The first SIGINT
    or SIGTERM stops the job cleanly (or, outside the job, raises KeyboardInterrupt); a
    second only waits for that; a third exits at once.
    """

    def __init__(self) -> None:
        self.by = ""
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: Callable[[], object] | None = None
        self._toggle: Callable[[], None] | None = None
        self._in_loop = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGUSR1", None)):
                if sig is None:
                    continue
                try:
                    self._saved[sig] = signal.signal(sig, self._handle)
                except (ValueError, OSError):  # not allowed here
                    pass
        return self

    def __exit__(self, *exc: object) -> None:
        if self.by:
            # Stopped by a signal: the command ends in exit 130, and the process with it. The
            # handlers hold until then (a second signal is still ignored, a third exits 130 at
            # once), and from the interpreter's teardown on, the signals are ignored: Python
            # puts the default action back there, and in the tens of milliseconds its teardown
            # takes a second SIGTERM killed the process with 143.
            self._saved.clear()
            atexit.register(_ignore_stop_signals)
            return
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def loop_running(self, running: bool) -> None:
        """Inside the event loop a signal must never raise: the job sees it when it attaches."""
        self._in_loop = running

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], object], toggle: Callable[[], None]) -> None:
        self._loop, self._stop, self._toggle = loop, stop, toggle
        if self.by:  # a signal came while the engine was starting
            loop.call_soon(stop)

    def detach(self) -> None:
        self._loop = self._stop = self._toggle = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == getattr(signal, "SIGUSR1", None):
            if self._loop is not None and self._toggle is not None:
                self._loop.call_soon_threadsafe(self._toggle)
            return
        self.count += 1
        if self.count >= 3:
            os._exit(EXIT_INTERRUPTED)  # asked three times: every committed result is safe already
        if self.by:
            return  # stopping already: the clean stop goes on, and exits 130
        self.by = "Ctrl+C" if signum == signal.SIGINT else "SIGTERM"
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop)
        elif not self._in_loop:
            raise KeyboardInterrupt


def _ignore_stop_signals() -> None:
    """At exit after a clean stop: every result is saved, and the exit code is 130 whatever comes now.
    SIG_IGN is the one disposition Python's teardown leaves as it is."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, signal.SIG_IGN)


# ---------------------------------------------------------------- run / resume


def run_job(options: RunOptions) -> int:
    """`capmon batch run INPUT`: a new job, or the same command again (a resume)."""
    input_path = options.input.expanduser()
    if not input_path.exists():
        raise BatchError(f"{input_path}: no such file")
    if not input_path.is_file():
        raise BatchError(f"{input_path}: not a file, expected a JSONL file with one item per line")
    pacing = Pacing.of(options.concurrency, options.rate, options.window)
    if options.out:
        check_writable(options.out)  # before anything is sent
    return _start(options, options.job or input_path.stem, input_path, pacing)


def resume_job(options: ResumeOptions) -> int:
    """`capmon batch resume JOB`: go on with the job's own input and, unless told, its own pacing."""
    store = open_store(resolve_db(options.db), readonly=True)
    try:
        info = store.require(options.job)
    finally:
        store.close()
    saved = info.settings
    pacing = Pacing.of(
        options.concurrency
        if options.concurrency is not None
        else int(saved.get("concurrency") or DEFAULT_CONCURRENCY),
        options.rate if options.rate is not None else saved.get("rate"),
        options.window if options.window is not None else saved.get("window"),
    )
    if options.out:
        check_writable(options.out)
    if options.max_cost is None and saved.get("max_cost") is not None:
        options = dataclasses.replace(options, max_cost=float(saved["max_cost"]))
    return _start(options, options.job, None, pacing)


def _start(options: StartOptions, job: str, input_path: Path | None, pacing: Pacing) -> int:
    with Interrupts() as interrupts:
        from capmon.runtime import load

        config = load(options.config)
        db = resolve_db(options.db)
        progress = ProgressLine(sys.stderr, enabled=None if options.show_progress else False)
        interrupts.loop_running(True)
        try:
            summary = asyncio.run(_drive(config, db, job, input_path, pacing, progress, interrupts, options))
        finally:
            interrupts.loop_running(False)
        if summary is None:
            return EXIT_INTERRUPTED
        _say(describe_summary(summary))
        if summary.failed:
            _say(_failures(db, job))
        if interrupts.by:  # it came as the job finished: everything is saved, the export is not made
            _say(
                f"stopped by {interrupts.by}"
                + (f"; export with: capmon batch export {job} --out {options.out}" if options.out else "")
            )
            return EXIT_INTERRUPTED
        if options.out and summary.state is JobState.FINISHED:
            result = export_job(db, job, options.out)
            _say(f"exported {result.written} records to {result.path}")
        return EXIT_OK if summary.failed == 0 else EXIT_FAILED_ITEMS


async def _drive(
    config: Config,
    db: Db,
    job: str,
    input_path: Path | None,
    pacing: Pacing,
    progress: ProgressLine,
    interrupts: Interrupts,
    options: StartOptions,
) -> JobSummary | None:
    from capmon.runtime import open_engine

    async with open_engine(config, role="batch") as engine:
        runner = BatchRunner(
            engine.client,
            db,
            job,
            RunnerOptions(
                input_path=input_path,
                concurrency=pacing.concurrency,
                rate=pacing.rate,
                window=pacing.window,
                remap=options.remap,
                accept_changed_input=options.accept_changed_input,
                lease_ttl=options.lease_ttl,
                stream=options.stream,
                max_cost=options.max_cost,
            ),
        )

        def show(event: Event) -> None:
            if isinstance(event, BatchProgress) and event.job == job:
                progress.update(event)
            elif isinstance(event, Notice):  # the runner's: a changed input taken, a save that failed
                if runner.halt is not None and event.message == str(runner.halt):
                    return  # the halt itself: the run raises it, and the CLI prints it once
                progress.clear()
                _say(f"capmon: {event.message}")

        unsubscribe = engine.bus.subscribe(show)
        task = asyncio.create_task(runner.run(), name=f"capmon-batch:{job}")

        def toggle() -> None:
            paused = runner.toggle_pause()
            progress.update(runner.progress())
            if not progress.enabled:
                _say(f"job {job!r} {'paused (SIGUSR1 again to go on)' if paused else 'resumed'}")

        interrupts.attach(asyncio.get_running_loop(), task.cancel, toggle)
        try:
            return await task
        except asyncio.CancelledError:
            if not interrupts.by:
                raise
            progress.clear()
            p = runner.progress()
            saved = (
                "every result so far is saved"
                if runner.save_error is None
                else f"the last results could not be saved ({runner.save_error}) and will be sent again"
            )
            _say(
                f"stopped by {interrupts.by}: {p.done} done, {p.failed} failed, "
                f"{(p.total or 0) - p.done - p.failed} left; {saved}. "
                f"Go on with: capmon batch resume {shown(job)}" + _db_flag(db)
            )
            return None
        finally:
            interrupts.detach()
            unsubscribe()
            progress.clear()


def describe_summary(s: JobSummary) -> str:
    models = ", ".join(f"{m} {n}" for m, n in s.per_model)
    return (
        f"job {s.job!r} {s.state}: {s.total} items, {s.done} done, {s.failed} failed"
        + (f", {s.parked} parked" if s.parked else "")
        + (f", {s.pending} pending" if s.pending else "")
        + (f" (served by {models})" if models else "")
        + f"; {s.sent} sent in {text.duration(s.elapsed)}"
    )


def _failures(db: Db, job: str, limit: int = 5) -> str:
    store = open_store(db, readonly=True)
    try:
        info = store.require(job)
        rows = store.failed_items(info.id, limit)
        kinds = store.failure_kinds(info.id)
    finally:
        store.close()
    lines = ["failed: " + ", ".join(f"{shown(k)} {n}" for k, n in kinds.items())]
    lines += [
        f"  line {line} ({shown(item_id)}): {shown(kind)}: {shown(message)}" for line, item_id, kind, message in rows
    ]
    more = sum(kinds.values()) - len(rows)
    if more > 0:
        lines.append(f"  ... and {more} more: capmon batch show {shown(job)}; capmon report {shown(job)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- export / list / show


def export_command(db: Db | str | None, job: str, out: str) -> int:
    """`capmon batch export JOB --out FILE` ("-": stdout)."""
    result = export_job(resolve_db(db), job, out)
    note = f"; {result.unfinished} items not finished yet (capmon batch resume {job})" if result.unfinished else ""
    removed = f", {result.removed} removed from the input" if result.removed else ""
    _say(
        f"exported {result.written} records ({result.done} done, {result.failed} failed{removed}) "
        f"to {result.path}{note}"
    )
    return EXIT_OK


def compare_command(db: Db | str | None, job: str, sample: int, seed: int, config: str | None = None) -> int:
    """`capmon batch compare JOB --sample N --seed S`."""
    if sample < 1:
        raise OptionError("sample", "expected at least 1", value=str(sample))
    from capmon.runtime import load, open_engine

    async def drive() -> Agreement:
        async with open_engine(load(config), role="batch") as engine:
            return await compare_job(engine.client, resolve_db(db), job, sample, seed)

    with Interrupts():
        result = asyncio.run(drive())
    _say(describe_agreement(job, result))
    return EXIT_OK


def describe_agreement(job: str, a: Agreement) -> str:
    if a.rate is None:
        return f"job {job!r}: nothing compared" + (f" ({a.missing} got no answer)" if a.missing else "")
    return (
        f"job {job!r}: the preferred model agrees with the fallback on {a.agreed} of {a.compared} "
        f"items ({a.rate:.0%})" + (f"; {a.missing} got no answer" if a.missing else "")
    )


def _when(wall: float | None) -> str:
    return text.timestamp(wall or None, date=True, precision="min")


def list_jobs(db: Db | str | None, out: TextIO | None = None) -> int:
    """`capmon batch list`."""
    out = out or sys.stdout
    db = resolve_db(db)
    if isinstance(db, Path) and not db.exists():
        print(f"no jobs yet ({db} does not exist)", file=out)
        return EXIT_OK
    store = open_store(db, readonly=True)
    try:
        jobs = store.jobs()
        rows = [("name", "created", "total", "done", "failed", "parked", "state")]
        for j in jobs:
            c = store.counts(j.id)
            rows.append(
                (
                    shown(j.name),
                    _when(j.created),
                    str(j.total),
                    str(c[ItemState.DONE]),
                    str(c[ItemState.FAILED]),
                    str(c[ItemState.PARKED]),
                    store.state_of(j),
                )
            )
    finally:
        store.close()
    if not jobs:
        print(f"no jobs in {db}", file=out)
    else:
        print("\n".join(text.table(rows, numbers_right=True)), file=out)
    return EXIT_OK


def show_job(db: Db | str | None, job: str, out: TextIO | None = None) -> int:
    """`capmon batch show JOB` (and `capmon --attach JOB` without a terminal)."""
    out = out or sys.stdout
    db = resolve_db(db)
    store = open_store(db, readonly=True)
    try:
        j = store.require(job)
        counts = store.counts(j.id)
        served = store.served_by_model(j.id)
        kinds = store.failure_kinds(j.id)
        failed = store.failed_items(j.id, 10)
        state = store.state_of(j)
        workers = store.progress(job).workers if store.shared else ()
    finally:
        store.close()
    s = j.settings
    name = shown(j.name)
    lines = [
        f"job        {name}",
        f"state      {state}"
        + (
            f": {shown(j.message)}"
            if j.message and state in (JobState.HALTED, JobState.STOPPED, JobState.PAUSED)
            else ""
        ),
        f"input      {shown(j.input_path)}",
        f"created    {_when(j.created)}   updated {_when(j.updated)}",
        f"settings   {settings_text(s)}",
        f"items      {j.total} total: {counts[ItemState.DONE]} done, {counts[ItemState.FAILED]} failed, "
        f"{counts[ItemState.PARKED]} parked, {counts[ItemState.PENDING]} pending, "
        f"{counts[ItemState.IN_FLIGHT]} in flight"
        + (f"; {counts[ItemState.REMOVED]} removed from the input" if counts[ItemState.REMOVED] else ""),
    ]
    if workers:
        lines.append("workers    " + ", ".join(f"{shown(w)} {n} done" for w, n in workers))
    if state is JobState.RUNNING and not store.shared:
        c = j.counters
        lines.append(f"progress   {float(c.get('rate') or 0):.1f} items/s, ETA {text.duration(c.get('eta'))}")
    if served:
        lines.append("served by  " + ", ".join(f"{shown(m)} {n}" for m, n in served.items()))
    if kinds:
        lines.append("failures   " + ", ".join(f"{shown(k)} {n}" for k, n in kinds.items()))
        lines += [
            f"  line {line} ({shown(item_id)}): {shown(kind)}: {shown(message)}"
            for line, item_id, kind, message in failed
        ]
        if sum(kinds.values()) > len(failed):
            lines.append(f"  ... and {sum(kinds.values()) - len(failed)} more")
    extra = _db_flag(db)
    if state is not JobState.FINISHED:
        lines.append(f"go on      capmon batch resume {name}{extra}")
    lines.append(f"results    capmon batch export {name} --out {name}.out.jsonl{extra}")
    lines.append(f"report     capmon report {name}{extra}")
    print("\n".join(lines), file=out)
    return EXIT_OK
