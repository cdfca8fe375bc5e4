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
which the CLI turns into a message and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Mapping, TextIO

from capmon.batch import store as st
from capmon.batch.export import check_writable, export_job
from capmon.batch.pacing import Window
from capmon.batch.progress import ProgressLine, fmt_duration
from capmon.batch.runner import BatchRunner, JobSummary
from capmon.batch.store import JobStore, default_db_path, job_state
from capmon.core.clock import default_clock
from capmon.core.events import BatchProgress, Event, Notice
from capmon.core.exceptions import BatchError
from capmon.report import shown

EXIT_OK, EXIT_FAILED_ITEMS, EXIT_INTERRUPTED = 0, 1, 130


def run_batch_command(args: argparse.Namespace) -> int:
    handlers = {"run": _run, "resume": _resume, "export": _export, "list": _list, "show": _show}
    return handlers[args.batch_command](args)


def db_path(args: argparse.Namespace) -> Path:
    return Path(args.db).expanduser() if getattr(args, "db", None) else default_db_path()


def _say(text: str, err: TextIO | None = None) -> None:
    print(text, file=err or sys.stderr, flush=True)


def parse_remap(pairs: list[str] | None) -> dict[str, str]:
    """``--remap OLD=NEW`` (repeatable) -> {OLD: NEW}."""
    out: dict[str, str] = {}
    for pair in pairs or ():
        old, sep, new = pair.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise BatchError(f"--remap {pair}: expected OLD=NEW, a model the job's items name and one in the config")
        if old in out and out[old] != new:
            raise BatchError(f"--remap {old}: given twice ({out[old]} and {new})")
        out[old] = new
    return out


class Interrupts:
    """SIGINT, SIGTERM and SIGUSR1 for the whole of a batch command.

    Python-level handlers, installed before anything starts and kept until the command
    returns: the event loop's own handlers are dropped when the loop closes, and a
    SIGTERM that came then met the default action (death, exit 143) instead of the
    clean stop. The first SIGINT or SIGTERM stops the job cleanly (or, outside the
    job, raises KeyboardInterrupt); a second only waits for that; a third exits at once.
    """

    def __init__(self) -> None:
        self.by = ""
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: Callable[[], None] | None = None
        self._toggle: Callable[[], None] | None = None
        self._in_loop = False
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> "Interrupts":
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
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        self._saved.clear()

    def loop_running(self, running: bool) -> None:
        """Inside the event loop a signal must never raise: the job sees it when it attaches."""
        self._in_loop = running

    def attach(self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None], toggle: Callable[[], None]) -> None:
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


# ---------------------------------------------------------------- run / resume


def _check_pacing(concurrency: int | None, rate: float | None, window: str | None) -> None:
    if concurrency is not None and concurrency < 1:
        raise BatchError(f"--concurrency: expected a whole number >= 1, got {concurrency}")
    if rate is not None and not rate > 0:
        raise BatchError(f"--rate: expected items per second > 0, got {rate}")
    if window:
        Window.parse(window)


def _run(args: argparse.Namespace) -> int:
    input_path = Path(args.input).expanduser()
    if not input_path.exists():
        raise BatchError(f"{input_path}: no such file")
    if not input_path.is_file():
        raise BatchError(f"{input_path}: not a file, expected a JSONL file with one item per line")
    _check_pacing(args.concurrency, args.rate, args.window)
    if args.out:
        check_writable(args.out)  # before anything is sent
    job = args.job or input_path.stem
    return _start(args, job=job, input_path=input_path, concurrency=args.concurrency, rate=args.rate,
                  window=args.window, remap=parse_remap(getattr(args, "remap", None)))


def _resume(args: argparse.Namespace) -> int:
    db = db_path(args)
    store = JobStore(db, readonly=True)
    try:
        info = store.require(args.job)
    finally:
        store.close()
    saved = info.settings
    concurrency = args.concurrency if args.concurrency is not None else int(saved.get("concurrency") or 16)
    rate = args.rate if args.rate is not None else saved.get("rate")
    window = args.window if args.window is not None else saved.get("window")
    _check_pacing(concurrency, rate, window)
    if args.out:
        check_writable(args.out)
    return _start(args, job=args.job, input_path=None, concurrency=concurrency, rate=rate, window=window,
                  remap=parse_remap(getattr(args, "remap", None)))


def _start(args: argparse.Namespace, *, job: str, input_path: Path | None, concurrency: int, rate: float | None,
           window: str | None, remap: Mapping[str, str]) -> int:
    with Interrupts() as interrupts:
        from capmon.runtime import load

        config = load(getattr(args, "config", None))
        db = db_path(args)
        progress = ProgressLine(sys.stderr, enabled=False if getattr(args, "no_progress", False) else None)
        interrupts.loop_running(True)
        try:
            summary = asyncio.run(_drive(config, db, job, input_path, concurrency, rate, window, progress,
                                         interrupts, remap=remap,
                                         accept_changed_input=bool(getattr(args, "accept_changed_input", False))))
        finally:
            interrupts.loop_running(False)
        if summary is None:
            return EXIT_INTERRUPTED
        _say(describe_summary(summary))
        if summary.failed:
            _say(_failures(db, job))
        if interrupts.by:  # it came as the job finished: everything is saved, the export is not made
            _say(f"stopped by {interrupts.by}" + (f"; export with: capmon batch export {job} --out {args.out}"
                                                    if args.out else ""))
            return EXIT_INTERRUPTED
        if args.out and summary.state == "finished":
            result = export_job(db, job, args.out)
            _say(f"exported {result.written} records to {result.path}")
        return EXIT_OK if summary.failed == 0 else EXIT_FAILED_ITEMS


async def _drive(config: Any, db: Path, job: str, input_path: Path | None, concurrency: int, rate: float | None,
                 window: str | None, progress: ProgressLine, interrupts: Interrupts, *, remap: Mapping[str, str],
                 accept_changed_input: bool) -> JobSummary | None:
    from capmon.runtime import open_engine

    async with open_engine(config) as engine:
        runner = BatchRunner(engine.client, db, job, input_path=input_path, concurrency=concurrency, rate=rate,
                             window=window, remap=remap, accept_changed_input=accept_changed_input)

        def show(event: Event) -> None:
            if isinstance(event, BatchProgress) and event.job == job:
                progress.update(event)
            elif isinstance(event, Notice):  # the runner's: a changed input taken, a save that failed
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
            saved = ("every result so far is saved" if runner.save_error is None else
                     f"the last results could not be saved ({runner.save_error}) and will be sent again")
            _say(f"stopped by {interrupts.by}: {p.done} done, {p.failed} failed, "
                 f"{(p.total or 0) - p.done - p.failed} left; {saved}. "
                 f"Go on with: capmon batch resume {shown(job)}" + (f" --db {db}" if db != default_db_path() else ""))
            return None
        finally:
            interrupts.detach()
            unsubscribe()
            progress.clear()


def describe_summary(s: JobSummary) -> str:
    models = ", ".join(f"{m} {n}" for m, n in s.per_model)
    text = (f"job {s.job!r} {s.state}: {s.total} items, {s.done} done, {s.failed} failed"
            + (f", {s.parked} parked" if s.parked else "") + (f", {s.pending} pending" if s.pending else "")
            + (f" (served by {models})" if models else "") + f"; {s.sent} sent in {fmt_duration(s.elapsed)}")
    return text


def _failures(db: Path, job: str, limit: int = 5) -> str:
    store = JobStore(db, readonly=True)
    try:
        info = store.require(job)
        rows = store.failed_items(info.id, limit)
        kinds = store.failure_kinds(info.id)
    finally:
        store.close()
    lines = ["failed: " + ", ".join(f"{shown(k)} {n}" for k, n in kinds.items())]
    lines += [f"  line {line} ({shown(item_id)}): {shown(kind)}: {shown(message)}"
              for line, item_id, kind, message in rows]
    more = sum(kinds.values()) - len(rows)
    if more > 0:
        lines.append(f"  ... and {more} more: capmon batch show {shown(job)}; capmon report {shown(job)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- export / list / show


def _export(args: argparse.Namespace) -> int:
    result = export_job(db_path(args), args.job, args.out)
    note = f"; {result.unfinished} items not finished yet (capmon batch resume {args.job})" if result.unfinished else ""
    removed = f", {result.removed} removed from the input" if result.removed else ""
    _say(f"exported {result.written} records ({result.done} done, {result.failed} failed{removed}) to {result.path}{note}")
    return EXIT_OK


def _when(wall: float | None) -> str:
    return "-" if not wall else dt.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M")


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) if c.replace(".", "").isdigit()
                               else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def _list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    db = db_path(args)
    if not db.exists():
        print(f"no jobs yet ({db} does not exist)", file=out)
        return EXIT_OK
    store = JobStore(db, readonly=True)
    try:
        jobs = store.jobs()
        wall = default_clock().wall()
        rows = [("name", "created", "total", "done", "failed", "parked", "state")]
        for j in jobs:
            c = store.counts(j.id)
            rows.append((shown(j.name), _when(j.created), str(j.total), str(c[st.DONE]), str(c[st.FAILED]),
                         str(c[st.PARKED]), job_state(j, wall)))
    finally:
        store.close()
    if not jobs:
        print(f"no jobs in {db}", file=out)
    else:
        print(_table(rows), file=out)
    return EXIT_OK


def _show(args: argparse.Namespace, out: TextIO | None = None) -> int:
    return show_job(db_path(args), args.job, out)


def show_job(db: Path, job: str, out: TextIO | None = None) -> int:
    """`capmon batch show JOB` (and `capmon --attach JOB` without a terminal)."""
    out = out or sys.stdout
    store = JobStore(db, readonly=True)
    try:
        j = store.require(job)
        counts = store.counts(j.id)
        served = store.served_by_model(j.id)
        kinds = store.failure_kinds(j.id)
        failed = store.failed_items(j.id, 10)
    finally:
        store.close()
    clock = default_clock()
    state = job_state(j, clock.wall())
    s = j.settings
    name = shown(j.name)
    remap = ", ".join(f"{shown(k)}={shown(v)}" for k, v in (s.get("remap") or {}).items())
    lines = [
        f"job        {name}",
        f"state      {state}"
        + (f": {shown(j.message)}" if j.message and state in ("halted", "stopped", "paused") else ""),
        f"input      {shown(j.input_path)}",
        f"created    {_when(j.created)}   updated {_when(j.updated)}",
        f"settings   concurrency {s.get('concurrency', '-')}, rate {s.get('rate') or '-'}/s, window {s.get('window') or '-'}"
        + (f", remap {remap}" if remap else ""),
        f"items      {j.total} total: {counts[st.DONE]} done, {counts[st.FAILED]} failed, {counts[st.PARKED]} parked, "
        f"{counts[st.PENDING]} pending, {counts[st.IN_FLIGHT]} in flight"
        + (f"; {counts[st.REMOVED]} removed from the input" if counts[st.REMOVED] else ""),
    ]
    if state == "running":
        c = j.counters
        lines.append(f"progress   {float(c.get('rate') or 0):.1f} items/s, ETA {fmt_duration(c.get('eta'))}")
    if served:
        lines.append("served by  " + ", ".join(f"{shown(m)} {n}" for m, n in served.items()))
    if kinds:
        lines.append("failures   " + ", ".join(f"{shown(k)} {n}" for k, n in kinds.items()))
        lines += [f"  line {line} ({shown(item_id)}): {shown(kind)}: {shown(message)}"
                  for line, item_id, kind, message in failed]
        if sum(kinds.values()) > len(failed):
            lines.append(f"  ... and {sum(kinds.values()) - len(failed)} more")
    extra = f" --db {db}" if db != default_db_path() else ""
    if state != "finished":
        lines.append(f"go on      capmon batch resume {name}{extra}")
    lines.append(f"results    capmon batch export {name} --out {name}.out.jsonl{extra}")
    lines.append(f"report     capmon report {name}{extra}")
    print("\n".join(lines), file=out)
    return EXIT_OK
